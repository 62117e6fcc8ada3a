package fsck_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func ownerHead(t *testing.T, format int, seq int64) []byte {
	t.Helper()
	id := fsfixtures.Owner()
	data, err := envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: format, Seq: seq, Time: fsfixtures.T0})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func witnessOf(dir string) string {
	return dataroot.WitnessFile(fsfixtures.DataRoot(dir), string(fsfixtures.OwnerDID()))
}

// TestHeadFormatNewerRefusesTheRun: a store whose head names a newer format is
// neither checked nor repaired, and nothing in the data root changes.
func TestHeadFormatNewerRefusesTheRun(t *testing.T) {
	dir := fsfixtures.Build(t, fsfixtures.HeadFormatNewer)
	// Damage that a repair would otherwise fix, so that a repair would change something.
	if err := os.Chmod(filepath.Join(dir, "messages"), 0o750); err != nil {
		t.Fatal(err)
	}
	root := fsfixtures.DataRoot(dir)
	before := fsfixtures.HashTree(t, root)
	opts := fsck.Options{Signer: fsfixtures.Owner().Signer()}
	_, err := fsck.Check(ctx, dir, opts)
	if !errors.Is(err, errcode.StoreFormatNewer) {
		t.Fatalf("Check: %v", err)
	}
	want := "this sealbridge reads format 2; the store at " + dir + " was written by format 3: use a newer sealbridge"
	if hint := errcode.HintOf(err); hint != want {
		t.Fatalf("hint %q, want %q", hint, want)
	}
	if _, err := fsck.Repair(ctx, dir, opts); !errors.Is(err, errcode.StoreFormatNewer) {
		t.Fatalf("Repair: %v", err)
	}
	if fsfixtures.HashTree(t, root) != before {
		t.Fatal("the data root changed")
	}
}

// TestRepairNeverTouchesTheHead: with head findings and damage it repairs, --repair
// fixes the damage and leaves .head and the witness byte for byte, their findings
// still reported.
func TestRepairNeverTouchesTheHead(t *testing.T) {
	for _, c := range []struct {
		fixture string
		code    fsck.Code
	}{
		{"head-invalid", fsck.CodeHeadInvalid},
		{"head-foreign", fsck.CodeHeadInvalid},
		{"store-rolled-back", fsck.CodeStoreRolledBack},
		{"head-absent", fsck.CodeHeadAbsent},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			dir := fsfixtures.Build(t, c.fixture)
			if err := os.Chmod(filepath.Join(dir, "messages"), 0o750); err != nil {
				t.Fatal(err)
			}
			head, _ := os.ReadFile(filepath.Join(dir, store.HeadFile))
			wit, _ := os.ReadFile(witnessOf(dir))
			rr := repair(t, dir, fsck.Options{Signer: fsfixtures.Owner().Signer()})
			mustFind(t, rr.Before, "messages", fsck.CodeBadMode)
			if find(rr.After, "messages", fsck.CodeBadMode) != nil {
				t.Fatal("the bad mode was not repaired")
			}
			f := mustFind(t, rr.After, store.HeadFile, c.code)
			if f.Repairable {
				t.Fatalf("%s is repairable", c.code)
			}
			gotHead, _ := os.ReadFile(filepath.Join(dir, store.HeadFile))
			gotWit, _ := os.ReadFile(witnessOf(dir))
			if !bytes.Equal(head, gotHead) || !bytes.Equal(wit, gotWit) {
				t.Fatal("repair changed .head or the witness")
			}
			if c.code != fsck.CodeHeadAbsent && rr.After.Problems() == 0 {
				t.Fatal("no problem left after repair")
			}
		})
	}
}

