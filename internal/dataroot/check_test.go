package dataroot_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// mkdirs creates dirs (relative to base) with mode perm, exactly (no umask).
func mkdirs(t *testing.T, base string, perm os.FileMode, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		p := filepath.Join(base, d)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, perm); err != nil {
			t.Fatal(err)
		}
	}
}

// symlinkDir replaces the directory at path by a symbolic link to a copy of it
// (a real directory next to it), and returns the copy's path.
func symlinkDir(t *testing.T, path string) string {
	t.Helper()
	real := path + ".real"
	if err := os.Rename(path, real); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(real), path); err != nil {
		t.Fatal(err)
	}
	return real
}

func chmod(t *testing.T, path string, perm os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

// newRoot returns a data root that keeps every rule: the root 0700 with
// delivery/, identities/ and run/ (0700) and relay/ (0755: not writable by
// group or others is enough below the store).
func newRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "home dir") // a space: the fix must quote it
	mkdirs(t, root, 0o700, "", "delivery", "identities", "run")
	mkdirs(t, root, 0o755, "relay")
	return root
}

// wantViolation checks that err is a *Violation of path whose message starts with
// the path and whose hint (errcode.HintOf) is its fix and contains fixHas.
func wantViolation(t *testing.T, err error, path, ruleHas, fixHas string) {
	t.Helper()
	var v *dataroot.Violation
	if !errors.As(err, &v) {
		t.Fatalf("err = %v, want a *dataroot.Violation of %s", err, path)
	}
	if v.Path != path {
		t.Errorf("Violation.Path = %q, want %q", v.Path, path)
	}
	if !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(v.Rule, ruleHas) {
		t.Errorf("message %q: want %q then a rule containing %q", err, path+": ", ruleHas)
	}
	if h := errcode.HintOf(err); h != v.Fix || !strings.Contains(h, fixHas) {
		t.Errorf("HintOf = %q (Fix %q), want the fix containing %q", h, v.Fix, fixHas)
	}
}

func TestCheckRootAcceptsAGoodRoot(t *testing.T) {
	root := newRoot(t)
	if err := dataroot.CheckRoot(root); err != nil {
		t.Fatalf("CheckRoot(0700 root) = %v", err)
	}
	chmod(t, root, 0o755) // readable by others, not writable: allowed
	if err := dataroot.CheckRoot(root); err != nil {
		t.Fatalf("CheckRoot(0755 root) = %v", err)
	}
	if err := dataroot.CheckRoot(filepath.Join(root, "not yet")); err != nil {
		t.Fatalf("CheckRoot(missing root) = %v, want nil (created 0700 when needed)", err)
	}
	only := filepath.Join(t.TempDir(), "bare")
	mkdirs(t, only, 0o700, "")
	if err := dataroot.CheckRoot(only); err != nil {
		t.Fatalf("CheckRoot(root without subdirectories) = %v", err)
	}
}

// TestCheckRootRefusesEachBrokenRule breaks one rule at a time.
func TestCheckRootRefusesEachBrokenRule(t *testing.T) {
	q := func(p string) string { return "'" + p + "'" }
	for _, tc := range []struct {
		name    string
		broken  string                                 // relative to the root ("" is the root)
		break_  func(t *testing.T, path string) string // returns what the fix must contain
		ruleHas string
	}{
		{"root 0777", "", func(t *testing.T, p string) string { chmod(t, p, 0o777); return "chmod 700 " + q(p) }, "writable by group or others (mode 0777)"},
		{"root 0770", "", func(t *testing.T, p string) string { chmod(t, p, 0o770); return "chmod 700 " + q(p) }, "writable by group or others"},
		{"root 0702", "", func(t *testing.T, p string) string { chmod(t, p, 0o702); return "chmod 700 " + q(p) }, "writable by group or others"},
		{"root symlink", "", func(t *testing.T, p string) string {
			real := symlinkDir(t, p)
			return "rm " + q(p) + " && mv " + q(real) + " " + q(p)
		}, "is a symbolic link"},
		{"root a file", "", func(t *testing.T, p string) string {
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return "out of the way"
		}, "is a regular file, not a directory"},
		{"delivery 0777", "delivery", func(t *testing.T, p string) string { chmod(t, p, 0o777); return "chmod 700 " + q(p) }, "the delivery/ directory is writable"},
		{"delivery symlink", "delivery", func(t *testing.T, p string) string { symlinkDir(t, p); return "rm " + q(p) }, "the delivery/ directory is a symbolic link"},
		{"identities symlink", "identities", func(t *testing.T, p string) string { symlinkDir(t, p); return "rm " + q(p) }, "the identities/ directory is a symbolic link"},
		{"identities 0775", "identities", func(t *testing.T, p string) string { chmod(t, p, 0o775); return "chmod 700 " + q(p) }, "writable"},
		{"run symlink", "run", func(t *testing.T, p string) string { symlinkDir(t, p); return "rm " + q(p) }, "the run/ directory is a symbolic link"},
		{"run a file", "run", func(t *testing.T, p string) string {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return "out of the way"
		}, "not a directory"},
		{"relay symlink", "relay", func(t *testing.T, p string) string { symlinkDir(t, p); return "rm " + q(p) }, "the relay/ directory is a symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot(t)
			path := filepath.Join(root, tc.broken)
			fixHas := tc.break_(t, path)
			wantViolation(t, dataroot.CheckRoot(root), path, tc.ruleHas, fixHas)
		})
	}
}

func TestCheckRootRefusesAnotherUsersDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a directory to another user needs root")
	}
	for _, rel := range []string{"", "identities"} {
		root := newRoot(t)
		path := filepath.Join(root, rel)
		if err := os.Lchown(path, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, dataroot.CheckRoot(root), path, "owned by uid 4242", "chown 0 ")
	}
}

// TestRootViolationsListsEvery: fsck reports every violation, not only the first.
func TestRootViolationsListsEvery(t *testing.T) {
	root := newRoot(t)
	chmod(t, root, 0o777)
	symlinkDir(t, filepath.Join(root, "delivery"))
	chmod(t, filepath.Join(root, "run"), 0o757)
	vs, err := dataroot.RootViolations(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vs {
		got = append(got, v.Path)
	}
	want := []string{root, filepath.Join(root, "delivery"), filepath.Join(root, "run")}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("RootViolations = %q, want %q", got, want)
	}
}

func TestCheckStore(t *testing.T) {
	kinds := []string{"outbox", "messages"}
	newStore := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "delivery", "abc")
		mkdirs(t, dir, 0o700, "", "outbox", "messages")
		return dir
	}
	t.Run("good", func(t *testing.T) {
		dir := newStore(t)
		if err := dataroot.CheckStore(dir, kinds); err != nil {
			t.Fatalf("CheckStore(0700 store) = %v", err)
		}
		if err := os.Remove(filepath.Join(dir, "messages")); err != nil {
			t.Fatal(err)
		}
		if err := dataroot.CheckStore(dir, kinds); err != nil {
			t.Fatalf("CheckStore(store without a kind directory) = %v", err)
		}
		if err := dataroot.CheckStore(filepath.Join(dir, "missing"), kinds); err != nil {
			t.Fatalf("CheckStore(missing store) = %v", err)
		}
	})
	for _, tc := range []struct {
		name, broken string
		mode         os.FileMode // 0: make it a symbolic link
		ruleHas      string
	}{
		{"store 0755", "", 0o755, "the store directory has group or other permissions (mode 0755); store directories are 0700"},
		{"store 0740", "", 0o740, "group or other permissions"},
		{"store 0701", "", 0o701, "group or other permissions"},
		{"store symlink", "", 0, "the store directory is a symbolic link"},
		{"kind 0755", "outbox", 0o755, "the store's outbox/ directory has group or other permissions (mode 0755)"},
		{"kind symlink", "messages", 0, "the store's messages/ directory is a symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := newStore(t)
			path := filepath.Join(dir, tc.broken)
			fixHas := "chmod 700 " + path
			if tc.mode == 0 {
				symlinkDir(t, path)
				fixHas = "rm " + path
			} else {
				chmod(t, path, tc.mode)
			}
			wantViolation(t, dataroot.CheckStore(dir, kinds), path, tc.ruleHas, fixHas)
		})
	}
	t.Run("kind unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root opens a directory whatever its mode")
		}
		dir := newStore(t)
		path := filepath.Join(dir, "outbox")
		chmod(t, path, 0o300)
		t.Cleanup(func() { chmod(t, path, 0o700) })
		wantViolation(t, dataroot.CheckStore(dir, kinds), path, "cannot be opened", "chmod 700 "+path)
	})
}

func TestCheckDirRelativePathIsReportedAbsolute(t *testing.T) {
	base := t.TempDir()
	mkdirs(t, base, 0o777, "inbox")
	t.Chdir(base)
	wantViolation(t, dataroot.CheckDir("inbox", "the relay's inbox directory"), filepath.Join(base, "inbox"),
		"the relay's inbox directory is writable", "chmod 700 "+filepath.Join(base, "inbox"))
}
