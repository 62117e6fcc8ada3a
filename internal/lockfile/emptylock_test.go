package lockfile_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
)

// contend runs workers goroutines, released together by a start gate once all of them
// are started, that each take
// the lock of dir rounds times through their own fsx.OS (each Acquire opens its own
// descriptor: to flock, as many processes). Inside, each checks that it is alone and
// that ".lock" holds its own holder details (nobody wrote over them). Worker w's clock
// stands at base+w ns, so that holders' details differ. started, if set, is closed
// after the first hold of any worker. It returns the errors met.
func contend(t *testing.T, dir string, workers, rounds int, base time.Time, started chan<- struct{}) []error {
	t.Helper()
	start := make(chan struct{})
	var inside atomic.Int32
	var once sync.Once
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Go(func() {
			fsys := fsx.NewOS(dir)
			now := base.Add(time.Duration(w))
			// Stale is an hour and the clock stands still: only the flock and the record
			// decide. Wait is a bound, not a sleep: the holds are microseconds.
			o := lockfile.Options{Wait: 30 * time.Second, Stale: time.Hour, Now: func() time.Time { return now }}
			<-start
			for range rounds {
				l, err := lockfile.Acquire(bg, fsys, o)
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				if n := inside.Add(1); n != 1 {
					errs <- fmt.Errorf("worker %d: %d holders at once", w, n)
				}
				if err := ownRecord(dir, l); err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
				}
				inside.Add(-1)
				if err := l.Unlock(); err != nil {
					errs <- fmt.Errorf("worker %d: Unlock: %w", w, err)
					return
				}
				if started != nil {
					once.Do(func() { close(started) })
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// ownRecord checks that ".lock" holds exactly the holder details l wrote.
func ownRecord(dir string, l *lockfile.Lock) error {
	h, err := readHolderErr(dir)
	if err != nil {
		return err
	}
	if want := l.Holder(); h.Pid != want.Pid || !h.Time.Equal(want.Time) || h.Host != want.Host {
		return fmt.Errorf(".lock holds %+v while %+v holds the lock", h, want)
	}
	return nil
}

func readHolderErr(dir string) (lockfile.Holder, error) {
	var h lockfile.Holder
	b, err := os.ReadFile(filepath.Join(dir, lockfile.LockName))
	if err != nil {
		return h, err
	}
	return h, json.Unmarshal(b, &h)
}

// Many writers meet at once a ".lock" left empty by a power cut (its first contents
// never fsynced) and dated now (a file-system shutdown and remount, no reboot: the boot
// rule does not apply), with a clock that stands still and an hour's stale bound: all
// of them find it empty, or torn, at the same moment. The flock lets one of them
// take it over in place; every one gets the lock in turn, each alone, none waits for
// the stale bound, and no holder's details are written over. On the code before the
// fix each worker waited its whole Wait and got ErrBusy.
func TestEmptyLockManyContenders(t *testing.T) {
	for _, content := range []string{"", `{"pid":12,"ho`} {
		t.Run(fmt.Sprintf("%q", content), func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, lockfile.LockName), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, err := range contend(t, dir, 16, 20, time.Now(), nil) {
				t.Error(err)
			}
			checkFree(t, dir)
		})
	}
}

// pausingFS pauses the first Acquire that makes ".lock" — the creator — at one point
// of the creation: "write" (its temp exists, empty, before its first contents are
// written: the window in which an implementation that made ".lock" itself with O_EXCL
// would show it empty) or "link" (".lock" exists, before the temp's unlink and the
// directory fsync).
type pausingFS struct {
	fsx.FS
	at      string
	armed   atomic.Bool
	reached chan struct{} // closed when the creator is paused
	resume  chan struct{} // closed to let it go on
}

func newPausingFS(dir, at string) *pausingFS {
	p := &pausingFS{FS: fsx.NewOS(dir), at: at, reached: make(chan struct{}), resume: make(chan struct{})}
	p.armed.Store(true)
	return p
}

func (p *pausingFS) pause() {
	close(p.reached)
	<-p.resume
}

func (p *pausingFS) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	f, err := p.FS.OpenFile(name, flag, perm)
	creating := lockfile.IsTempName(name) || name == lockfile.LockName && flag&syscall.O_CREAT != 0
	if err == nil && p.at == "write" && creating && p.armed.CompareAndSwap(true, false) {
		return &pausingFile{File: f, p: p}, nil
	}
	return f, err
}

func (p *pausingFS) Link(oldname, newname string) error {
	err := p.FS.Link(oldname, newname)
	if err == nil && p.at == "link" && p.armed.CompareAndSwap(true, false) {
		p.pause()
	}
	return err
}

type pausingFile struct {
	fsx.File
	p *pausingFS
}

func (f *pausingFile) Write(b []byte) (int, error) {
	f.p.pause()
	return f.File.Write(b)
}

// The take-at-once rule is safe while ".lock" is being made: no writer ever sees a
// ".lock" before its first contents are written (the creator writes and fsyncs a temp
// and links it), and the creator writes ".lock" only through the flock afterwards.
// The creator is held at each point of the creation while 16 writers, released by a
// start gate, take the lock over and over; it is let go after their first hold. Every
// writer and the creator get the lock, each alone, and each finds its own details in
// ".lock" while it holds it. (This passes on the code before the fix as well: it
// shows that taking an empty lock at once cannot meet a creator in its window.)
func TestCreatorWindowIsSafe(t *testing.T) {
	for _, at := range []string{"write", "link"} {
		t.Run(at, func(t *testing.T) {
			dir := t.TempDir()
			pfs := newPausingFS(dir, at)
			base := time.Now()
			creatorNow := base.Add(time.Hour)
			creator := make(chan error, 1)
			go func() {
				l, err := lockfile.Acquire(bg, pfs, lockfile.Options{Wait: 30 * time.Second, Stale: time.Hour, Now: func() time.Time { return creatorNow }})
				if err == nil {
					err = errors.Join(ownRecord(dir, l), l.Unlock())
				}
				creator <- err
			}()
			<-pfs.reached
			switch b, err := os.ReadFile(filepath.Join(dir, lockfile.LockName)); {
			case at == "write" && !os.IsNotExist(err):
				t.Fatalf("the creator's temp is not written yet and .lock is visible: %q, %v", b, err)
			case at == "link" && (err != nil || len(b) < 512 || string(b[:len(freeRecord)]) != freeRecord):
				t.Fatalf(".lock is visible without its whole first contents: %q, %v", b, err)
			}
			started := make(chan struct{})
			go func() {
				<-started
				close(pfs.resume)
			}()
			for _, err := range contend(t, dir, 16, 20, base, started) {
				t.Error(err)
			}
			if err := <-creator; err != nil {
				t.Fatalf("creator: %v", err)
			}
			checkFree(t, dir)
		})
	}
}

// BenchmarkTakeEmptyLock: the first Acquire after a power cut left ".lock" empty (and
// dated now), then its Unlock. On the code before the fix it was ErrBusy for the
// whole stale bound (30 s).
func BenchmarkTakeEmptyLock(b *testing.B) {
	dir := b.TempDir()
	fsys := fsx.NewOS(dir)
	p := filepath.Join(dir, lockfile.LockName)
	for b.Loop() {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		l, err := lockfile.Acquire(bg, fsys, lockfile.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(); err != nil {
			b.Fatal(err)
		}
	}
}