func TestHeadInvalidKinds(t *testing.T) {
	cases := map[string]struct {
		plant func(t *testing.T, p string)
		why   string
	}{
		"symlink": {func(t *testing.T, p string) {
			os.Rename(p, p+"-target")
			os.Symlink(filepath.Base(p)+"-target", p)
		}, "a symbolic link"},
		"mode":      {func(t *testing.T, p string) { os.Chmod(p, 0o644) }, "has mode 0644"},
		"hard link": {func(t *testing.T, p string) { os.Link(p, filepath.Join(filepath.Dir(p), "messages", "x")) }, "has 2 links"},
		"directory": {func(t *testing.T, p string) { os.Remove(p); os.Mkdir(p, 0o700) }, "a directory"},
		"fifo":      {func(t *testing.T, p string) { os.Remove(p); syscall.Mkfifo(p, 0o600) }, "a FIFO"},
		"too large": {func(t *testing.T, p string) { os.WriteFile(p, bytes.Repeat([]byte("a"), 2000), 0o600) }, "larger than a head"},
		"empty":     {func(t *testing.T, p string) { os.WriteFile(p, nil, 0o600) }, "not a valid signed head"},
		"newline": {func(t *testing.T, p string) {
			data, _ := os.ReadFile(p)
			os.WriteFile(p, append(data, '\n'), 0o600)
		}, "not a valid signed head"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := fsfixtures.Build(t, "valid")
			c.plant(t, filepath.Join(dir, store.HeadFile))
			f := mustFind(t, check(t, dir, fsck.Options{}), store.HeadFile, fsck.CodeHeadInvalid)
			if !strings.Contains(f.Explanation, c.why) || f.Repairable || f.Severity != fsck.Problem {
				t.Fatalf("%+v, want an unrepairable problem saying %q", f, c.why)
			}
			// The store agrees: it refuses to open.
			if _, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Dir: dir}); !errors.Is(err, errcode.OutboxStoreInvalid) {
				t.Fatalf("store.Open: %v", err)
			}
		})
	}
}

func TestWitness(t *testing.T) {
	t.Run("invalid", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		wf := witnessOf(dir)
		os.WriteFile(wf, []byte("garbage"), 0o600)
		f := mustFind(t, check(t, dir, fsck.Options{}), wf, fsck.CodeWitnessInvalid)
		if f.Repairable {
			t.Fatal("repairable")
		}
		if _, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Home: fsfixtures.DataRoot(dir)}); !errors.Is(err, errcode.OutboxStoreInvalid) {
			t.Fatalf("store.Open: %v", err)
		}
	})
	t.Run("absent", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		os.Remove(witnessOf(dir))
		if rep := check(t, dir, fsck.Options{}); rep.Problems() != 0 || len(rep.Findings) != 0 {
			t.Fatalf("%+v", rep.Findings)
		}
	})
	t.Run("behind or equal", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		os.WriteFile(filepath.Join(dir, store.HeadFile), ownerHead(t, store.FormatVersion, 7), 0o600)
		if rep := check(t, dir, fsck.Options{}); len(rep.Findings) != 0 {
			t.Fatalf("%+v", rep.Findings)
		}
	})
	t.Run("Options.WitnessFile", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		wf := filepath.Join(t.TempDir(), "w.head")
		os.WriteFile(wf, ownerHead(t, store.FormatVersion, 9), 0o600)
		f := mustFind(t, check(t, dir, fsck.Options{WitnessFile: wf}), store.HeadFile, fsck.CodeStoreRolledBack)
		if !strings.Contains(f.Explanation, "seq 1") || !strings.Contains(f.Explanation, "seq 9") {
			t.Fatal(f.Explanation)
		}
	})
	t.Run("agrees with the store", func(t *testing.T) {
		dir := fsfixtures.Build(t, "store-rolled-back")
		s, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Home: fsfixtures.DataRoot(dir), Now: func() time.Time { return fsfixtures.T0 }})
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(s.RolledBack(), errcode.StoreRolledBack) {
			t.Fatalf("the store is not rolled back: %v", s.RolledBack())
		}
		if err := s.Reconcile(ctx, 0, nil); err != nil {
			t.Fatal(err)
		}
		if rep := check(t, dir, fsck.Options{}); len(rep.Findings) != 0 {
			t.Fatalf("after Reconcile: %+v", rep.Findings)
		}
	})
}
