package fsx

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// newFSFunc makes a fresh, empty FS for one test.
type newFSFunc func(t *testing.T) FS

func newOS(t *testing.T) FS { return NewOS(t.TempDir()) }

func newFaultyOS(t *testing.T) FS { return NewFaulty(NewOS(t.TempDir())) }

// withoutOpenat2 makes the rest of the test use the O_NOFOLLOW walk fallback.
func withoutOpenat2(t *testing.T) {
	t.Helper()
	old := noOpenat2.Load()
	noOpenat2.Store(true)
	t.Cleanup(func() { noOpenat2.Store(old) })
}

// withUmask sets the process umask for the rest of the test. Tests using it must not
// run in parallel with others.
func withUmask(t *testing.T, mask int) {
	t.Helper()
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

func skipIfRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Skip("needs a non-root user (root bypasses permission checks)")
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// abs returns the real path of name under fsys's root, for setting up fixtures with
// the os package.
func abs(fsys FS, name string) string { return filepath.Join(fsys.Root(), filepath.FromSlash(name)) }

func mkdirAll(t *testing.T, fsys FS, name string) {
	t.Helper()
	if err := os.MkdirAll(abs(fsys, name), 0o700); err != nil {
		t.Fatal(err)
	}
}

func writeRaw(t *testing.T, fsys FS, name string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(abs(fsys, name), data, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(abs(fsys, name), perm); err != nil { // umask-proof
		t.Fatal(err)
	}
}

func readRaw(t *testing.T, fsys FS, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(abs(fsys, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func symlink(t *testing.T, fsys FS, target, name string) {
	t.Helper()
	if err := os.Symlink(target, abs(fsys, name)); err != nil {
		t.Fatal(err)
	}
}

func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func rawMode(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode
}

// wantErrno fails unless err carries errno.
func wantErrno(t *testing.T, err error, errno syscall.Errno, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: got nil error, want %v", what, errno)
	}
	if !errors.Is(err, errno) {
		t.Fatalf("%s: got %v (errno %d), want %v", what, err, Errno(err), errno)
	}
}

// wantErrnoIn fails unless err carries one of errnos.
func wantErrnoIn(t *testing.T, err error, what string, errnos ...syscall.Errno) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: got nil error, want one of %v", what, errnos)
	}
	if !slices.Contains(errnos, Errno(err)) {
		t.Fatalf("%s: got %v, want one of %v", what, err, errnos)
	}
}

// wantPathError fails unless err is (or wraps) an *fs.PathError.
func wantPathError(t *testing.T, err error, what string) {
	t.Helper()
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		t.Fatalf("%s: %v (%T) is not an *fs.PathError", what, err, err)
	}
}

// dirNames lists dir (a real path) sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

// temps returns the names in dir (a real path) that look like staged writes.
func temps(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, n := range dirNames(t, dir) {
		if IsTempName(n) {
			out = append(out, n)
		}
	}
	return out
}
