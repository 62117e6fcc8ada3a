//go:build linux

package fsx

import (
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OS is the real FS, rooted at an absolute directory path. It keeps the root, and up
// to maxCachedDirs directories beneath it, open as O_PATH descriptors (dirCache) and
// resolves every name relative to them, so a call on "messages/x.json" is one system
// call rather than a reopening of the root and the kind directory. An OS may be
// created before its root exists: descriptors are opened on first use. Close releases
// them (so does the garbage collector, once the OS is unreachable); the OS stays
// usable and reopens what it needs.
//
// A cached descriptor names a directory inode, never a path, so no symbolic link put
// in a directory's place after it was opened is ever followed. Before each call in a
// cached directory of the root, one fstatat beneath the cached root checks that the
// name still names it; if not (renamed away, replaced by another directory or by a
// symlink) the descriptor is dropped and the name resolved afresh, so the call acts on
// what the name names now, and a symlink there is refused as without a cache. The root
// is checked by every Lstat(".") and SyncDir (an lstat of the root path); SyncDir also
// checks, after the fsync, that its directory is still at its name, and fails with
// ESTALE otherwise, so nothing is acknowledged for a directory moved away meanwhile.
// A call that fails with ENOENT in a directory since removed is retried once, afresh.
// Mkdir, RemoveDir and Rename drop what they may have changed.
type OS struct {
	root string
	c    *dirCache
}

var _ FS = (*OS)(nil)

// NewOS returns the real FS rooted at dir (made absolute; not required to exist yet).
func NewOS(dir string) *OS {
	if abs, err := absPath(dir); err == nil {
		dir = abs
	}
	o := &OS{root: dir, c: &dirCache{dirs: map[string]*dirEnt{}}}
	runtime.AddCleanup(o, func(c *dirCache) { c.closeAll() }, o.c)
	return o
}

// Close closes the cached directory descriptors (those in use by a call in progress
// once it ends). The OS remains usable.
func (o *OS) Close() error {
	o.c.closeAll()
	return nil
}

func absPath(dir string) (string, error) {
	if path.IsAbs(dir) {
		return path.Clean(dir), nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return path.Join(wd, dir), nil
}

// Root returns the absolute root path.
func (o *OS) Root() string { return o.root }

// noOpenat2 is set when the kernel (or a seccomp filter) has no openat2. It is decided
// once, by a probe at start-up, so an ordinary EPERM from a later open (an immutable
// file, say) never switches the process to the walk.
var noOpenat2 atomic.Bool

func init() {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err != nil {
		noOpenat2.Store(true)
		return
	}
	unix.Close(fd)
}

func retryEINTR(f func() error) error {
	for {
		err := f()
		if err != unix.EINTR {
			return err
		}
	}
}

// openBeneath opens name beneath the directory dirfd, refusing symlinks everywhere.
func openBeneath(dirfd int, name string, flag int, perm uint32) (int, error) {
	flag |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if name == "." {
		return unix.Openat(dirfd, ".", flag, perm)
	}
	if !noOpenat2.Load() {
		how := unix.OpenHow{
			Flags:   uint64(flag),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		}
		// openat2 refuses a mode without O_CREAT or O_TMPFILE. O_TMPFILE includes the
		// O_DIRECTORY bit, so it must be tested as a whole.
		if flag&unix.O_CREAT != 0 || flag&unix.O_TMPFILE == unix.O_TMPFILE {
			how.Mode = uint64(perm)
		}
		var fd int
		err := retryEINTR(func() (err error) {
			fd, err = unix.Openat2(dirfd, name, &how)
			return err
		})
		return fd, err
	}
	return walkBeneath(dirfd, name, flag, perm)
}

// walkBeneath opens name one component at a time with O_NOFOLLOW. Names are clean and
// local (CheckName), so the walk cannot leave dirfd.
func walkBeneath(dirfd int, name string, flag int, perm uint32) (int, error) {
	dir, base := path.Split(name)
	cur := dirfd
	closeCur := func() {
		if cur != dirfd {
			unix.Close(cur)
		}
	}
	for _, comp := range splitPath(dir) {
		var next int
		err := retryEINTR(func() (err error) {
			next, err = unix.Openat(cur, comp, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			return err
		})
		if err != nil {
			if err == unix.ENOTDIR && isSymlinkAt(cur, comp) {
				err = unix.ELOOP // a symlink where a directory should be, as openat2 says
			}
			closeCur()
			return -1, err
		}
		closeCur()
		cur = next
	}
	var fd int
	err := retryEINTR(func() (err error) {
		fd, err = unix.Openat(cur, base, flag, perm)
		return err
	})
	closeCur()
	return fd, err
}

// isSymlinkAt reports whether name in directory dirfd is a symbolic link.
func isSymlinkAt(dirfd int, name string) bool {
	var st unix.Stat_t
	err := retryEINTR(func() error { return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
	return err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

func splitPath(dir string) []string {
	var out []string
	for _, c := range splitSlash(dir) {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

func splitSlash(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// withParent calls f with a descriptor of name's parent directory (cached) and name's
// last component. A cached directory in the root is first checked to be still what its
// name names (valid: one fstatat), so a directory replaced by a symlink is refused by
// the next call, as without a cache. A failure with ENOENT in a cached directory that has since been
// removed drops it and is retried once with the directory resolved afresh.
func (o *OS) withParent(op, name string, f func(pfd int, base string) error) error {
	if err := CheckName(name); err != nil {
		return err
	}
	dir, base := path.Split(name)
	dir = path.Clean(dir) // "." for a name in the root
	for attempt := 0; ; attempt++ {
		e, err := o.c.get(o.root, dir)
		if err != nil {
			if dir == "." {
				return &fs.PathError{Op: op, Path: o.root, Err: err}
			}
			return &fs.PathError{Op: op, Path: name, Err: err}
		}
		if dir != "." && !o.c.valid(o.root, dir, e) {
			// Renamed away or replaced since it was opened: resolve it afresh.
			o.c.put(e)
			o.c.drop(dir)
			if attempt == 0 {
				continue
			}
			return &fs.PathError{Op: op, Path: name, Err: unix.ESTALE}
		}
		err = retryEINTR(func() error { return f(e.fd, base) })
		retry := err == unix.ENOENT && attempt == 0 && o.c.dropIfRemoved(e)
		o.c.put(e)
		if retry {
			continue
		}
		if err != nil {
			return &fs.PathError{Op: op, Path: name, Err: err}
		}
		return nil
	}
}

func (o *OS) open(op, name string, flag int, perm uint32) (int, error) {
	if err := CheckName(name); err != nil {
		return -1, err
	}
	if name == "." {
		fd := -1
		err := o.withDir(op, ".", func(dfd int) (err error) {
			// "." of a removed directory opens, and what is done with it fails later:
			// a root with no link left is ENOENT here, which withDir retries afresh.
			var st unix.Stat_t
			if err := unix.Fstat(dfd, &st); err == nil && st.Nlink == 0 {
				return unix.ENOENT
			}
			fd, err = unix.Openat(dfd, ".", flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
			return err
		})
		return fd, err
	}
	fd := -1
	err := o.withParent(op, name, func(pfd int, base string) (err error) {
		fd, err = openBeneath(pfd, base, flag, perm)
		return err
	})
	return fd, err
}

// withDir calls f with a cached descriptor of directory name itself.
func (o *OS) withDir(op, name string, f func(dfd int) error) error {
	for attempt := 0; ; attempt++ {
		e, err := o.c.get(o.root, name)
		if err != nil {
			if name == "." {
				return &fs.PathError{Op: op, Path: o.root, Err: err}
			}
			return &fs.PathError{Op: op, Path: name, Err: err}
		}
		err = retryEINTR(func() error { return f(e.fd) })
		retry := err == unix.ENOENT && attempt == 0 && o.c.dropIfRemoved(e)
		o.c.put(e)
		if retry {
			continue
		}
		if err != nil {
			return &fs.PathError{Op: op, Path: name, Err: err}
		}
		return nil
	}
}

// OpenFile implements FS.
func (o *OS) OpenFile(name string, flag int, perm uint32) (File, error) {
	fd, err := o.open("open", name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &osFile{fd: fd, name: name}, nil
}

// Lstat implements FS. Lstat of a directory the OS holds open also checks that the
// name still names it, and drops the descriptor if not (see OS).
func (o *OS) Lstat(name string) (Info, error) {
	var st unix.Stat_t
	if name == "." {
		err := retryEINTR(func() error { return unix.Lstat(o.root, &st) })
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			err = unix.ELOOP // as opening the root with O_NOFOLLOW says
		} else if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			err = unix.ENOTDIR
		}
		o.c.check(".", &st, err)
		if err != nil {
			return Info{}, &fs.PathError{Op: "lstat", Path: o.root, Err: err}
		}
		return infoOf(&st), nil
	}
	err := o.withParent("lstat", name, func(pfd int, base string) error {
		return unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	})
	o.c.check(name, &st, err)
	if err != nil {
		return Info{}, err
	}
	return infoOf(&st), nil
}

// Mkdir implements FS.
func (o *OS) Mkdir(name string, perm uint32) error {
	defer o.c.drop(name)
	return o.withParent("mkdir", name, func(pfd int, base string) error {
		return unix.Mkdirat(pfd, base, perm)
	})
}

// twoParents resolves the parents of two names and calls f. An error resolving b
// (including a refused name) is returned as it is, naming b; an error from f names a.
func (o *OS) twoParents(op, a, b string, f func(pa int, ba string, pb int, bb string) error) error {
	for _, name := range []string{a, b} {
		if err := CheckName(name); err != nil {
			return err
		}
	}
	var resolveB error
	err := o.withParent(op, a, func(pa int, ba string) error {
		var inner error
		resolveB = o.withParent(op, b, func(pb int, bb string) error {
			inner = f(pa, ba, pb, bb)
			return nil
		})
		return inner
	})
	if resolveB != nil {
		return resolveB
	}
	return err
}

// Rename implements FS.
func (o *OS) Rename(oldname, newname string) error {
	defer o.c.drop(oldname)
	defer o.c.drop(newname)
	return o.twoParents("rename", oldname, newname, func(pa int, ba string, pb int, bb string) error {
		return unix.Renameat(pa, ba, pb, bb)
	})
}

// RenameNoReplace renames oldname to newname unless newname exists (EEXIST), with
// renameat2 RENAME_NOREPLACE. A file system without the flag fails with EINVAL.
// Staged.PublishNoReplace uses it.
func (o *OS) RenameNoReplace(oldname, newname string) error {
	defer o.c.drop(oldname)
	defer o.c.drop(newname)
	return o.twoParents("rename", oldname, newname, func(pa int, ba string, pb int, bb string) error {
		return unix.Renameat2(pa, ba, pb, bb, unix.RENAME_NOREPLACE)
	})
}

// Link implements FS.
func (o *OS) Link(oldname, newname string) error {
	return o.twoParents("link", oldname, newname, func(pa int, ba string, pb int, bb string) error {
		return unix.Linkat(pa, ba, pb, bb, 0)
	})
}

// Remove implements FS.
func (o *OS) Remove(name string) error {
	return o.withParent("unlink", name, func(pfd int, base string) error {
		return unix.Unlinkat(pfd, base, 0)
	})
}

// RemoveDir implements FS.
func (o *OS) RemoveDir(name string) error {
	defer o.c.drop(name)
	return o.withParent("rmdir", name, func(pfd int, base string) error {
		return unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
	})
}

// ReadDir implements FS.
func (o *OS) ReadDir(name string) ([]DirEntry, error) {
	fd, err := o.open("readdir", name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: Errno(err)}
	}
	out := make([]DirEntry, len(ents))
	for i, e := range ents {
		out[i] = DirEntry{Name: e.Name(), Type: e.Type()}
	}
	return out, nil
}

// SyncDir implements FS. After the fsync it checks that name still names the
// directory it synced (from the root path down, without following links); if not, it
// fails with ESTALE and drops its descriptors: what was just made durable there is not
// at name any more.
func (o *OS) SyncDir(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	e, err := o.c.get(o.root, name)
	if err != nil {
		if name == "." {
			return &fs.PathError{Op: "syncdir", Path: o.root, Err: err}
		}
		return &fs.PathError{Op: "syncdir", Path: name, Err: err}
	}
	defer o.c.put(e)
	fd := e.fd
	if !e.readable {
		fd, err = retryEINTR2(func() (int, error) {
			return unix.Openat(e.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		})
		if err != nil {
			return &fs.PathError{Op: "syncdir", Path: name, Err: err}
		}
		defer unix.Close(fd)
	}
	err = retryEINTR(func() error { return unix.Fsync(fd) })
	if err != nil {
		return &fs.PathError{Op: "fsync", Path: name, Err: err}
	}
	if !o.stillNamed(name, e) {
		o.c.drop(".")
		return &fs.PathError{Op: "syncdir", Path: name, Err: unix.ESTALE}
	}
	return nil
}

// stillNamed reports whether name, resolved from the root path without following a
// link, is still the directory e was opened on. For the root, or a name in it (the
// common case), that is an lstat of the root path and an fstatat beneath the cached
// root; a deeper name is resolved afresh.
func (o *OS) stillNamed(name string, e *dirEnt) bool {
	var st unix.Stat_t
	if err := retryEINTR(func() error { return unix.Lstat(o.root, &st) }); err != nil {
		return false
	}
	if name == "." {
		return st.Dev == e.dev && st.Ino == e.ino
	}
	if !strings.Contains(name, "/") {
		r, err := o.c.get(o.root, ".")
		if err != nil {
			return false
		}
		defer o.c.put(r)
		if r.dev != st.Dev || r.ino != st.Ino {
			return false
		}
		err = retryEINTR(func() error { return unix.Fstatat(r.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
		return err == nil && st.Dev == e.dev && st.Ino == e.ino
	}
	rfd, err := retryEINTR2(func() (int, error) {
		return unix.Open(o.root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return false
	}
	defer unix.Close(rfd)
	var rst unix.Stat_t
	if unix.Fstat(rfd, &rst) != nil || rst.Dev != st.Dev || rst.Ino != st.Ino {
		return false
	}
	dfd, err := openBeneath(rfd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return false
	}
	defer unix.Close(dfd)
	return unix.Fstat(dfd, &st) == nil && st.Dev == e.dev && st.Ino == e.ino
}

func retryEINTR2(f func() (int, error)) (int, error) {
	for {
		fd, err := f()
		if err != unix.EINTR {
			return fd, err
		}
	}
}

func infoOf(st *unix.Stat_t) Info {
	return Info{
		Dev: st.Dev, Ino: st.Ino, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid,
		Nlink: uint64(st.Nlink), Size: st.Size,
		MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano(),
	}
}

// osFile is a File over a raw descriptor (no runtime poller, so a FIFO opened with
// O_NONBLOCK is never waited on).
type osFile struct {
	fd   int
	name string
}

func (f *osFile) Name() string { return f.name }
func (f *osFile) Fd() uintptr  { return uintptr(f.fd) }

func (f *osFile) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(f.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, &fs.PathError{Op: "read", Path: f.name, Err: err}
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

func (f *osFile) ReadAt(p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Pread(f.fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, &fs.PathError{Op: "pread", Path: f.name, Err: err}
		}
		if n == 0 {
			return done, io.EOF
		}
		done += n
	}
	return done, nil
}

func (f *osFile) Write(p []byte) (int, error) {
	return f.writeAll("write", p, func(b []byte, _ int) (int, error) { return unix.Write(f.fd, b) })
}

func (f *osFile) WriteAt(p []byte, off int64) (int, error) {
	return f.writeAll("pwrite", p, func(b []byte, done int) (int, error) { return unix.Pwrite(f.fd, b, off+int64(done)) })
}

// writeAll calls write until all of p is written (write is given what is left and how
// much is done), retrying EINTR; a call that writes nothing is io.ErrShortWrite.
func (f *osFile) writeAll(op string, p []byte, write func(b []byte, done int) (int, error)) (int, error) {
	done := 0
	for done < len(p) {
		n, err := write(p[done:], done)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, &fs.PathError{Op: op, Path: f.name, Err: err}
		}
		if n == 0 {
			return done, &fs.PathError{Op: op, Path: f.name, Err: io.ErrShortWrite}
		}
		done += n
	}
	return done, nil
}

func (f *osFile) Sync() error {
	if err := retryEINTR(func() error { return unix.Fsync(f.fd) }); err != nil {
		return &fs.PathError{Op: "fsync", Path: f.name, Err: err}
	}
	return nil
}

func (f *osFile) Stat() (Info, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return Info{}, &fs.PathError{Op: "fstat", Path: f.name, Err: err}
	}
	return infoOf(&st), nil
}

func (f *osFile) SetTimes(atimeNs, mtimeNs int64) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(atimeNs), unix.NsecToTimespec(mtimeNs)}
	// utimensat with a NULL path sets the times of the descriptor itself (futimens);
	// x/sys has no wrapper taking no path.
	err := retryEINTR(func() error {
		_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(f.fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
		if e != 0 {
			return e
		}
		return nil
	})
	if err != nil {
		return &fs.PathError{Op: "futimens", Path: f.name, Err: err}
	}
	return nil
}

func (f *osFile) Close() error {
	if f.fd < 0 {
		return &fs.PathError{Op: "close", Path: f.name, Err: fs.ErrClosed}
	}
	err := unix.Close(f.fd)
	f.fd = -1
	if err != nil {
		return &fs.PathError{Op: "close", Path: f.name, Err: err}
	}
	return nil
}
