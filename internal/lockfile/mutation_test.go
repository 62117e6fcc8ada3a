package lockfile_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
)

// TestNegativeWaitIsOneAttempt: Wait < 0 makes exactly one attempt at a held lock.
func TestNegativeWaitIsOneAttempt(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	held := mustAcquire(t, fsys, lockfile.Options{})
	defer mustUnlock(t, held)
	c := &countingFS{FS: fsys}
	if _, err := lockfile.Acquire(bg, c, lockfile.Options{Wait: -1}); !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("Acquire(Wait -1) of a held lock: %v, want ErrBusy", err)
	}
	if n := c.opens.Load(); n != 1 {
		t.Fatalf("Acquire(Wait -1) made %d attempts, want 1", n)
	}
}

// TestNegativeWaitStillBreaksStaleLock: breaking a stale lock is progress, so even a
// single-attempt Acquire retries at once after it and gets the lock.
func TestNegativeWaitStillBreaksStaleLock(t *testing.T) {
	dir := t.TempDir()
	writeLock(t, dir, &lockfile.Holder{Pid: os.Getpid(), Host: hostname(t), Time: time.Now()})
	l, err := lockfile.Acquire(bg, fsx.NewOS(dir), lockfile.Options{Wait: -1})
	if err != nil {
		t.Fatalf("Acquire(Wait -1) over a stale lock: %v", err)
	}
	mustUnlock(t, l)
}

// TestZeroWaitWaits: the zero Options wait (the 2 s default) for a lock released
// while they wait. The holder lets go at the second attempt, deterministically.
func TestZeroWaitWaits(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	held := mustAcquire(t, fsys, lockfile.Options{})
	c := &countingFS{FS: fsys}
	c.afterOpen = func(n int32) {
		if n == 2 {
			if err := held.Unlock(); err != nil {
				t.Error(err)
			}
		}
	}
	l, err := lockfile.Acquire(bg, c, lockfile.Options{})
	if err != nil {
		t.Fatalf("Acquire(zero Options) of a lock released at the second attempt: %v", err)
	}
	if n := c.opens.Load(); n != 2 {
		t.Fatalf("acquired at attempt %d, want 2", n)
	}
	mustUnlock(t, l)
}

// TestFailedAcquireLeavesNoLock: whichever call of Acquire fails — making ".lock",
// taking over a stale one, or writing the holder's details — Acquire returns that
// error and no Lock, and nothing is left held: the lock says free (or was never made),
// and the next Acquire gets it at once.
func TestFailedAcquireLeavesNoLock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
	}{
		{"first", func(*testing.T, string) {}},
		{"free", func(t *testing.T, dir string) { mustUnlock(t, mustAcquire(t, fsx.NewOS(dir), lockfile.Options{})) }},
		{"stale", func(t *testing.T, dir string) {
			writeLock(t, dir, &lockfile.Holder{Pid: os.Getpid(), Host: hostname(t), Time: time.Now()})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			fa := fsx.NewFaulty(fsx.NewOS(dir))
			mustUnlock(t, mustAcquire(t, fa, lockfile.Options{}))
			total := len(fa.Log()) - 2 // the last two calls are Unlock's
			holderWrite := false
			for n := 1; n <= total; n++ {
				dir := t.TempDir()
				tc.setup(t, dir)
				fa := fsx.NewFaulty(fsx.NewOS(dir))
				fa.Inject = fsx.FailNth(n, syscall.EIO)
				l, err := lockfile.Acquire(bg, fa, lockfile.Options{Wait: -1})
				failed := fa.Log()[n-1]
				if err == nil || !errors.Is(err, syscall.EIO) || l != nil {
					t.Fatalf("call %d (%s %s) failed with EIO: Acquire = %v, %v", n, failed.Kind, failed.Path, l, err)
				}
				st, err := lockfile.Inspect(fsx.NewOS(dir), lockfile.Options{})
				if err != nil || st.Live || st.Present && !st.Stale {
					t.Fatalf("call %d (%s %s) failed: left the lock %+v, %v", n, failed.Kind, failed.Path, st, err)
				}
				mustUnlock(t, mustAcquire(t, fsx.NewOS(dir), lockfile.Options{Wait: -1}))
				holderWrite = holderWrite || failed.Kind == fsx.OpWrite && failed.Path == lockfile.LockName && !strings.HasPrefix(string(failed.Data), freeRecord)
			}
			if !holderWrite {
				t.Fatal("the write of the holder's details was not failed")
			}
		})
	}
}

