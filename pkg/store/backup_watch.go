package store

import (
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// errNoWatch: inotify could not watch a directory (no inotify, no /proc, the user's
// watch limit reached). The backup then compares fingerprints instead.
var errNoWatch = errors.New("inotify is not available")

// dirWatch is a backup's inotify instance: it watches the store directory (for
// kind directories made, removed or replaced) and each kind directory and blobs/ (for
// every name published, removed, created, written or changed in mode). The kernel
// queues an event in the system call that makes the change, before it returns, so
// once the backup holds the store lock every publication made before is in the
// queue. Each watched directory is held open (and watched through its descriptor),
// so the directory checked at its name is the one watched.
type dirWatch struct {
	mu   sync.Mutex // serializes drains and changes of the watches
	fd   int
	buf  []byte
	dirs map[string]*watchedDir
	byWd map[int32]string
}

type watchedDir struct {
	wd       int32
	f        fsx.File
	dev, ino uint64
	stale    bool // its watch ended, or it was moved: list it again
}

const (
	// watchKindMask: every change to a name in a kind directory or blobs/, and the
	// directory itself removed or moved.
	watchKindMask = syscall.IN_MOVED_TO | syscall.IN_MOVED_FROM | syscall.IN_DELETE | syscall.IN_CREATE |
		syscall.IN_MODIFY | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_ONLYDIR
	// watchRootMask: a kind directory made, removed or renamed in the store directory.
	watchRootMask = syscall.IN_MOVED_TO | syscall.IN_MOVED_FROM | syscall.IN_DELETE | syscall.IN_CREATE |
		syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_ONLYDIR
	watchEndMask = syscall.IN_IGNORED | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_UNMOUNT
)

func newDirWatch() (*dirWatch, error) {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, errNoWatch
	}
	return &dirWatch{fd: fd, buf: make([]byte, 64<<10), dirs: map[string]*watchedDir{}, byWd: map[int32]string{}}, nil
}

func (w *dirWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return
	}
	for d := range w.dirs {
		w.forgetLocked(d)
	}
	_ = syscall.Close(w.fd)
	w.fd = -1
}

func (w *dirWatch) forgetLocked(d string) {
	wdir := w.dirs[d]
	if wdir == nil {
		return
	}
	_, _ = syscall.InotifyRmWatch(w.fd, uint32(wdir.wd))
	wdir.f.Close()
	delete(w.byWd, wdir.wd)
	delete(w.dirs, d)
}

// current reports whether d, as found at its name (info; exists false: absent), is
// the directory watched and its watch still runs, or is absent and not watched.
func (w *dirWatch) current(d string, info fsx.Info, exists bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	wdir := w.dirs[d]
	if !exists {
		return wdir == nil
	}
	return wdir != nil && !wdir.stale && wdir.dev == info.Dev && wdir.ino == info.Ino
}

// watchDir makes sure the directory at d (if it exists) is the one watched: a new or
// replaced directory gets a new watch. Without inotify the backup falls back to
// comparing fingerprints (scan).
func (b *backup) watchDir(d string) error {
	w := b.watch
	if w == nil || b.scanning() {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	f, err := b.s.fs.OpenFile(d, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if fsx.IsNotExist(err) {
		w.forgetLocked(d)
		return nil
	}
	if err != nil {
		return invalidAt(d, err)
	}
	info, err := f.Stat()
	if err == nil {
		err = fsx.CheckPrivateDir(d, info)
	}
	if err != nil {
		f.Close()
		return invalidAt(d, err)
	}
	if old := w.dirs[d]; old != nil && !old.stale && old.dev == info.Dev && old.ino == info.Ino {
		f.Close()
		return nil
	}
	w.forgetLocked(d)
	mask := uint32(watchKindMask)
	if d == "." {
		mask = watchRootMask
	}
	wd, err := syscall.InotifyAddWatch(w.fd, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), mask)
	if err != nil {
		f.Close()
		b.degrade()
		if d == "." {
			return errNoWatch
		}
		return nil
	}
	w.dirs[d] = &watchedDir{wd: int32(wd), f: f, dev: info.Dev, ino: info.Ino}
	w.byWd[int32(wd)] = d
	return nil
}

// degrade switches the backup to comparing fingerprints (a watch could not be set).
func (b *backup) degrade() {
	b.mu.Lock()
	b.degraded = true
	b.rep.Watch = "scan"
	b.mu.Unlock()
}

// scanning reports whether changes are found by comparing fingerprints.
func (b *backup) scanning() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.watch == nil || b.degraded
}

// drain reads every queued event and marks what it names: a changed name dirty, a
// kind directory made, removed, moved or no longer watched to be listed again, and
// lost events (queue overflow) as every directory to be listed again.
func (b *backup) drain() {
	w := b.watch
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return
	}
	for {
		n, err := syscall.Read(w.fd, w.buf)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return
		}
		if err != nil || n <= 0 {
			b.mu.Lock()
			b.overflow = true
			b.mu.Unlock()
			return
		}
		b.events(w, w.buf[:n])
	}
}

// events applies a buffer of inotify events (struct inotify_event: wd, mask,
// cookie, len, name). Caller holds w.mu.
func (b *backup) events(w *dirWatch, buf []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for off := 0; off+16 <= len(buf); {
		wd := int32(binary.NativeEndian.Uint32(buf[off:]))
		mask := binary.NativeEndian.Uint32(buf[off+4:])
		l := int(binary.NativeEndian.Uint32(buf[off+12:]))
		end := min(off+16+l, len(buf))
		name := buf[off+16 : end]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		off = end
		if mask&syscall.IN_Q_OVERFLOW != 0 {
			b.overflow = true
			continue
		}
		d, ok := w.byWd[wd]
		if !ok {
			continue
		}
		if mask&watchEndMask != 0 {
			if d == "." {
				b.gone = invalidAt(".", errors.New("the store directory was moved or removed during the backup"))
				continue
			}
			w.dirs[d].stale = true
			b.rescan[d] = true
			continue
		}
		if len(name) == 0 {
			continue
		}
		nm := string(name)
		if d == "." {
			if slices.Contains(backupDirs, nm) {
				b.rescan[nm] = true
			}
			continue
		}
		if skip, err := skipName(d, nm); skip && err == nil {
			continue
		}
		b.dirty[d+"/"+nm] = struct{}{}
	}
}

// backupDrainEvery is how often drainInBackground drains (tests lengthen it).
var backupDrainEvery = 5 * time.Millisecond

// drainInBackground drains the events every few milliseconds while the backup runs,
// so that the kernel's queue (16,384 events by default) does not overflow during a
// long pass. The returned function stops it.
func (b *backup) drainInBackground() (stop func()) {
	if b.watch == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(backupDrainEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				b.drain()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
