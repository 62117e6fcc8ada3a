//go:build linux

package fsx

import (
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// maxCachedDirs bounds how many directories in the root an OS keeps open (the root
// itself is always kept). A store has eight kind directories; a directory beyond the
// bound, or deeper than the root's own entries, is opened beneath the cached root and
// closed around each call.
const maxCachedDirs = 32

// dirCache is an OS's open directory descriptors, by name relative to the root ("."
// is the root). Entries are reference counted: one dropped while a call uses it is
// closed when that call ends, so a descriptor number is never used after close.
type dirCache struct {
	mu   sync.Mutex
	dirs map[string]*dirEnt
}

// dirEnt is one open directory. readable: opened O_RDONLY (usable by fsync), else
// O_PATH (a directory we may search but not read).
type dirEnt struct {
	fd       int
	dev, ino uint64
	readable bool
	refs     int
	dead     bool // no longer in the cache: closed when refs reaches 0
}

// get returns the entry of directory name (opening and caching it if needed), with a
// reference the caller must give back with put. name is "." or a clean local path.
func (c *dirCache) get(root, name string) (*dirEnt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.dirs[name]; e != nil {
		e.refs++
		return e, nil
	}
	var fd int
	var err error
	if name == "." {
		fd, err = openDir(func(flag int) (int, error) {
			return retryEINTR2(func() (int, error) { return unix.Open(root, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0) })
		})
	} else {
		r := c.dirs["."]
		if r == nil {
			// Open the root first (recursively, under the same lock: unlock and retry).
			c.mu.Unlock()
			r, err = c.get(root, ".")
			c.mu.Lock()
			if err != nil {
				return nil, err
			}
			defer c.putLocked(r)
			if e := c.dirs[name]; e != nil {
				e.refs++
				return e, nil
			}
		}
		rfd := r.fd
		fd, err = openDir(func(flag int) (int, error) { return openBeneath(rfd, name, flag, 0) })
		if err == unix.ENOTDIR && isSymlinkAt(rfd, name) {
			err = unix.ELOOP // a symlink where a directory should be, as openat2 says
		}
	}
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	e := &dirEnt{fd: fd, dev: st.Dev, ino: st.Ino, readable: fdReadable(fd), refs: 1}
	if name == "." || !strings.Contains(name, "/") && len(c.dirs) < maxCachedDirs+1 {
		c.dirs[name] = e
	} else {
		e.dead = true
	}
	return e, nil
}

// openDir opens a directory O_RDONLY, or O_PATH where it may not be read.
func openDir(open func(flag int) (int, error)) (int, error) {
	fd, err := open(unix.O_RDONLY | unix.O_DIRECTORY)
	if err == unix.EACCES {
		fd, err = open(unix.O_PATH | unix.O_DIRECTORY)
	}
	return fd, err
}

func fdReadable(fd int) bool {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	return err == nil && fl&unix.O_PATH == 0
}

// put gives back a reference taken by get.
func (c *dirCache) put(e *dirEnt) {
	c.mu.Lock()
	c.putLocked(e)
	c.mu.Unlock()
}

func (c *dirCache) putLocked(e *dirEnt) {
	e.refs--
	if e.dead && e.refs == 0 {
		unix.Close(e.fd)
		e.fd = -1
	}
}

// killLocked removes e (cached as name) from the cache.
func (c *dirCache) killLocked(name string, e *dirEnt) {
	delete(c.dirs, name)
	e.dead = true
	if e.refs == 0 {
		unix.Close(e.fd)
		e.fd = -1
	}
}

// drop removes name and everything beneath it from the cache ("." removes all).
func (c *dirCache) drop(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n, e := range c.dirs {
		if name == "." || n == name || strings.HasPrefix(n, name+"/") {
			c.killLocked(n, e)
		}
	}
}

// check compares an lstat of name (err its error) with the cached entry of name, if
// any, and drops name (and what is beneath it) when it no longer names that directory.
func (c *dirCache) check(name string, st *unix.Stat_t, err error) {
	c.mu.Lock()
	e := c.dirs[name]
	stale := e != nil && (err != nil || st.Dev != e.dev || st.Ino != e.ino || st.Mode&unix.S_IFMT != unix.S_IFDIR)
	c.mu.Unlock()
	if stale {
		c.drop(name)
	}
}

// dropIfRemoved reports whether e's directory has been removed (no links left), and
// if so drops it and everything cached beneath the root: a call that failed with
// ENOENT there is worth one retry afresh.
func (c *dirCache) dropIfRemoved(e *dirEnt) bool {
	var st unix.Stat_t
	if err := unix.Fstat(e.fd, &st); err != nil || st.Nlink > 0 {
		return false
	}
	c.drop(".")
	return true
}

// valid reports whether e, the entry of name (a name in the root), is still what name
// names: one fstatat beneath the cached root, never following a link. cached: e is in
// the cache (an uncached entry was resolved by this very call).
func (c *dirCache) valid(root, name string, e *dirEnt) bool {
	c.mu.Lock()
	cached := c.dirs[name] == e
	r := c.dirs["."]
	var rfd int
	if r != nil {
		r.refs++
		rfd = r.fd
	}
	c.mu.Unlock()
	if !cached {
		if r != nil {
			c.put(r)
		}
		return true
	}
	if r == nil {
		return false
	}
	defer c.put(r)
	var st unix.Stat_t
	err := retryEINTR(func() error { return unix.Fstatat(rfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
	return err == nil && st.Dev == e.dev && st.Ino == e.ino && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// closeAll closes every cached descriptor (those in use when their call ends).
func (c *dirCache) closeAll() { c.drop(".") }