func writeOrphan(t *testing.T, dir, name string, mtime time.Time) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// TestCleanOrphansReportsAndCarriesOn: a removal that fails is reported, and the other
// orphans are still removed.
func TestCleanOrphansReportsAndCarriesOn(t *testing.T) {
	dir := t.TempDir()
	first := ".lock-0f8fad5b-d9cb-469f-a165-70867728950e.tmp"
	second := ".lock-7c9e6679-7425-40de-944b-e07fc1f90ae7.tmp"
	old := time.Now().Add(-time.Hour)
	writeOrphan(t, dir, first, old)
	writeOrphan(t, dir, second, old)
	fa := fsx.NewFaulty(fsx.NewOS(dir))
	fa.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpRemove && op.Path == first {
			return syscall.EIO
		}
		return nil
	}
	removed, err := lockfile.CleanOrphans(fa, lockfile.Options{})
	if !errors.Is(err, syscall.EIO) || !slices.Equal(removed, []string{second}) {
		t.Fatalf("CleanOrphans = %v, %v; want [%s], EIO", removed, err, second)
	}
	if got := listDir(t, dir); !slices.Equal(got, []string{first}) {
		t.Fatalf("left %v, want only %s", got, first)
	}
	fa.Inject = nil
	if removed, err := lockfile.CleanOrphans(fa, lockfile.Options{}); err != nil || !slices.Equal(removed, []string{first}) {
		t.Fatalf("CleanOrphans without faults = %v, %v", removed, err)
	}
}

// TestCleanOrphansAgeBoundary: an orphan exactly Options.Stale old is kept; one a
// nanosecond older is removed.
func TestCleanOrphansAgeBoundary(t *testing.T) {
	dir := t.TempDir()
	name := ".lock-0f8fad5b-d9cb-469f-a165-70867728950e.tmp"
	mtime := time.Unix(time.Now().Add(-time.Hour).Unix(), 0)
	writeOrphan(t, dir, name, mtime)
	fsys := fsx.NewOS(dir)
	at := func(now time.Time) lockfile.Options {
		return lockfile.Options{Stale: time.Minute, Now: func() time.Time { return now }}
	}
	if removed, err := lockfile.CleanOrphans(fsys, at(mtime.Add(time.Minute))); err != nil || len(removed) != 0 {
		t.Fatalf("orphan exactly Stale old: CleanOrphans = %v, %v", removed, err)
	}
	if removed, err := lockfile.CleanOrphans(fsys, at(mtime.Add(time.Minute+1))); err != nil || !slices.Equal(removed, []string{name}) {
		t.Fatalf("orphan just past Stale: CleanOrphans = %v, %v", removed, err)
	}
}

// failingReadDir is an FS whose directory listings fail.
type failingReadDir struct{ fsx.FS }

func (failingReadDir) ReadDir(string) ([]fsx.DirEntry, error) { return nil, syscall.EIO }

// TestListErrorsReported: Inspect and CleanOrphans report a failed listing of the
// root, and Inspect still reports the lock it saw.
func TestListErrorsReported(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	held := mustAcquire(t, fsys, lockfile.Options{})
	defer mustUnlock(t, held)
	st, err := lockfile.Inspect(failingReadDir{fsys}, lockfile.Options{})
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("Inspect with a failing listing: %v, want EIO", err)
	}
	if !st.Present || !st.Live {
		t.Fatalf("Inspect with a failing listing: %+v, want the live lock", st)
	}
	if _, err := lockfile.CleanOrphans(failingReadDir{fsys}, lockfile.Options{}); !errors.Is(err, syscall.EIO) {
		t.Fatalf("CleanOrphans with a failing listing: %v, want EIO", err)
	}
}

