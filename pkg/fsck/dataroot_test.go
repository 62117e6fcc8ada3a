package fsck_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/fsck"
)

// dataRootStore makes an empty store of the fixtures' owner in a data root:
// <base>/root/delivery/<hex>/, with identities/ and run/, all 0700.
func dataRootStore(t *testing.T) (root, dir string) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "root")
	dir = dataroot.StoreDir(root, string(fsfixtures.Owner().DID()))
	for _, p := range []string{dir, filepath.Join(root, "identities"), filepath.Join(root, "run")} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return root, dir
}

func dataRootFindings(rep *fsck.Report) []string {
	var got []string
	for _, f := range rep.Findings {
		if f.Code == fsck.CodeDataRootUnsafe {
			got = append(got, f.Path)
		}
	}
	return got
}

// TestDataRootViolationsAreFindings: the data root above a store, and its
// delivery/, identities/ and run/, are checked by the data-root rules; each
// violation is a problem at its absolute path, not repairable, its action the fix;
// Repair leaves it (and reports it again after).
func TestDataRootViolationsAreFindings(t *testing.T) {
	opts := fsck.Options{Owner: fsfixtures.Owner().DID()}
	root, dir := dataRootStore(t)
	if got := dataRootFindings(check(t, dir, opts)); len(got) != 0 {
		t.Fatalf("a good data root: findings at %q", got)
	}

	if err := os.Chmod(root, 0o777); err != nil {
		t.Fatal(err)
	}
	ids := filepath.Join(root, "identities")
	if err := os.Rename(ids, ids+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("identities.real", ids); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "delivery"), 0o757); err != nil {
		t.Fatal(err)
	}
	rep := check(t, dir, opts)
	want := []string{root, filepath.Join(root, "delivery"), ids}
	if got := dataRootFindings(rep); !slices.Equal(got, want) {
		t.Fatalf("data-root-unsafe findings at %q, want %q", got, want)
	}
	for _, f := range rep.Findings {
		if f.Code != fsck.CodeDataRootUnsafe {
			continue
		}
		if f.Severity != fsck.Problem || f.Repairable || !strings.HasPrefix(f.Action, "none: ") {
			t.Errorf("%s: severity %s, repairable %v, action %q: want a problem that is not repairable", f.Path, f.Severity, f.Repairable, f.Action)
		}
		if f.Path == root && (!strings.Contains(f.Explanation, "writable by group or others (mode 0777)") || f.Action != "none: chmod 700 "+root) {
			t.Errorf("root finding: %q, action %q", f.Explanation, f.Action)
		}
		if f.Path == ids && !strings.Contains(f.Action, "rm "+ids+" && mv "+ids+".real "+ids) {
			t.Errorf("identities finding: action %q", f.Action)
		}
	}
	if rep.Problems() != 3 {
		t.Errorf("%d problems, want 3", rep.Problems())
	}

	rr, err := fsck.Repair(ctx, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := dataRootFindings(rr.After); !slices.Equal(got, want) {
		t.Errorf("after repair: findings at %q, want %q (fsck does not change the data root)", got, want)
	}
	if info, err := os.Lstat(root); err != nil || info.Mode().Perm() != 0o777 {
		t.Errorf("repair changed the data root: %v %v", info.Mode(), err)
	}
}
