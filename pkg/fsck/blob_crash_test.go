package fsck_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/crashtest"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/fsck"
)

// TestBlobRepairCrashStates: every crash state of a repair of damaged blobs — moves
// to lost+found (blob-truncated, blob-digest, an unknown name in blobs/) and the
// streamed private copy of a hard-linked blob — converges when the repair runs again:
// no problem is left but the blob-missing of a record whose body is gone, and every
// file of the damaged store is in place with its bytes or in lost+found with them and
// its note.
func TestBlobRepairCrashStates(t *testing.T) {
	build := map[string]func(t *testing.T) string{
		"blob-truncated": func(t *testing.T) string { return fsfixtures.Build(t, "blob-truncated") },
		"blob-digest":    func(t *testing.T) string { return fsfixtures.Build(t, "blob-digest") },
		"linked-and-unknown": func(t *testing.T) string {
			dir := fsfixtures.Build(t, "blobs-valid")
			_, ref, _ := fsfixtures.ReadBlobTestdata(t, fsfixtures.BlobOut)
			// A second name at the top (unknown-top, never moved), so the blob has two links.
			if err := os.Link(filepath.Join(dir, fsfixtures.BlobPath(ref.Digest)), filepath.Join(dir, "blob-link")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "blobs", "README"), []byte("planted\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		},
	}
	total := 0
	for name, mk := range build {
		t.Run(name, func(t *testing.T) {
			dir := mk(t)
			files := fsfixtures.Files(t, dir)
			initial, err := crashtest.Snapshot(dir)
			if err != nil {
				t.Fatal(err)
			}
			var faulty *fsx.Faulty
			opts := fsck.Options{WrapFS: func(inner fsx.FS) fsx.FS {
				if faulty == nil {
					faulty = fsx.NewFaulty(inner)
				}
				return faulty
			}}
			if _, err := fsck.Repair(context.Background(), dir, opts); err != nil {
				t.Fatal(err)
			}
			states, err := crashtest.Explore(initial, faulty.Log())
			if err != nil {
				t.Fatal(err)
			}
			if len(states) < 2 {
				t.Fatalf("%d crash states: the repair did nothing", len(states))
			}
			total += len(states)
			for i, st := range states {
				sdir := filepath.Join(t.TempDir(), "delivery", filepath.Base(dir))
				if err := os.MkdirAll(sdir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := st.Tree.Materialize(sdir); err != nil {
					t.Fatal(err)
				}
				ageTree(sdir) // the rerun comes later: a note's temp left by the crash is a leftover
				if _, err := fsck.Repair(context.Background(), sdir, fsck.Options{}); err != nil {
					t.Fatalf("state %d (%s): rerun: %v", i, st.Desc, err)
				}
				rep := check(t, sdir, fsck.Options{})
				for _, f := range rep.Findings {
					if f.Severity == fsck.Problem && f.Code != fsck.CodeBlobMissing {
						t.Errorf("state %d (%s): left %s %s", i, st.Desc, f.Code, f.Path)
					}
				}
				fsfixtures.AssertKept(t, sdir, files, func(string) bool { return false })
				if t.Failed() {
					t.FailNow()
				}
			}
		})
	}
	t.Logf("%d crash states explored", total)
}

// ageTree dates every file under dir a day after the epoch.
func ageTree(dir string) {
	long := time.Unix(86400, 0)
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil {
			os.Chtimes(p, long, long)
		}
		return nil
	})
}
