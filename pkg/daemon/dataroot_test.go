package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// treeOf lists every name under root with its type and mode, never following a
// symbolic link.
func treeOf(t *testing.T, root string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		names = append(names, fmt.Sprintf("%s %v", p, info.Mode()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// TestNewRefusesABrokenDataRootRuleBeforeWritingAnything: with any data-root rule
// broken, New fails naming the path with the fix as its hint, and leaves the data
// root exactly as it was (no run directory, pid file or store directory created).
func TestNewRefusesABrokenDataRootRuleBeforeWritingAnything(t *testing.T) {
	symlink := func(t *testing.T, p string) {
		if err := os.Rename(p, p+".real"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Base(p)+".real", p); err != nil {
			t.Fatal(err)
		}
	}
	chmod := func(perm os.FileMode) func(*testing.T, string) {
		return func(t *testing.T, p string) {
			if err := os.Chmod(p, perm); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		rel    string // under the store directory when store is set, else under the data root
		store  bool
		break_ func(*testing.T, string)
		hint   string // what the hint starts with
	}{
		{"data root 0777", "", false, chmod(0o777), "chmod 700 "},
		{"data root symlink", "", false, symlink, "replace the symbolic link"},
		{"delivery 0777", "delivery", false, chmod(0o777), "chmod 700 "},
		{"delivery symlink", "delivery", false, symlink, "replace the symbolic link"},
		{"identities symlink", "identities", false, symlink, "replace the symbolic link"},
		{"identities 0777", "identities", false, chmod(0o777), "chmod 700 "},
		{"run symlink", "run", false, symlink, "replace the symbolic link"},
		{"store dir 0755", "", true, chmod(0o755), "chmod 700 "},
		{"store dir symlink", "", true, symlink, "replace the symbolic link"},
		{"kind dir 0755", "outbox", true, chmod(0o755), "chmod 700 "},
		{"kind dir symlink", "receipts", true, symlink, "replace the symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := filepath.Join(t.TempDir(), "home")
			id, err := InitIdentity(home, "")
			if err != nil {
				t.Fatal(err)
			}
			dir := dataroot.StoreDir(home, string(id.DID()))
			for _, p := range []string{filepath.Join(dir, "outbox"), filepath.Join(dir, "receipts"), filepath.Join(home, "run")} {
				if err := os.MkdirAll(p, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(home, tc.rel)
			if tc.store {
				path = filepath.Join(dir, tc.rel)
			}
			tc.break_(t, path)
			before := treeOf(t, filepath.Dir(home))

			d, err := New(Options{Home: home, Logger: quiet, SocketPath: filepath.Join(t.TempDir(), "s.sock")})
			if err == nil {
				d.Close()
				t.Fatalf("New succeeded with %s broken", path)
			}
			var v *dataroot.Violation
			if !errors.As(err, &v) || v.Path != path || !strings.Contains(err.Error(), path+": ") {
				t.Fatalf("New = %v, want a violation of %s", err, path)
			}
			if h := errcode.HintOf(err); !strings.HasPrefix(h, tc.hint) {
				t.Errorf("hint %q, want %q…", h, tc.hint)
			}
			if strings.Count(err.Error(), path) != 1 {
				t.Errorf("error names the path more than once: %v", err)
			}
			if after := treeOf(t, filepath.Dir(home)); !slices.Equal(before, after) {
				t.Errorf("New changed the data root:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}

// TestInitRefusesAFresh0777Home: init of a data root that exists with mode 0777
// refuses with the chmod fix and creates no key.
func TestInitRefusesAFresh0777Home(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(home, 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := InitIdentity(home, "")
	var v *dataroot.Violation
	if !errors.As(err, &v) || v.Path != home {
		t.Fatalf("InitIdentity = %v, want a violation of %s", err, home)
	}
	if h := errcode.HintOf(err); h != "chmod 700 "+home {
		t.Errorf("hint %q, want %q", h, "chmod 700 "+home)
	}
	if _, err := os.Lstat(filepath.Join(home, "identities")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("identities/ created: %v", err)
	}
}
