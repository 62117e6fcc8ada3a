package fsck_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/fsck"
)

// An owner's store directory that does not exist is a store with nothing in it only
// when the caller says the directory was named from an existing identity
// (MayBeAbsent) and it is that owner's directory in its data root; otherwise it is
// ErrNotStore, as before.
func TestAbsentStore(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	owner := fsfixtures.OwnerDID()
	dir := dataroot.StoreDir(root, string(owner))
	for _, tc := range []struct {
		name string
		dir  string
		opts fsck.Options
	}{
		{"without MayBeAbsent", dir, fsck.Options{Owner: owner}},
		{"without the owner", dir, fsck.Options{MayBeAbsent: true}},
		{"another directory", filepath.Join(root, dataroot.DeliveryDir, "0000000000000000000000000000000000000000000000000000000000000000"), fsck.Options{Owner: owner, MayBeAbsent: true}},
		{"not in delivery/", filepath.Join(root, filepath.Base(dir)), fsck.Options{Owner: owner, MayBeAbsent: true}},
	} {
		if _, err := fsck.Check(ctx, tc.dir, tc.opts); !errors.Is(err, fsck.ErrNotStore) {
			t.Errorf("%s: Check = %v, want ErrNotStore", tc.name, err)
		}
		if _, err := fsck.Repair(ctx, tc.dir, tc.opts); !errors.Is(err, fsck.ErrNotStore) {
			t.Errorf("%s: Repair = %v, want ErrNotStore", tc.name, err)
		}
	}
	opts := fsck.Options{Owner: owner, MayBeAbsent: true}
	rep := check(t, dir, opts)
	if rep.Problems() != 0 || len(rep.Findings) != 1 || rep.Findings[0].Code != fsck.CodeStoreAbsent || rep.Owner != owner || rep.Records != 0 {
		t.Fatalf("Check of an owner's absent store: %+v", rep)
	}
	rr := repair(t, dir, opts)
	if len(rr.Actions) != 0 || rr.After.Problems() != 0 {
		t.Fatalf("Repair of an owner's absent store: %+v", rr)
	}
	// The data root's rules still hold: an unsafe data root is a problem.
	if err := os.Chmod(root, 0o770); err != nil {
		t.Fatal(err)
	}
	rep = check(t, dir, opts)
	if rep.Problems() == 0 || mustFind(t, rep, root, fsck.CodeDataRootUnsafe) == nil {
		t.Fatalf("an unsafe data root above an absent store: %+v", rep.Findings)
	}
	if _, err := os.Lstat(filepath.Join(root, dataroot.DeliveryDir)); !os.IsNotExist(err) {
		t.Fatalf("fsck created delivery/: %v", err)
	}
}
