package fsfixtures_test

import (
	"bytes"
	"context"
	"flag"
	"io"
	"testing"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/fsck"
)

var updateBlobs = flag.Bool("update-blobs", false, "seal testdata/blobs anew (their digests then change every golden that names them)")

// TestBlobTestdata: every testdata blob is a valid signed envelope with a blob body
// from its sender to its recipient, for its message, and its sealed bytes open for
// the recipient to the fixtures' plaintext (envelope.OpenBlob verifies every chunk,
// the size and the digest).
func TestBlobTestdata(t *testing.T) {
	if *updateBlobs {
		fsfixtures.WriteBlobTestdata(t)
	}
	for _, d := range fsfixtures.BlobsTestdata() {
		env, ref, sealed := fsfixtures.ReadBlobTestdata(t, d.Name)
		if env.Sender() != d.Sender.DID() || env.Recipient() != d.Recipient.DID() || env.MessageID() != fsfixtures.ID(d.Label) ||
			ref.Size <= fsfixtures.BlobPlainSize || !env.DeliveryDeadline().Equal(fsfixtures.Far) {
			t.Errorf("%s: %+v", d.Name, ref)
		}
		if (sealed != nil) != d.Sealed {
			t.Fatalf("%s: sealed bytes kept %v, want %v", d.Name, sealed != nil, d.Sealed)
		}
		if sealed == nil {
			continue
		}
		r, err := envelope.OpenBlob(d.Recipient, ref, bytes.NewReader(sealed))
		if err != nil {
			t.Fatalf("%s: %v", d.Name, err)
		}
		plain, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(plain, fsfixtures.BlobPlain()) {
			t.Fatalf("%s: %d bytes, %v", d.Name, len(plain), err)
		}
	}
}

// blobLeft are the blob fixtures whose repair leaves problems it cannot repair, and
// which: a body that is gone (missing, or moved to lost+found because it was
// damaged) leaves the record that names it reporting blob-missing.
var blobLeft = map[string][]string{
	"blob-missing":   {"blob-missing", "blob-missing"},
	"blob-truncated": {"blob-missing"},
	"blob-digest":    {"blob-missing"},
}

// TestBlobFixturesRepair repairs each blob fixture as sealbridge-fsck --repair does
// and checks: every action done; what is left is only what blobLeft says (nothing,
// for the others), none of it repairable; a second repair does nothing; and every
// file is in place with its bytes or in lost+found with its note (nothing deleted).
func TestBlobFixturesRepair(t *testing.T) {
	for _, name := range []string{"blobs-valid", "blob-missing", "blob-truncated", "blob-digest", "blob-unreferenced", "blob-partial", "blob-layout"} {
		t.Run(name, func(t *testing.T) {
			dir := fsfixtures.Build(t, name)
			files := fsfixtures.Files(t, dir)
			rr, err := fsck.Repair(context.Background(), dir, fsck.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if rr.Before.Repairable() == 0 && len(rr.Actions) != 0 {
				t.Fatalf("%d actions with nothing repairable: %+v", len(rr.Actions), rr.Actions)
			}
			for _, a := range rr.Actions {
				if a.Result != fsck.ResultDone {
					t.Errorf("%s %s: %s (%s)", a.Code, a.Path, a.Result, a.Detail)
				}
			}
			var left []string
			for _, f := range rr.After.Findings {
				if f.Severity == fsck.Problem {
					left = append(left, string(f.Code))
					if f.Repairable {
						t.Errorf("left repairable: %+v", f)
					}
				}
			}
			if want := blobLeft[name]; len(left) != len(want) || len(left) > 0 && left[0] != want[0] {
				t.Errorf("left %v, want %v", left, want)
			}
			again, err := fsck.Repair(context.Background(), dir, fsck.Options{})
			if err != nil || len(again.Actions) != 0 {
				t.Fatalf("second repair: %v, %+v", err, again.Actions)
			}
			fsfixtures.AssertKept(t, dir, files, func(string) bool { return false })
		})
	}
}
