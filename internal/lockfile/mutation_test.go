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

func links(fa *fsx.Faulty) int {
	n := 0
	for _, op := range fa.Log() {
		if op.Kind == fsx.OpLink {
			n++
		}
	}
	return n
}

// TestNegativeWaitIsOneAttempt: Wait < 0 makes exactly one attempt at a held lock.
func TestNegativeWaitIsOneAttempt(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	held := mustAcquire(t, fsys, lockfile.Options{})
	defer mustUnlock(t, held)
	fa := fsx.NewFaulty(fsys)
	if _, err := lockfile.Acquire(bg, fa, lockfile.Options{Wait: -1}); !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("Acquire(Wait -1) of a held lock: %v, want ErrBusy", err)
	}
	if n := links(fa); n != 1 {
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
	fa := fsx.NewFaulty(fsys)
	attempts := 0
	fa.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpLink {
			if attempts++; attempts == 2 {
				if err := held.Unlock(); err != nil {
					return err
				}
			}
		}
		return nil
	}
	l, err := lockfile.Acquire(bg, fa, lockfile.Options{})
	if err != nil {
		t.Fatalf("Acquire(zero Options) of a lock released at the second attempt: %v", err)
	}
	if attempts != 2 {
		t.Fatalf("acquired at attempt %d, want 2", attempts)
	}
	mustUnlock(t, l)
}

// TestFailedAcquireLeavesNoLock: whichever call of Acquire fails, no ".lock" is left
// behind — also when the failure comes after the link, which is undone.
func TestFailedAcquireLeavesNoLock(t *testing.T) {
	dir := t.TempDir()
	fa := fsx.NewFaulty(fsx.NewOS(dir))
	mustUnlock(t, mustAcquire(t, fa, lockfile.Options{}))
	total := len(fa.Log()) - 1 // the last call is Unlock's
	afterLink := false
	for n := 1; n <= total; n++ {
		dir := t.TempDir()
		fa := fsx.NewFaulty(fsx.NewOS(dir))
		fa.Inject = fsx.FailNth(n, syscall.EIO)
		l, err := lockfile.Acquire(bg, fa, lockfile.Options{Wait: -1})
		if err == nil {
			t.Fatalf("call %d failed with EIO: Acquire succeeded", n)
		}
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("call %d failed with EIO: %v", n, err)
		}
		if l != nil {
			t.Fatalf("call %d failed: Acquire returned a Lock with its error", n)
		}
		if got := listDir(t, dir); slices.Contains(got, lockfile.LockName) {
			t.Fatalf("call %d (%s %s) failed: left %v", n, fa.Log()[n-1].Kind, fa.Log()[n-1].Path, got)
		}
		afterLink = afterLink || n > 1 && fa.Log()[n-2].Kind == fsx.OpLink
	}
	if !afterLink {
		t.Fatal("no call after the link was failed")
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

// TestImmediateRetriesAreBounded: when ".lock" keeps vanishing before it can be
// inspected, Acquire retries at once only a few times (1 + 8 attempts), then obeys
// its wait bound. A context cancelled at the 50th attempt stops a runaway loop.
func TestImmediateRetriesAreBounded(t *testing.T) {
	dir := t.TempDir()
	lockPath := filepath.Join(dir, lockfile.LockName)
	fa := fsx.NewFaulty(fsx.NewOS(dir))
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	attempts := 0
	fa.Inject = func(op fsx.Op) error {
		switch {
		case op.Kind == fsx.OpLink:
			// Someone else's lock appears just before our link...
			if attempts++; attempts == 50 {
				cancel()
			}
			if err := os.WriteFile(lockPath, nil, 0o600); err != nil {
				return err
			}
		case op.Kind == fsx.OpRemove && lockfile.IsTempName(op.Path):
			// ...and is gone again when we look at it.
			if err := os.Remove(lockPath); err != nil {
				return err
			}
		}
		return nil
	}
	_, err := lockfile.Acquire(ctx, fa, lockfile.Options{Wait: -1})
	if !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("Acquire: %v, want ErrBusy", err)
	}
	if attempts != 9 {
		t.Fatalf("%d attempts, want 9", attempts)
	}
}

// TestLockChangedRightAfterLink: when ".lock" is removed or replaced between our link
// and our check, Acquire fails with ErrLost saying which, and leaves the other file.
func TestLockChangedRightAfterLink(t *testing.T) {
	for _, tc := range []struct {
		name, says string
		change     func(lockPath string) error
		left       []string
	}{
		{"removed", "vanished", os.Remove, nil},
		{"replaced", "replaced", func(lockPath string) error {
			other := filepath.Join(filepath.Dir(lockPath), "other")
			if err := os.WriteFile(other, nil, 0o600); err != nil {
				return err
			}
			return os.Rename(other, lockPath)
		}, []string{lockfile.LockName}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lockPath := filepath.Join(dir, lockfile.LockName)
			fa := fsx.NewFaulty(fsx.NewOS(dir))
			linked := false
			fa.Inject = func(op fsx.Op) error {
				if op.Kind == fsx.OpLink {
					linked = true
				} else if linked && op.Kind == fsx.OpRemove && lockfile.IsTempName(op.Path) {
					linked = false
					return tc.change(lockPath)
				}
				return nil
			}
			_, err := lockfile.Acquire(bg, fa, lockfile.Options{Wait: -1})
			if !errors.Is(err, lockfile.ErrLost) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Acquire: %v, want ErrLost saying %q", err, tc.says)
			}
			if got := listDir(t, dir); !slices.Equal(got, tc.left) {
				t.Fatalf("left %v, want %v", got, tc.left)
			}
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
