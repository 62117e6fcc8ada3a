package fsx

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// readBack reports whether name under fsys's root holds data, read with the os package
// (by path, as another process would).
func readBack(fsys FS, name string, data []byte) bool {
	b, err := os.ReadFile(abs(fsys, name))
	return err == nil && string(b) == string(data)
}

// The OS keeps its directories open between calls. Each case opens "d" (a write there
// caches it), then moves it out of the way and puts something else at its name. From
// then on, no call may be acknowledged for a file that is not at its name, and nothing
// is ever created through a symbolic link. Every case runs with openat2 and the walk.
func TestCachedDirectoryMovedAway(t *testing.T) {
	for _, walk := range []bool{false, true} {
		t.Run(map[bool]string{false: "openat2", true: "walk"}[walk], func(t *testing.T) {
			if walk {
				withoutOpenat2(t)
			}
			for _, tc := range []struct {
				name    string
				replace func(t *testing.T, fsys FS, outside string) // after d was moved to d.old
				want    syscall.Errno                               // of a later write into d (0: it works)
			}{
				{"by a directory", func(t *testing.T, fsys FS, _ string) { mkdirAll(t, fsys, "d") }, 0},
				{"by a symlink", func(t *testing.T, fsys FS, outside string) {
					if err := os.Symlink(outside, abs(fsys, "d")); err != nil {
						t.Fatal(err)
					}
				}, syscall.ELOOP},
				{"by nothing", func(*testing.T, FS, string) {}, syscall.ENOENT},
			} {
				t.Run(tc.name, func(t *testing.T) {
					fsys := NewOS(t.TempDir())
					outside := t.TempDir()
					mkdirAll(t, fsys, "d")
					if err := WriteFile(fsys, "d", "a", []byte("a")); err != nil {
						t.Fatal(err)
					}
					if err := os.Rename(abs(fsys, "d"), abs(fsys, "d.old")); err != nil {
						t.Fatal(err)
					}
					tc.replace(t, fsys, outside)
					for i := range 3 {
						base := "w" + strconv.Itoa(i)
						err := WriteFile(fsys, "d", base, []byte(base))
						if err == nil && !readBack(fsys, "d/"+base, []byte(base)) {
							t.Fatalf("write %d acknowledged, but d/%s does not hold it", i, base)
						}
						if i > 0 && Errno(err) != tc.want {
							// The first write may land in the moved directory (and fail);
							// from then on the name is resolved afresh.
							t.Fatalf("write %d: %v, want errno %d", i, err, tc.want)
						}
					}
					if ents, _ := os.ReadDir(outside); len(ents) != 0 {
						t.Fatalf("written through the symlink: %v", ents)
					}
					// A listing says what is at the name now (a symlink: ELOOP, or ENOTDIR as
					// opening it O_DIRECTORY says).
					_, err := fsys.ReadDir("d")
					if got := Errno(err); got != tc.want && !(tc.want == syscall.ELOOP && got == syscall.ENOTDIR) {
						t.Fatalf("ReadDir(d): %v, want errno %d", err, tc.want)
					}
				})
			}
		})
	}
}

// The root itself, replaced by a symlink after the OS opened it: refused from then on,
// and nothing is written through the link.
func TestCachedRootReplacedBySymlink(t *testing.T) {
	parent := t.TempDir()
	root := filepath.Join(parent, "store")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	fsys := NewOS(root)
	if err := WriteFile(fsys, ".", "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.Rename(root, root+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, root); err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.Lstat("."); Errno(err) != syscall.ELOOP {
		t.Fatalf("Lstat(.): %v, want ELOOP", err)
	}
	for i := range 2 {
		err := WriteFile(fsys, ".", "w", []byte("w"))
		if err == nil {
			t.Fatalf("write %d through a symlinked root acknowledged", i)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written through the symlink: %v", ents)
	}
}

// A directory removed and made again by someone else: the next call finds the new one.
func TestCachedDirectoryRemovedAndRecreated(t *testing.T) {
	fsys := NewOS(t.TempDir())
	mkdirAll(t, fsys, "d")
	if err := WriteFile(fsys, "d", "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(abs(fsys, "d")); err != nil {
		t.Fatal(err)
	}
	mkdirAll(t, fsys, "d")
	if err := WriteFile(fsys, "d", "b", []byte("b")); err != nil {
		t.Fatal(err)
	}
	if !readBack(fsys, "d/b", []byte("b")) {
		t.Fatal("d/b is not in the new directory")
	}
}

// The cache is bounded, Close releases every descriptor, and the OS still works after.
func TestDirCacheBoundedAndClosed(t *testing.T) {
	fsys := NewOS(t.TempDir())
	before := openFDsUnder(t, fsys.Root())
	for i := range 3 * maxCachedDirs {
		d := "d" + strconv.Itoa(i)
		mkdirAll(t, fsys, d)
		if err := WriteFile(fsys, d, "x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if n := openFDsUnder(t, fsys.Root()) - before; n > maxCachedDirs+1 {
		t.Fatalf("%d descriptors open for the cache, bound %d", n, maxCachedDirs+1)
	}
	if err := fsys.Close(); err != nil {
		t.Fatal(err)
	}
	if n := openFDsUnder(t, fsys.Root()) - before; n != 0 {
		t.Fatalf("%d descriptors open after Close", n)
	}
	if _, _, err := ReadFile(fsys, "d0/x", 10); err != nil {
		t.Fatalf("ReadFile after Close: %v", err)
	}
	fsys.Close()
}

// A descriptor dropped while another goroutine uses it is closed only when that call
// ends (run under -race with many goroutines replacing the directory).
func TestDirCacheConcurrentDrop(t *testing.T) {
	fsys := NewOS(t.TempDir())
	mkdirAll(t, fsys, "d")
	done := make(chan error)
	for g := range 4 {
		go func() {
			var err error
			for i := range 200 {
				if _, e := fsys.Lstat("d/missing"); e != nil && !IsNotExist(e) && err == nil {
					err = e
				}
				if g == 0 && i%10 == 0 {
					fsys.Close()
				}
				if e := WriteFile(fsys, "d", "g"+strconv.Itoa(g), []byte("x")); e != nil && err == nil && !errors.Is(e, syscall.ESTALE) {
					err = e
				}
			}
			done <- err
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
