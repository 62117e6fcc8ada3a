package fsx

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// cached returns the cache entry of directory name in fsys (nil if none).
func cached(fsys *OS, name string) *dirEnt {
	fsys.c.mu.Lock()
	defer fsys.c.mu.Unlock()
	return fsys.c.dirs[name]
}

// cacheDir makes fsys open and cache directory d (a name in the root) by writing in it.
func cacheDir(t *testing.T, fsys *OS, d string) *dirEnt {
	t.Helper()
	mkdirAll(t, fsys, d)
	if err := WriteFile(fsys, d, "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	e := cached(fsys, d)
	if e == nil {
		t.Fatalf("%s is not cached after a write in it", d)
	}
	return e
}

// The first call after a cached directory was replaced acts on what its name names
// now: the cached descriptor is checked before the call, not only by SyncDir after.
func TestCachedDirectoryCheckedBeforeEachCall(t *testing.T) {
	for _, walk := range []bool{false, true} {
		t.Run(map[bool]string{false: "openat2", true: "walk"}[walk], func(t *testing.T) {
			if walk {
				withoutOpenat2(t)
			}
			fsys := NewOS(t.TempDir())
			cacheDir(t, fsys, "d")
			if err := os.Rename(abs(fsys, "d"), abs(fsys, "d.old")); err != nil {
				t.Fatal(err)
			}
			mkdirAll(t, fsys, "d")
			if _, err := fsys.Lstat("d/a"); !IsNotExist(err) {
				t.Fatalf("Lstat(d/a) after d was replaced: %v, want ENOENT (d/a is in d.old now)", err)
			}
			f, err := fsys.OpenFile("d/b", syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o600)
			if err != nil {
				t.Fatalf("first create in the new d: %v", err)
			}
			f.Close()
			if !exists(t, abs(fsys, "d/b")) || exists(t, abs(fsys, "d.old/b")) {
				t.Fatal("the create did not land in the directory named d now")
			}
		})
	}
}

// Lstat of a cached directory keeps its descriptor while the name still names it, and
// drops it once it does not (replaced, or gone).
func TestLstatKeepsOrDropsTheCachedDirectory(t *testing.T) {
	fsys := NewOS(t.TempDir())
	e := cacheDir(t, fsys, "d")
	if _, err := fsys.Lstat("d"); err != nil {
		t.Fatal(err)
	}
	if cached(fsys, "d") != e {
		t.Fatal("Lstat of an unchanged cached directory dropped it")
	}
	if err := os.Rename(abs(fsys, "d"), abs(fsys, "d.old")); err != nil {
		t.Fatal(err)
	}
	mkdirAll(t, fsys, "d")
	if _, err := fsys.Lstat("d"); err != nil {
		t.Fatal(err)
	}
	if cached(fsys, "d") == e {
		t.Fatal("Lstat of a replaced directory kept the old descriptor")
	}
	if !e.dead || e.fd != -1 {
		t.Fatalf("the dropped entry is not closed: dead %v, fd %d", e.dead, e.fd)
	}
	e = cacheDir(t, fsys, "d")
	if err := os.RemoveAll(abs(fsys, "d")); err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.Lstat("d"); !IsNotExist(err) {
		t.Fatalf("Lstat(d) after removal: %v", err)
	}
	if cached(fsys, "d") != nil {
		t.Fatal("Lstat that found nothing kept the descriptor")
	}
	// The root: an Lstat(".") that finds it unchanged keeps it.
	r := cached(fsys, ".")
	if _, err := fsys.Lstat("."); err != nil || cached(fsys, ".") != r || r == nil {
		t.Fatalf("Lstat(.) of the unchanged root: %v; entry kept %v", err, cached(fsys, ".") == r)
	}
}

// A descriptor the cache drops is closed, and its entry's fd set to -1, when its last
// user gives it back — at once when it has none — so a stale entry can never reach a
// descriptor number the process reused.
func TestDroppedEntriesAreClosed(t *testing.T) {
	fsys := NewOS(t.TempDir())
	cacheDir(t, fsys, "d")
	e, err := fsys.c.get(fsys.root, "d")
	if err != nil {
		t.Fatal(err)
	}
	fd := e.fd
	fsys.c.drop("d")
	if e.fd != fd {
		t.Fatal("an entry in use was closed when it was dropped")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatalf("the descriptor of an entry in use is closed: %v", err)
	}
	fsys.c.put(e)
	if e.fd != -1 {
		t.Fatalf("after its last put, the dropped entry still holds fd %d", e.fd)
	}
	e = cacheDir(t, fsys, "d") // refs 0
	fsys.c.drop("d")
	if e.fd != -1 || !e.dead {
		t.Fatalf("an unused entry dropped: fd %d, dead %v", e.fd, e.dead)
	}
}

// The cache holds the root and up to maxCachedDirs directories in it, and nothing
// deeper.
func TestDirCacheHoldsExactlyItsBound(t *testing.T) {
	fsys := NewOS(t.TempDir())
	for i := range maxCachedDirs + 3 {
		cacheDirMaybe(t, fsys, "d"+strconv.Itoa(i))
	}
	mkdirAll(t, fsys, "d0/deep")
	if err := WriteFile(fsys, "d0/deep", "x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	fsys.c.mu.Lock()
	n, deep := len(fsys.c.dirs), fsys.c.dirs["d0/deep"]
	fsys.c.mu.Unlock()
	if n != maxCachedDirs+1 {
		t.Fatalf("%d entries cached, want the root and %d directories", n, maxCachedDirs)
	}
	if deep != nil {
		t.Fatal("a directory below the root's own entries is cached")
	}
	for i := range maxCachedDirs {
		if cached(fsys, "d"+strconv.Itoa(i)) == nil {
			t.Fatalf("d%d, one of the first %d, is not cached", i, maxCachedDirs)
		}
	}
}

func cacheDirMaybe(t *testing.T, fsys *OS, d string) {
	t.Helper()
	mkdirAll(t, fsys, d)
	if err := WriteFile(fsys, d, "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
}

// A readable directory's entry can be fsynced through its own descriptor; an O_PATH
// descriptor is not readable.
func TestFdReadable(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		flag int
		want bool
	}{{unix.O_RDONLY | unix.O_DIRECTORY, true}, {unix.O_PATH | unix.O_DIRECTORY, false}} {
		fd, err := unix.Open(dir, c.flag|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := fdReadable(fd); got != c.want {
			t.Errorf("fdReadable(flags %#x) = %v, want %v", c.flag, got, c.want)
		}
		unix.Close(fd)
	}
	if fdReadable(-1) {
		t.Error("a closed descriptor is readable")
	}
	fsys := NewOS(dir)
	if _, err := fsys.Lstat("x"); !IsNotExist(err) {
		t.Fatal(err)
	}
	if r := cached(fsys, "."); r == nil || !r.readable {
		t.Fatalf("the root of a readable directory is cached as not readable: %+v", r)
	}
}

// The root removed and made again at its path by someone else: a call that fails with
// ENOENT in the removed directory is retried once, afresh, and works; a call that
// fails with ENOENT in a directory that is still there is not retried, and the cache
// is kept. Opening "." of the removed root would succeed (a removed directory stays
// open), so open(".") checks first that the root it holds still has a link: on the old
// code ReadDir(".") and ProbeGranularity failed on every call until some other call
// dropped the dead descriptor.
func TestRootRemovedAndRecreated(t *testing.T) {
	for name, call := range map[string]func(fsys FS) error{
		"list the root": func(fsys FS) error {
			ents, err := fsys.ReadDir(".")
			if err == nil && len(ents) != 2 {
				return errors.New("the listing is not of the new root")
			}
			return err
		},
		"probe the root's granularity": func(fsys FS) error { _, err := ProbeGranularity(fsys, "."); return err },
		"create": func(fsys FS) error {
			f, err := fsys.OpenFile("b", syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o600)
			if err == nil {
				f.Close()
			}
			return err
		},
		"list a directory in it": func(fsys FS) error {
			ents, err := fsys.ReadDir("k")
			if err == nil && len(ents) != 1 {
				return errors.New("the listing is not of the new root's k")
			}
			return err
		},
		"lstat": func(fsys FS) error { _, err := fsys.Lstat("marker"); return err },
	} {
		t.Run(name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "store")
			if err := os.Mkdir(root, 0o700); err != nil {
				t.Fatal(err)
			}
			fsys := NewOS(root)
			if err := WriteFile(fsys, ".", "a", []byte("a")); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(root); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(root, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "marker"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(root, "k", "j"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := call(fsys); err != nil {
				t.Fatalf("first call after the root was made again: %v", err)
			}
		})
	}
	fsys := NewOS(t.TempDir())
	if err := WriteFile(fsys, ".", "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	r := cached(fsys, ".")
	if _, err := fsys.Lstat("missing"); !IsNotExist(err) {
		t.Fatalf("Lstat(missing): %v", err)
	}
	if _, err := fsys.ReadDir("missing"); !IsNotExist(err) {
		t.Fatalf("ReadDir(missing): %v", err)
	}
	if cached(fsys, ".") != r {
		t.Fatal("an ENOENT in a directory that is still there dropped the cache")
	}
}

// An error resolving the directory of a call names the root when it is the root that
// cannot be opened, and the name called on otherwise.
func TestResolveErrorsNameWhatFailed(t *testing.T) {
	missingRoot := filepath.Join(t.TempDir(), "none")
	fsys := NewOS(missingRoot)
	for what, err := range map[string]error{
		"Lstat(x)":   func() error { _, err := fsys.Lstat("x"); return err }(),
		"ReadDir(.)": func() error { _, err := fsys.ReadDir("."); return err }(),
		"SyncDir(.)": fsys.SyncDir("."),
	} {
		var pe *fs.PathError
		if !errors.As(err, &pe) || pe.Path != missingRoot || !IsNotExist(err) {
			t.Errorf("%s in a missing root: %v, want ENOENT naming %s", what, err, missingRoot)
		}
	}
	fsys = NewOS(t.TempDir())
	for what, c := range map[string]struct {
		err  error
		name string
	}{
		"Lstat(k/x)":   {func() error { _, err := fsys.Lstat("k/x"); return err }(), "k/x"},
		"ReadDir(k)":   {func() error { _, err := fsys.ReadDir("k"); return err }(), "k"},
		"SyncDir(k)":   {fsys.SyncDir("k"), "k"},
		"ReadDir(k/j)": {func() error { _, err := fsys.ReadDir("k/j"); return err }(), "k/j"},
	} {
		var pe *fs.PathError
		if !errors.As(c.err, &pe) || pe.Path != c.name || !IsNotExist(c.err) {
			t.Errorf("%s with k missing: %v, want ENOENT naming %s", what, c.err, c.name)
		}
	}
}
