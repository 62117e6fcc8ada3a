package fsx

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestConformance runs the FS conformance suite on the real FS and on Faulty wrapping
// it, each with openat2 (where the kernel has it) and with the O_NOFOLLOW walk.
func TestConformance(t *testing.T) {
	impls := []struct {
		name  string
		newFS newFSFunc
	}{{"OS", newOS}, {"Faulty", newFaultyOS}}
	for _, walk := range []bool{false, true} {
		mode := "openat2"
		if walk {
			mode = "walk"
		}
		for _, impl := range impls {
			t.Run(mode+"/"+impl.name, func(t *testing.T) {
				if walk {
					withoutOpenat2(t)
				}
				runConformance(t, impl.newFS)
			})
		}
	}
}

func TestOpenat2Available(t *testing.T) {
	fsys := newOS(t)
	writeRaw(t, fsys, "a", []byte("x"), 0o600)
	if _, _, err := ReadFile(fsys, "a", 10); err != nil {
		t.Fatal(err)
	}
	if noOpenat2.Load() {
		t.Log("openat2 is not available here: the openat2 runs of the suite used the walk too")
	}
}

// runConformance is the behaviour every FS must have. It does not run subtests in
// parallel: some change the process umask.
func runConformance(t *testing.T, newFS newFSFunc) {
	t.Run("OpenFile", func(t *testing.T) { testOpenFile(t, newFS(t)) })
	t.Run("Lstat", func(t *testing.T) { testLstat(t, newFS(t)) })
	t.Run("Mkdir", func(t *testing.T) { testMkdir(t, newFS(t)) })
	t.Run("Rename", func(t *testing.T) { testRename(t, newFS(t)) })
	t.Run("Link", func(t *testing.T) { testLink(t, newFS(t)) })
	t.Run("Remove", func(t *testing.T) { testRemove(t, newFS(t)) })
	t.Run("RemoveDir", func(t *testing.T) { testRemoveDir(t, newFS(t)) })
	t.Run("ReadDir", func(t *testing.T) { testReadDir(t, newFS(t)) })
	t.Run("SyncDir", func(t *testing.T) { testSyncDir(t, newFS(t)) })
	t.Run("PermissionDenied", func(t *testing.T) { testPermissionDenied(t, newFS(t)) })
	t.Run("NotLocalNames", func(t *testing.T) { testNotLocalNames(t, newFS(t)) })
	t.Run("SymlinkFile", func(t *testing.T) { testSymlinkFile(t, newFS(t)) })
	t.Run("SymlinkDir", func(t *testing.T) { testSymlinkDir(t, newFS) })
	t.Run("SymlinkItselfIsAnEntry", func(t *testing.T) { testSymlinkEntry(t, newFS(t)) })
	t.Run("ReadFile", func(t *testing.T) { testReadFile(t, newFS(t)) })
	t.Run("ReadFileFIFO", func(t *testing.T) { testReadFileFIFO(t, newFS(t)) })
	t.Run("ReadFileDevice", func(t *testing.T) { testReadFileDevice(t, newFS(t)) })
	t.Run("Stage", func(t *testing.T) { testStage(t, newFS(t)) })
	t.Run("WriteFile", func(t *testing.T) { testWriteFile(t, newFS(t)) })
	t.Run("WriteFileAtomic", func(t *testing.T) { testWriteFileAtomic(t, newFS(t)) })
	t.Run("RemoveFile", func(t *testing.T) { testRemoveFile(t, newFS(t)) })
	t.Run("BadBase", func(t *testing.T) { testBadBase(t, newFS(t)) })
	t.Run("MkdirPrivate", func(t *testing.T) { testMkdirPrivate(t, newFS(t)) })
	t.Run("CheckPrivateFile", func(t *testing.T) { testCheckPrivateFile(t, newFS(t)) })
	t.Run("CheckPrivateDir", func(t *testing.T) { testCheckPrivateDir(t, newFS(t)) })
	t.Run("Fingerprint", func(t *testing.T) { testFingerprint(t, newFS(t)) })
	t.Run("DirStamp", func(t *testing.T) { testDirStamp(t, newFS(t)) })
}

const (
	oCreateExcl = syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL
)