// TestImmediateRetriesAreBounded: when ".lock" keeps being replaced before it can be
// checked, Acquire retries at once only a few times (1 + 8 attempts), then obeys its
// wait bound. A context cancelled at the 50th attempt stops a runaway loop.
func TestImmediateRetriesAreBounded(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	mustUnlock(t, mustAcquire(t, fsys, lockfile.Options{}))
	lockPath := filepath.Join(dir, lockfile.LockName)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	c := &countingFS{FS: fsys}
	c.afterOpen = func(n int32) {
		if n == 50 {
			cancel()
		}
		// Someone replaces the lock file right after we opened it.
		other := filepath.Join(dir, "other")
		if err := os.WriteFile(other, []byte(freeRecord), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Rename(other, lockPath); err != nil {
			t.Error(err)
		}
	}
	_, err := lockfile.Acquire(ctx, c, lockfile.Options{Wait: -1})
	if !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("Acquire: %v, want ErrBusy", err)
	}
	if n := c.opens.Load(); n != 9 {
		t.Fatalf("%d attempts, want 9", n)
	}
}

// TestLockChangedWhileOpening: when ".lock" is removed or replaced between our open
// and our check, Acquire never keeps the flock of a file ".lock" does not name: it
// tries again, and holds the file ".lock" names at the end.
func TestLockChangedWhileOpening(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(lockPath string) error
	}{
		{"removed", os.Remove},
		{"replaced", func(lockPath string) error {
			other := filepath.Join(filepath.Dir(lockPath), "other")
			if err := os.WriteFile(other, []byte(freeRecord), 0o600); err != nil {
				return err
			}
			return os.Rename(other, lockPath)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fsys := fsx.NewOS(dir)
			mustUnlock(t, mustAcquire(t, fsys, lockfile.Options{}))
			lockPath := filepath.Join(dir, lockfile.LockName)
			old := lstat(t, lockPath).Ino
			c := &countingFS{FS: fsys}
			c.afterOpen = func(n int32) {
				if n == 1 {
					if err := tc.change(lockPath); err != nil {
						t.Error(err)
					}
				}
			}
			l, err := lockfile.Acquire(bg, c, lockfile.Options{Wait: -1})
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if err := l.Check(); err != nil {
				t.Fatalf("Check: %v", err)
			}
			if n := c.opens.Load(); n != 2 {
				t.Fatalf("%d opens, want 2", n)
			}
			if got := lstat(t, lockPath).Ino; got == old && tc.name == "replaced" {
				t.Fatal(".lock was not replaced") // (a removed inode's number may be reused)
			}
			if h := readHolder(t, dir); h.Pid != os.Getpid() {
				t.Fatalf(".lock says %+v: the lock taken is not the one .lock names", h)
			}
			mustUnlock(t, l)
			checkFree(t, dir)
		})
	}
}

// slashRoot is an FS whose Root ends in "/", as the root directory's does.
type slashRoot struct{ fsx.FS }

func (s slashRoot) Root() string { return s.FS.Root() + "/" }

// TestPathsUnderASlashRoot: paths in messages are root and name joined by one "/",
// also when the root already ends in one.
func TestPathsUnderASlashRoot(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	held := mustAcquire(t, fsys, lockfile.Options{})
	defer mustUnlock(t, held)
	_, err := lockfile.Acquire(bg, slashRoot{fsys}, lockfile.Options{Wait: -1})
	if !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("Acquire: %v, want ErrBusy", err)
	}
	if want := dir + "/" + lockfile.LockName + " "; !strings.Contains(err.Error(), want) {
		t.Fatalf("busy error %q does not name %q", err, want)
	}
}