func testOpenFile(t *testing.T, fsys FS) {
	f, err := fsys.OpenFile("a", oCreateExcl, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if f.Name() != "a" {
		t.Fatalf("Name = %q", f.Name())
	}
	if n, err := f.Write([]byte("hello")); n != 5 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	info, err := f.Stat()
	if err != nil || !info.IsRegular() || info.Size != 5 {
		t.Fatalf("Stat = %+v, %v", info, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
	if got := rawMode(t, abs(fsys, "a")); got&0o777 != 0o600&^uint32(currentUmask()) {
		t.Fatalf("mode %o", got)
	}

	r, err := fsys.OpenFile("a", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read back %q, %v", got, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	_, err = fsys.OpenFile("a", oCreateExcl, 0o600)
	wantErrno(t, err, syscall.EEXIST, "O_EXCL on an existing file")
	wantPathError(t, err, "O_EXCL on an existing file")
	_, err = fsys.OpenFile("missing", syscall.O_RDONLY, 0)
	wantErrno(t, err, syscall.ENOENT, "open of a missing file")
	_, err = fsys.OpenFile("nodir/a", oCreateExcl, 0o600)
	wantErrno(t, err, syscall.ENOENT, "create in a missing directory")
	_, err = fsys.OpenFile("a/b", syscall.O_RDONLY, 0)
	wantErrno(t, err, syscall.ENOTDIR, "open beneath a regular file")

	// O_CREAT|O_TRUNC without O_EXCL reopens and truncates.
	f, err = fsys.OpenFile("a", syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readRaw(t, fsys, "a"); string(got) != "x" {
		t.Fatalf("after O_TRUNC: %q", got)
	}

	// Directories: "." and a subdirectory open read-only; not for writing.
	mkdirAll(t, fsys, "d")
	for _, name := range []string{".", "d"} {
		d, err := fsys.OpenFile(name, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			t.Fatalf("open dir %q: %v", name, err)
		}
		if info, err := d.Stat(); err != nil || !info.IsDir() {
			t.Fatalf("Stat of dir %q = %+v, %v", name, info, err)
		}
		d.Close()
	}
	// A mode given without O_CREAT is ignored, also with O_DIRECTORY (whose bit is
	// part of O_TMPFILE).
	for _, flag := range []int{syscall.O_RDONLY, syscall.O_RDONLY | syscall.O_DIRECTORY} {
		d, err := fsys.OpenFile("d", flag, 0o700)
		if err != nil {
			t.Fatalf("open dir with flag %#x and a mode: %v", flag, err)
		}
		d.Close()
	}
	_, err = fsys.OpenFile("d", syscall.O_WRONLY, 0)
	wantErrno(t, err, syscall.EISDIR, "open of a directory for writing")
	_, err = fsys.OpenFile("a", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	wantErrno(t, err, syscall.ENOTDIR, "O_DIRECTORY on a file")

	// Files in subdirectories.
	f, err = fsys.OpenFile("d/b", oCreateExcl, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !exists(t, abs(fsys, "d/b")) {
		t.Fatal("d/b not created")
	}
}

func currentUmask() int {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return m
}

func testLstat(t *testing.T, fsys FS) {
	writeRaw(t, fsys, "a", []byte("12345"), 0o640)
	mkdirAll(t, fsys, "d/e")
	var st unix.Stat_t
	if err := unix.Lstat(abs(fsys, "a"), &st); err != nil {
		t.Fatal(err)
	}
	info, err := fsys.Lstat("a")
	if err != nil {
		t.Fatal(err)
	}
	want := Info{Dev: st.Dev, Ino: st.Ino, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid, Nlink: uint64(st.Nlink), Size: 5, MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano()}
	if info != want {
		t.Fatalf("Lstat = %+v, want %+v", info, want)
	}
	if !info.IsRegular() || info.IsDir() || info.IsSymlink() || info.Perm() != 0o640 || info.Nlink != 1 || int(info.Uid) != os.Geteuid() {
		t.Fatalf("Lstat(a) = %+v", info)
	}
	for _, name := range []string{".", "d", "d/e"} {
		info, err := fsys.Lstat(name)
		if err != nil || !info.IsDir() || info.IsRegular() || info.IsSymlink() {
			t.Fatalf("Lstat(%q) = %+v, %v", name, info, err)
		}
	}
	if err := unix.Lstat(fsys.Root(), &st); err != nil {
		t.Fatal(err)
	}
	if info, _ := fsys.Lstat("."); info.Ino != st.Ino || info.Dev != st.Dev {
		t.Fatalf("Lstat(.) is not the root")
	}
	_, err = fsys.Lstat("missing")
	wantErrno(t, err, syscall.ENOENT, "Lstat of a missing file")
	wantPathError(t, err, "Lstat of a missing file")
	_, err = fsys.Lstat("missing/x")
	wantErrno(t, err, syscall.ENOENT, "Lstat in a missing directory")
	_, err = fsys.Lstat("a/x")
	wantErrno(t, err, syscall.ENOTDIR, "Lstat beneath a regular file")

	// An FS may be made before its root exists.
	late := NewOS(abs(fsys, "later"))
	_, err = late.Lstat(".")
	wantErrno(t, err, syscall.ENOENT, "Lstat(.) of a missing root")
	mkdirAll(t, fsys, "later")
	if _, err := late.Lstat("."); err != nil {
		t.Fatal(err)
	}
}

func testMkdir(t *testing.T, fsys FS) {
	if err := fsys.Mkdir("d", 0o700); err != nil {
		t.Fatal(err)
	}
	if m := rawMode(t, abs(fsys, "d")); m&syscall.S_IFMT != syscall.S_IFDIR || m&0o777 != 0o700 {
		t.Fatalf("mode %o", m)
	}
	if err := fsys.Mkdir("d/e", 0o700); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, fsys.Mkdir("d", 0o700), syscall.EEXIST, "Mkdir of an existing dir")
	writeRaw(t, fsys, "f", nil, 0o600)
	wantErrno(t, fsys.Mkdir("f", 0o700), syscall.EEXIST, "Mkdir over a file")
	wantErrno(t, fsys.Mkdir("nodir/d", 0o700), syscall.ENOENT, "Mkdir in a missing dir")
	wantErrno(t, fsys.Mkdir("f/d", 0o700), syscall.ENOTDIR, "Mkdir beneath a file")
	wantPathError(t, fsys.Mkdir("d", 0o700), "Mkdir error")
}

func testRename(t *testing.T, fsys FS) {
	writeRaw(t, fsys, "a", []byte("A"), 0o600)
	writeRaw(t, fsys, "b", []byte("B"), 0o600)
	ia, _ := fsys.Lstat("a")
	if err := fsys.Rename("a", "b"); err != nil {
		t.Fatal(err)
	}
	if got := readRaw(t, fsys, "b"); string(got) != "A" {
		t.Fatalf("b = %q after rename", got)
	}
	if exists(t, abs(fsys, "a")) {
		t.Fatal("a still exists")
	}
	if ib, _ := fsys.Lstat("b"); ib.Ino != ia.Ino {
		t.Fatal("rename did not move the inode")
	}
	mkdirAll(t, fsys, "d1")
	mkdirAll(t, fsys, "d2")
	if err := fsys.Rename("b", "d1/x"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Rename("d1/x", "d2/y"); err != nil {
		t.Fatal(err)
	}
	if got := readRaw(t, fsys, "d2/y"); string(got) != "A" {
		t.Fatalf("d2/y = %q", got)
	}
	err := fsys.Rename("missing", "c")
	wantErrno(t, err, syscall.ENOENT, "Rename of a missing file")
	wantPathError(t, err, "Rename of a missing file")
	wantErrno(t, fsys.Rename("d2/y", "nodir/y"), syscall.ENOENT, "Rename into a missing dir")
	wantErrno(t, fsys.Rename("nodir/y", "z"), syscall.ENOENT, "Rename from a missing dir")
	if !exists(t, abs(fsys, "d2/y")) {
		t.Fatal("failed rename lost the source")
	}
	// A directory renames too, and cannot replace a non-empty one.
	if err := fsys.Rename("d1", "d3"); err != nil {
		t.Fatal(err)
	}
	wantErrnoIn(t, fsys.Rename("d3", "d2"), "Rename over a non-empty dir", syscall.ENOTEMPTY, syscall.EEXIST)
}

func testLink(t *testing.T, fsys FS) {
	writeRaw(t, fsys, "a", []byte("A"), 0o600)
	mkdirAll(t, fsys, "d")
	if err := fsys.Link("a", "b"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Link("a", "d/c"); err != nil {
		t.Fatal(err)
	}
	ia, _ := fsys.Lstat("a")
	ib, _ := fsys.Lstat("b")
	ic, _ := fsys.Lstat("d/c")
	if ia.Ino != ib.Ino || ia.Ino != ic.Ino || ia.Nlink != 3 {
		t.Fatalf("links: %+v %+v %+v", ia, ib, ic)
	}
	err := fsys.Link("a", "b")
	wantErrno(t, err, syscall.EEXIST, "Link onto an existing name")
	wantPathError(t, err, "Link onto an existing name")
	writeRaw(t, fsys, "other", []byte("O"), 0o600)
	wantErrno(t, fsys.Link("a", "other"), syscall.EEXIST, "Link onto another file")
	if got := readRaw(t, fsys, "other"); string(got) != "O" {
		t.Fatal("failed Link changed its target name")
	}
	wantErrno(t, fsys.Link("missing", "x"), syscall.ENOENT, "Link of a missing file")
	wantErrno(t, fsys.Link("a", "nodir/x"), syscall.ENOENT, "Link into a missing dir")
}

func testRemove(t *testing.T, fsys FS) {
	writeRaw(t, fsys, "a", nil, 0o600)
	mkdirAll(t, fsys, "d")
	writeRaw(t, fsys, "d/b", nil, 0o600)
	if err := fsys.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Remove("d/b"); err != nil {
		t.Fatal(err)
	}
	if exists(t, abs(fsys, "a")) || exists(t, abs(fsys, "d/b")) {
		t.Fatal("Remove left the file")
	}
	err := fsys.Remove("a")
	wantErrno(t, err, syscall.ENOENT, "Remove of a missing file")
	wantPathError(t, err, "Remove of a missing file")
	wantErrno(t, fsys.Remove("nodir/a"), syscall.ENOENT, "Remove in a missing dir")
	wantErrno(t, fsys.Remove("d"), syscall.EISDIR, "Remove of a directory")
	if !exists(t, abs(fsys, "d")) {
		t.Fatal("Remove removed a directory")
	}
}

func testRemoveDir(t *testing.T, fsys FS) {
	mkdirAll(t, fsys, "d/e")
	writeRaw(t, fsys, "f", nil, 0o600)
	wantErrno(t, fsys.RemoveDir("d"), syscall.ENOTEMPTY, "RemoveDir of a non-empty dir")
	if err := fsys.RemoveDir("d/e"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.RemoveDir("d"); err != nil {
		t.Fatal(err)
	}
	if exists(t, abs(fsys, "d")) {
		t.Fatal("RemoveDir left the dir")
	}
	err := fsys.RemoveDir("d")
	wantErrno(t, err, syscall.ENOENT, "RemoveDir of a missing dir")
	wantPathError(t, err, "RemoveDir of a missing dir")
	wantErrno(t, fsys.RemoveDir("f"), syscall.ENOTDIR, "RemoveDir of a file")
}

func testReadDir(t *testing.T, fsys FS) {
	writeRaw(t, fsys, "a", nil, 0o600)
	writeRaw(t, fsys, "b", nil, 0o600)
	mkdirAll(t, fsys, "d/sub")
	symlink(t, fsys, "a", "l")
	if err := unix.Mkfifo(abs(fsys, "p"), 0o600); err != nil {
		t.Fatal(err)
	}
	ents, err := fsys.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(ents, func(x, y DirEntry) int { return compareStrings(x.Name, y.Name) })
	want := []DirEntry{{"a", 0}, {"b", 0}, {"d", fs.ModeDir}, {"l", fs.ModeSymlink}, {"p", fs.ModeNamedPipe}}
	if !slices.Equal(ents, want) {
		t.Fatalf("ReadDir(.) = %v, want %v", ents, want)
	}
	ents, err = fsys.ReadDir("d")
	if err != nil || !slices.Equal(ents, []DirEntry{{"sub", fs.ModeDir}}) {
		t.Fatalf("ReadDir(d) = %v, %v", ents, err)
	}
	ents, err = fsys.ReadDir("d/sub")
	if err != nil || len(ents) != 0 {
		t.Fatalf("ReadDir(empty) = %v, %v", ents, err)
	}
	_, err = fsys.ReadDir("missing")
	wantErrno(t, err, syscall.ENOENT, "ReadDir of a missing dir")
	wantPathError(t, err, "ReadDir of a missing dir")
	_, err = fsys.ReadDir("a")
	wantErrno(t, err, syscall.ENOTDIR, "ReadDir of a file")
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func testSyncDir(t *testing.T, fsys FS) {
	mkdirAll(t, fsys, "d/e")
	writeRaw(t, fsys, "f", nil, 0o600)
	for _, name := range []string{".", "d", "d/e"} {
		if err := fsys.SyncDir(name); err != nil {
			t.Fatalf("SyncDir(%q): %v", name, err)
		}
	}
	err := fsys.SyncDir("missing")
	wantErrno(t, err, syscall.ENOENT, "SyncDir of a missing dir")
	wantPathError(t, err, "SyncDir of a missing dir")
	wantErrno(t, fsys.SyncDir("f"), syscall.ENOTDIR, "SyncDir of a file")
}

func testPermissionDenied(t *testing.T, fsys FS) {
	skipIfRoot(t)
	mkdirAll(t, fsys, "locked")
	writeRaw(t, fsys, "locked/x", []byte("x"), 0o600)
	writeRaw(t, fsys, "unreadable", []byte("x"), 0o000)
	if err := os.Chmod(abs(fsys, "locked"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(abs(fsys, "locked"), 0o700) })
	_, err := fsys.OpenFile("locked/x", syscall.O_RDONLY, 0)
	wantErrno(t, err, syscall.EACCES, "open in a mode-0 dir")
	_, err = fsys.OpenFile("unreadable", syscall.O_RDONLY, 0)
	wantErrno(t, err, syscall.EACCES, "open of a mode-0 file")
	_, err = fsys.Lstat("locked/x")
	wantErrno(t, err, syscall.EACCES, "Lstat in a mode-0 dir")
	wantErrno(t, WriteFile(fsys, "locked", "y", nil), syscall.EACCES, "WriteFile in a mode-0 dir")
}

func testNotLocalNames(t *testing.T, fsys FS) {
	writeRaw(t, fsys, "ok", []byte("ok"), 0o600)
	mkdirAll(t, fsys, "a")
	mkdirAll(t, fsys, "b")
	bad := []string{"../x", "/abs", "a/../b", "", "..", "a/", "./a", "a//b", "a/.", "/", "x\x00y", "../" + "ok"}
	for _, name := range bad {
		check := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, ErrNotLocal) {
				t.Errorf("%s(%q) = %v, want ErrNotLocal", what, name, err)
			}
		}
		_, err := fsys.OpenFile(name, syscall.O_RDONLY, 0)
		check("OpenFile", err)
		_, err = fsys.OpenFile(name, syscall.O_WRONLY|syscall.O_CREAT, 0o600)
		check("OpenFile(O_CREAT)", err)
		_, err = fsys.Lstat(name)
		check("Lstat", err)
		check("Mkdir", fsys.Mkdir(name, 0o700))
		check("Rename(bad, ok)", fsys.Rename(name, "ok2"))
		check("Rename(ok, bad)", fsys.Rename("ok", name))
		check("Link(bad, ok)", fsys.Link(name, "ok2"))
		check("Link(ok, bad)", fsys.Link("ok", name))
		check("Remove", fsys.Remove(name))
		check("RemoveDir", fsys.RemoveDir(name))
		_, err = fsys.ReadDir(name)
		check("ReadDir", err)
		check("SyncDir", fsys.SyncDir(name))
		_, _, err = ReadFile(fsys, name, 100)
		check("ReadFile", err)
		check("WriteFile(dir)", WriteFile(fsys, name, "w", []byte("w")))
		check("RemoveFile(dir)", RemoveFile(fsys, name, "ok"))
		_, err = MkdirPrivate(fsys, name)
		check("MkdirPrivate", err)
		if err := CheckName(name); !errors.Is(err, ErrNotLocal) {
			t.Errorf("CheckName(%q) = %v", name, err)
		}
	}
	for _, name := range []string{".", "a", "a/b", ".hidden", "a/.x.tmp", "..a", "a..", "a/..b"} {
		if err := CheckName(name); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", name, err)
		}
	}
	// Nothing was created or moved by the refused calls.
	if got := dirNames(t, fsys.Root()); !slices.Equal(got, []string{"a", "b", "ok"}) {
		t.Fatalf("root now holds %v", got)
	}
	if got := readRaw(t, fsys, "ok"); string(got) != "ok" {
		t.Fatalf("ok = %q", got)
	}
}

// symlinkFixture makes, under fsys's root: "target" (a file), "ln" → target,
// "lnout" → a file outside the root, "dangling" → a missing file outside the root.
func symlinkFixture(t *testing.T, fsys FS) (outside string) {
	outside = t.TempDir()
	if err := os.WriteFile(outside+"/out", []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, fsys, "target", []byte("secret"), 0o600)
	symlink(t, fsys, "target", "ln")
	symlink(t, fsys, outside+"/out", "lnout")
	symlink(t, fsys, outside+"/new", "dangling")
	return outside
}

func testSymlinkFile(t *testing.T, fsys FS) {
	outside := symlinkFixture(t, fsys)
	for _, name := range []string{"ln", "lnout"} {
		_, err := fsys.OpenFile(name, syscall.O_RDONLY, 0)
		wantErrno(t, err, syscall.ELOOP, "OpenFile of symlink "+name)
		wantPathError(t, err, "OpenFile of symlink "+name)
		_, err = fsys.OpenFile(name, syscall.O_WRONLY|syscall.O_TRUNC, 0)
		wantErrno(t, err, syscall.ELOOP, "OpenFile(O_TRUNC) of symlink "+name)
		_, err = fsys.OpenFile(name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_APPEND, 0o600)
		wantErrno(t, err, syscall.ELOOP, "OpenFile(O_CREAT) of symlink "+name)
		_, _, err = ReadFile(fsys, name, 1<<20)
		wantErrno(t, err, syscall.ELOOP, "ReadFile of symlink "+name)
		info, err := fsys.Lstat(name)
		if err != nil || !info.IsSymlink() || info.IsRegular() || info.IsDir() {
			t.Fatalf("Lstat(%s) = %+v, %v", name, info, err)
		}
	}
	// A dangling symlink is never created through.
	_, err := fsys.OpenFile("dangling", syscall.O_WRONLY|syscall.O_CREAT, 0o600)
	wantErrno(t, err, syscall.ELOOP, "O_CREAT through a dangling symlink")
	_, err = fsys.OpenFile("dangling", oCreateExcl, 0o600)
	wantErrno(t, err, syscall.EEXIST, "O_CREAT|O_EXCL on a dangling symlink")
	if exists(t, outside+"/new") {
		t.Fatal("a file was created through a dangling symlink")
	}
	if got := readRaw(t, fsys, "target"); string(got) != "secret" {
		t.Fatalf("target = %q", got)
	}
	if b, _ := os.ReadFile(outside + "/out"); string(b) != "outside" {
		t.Fatalf("outside file = %q", b)
	}
}

// testSymlinkDir checks that a symlinked directory anywhere in a path is refused, for
// a link to a directory inside the root, one outside it, and one deeper in the tree.
func testSymlinkDir(t *testing.T, newFS newFSFunc) {
	cases := []struct {
		name string
		link string // the symlinked directory, as named beneath the root
		via  string // where the link's real directory is
	}{
		{"inside", "sd", "real"},
		{"outside", "sd", ""},
		{"deep", "d/sd", "real"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fsys := newFS(t)
			realDir := abs(fsys, tc.via)
			if tc.via == "" {
				realDir = t.TempDir()
			} else {
				mkdirAll(t, fsys, tc.via)
			}
			mkdirAll(t, fsys, "d")
			if err := os.WriteFile(realDir+"/x", []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(realDir+"/empty", 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(realDir, abs(fsys, tc.link)); err != nil {
				t.Fatal(err)
			}
			writeRaw(t, fsys, "a", []byte("a"), 0o600)
			before := dirNames(t, realDir)
			sd := tc.link

			info, err := fsys.Lstat(sd)
			if err != nil || !info.IsSymlink() {
				t.Fatalf("Lstat(%s) = %+v, %v", sd, info, err)
			}
			// Through the link, every call fails.
			_, err = fsys.OpenFile(sd+"/x", syscall.O_RDONLY, 0)
			wantErrno(t, err, syscall.ELOOP, "open of "+sd+"/x")
			_, err = fsys.OpenFile(sd+"/new", oCreateExcl, 0o600)
			wantErrno(t, err, syscall.ELOOP, "create of "+sd+"/new")
			_, _, err = ReadFile(fsys, sd+"/x", 100)
			wantErrno(t, err, syscall.ELOOP, "ReadFile of "+sd+"/x")
			_, err = fsys.Lstat(sd + "/x")
			wantErrnoIn(t, err, "Lstat of "+sd+"/x", syscall.ELOOP, syscall.ENOTDIR)
			_, err = fsys.ReadDir(sd)
			wantErrnoIn(t, err, "ReadDir of "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, fsys.SyncDir(sd), "SyncDir of "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, fsys.Mkdir(sd+"/m", 0o700), "Mkdir in "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, fsys.Rename("a", sd+"/a"), "Rename into "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, fsys.Rename(sd+"/x", "y"), "Rename out of "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, fsys.Link("a", sd+"/a"), "Link into "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, fsys.Link(sd+"/x", "y"), "Link out of "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, fsys.Remove(sd+"/x"), "Remove in "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, fsys.RemoveDir(sd+"/empty"), "RemoveDir in "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, WriteFile(fsys, sd, "w", []byte("w")), "WriteFile in "+sd, syscall.ELOOP, syscall.ENOTDIR)
			wantErrnoIn(t, RemoveFile(fsys, sd, "x"), "RemoveFile in "+sd, syscall.ELOOP, syscall.ENOTDIR)
			_, err = MkdirPrivate(fsys, sd)
			wantErrno(t, err, syscall.ELOOP, "MkdirPrivate of "+sd)
			_, err = MkdirPrivate(fsys, sd+"/m")
			wantErrnoIn(t, err, "MkdirPrivate in "+sd, syscall.ELOOP, syscall.ENOTDIR)

			// Nothing changed on either side of the link.
			if got := dirNames(t, realDir); !slices.Equal(got, before) {
				t.Fatalf("the linked dir changed: %v, was %v", got, before)
			}
			if got := readRaw(t, fsys, "a"); string(got) != "a" {
				t.Fatalf("a = %q", got)
			}
			if b, _ := os.ReadFile(realDir + "/x"); string(b) != "x" {
				t.Fatalf("x = %q", b)
			}
		})
	}
	t.Run("root", func(t *testing.T) {
		// The root itself must not be a symlink either.
		real := t.TempDir()
		linkDir := t.TempDir()
		if err := os.WriteFile(real+"/x", []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(real, linkDir+"/store"); err != nil {
			t.Fatal(err)
		}
		var fsys FS = NewOS(linkDir + "/store")
		if _, ok := newFS(t).(*Faulty); ok {
			fsys = NewFaulty(fsys)
		}
		_, err := fsys.Lstat(".")
		wantErrnoIn(t, err, "Lstat(.) of a symlinked root", syscall.ELOOP, syscall.ENOTDIR)
		_, err = fsys.OpenFile("x", syscall.O_RDONLY, 0)
		wantErrnoIn(t, err, "open in a symlinked root", syscall.ELOOP, syscall.ENOTDIR)
		wantErrnoIn(t, WriteFile(fsys, ".", "y", nil), "WriteFile in a symlinked root", syscall.ELOOP, syscall.ENOTDIR)
		if got := dirNames(t, real); !slices.Equal(got, []string{"x"}) {
			t.Fatalf("real root now holds %v", got)
		}
	})
}

// testSymlinkEntry checks that the calls that act on a name act on a symlink itself
// (so fsck can move or remove a planted link) and never on its target.
func testSymlinkEntry(t *testing.T, fsys FS) {
	outside := symlinkFixture(t, fsys)
	mkdirAll(t, fsys, "lost+found")
	if err := fsys.Rename("lnout", "lost+found/lnout"); err != nil {
		t.Fatal(err)
	}
	if info, err := fsys.Lstat("lost+found/lnout"); err != nil || !info.IsSymlink() {
		t.Fatalf("moved link: %+v, %v", info, err)
	}
	if err := fsys.Remove("ln"); err != nil {
		t.Fatal(err)
	}
	if exists(t, abs(fsys, "ln")) || !exists(t, abs(fsys, "target")) {
		t.Fatal("Remove of a link did not remove just the link")
	}
	if b, _ := os.ReadFile(outside + "/out"); string(b) != "outside" {
		t.Fatalf("outside file = %q", b)
	}
	// Link of a symlink links the symlink itself, never its target.
	if err := fsys.Link("dangling", "dangling2"); err != nil {
		t.Fatal(err)
	}
	if info, _ := fsys.Lstat("dangling2"); !info.IsSymlink() {
		t.Fatal("Link followed a symlink")
	}
	// A symlink to a directory is not a directory.
	if err := os.Symlink(outside, abs(fsys, "sd")); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, fsys.RemoveDir("sd"), syscall.ENOTDIR, "RemoveDir of a symlink")
	if err := fsys.Remove("sd"); err != nil {
		t.Fatal(err)
	}
	if !exists(t, outside+"/out") {
		t.Fatal("Remove of a dir link touched the target")
	}
}

func testReadFile(t *testing.T, fsys FS) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 70000) // > 1 MiB: several reads
	writeRaw(t, fsys, "big", data, 0o600)
	got, info, err := ReadFile(fsys, "big", int64(len(data)))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadFile(big) = %d bytes, %v", len(got), err)
	}
	want, _ := fsys.Lstat("big")
	if info != want {
		t.Fatalf("ReadFile info = %+v, want the file's %+v", info, want)
	}

	writeRaw(t, fsys, "f", []byte("hello\n"), 0o600)
	got, info, err = ReadFile(fsys, "f", 6)
	if err != nil || string(got) != "hello\n" || info.Size != 6 || !info.IsRegular() {
		t.Fatalf("ReadFile(f, 6) = %q, %+v, %v", got, info, err)
	}
	got, info, err = ReadFile(fsys, "f", 5)
	if !errors.Is(err, ErrTooLarge) || got != nil {
		t.Fatalf("ReadFile(f, 5) = %q, %v, want ErrTooLarge", got, err)
	}
	if info.Size != 6 {
		t.Fatalf("ErrTooLarge info = %+v", info)
	}
	wantPathError(t, err, "ErrTooLarge")

	writeRaw(t, fsys, "empty", nil, 0o600)
	got, _, err = ReadFile(fsys, "empty", 0)
	if err != nil || len(got) != 0 {
		t.Fatalf("ReadFile(empty) = %q, %v", got, err)
	}

	mkdirAll(t, fsys, "d")
	_, info, err = ReadFile(fsys, "d", 1<<20)
	if !errors.Is(err, ErrNotRegular) || !info.IsDir() {
		t.Fatalf("ReadFile(dir) = %+v, %v, want ErrNotRegular", info, err)
	}
	_, _, err = ReadFile(fsys, "missing", 10)
	wantErrno(t, err, syscall.ENOENT, "ReadFile of a missing file")

	// A read-only file reads; reading never needs write permission.
	writeRaw(t, fsys, "ro", []byte("ro"), 0o400)
	if got, _, err := ReadFile(fsys, "ro", 10); err != nil || string(got) != "ro" {
		t.Fatalf("ReadFile(ro) = %q, %v", got, err)
	}
}

func testReadFileFIFO(t *testing.T, fsys FS) {
	fifo := abs(fsys, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	type result struct {
		data []byte
		info Info
		err  error
	}
	done := make(chan result, 1)
	go func() {
		data, info, err := ReadFile(fsys, "fifo", 1<<20)
		done <- result{data, info, err}
	}()
	select {
	case r := <-done:
		if !errors.Is(r.err, ErrNotRegular) || r.data != nil {
			t.Fatalf("ReadFile(fifo) = %q, %v, want ErrNotRegular", r.data, r.err)
		}
		if r.info.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			t.Fatalf("ReadFile(fifo) info mode %o", r.info.Mode)
		}
	case <-time.After(60 * time.Second):
		// Unblock the reader (a writer open succeeds once a reader waits) so the
		// goroutine does not outlive the test, then fail.
		if fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			unix.Close(fd)
		}
		t.Fatal("ReadFile blocked on a FIFO")
	}
	// The FIFO with a writer holding it open is refused the same way.
	rfd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	wfd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(wfd)
	if _, err := unix.Write(wfd, []byte("data")); err != nil {
		t.Fatal(err)
	}
	go func() {
		data, info, err := ReadFile(fsys, "fifo", 1<<20)
		done <- result{data, info, err}
	}()
	select {
	case r := <-done:
		if !errors.Is(r.err, ErrNotRegular) {
			t.Fatalf("ReadFile(fifo with a writer) = %q, %v", r.data, r.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("ReadFile blocked on a FIFO with a writer")
	}
	if err := CheckPrivateFile("fifo", mustLstat(t, fsys, "fifo")); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("CheckPrivateFile(fifo) = %v", err)
	}
}

// testReadFileDevice plants /dev/zero's device node: a ReadFile that trusted it would
// read forever.
func testReadFileDevice(t *testing.T, fsys FS) {
	requireRoot(t)
	if err := unix.Mknod(abs(fsys, "zero"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 5))); err != nil {
		t.Skipf("mknod: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := ReadFile(fsys, "zero", 1<<20)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) && !errors.Is(err, syscall.EACCES) { // EACCES on a nodev mount
			t.Fatalf("ReadFile(char device) = %v, want ErrNotRegular", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("ReadFile did not return on a device")
	}
	if err := CheckPrivateFile("zero", mustLstat(t, fsys, "zero")); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("CheckPrivateFile(device) = %v", err)
	}
}

func mustLstat(t *testing.T, fsys FS, name string) Info {
	t.Helper()
	info, err := fsys.Lstat(name)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func testStage(t *testing.T, fsys FS) {
	withUmask(t, 0)
	mkdirAll(t, fsys, "d")
	s, err := Stage(fsys, "d", []byte("staged"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Cleanup()
	if s.Dir != "d" || path.Dir(s.Temp) != "d" || !IsTempName(path.Base(s.Temp)) {
		t.Fatalf("Staged = %+v", s)
	}
	if m := rawMode(t, abs(fsys, s.Temp)); m&0o7777 != 0o600 || m&syscall.S_IFMT != syscall.S_IFREG {
		t.Fatalf("temp mode %o under umask 0, want 0600", m)
	}
	if got := readRaw(t, fsys, s.Temp); string(got) != "staged" {
		t.Fatalf("temp holds %q", got)
	}
	if s.Published() {
		t.Fatal("Published before Publish")
	}
	writeRaw(t, fsys, "d/x.json", []byte("old"), 0o600)
	if err := s.Publish("x.json"); err != nil {
		t.Fatal(err)
	}
	if !s.Published() {
		t.Fatal("not Published after Publish")
	}
	if got := readRaw(t, fsys, "d/x.json"); string(got) != "staged" {
		t.Fatalf("published file holds %q", got)
	}
	if m := rawMode(t, abs(fsys, "d/x.json")); m&0o7777 != 0o600 {
		t.Fatalf("published mode %o", m)
	}
	if tmps := temps(t, abs(fsys, "d")); len(tmps) != 0 {
		t.Fatalf("temps left: %v", tmps)
	}
	// Cleanup after Publish is a no-op; it never removes the published file, even
	// when a file has since been created at the temp's name.
	writeRaw(t, fsys, s.Temp, []byte("someone else's"), 0o600)
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := readRaw(t, fsys, "d/x.json"); string(got) != "staged" {
		t.Fatalf("Cleanup after Publish changed the file: %q", got)
	}
	if !exists(t, abs(fsys, s.Temp)) {
		t.Fatal("Cleanup after Publish removed a file")
	}
	os.Remove(abs(fsys, s.Temp))
	if err := s.Publish("y.json"); err == nil {
		t.Fatal("second Publish succeeded")
	}

	// Cleanup before Publish removes the temp; Publish after Cleanup fails; Cleanup
	// twice and Cleanup of nil are fine.
	s2, err := Stage(fsys, "d", []byte("discard"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if exists(t, abs(fsys, s2.Temp)) {
		t.Fatal("Cleanup left the temp")
	}
	if err := s2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := s2.Publish("z.json"); err == nil || exists(t, abs(fsys, "d/z.json")) {
		t.Fatalf("Publish after Cleanup = %v", err)
	}
	var nilStaged *Staged
	if err := nilStaged.Cleanup(); err != nil {
		t.Fatal(err)
	}
	// A temp that vanished is not a Cleanup error.
	s3, err := Stage(fsys, "d", nil)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(abs(fsys, s3.Temp))
	if err := s3.Cleanup(); err != nil {
		t.Fatalf("Cleanup of a vanished temp: %v", err)
	}
	// Staging in the root and in a missing dir.
	s4, err := Stage(fsys, ".", []byte("r"))
	if err != nil || path.Dir(s4.Temp) != "." || !IsTempName(s4.Temp) {
		t.Fatalf("Stage(.) = %+v, %v", s4, err)
	}
	s4.Cleanup()
	_, err = Stage(fsys, "nodir", []byte("x"))
	wantErrno(t, err, syscall.ENOENT, "Stage in a missing dir")
	if got := dirNames(t, abs(fsys, "d")); !slices.Equal(got, []string{"x.json"}) {
		t.Fatalf("d holds %v", got)
	}
	if got := dirNames(t, fsys.Root()); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("root holds %v", got)
	}
}

func testWriteFile(t *testing.T, fsys FS) {
	withUmask(t, 0)
	mkdirAll(t, fsys, "d")
	if err := WriteFile(fsys, "d", "x.json", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if got := readRaw(t, fsys, "d/x.json"); string(got) != "v1" {
		t.Fatalf("x.json = %q", got)
	}
	if m := rawMode(t, abs(fsys, "d/x.json")); m&0o7777 != 0o600 {
		t.Fatalf("mode %o under umask 0", m)
	}
	// Replacing: a new inode takes the name (rename, not an in-place rewrite), so a
	// reader holding the old file still sees the old bytes; a 0644 old file is
	// replaced by a 0600 one.
	if err := os.Chmod(abs(fsys, "d/x.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	old, err := fsys.OpenFile("d/x.json", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldInfo, _ := old.Stat()
	if err := WriteFile(fsys, "d", "x.json", []byte("version two")); err != nil {
		t.Fatal(err)
	}
	newInfo := mustLstat(t, fsys, "d/x.json")
	if newInfo.Ino == oldInfo.Ino {
		t.Fatal("WriteFile rewrote the file in place")
	}
	if newInfo.Perm() != 0o600 {
		t.Fatalf("replacement mode %o", newInfo.Perm())
	}
	if b, _ := io.ReadAll(old); string(b) != "v1" {
		t.Fatalf("the old file changed under its reader: %q", b)
	}
	if got := readRaw(t, fsys, "d/x.json"); string(got) != "version two" {
		t.Fatalf("x.json = %q", got)
	}
	if tmps := temps(t, abs(fsys, "d")); len(tmps) != 0 {
		t.Fatalf("temps left: %v", tmps)
	}
	// In the root.
	if err := WriteFile(fsys, ".", "top", []byte("t")); err != nil {
		t.Fatal(err)
	}
	if got := readRaw(t, fsys, "top"); string(got) != "t" {
		t.Fatalf("top = %q", got)
	}
	wantErrno(t, WriteFile(fsys, "nodir", "x", nil), syscall.ENOENT, "WriteFile in a missing dir")
	// Over a directory: the rename fails and the temp is cleaned up.
	mkdirAll(t, fsys, "d/sub")
	wantErrno(t, WriteFile(fsys, "d", "sub", []byte("x")), syscall.EISDIR, "WriteFile over a directory")
	if tmps := temps(t, abs(fsys, "d")); len(tmps) != 0 {
		t.Fatalf("temps left after failed rename: %v", tmps)
	}
}

// testWriteFileAtomic has a reader race a writer: every read sees one complete version.
func testWriteFileAtomic(t *testing.T, fsys FS) {
	mkdirAll(t, fsys, "d")
	a := bytes.Repeat([]byte("a"), 64<<10)
	b := bytes.Repeat([]byte("b"), 32<<10)
	if err := WriteFile(fsys, "d", "x", a); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	readerDone := make(chan error, 1)
	reads := 0
	go func() {
		for {
			select {
			case <-stop:
				readerDone <- nil
				return
			default:
			}
			got, _, err := ReadFile(fsys, "d/x", 1<<20)
			if err != nil {
				readerDone <- err
				return
			}
			if !bytes.Equal(got, a) && !bytes.Equal(got, b) {
				readerDone <- errors.New("read a torn version")
				return
			}
			reads++
		}
	}()
	for i := range 200 {
		data := a
		if i%2 == 0 {
			data = b
		}
		if err := WriteFile(fsys, "d", "x", data); err != nil {
			close(stop)
			<-readerDone
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-readerDone; err != nil {
		t.Fatalf("reader: %v", err)
	}
	if tmps := temps(t, abs(fsys, "d")); len(tmps) != 0 {
		t.Fatalf("temps left: %v", tmps)
	}
	t.Logf("%d concurrent reads", reads)
}

func testRemoveFile(t *testing.T, fsys FS) {
	mkdirAll(t, fsys, "d")
	writeRaw(t, fsys, "d/x", []byte("x"), 0o600)
	if err := RemoveFile(fsys, "d", "x"); err != nil {
		t.Fatal(err)
	}
	if exists(t, abs(fsys, "d/x")) {
		t.Fatal("RemoveFile left the file")
	}
	wantErrno(t, RemoveFile(fsys, "d", "x"), syscall.ENOENT, "RemoveFile of a missing file")
	writeRaw(t, fsys, "top", nil, 0o600)
	if err := RemoveFile(fsys, ".", "top"); err != nil {
		t.Fatal(err)
	}
}

// testBadBase checks that WriteFile, RemoveFile and Publish take a single name for
// base: anything else would put the file in another directory than the one fsynced.
func testBadBase(t *testing.T, fsys FS) {
	mkdirAll(t, fsys, "d/sub")
	writeRaw(t, fsys, "d/sub/x", []byte("x"), 0o600)
	writeRaw(t, fsys, "keep", []byte("keep"), 0o600)
	for _, base := range []string{"", ".", "..", "sub/x", "../keep", "/x", "a/", "x\x00"} {
		if err := WriteFile(fsys, "d", base, []byte("new")); !errors.Is(err, ErrNotLocal) {
			t.Errorf("WriteFile(d, %q) = %v, want ErrNotLocal", base, err)
		}
		if err := RemoveFile(fsys, "d", base); !errors.Is(err, ErrNotLocal) {
			t.Errorf("RemoveFile(d, %q) = %v, want ErrNotLocal", base, err)
		}
		s, err := Stage(fsys, "d", []byte("s"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Publish(base); !errors.Is(err, ErrNotLocal) || s.Published() {
			t.Errorf("Publish(%q) = %v, want ErrNotLocal", base, err)
		}
		if err := s.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
	if got := readRaw(t, fsys, "d/sub/x"); string(got) != "x" {
		t.Fatalf("d/sub/x = %q", got)
	}
	if got := readRaw(t, fsys, "keep"); string(got) != "keep" {
		t.Fatalf("keep = %q", got)
	}
	if got := dirNames(t, abs(fsys, "d")); !slices.Equal(got, []string{"sub"}) {
		t.Fatalf("d holds %v", got)
	}
}

func testMkdirPrivate(t *testing.T, fsys FS) {
	withUmask(t, 0)
	created, err := MkdirPrivate(fsys, "p")
	if err != nil || !created {
		t.Fatalf("MkdirPrivate(p) = %v, %v", created, err)
	}
	if m := rawMode(t, abs(fsys, "p")); m&0o7777 != 0o700 || m&syscall.S_IFMT != syscall.S_IFDIR {
		t.Fatalf("mode %o under umask 0, want 0700", m)
	}
	created, err = MkdirPrivate(fsys, "p")
	if err != nil || created {
		t.Fatalf("second MkdirPrivate(p) = %v, %v", created, err)
	}
	if created, err := MkdirPrivate(fsys, "p/q"); err != nil || !created {
		t.Fatalf("MkdirPrivate(p/q) = %v, %v", created, err)
	}
	_, err = MkdirPrivate(fsys, "nodir/q")
	wantErrno(t, err, syscall.ENOENT, "MkdirPrivate in a missing dir")

	if err := os.Mkdir(abs(fsys, "open"), 0o755); err != nil {
		t.Fatal(err)
	}
	created, err = MkdirPrivate(fsys, "open")
	if !errors.Is(err, ErrNotPrivate) || created {
		t.Fatalf("MkdirPrivate(0755 dir) = %v, %v, want ErrNotPrivate", created, err)
	}
	if m := rawMode(t, abs(fsys, "open")); m&0o777 != 0o755 {
		t.Fatalf("MkdirPrivate changed an existing dir's mode to %o", m)
	}
	if err := os.Symlink(abs(fsys, "p"), abs(fsys, "link")); err != nil {
		t.Fatal(err)
	}
	_, err = MkdirPrivate(fsys, "link")
	wantErrno(t, err, syscall.ELOOP, "MkdirPrivate of a symlink to a private dir")
	writeRaw(t, fsys, "file", nil, 0o600)
	_, err = MkdirPrivate(fsys, "file")
	wantErrno(t, err, syscall.ENOTDIR, "MkdirPrivate of a file")

	t.Run("Foreign", func(t *testing.T) {
		requireRoot(t)
		if err := os.Mkdir(abs(fsys, "foreign"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(abs(fsys, "foreign"), 65534, 65534); err != nil {
			t.Fatal(err)
		}
		created, err := MkdirPrivate(fsys, "foreign")
		if !errors.Is(err, ErrNotPrivate) || created {
			t.Fatalf("MkdirPrivate(dir of uid 65534) = %v, %v, want ErrNotPrivate", created, err)
		}
	})
}

func testCheckPrivateFile(t *testing.T, fsys FS) {
	writeRaw(t, fsys, "good", []byte("g"), 0o600)
	if err := CheckPrivateFile("good", mustLstat(t, fsys, "good")); err != nil {
		t.Fatalf("CheckPrivateFile(0600) = %v", err)
	}
	writeRaw(t, fsys, "ro", []byte("g"), 0o400)
	if err := CheckPrivateFile("ro", mustLstat(t, fsys, "ro")); err != nil {
		t.Fatalf("CheckPrivateFile(0400) = %v", err)
	}
	refuse := func(name string, want error) {
		t.Helper()
		err := CheckPrivateFile(name, mustLstat(t, fsys, name))
		if !errors.Is(err, want) {
			t.Errorf("CheckPrivateFile(%s) = %v, want %v", name, err, want)
		}
		wantPathError(t, err, "CheckPrivateFile("+name+")")
	}
	writeRaw(t, fsys, "linked", []byte("l"), 0o600)
	if err := os.Link(abs(fsys, "linked"), abs(fsys, "linked2")); err != nil {
		t.Fatal(err)
	}
	refuse("linked", ErrNotPrivate)
	refuse("linked2", ErrNotPrivate)
	for _, perm := range []os.FileMode{0o644, 0o640, 0o604, 0o601, 0o610, 0o660} {
		writeRaw(t, fsys, "wide", []byte("w"), perm)
		refuse("wide", ErrNotPrivate)
	}
	symlink(t, fsys, "good", "sym")
	refuse("sym", syscall.ELOOP)
	if err := unix.Mkfifo(abs(fsys, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	refuse("fifo", ErrNotRegular)
	mkdirAll(t, fsys, "dir")
	refuse("dir", ErrNotRegular)
	t.Run("Foreign", func(t *testing.T) {
		requireRoot(t)
		writeRaw(t, fsys, "foreign", []byte("f"), 0o600)
		if err := os.Lchown(abs(fsys, "foreign"), 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refuse("foreign", ErrNotPrivate)
	})
}

func testCheckPrivateDir(t *testing.T, fsys FS) {
	if err := os.Mkdir(abs(fsys, "ok"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := CheckPrivateDir("ok", mustLstat(t, fsys, "ok")); err != nil {
		t.Fatal(err)
	}
	for _, perm := range []os.FileMode{0o750, 0o705, 0o755, 0o777} {
		os.Chmod(abs(fsys, "ok"), perm)
		if err := CheckPrivateDir("ok", mustLstat(t, fsys, "ok")); !errors.Is(err, ErrNotPrivate) {
			t.Errorf("CheckPrivateDir(%o) = %v", perm, err)
		}
	}
	writeRaw(t, fsys, "f", nil, 0o600)
	wantErrno(t, CheckPrivateDir("f", mustLstat(t, fsys, "f")), syscall.ENOTDIR, "CheckPrivateDir(file)")
	symlink(t, fsys, "ok", "sym")
	wantErrno(t, CheckPrivateDir("sym", mustLstat(t, fsys, "sym")), syscall.ELOOP, "CheckPrivateDir(symlink)")
}

// waitFSClock busy-waits (no sleep) until the file system's timestamp clock has moved
// past ns, as seen on a probe file's ctime.
func waitFSClock(t *testing.T, fsys FS, ns int64) {
	t.Helper()
	probe := abs(fsys, ".clock-probe")
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; ; i++ {
		if err := os.WriteFile(probe, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		perm := os.FileMode(0o600)
		if i%2 == 1 {
			perm = 0o400
		}
		if err := os.Chmod(probe, perm); err != nil { // moves ctime
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(probe, &st); err != nil {
			t.Fatal(err)
		}
		if st.Ctim.Nano() > ns {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the file system clock did not move")
		}
	}
	if err := os.Remove(probe); err != nil {
		t.Fatal(err)
	}
}

func testFingerprint(t *testing.T, fsys FS) {
	writeRaw(t, fsys, "f", []byte("aaaa"), 0o600)
	before := mustLstat(t, fsys, "f")
	if mustLstat(t, fsys, "f").Fingerprint() != before.Fingerprint() {
		t.Fatal("fingerprint of an unchanged file changed")
	}
	waitFSClock(t, fsys, before.CtimeNs)
	// Rewrite in place with the same size, then put the mtime back: only ctime can
	// tell this version from the last.
	f, err := fsys.OpenFile("f", syscall.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("bbbb")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	mtime := unix.NsecToTimespec(before.MtimeNs)
	if err := unix.UtimesNano(abs(fsys, "f"), []unix.Timespec{mtime, mtime}); err != nil {
		t.Fatal(err)
	}
	after := mustLstat(t, fsys, "f")
	if after.Ino != before.Ino || after.Size != before.Size || after.MtimeNs != before.MtimeNs || after.Mode != before.Mode {
		t.Fatalf("fixture: before %+v, after %+v", before, after)
	}
	if after.CtimeNs == before.CtimeNs {
		t.Fatal("fixture: ctime did not move")
	}
	if after.Fingerprint() == before.Fingerprint() {
		t.Fatal("fingerprint did not change on an in-place rewrite")
	}
	// A permission change and an atomic replacement change it too.
	fp := after.Fingerprint()
	os.Chmod(abs(fsys, "f"), 0o400)
	if mustLstat(t, fsys, "f").Fingerprint() == fp {
		t.Fatal("fingerprint did not change on chmod")
	}
	fp = mustLstat(t, fsys, "f").Fingerprint()
	if err := WriteFile(fsys, ".", "f", []byte("bbbb")); err != nil {
		t.Fatal(err)
	}
	if mustLstat(t, fsys, "f").Fingerprint() == fp {
		t.Fatal("fingerprint did not change on replacement")
	}
	got := mustLstat(t, fsys, "f")
	want := Fingerprint{Dev: got.Dev, Ino: got.Ino, Mode: got.Mode, Uid: got.Uid, Size: got.Size, MtimeNs: got.MtimeNs, CtimeNs: got.CtimeNs}
	if got.Fingerprint() != want {
		t.Fatalf("Fingerprint = %+v, want %+v", got.Fingerprint(), want)
	}
}

func testDirStamp(t *testing.T, fsys FS) {
	mkdirAll(t, fsys, "d")
	writeRaw(t, fsys, "d/a", nil, 0o600)
	// Put the directory's mtime in the past so the next change cannot fall in the
	// same timestamp tick.
	setOld := func() DirStamp {
		old := unix.NsecToTimespec(time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC).UnixNano())
		if err := unix.UtimesNano(abs(fsys, "d"), []unix.Timespec{old, old}); err != nil {
			t.Fatal(err)
		}
		s := mustLstat(t, fsys, "d").DirStamp()
		if mustLstat(t, fsys, "d").DirStamp() != s {
			t.Fatal("stamp of an unchanged dir changed")
		}
		return s
	}
	s := setOld()
	// Writing a file in a subdirectory or reading does not change it.
	mkdirAll(t, fsys, "d/sub")
	s = setOld()
	writeRaw(t, fsys, "d/sub/x", []byte("x"), 0o600)
	if _, err := fsys.ReadDir("d"); err != nil {
		t.Fatal(err)
	}
	if mustLstat(t, fsys, "d").DirStamp() != s {
		t.Fatal("stamp changed without a change to the dir's entries")
	}
	for _, change := range []struct {
		what string
		do   func() error
	}{
		{"add", func() error { return WriteFile(fsys, "d", "b", []byte("b")) }},
		{"replace", func() error { return WriteFile(fsys, "d", "b", []byte("bb")) }},
		{"remove", func() error { return RemoveFile(fsys, "d", "b") }},
	} {
		s := setOld()
		if err := change.do(); err != nil {
			t.Fatal(err)
		}
		if mustLstat(t, fsys, "d").DirStamp() == s {
			t.Fatalf("stamp did not change on %s", change.what)
		}
	}
	info := mustLstat(t, fsys, "d")
	want := DirStamp{Dev: info.Dev, Ino: info.Ino, MtimeNs: info.MtimeNs, CtimeNs: info.CtimeNs}
	if info.DirStamp() != want {
		t.Fatalf("DirStamp = %+v, want %+v", info.DirStamp(), want)
	}
}
