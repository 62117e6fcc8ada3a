// Package lockfile is the store's writer lock (DESIGN §6): a file named ".lock" in the
// root of an fsx.FS that is present only while a writer holds the store.
//
// # Protocol
//
// A writer makes ".lock" appear already locked. It creates a private temp
// ".lock-<uuid>.tmp" (O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW, 0600) in the root, writes its
// holder info (a JSON Holder: pid, host, boot id, process start time, time), takes an
// exclusive flock(2) on it (github.com/gofrs/flock, opened by path with
// O_RDONLY|O_NOFOLLOW|O_NONBLOCK and never O_CREAT; the descriptor it locks is checked to
// be the temp it created), link(2)s it to ".lock" — which fails with EEXIST exactly like
// the O_CREAT|O_EXCL that other implementations use on the same path — unlinks the temp,
// and checks that ".lock" names the inode it holds. Release is: check, unlink ".lock",
// release the flock and close. A holder therefore holds the flock of the inode that
// ".lock" names for as long as ".lock" names it.
//
// A contender that meets EEXIST inspects ".lock". It refuses (ErrInvalid) a ".lock" that
// is a symbolic link, not a regular file, or owned by another user; it never follows,
// opens for writing, or removes such a file. Otherwise it tries the flock of ".lock":
//
//   - held by someone: the lock is live. It is never broken, whatever its age.
//   - free: nobody of this implementation holds it. The lock is stale when
//     (a) its holder info names this host (Options.Host) and that holder is gone: its pid
//     does not exist (kill(pid, 0) = ESRCH), is a zombie, was reused (its start time in
//     /proc/<pid>/stat differs from the recorded one), the host rebooted since (the
//     recorded boot id differs), or the pid is this very process (which holds the flock
//     of every lock it holds, so a free flock means a leaked lock); or
//     (b) it is older than Options.Stale — age from the recorded time, or from the
//     file's mtime when there is no parseable holder info (an empty ".lock" made with
//     O_CREAT|O_EXCL by another implementation is honoured until then); or
//     (c) its mtime lies before this host's last boot: after a power cut the lock's
//     holder info — never fsynced — may be empty or torn, and no holder survives a
//     reboot.
//     A lock that is not stale is waited for like a live one. Rule (a) trusts host
//     names to be unique among the hosts that share a store; it never overrides a
//     held flock.
//
// A stale lock is broken safely: while holding its flock, the contender confirms that
// ".lock" still names the same inode (it keeps the inode open, so the number cannot be
// reused), unlinks it, releases, and retries. A writer killed with SIGKILL releases its
// flock in the kernel, so its lock is broken at once on the same host (rule a) and after
// Options.Stale anywhere (rule b): the store never wedges.
//
// Waiting is bounded: retries back off from about 1 ms, doubling to about 50 ms, with
// jitter, for at most Options.Wait (default 2 s, measured on the monotonic clock) and
// never past ctx; then Acquire returns ErrBusy naming the holder's pid and host.
//
// # What a caller may rely on
//
//   - Between a successful Acquire and Unlock, no other caller of this package — another
//     process or another goroutine of this one (flock belongs to an open file
//     description, and each Acquire opens its own) — holds the lock, as long as nobody
//     tampers with ".lock" by other means. Lock.Check detects such tampering (ErrLost);
//     the store calls it before publishing.
//   - A live lock (flock held) is never broken, by Acquire, BreakStale or CleanOrphans.
//   - Inspect changes nothing on disk.
//
// # Durability
//
// Nothing here is fsynced: neither the temp nor the root directory. A lock is a
// property of running processes, and a lock that does not survive a crash is correct.
// After a power cut ".lock" may be missing, or present with empty or partial holder
// info; the latter is broken as stale once older than Options.Stale (or at once by the
// boot-id rule when the holder info survived). Removals of stale locks and orphan temps
// are likewise not durable, which is harmless: a resurrected stale lock is stale again.
//
// # Orphans
//
// A crash between creating the temp and linking it leaves an orphan ".lock-<uuid>.tmp"
// and no ".lock". Acquire, once it holds the lock, removes (best effort) every lock temp
// older than Options.Stale whose flock is free; CleanOrphans does the same on demand and
// Inspect lists lock temps. IsTempName recognises their names (they are not
// fsx.IsTempName names).
//
// No network I/O and no unbounded work is done here; the caller must not do any while
// holding the lock either (DESIGN §6).
package lockfile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/gofrs/flock"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// LockName is the name of the lock file in the root of the store.
const LockName = ".lock"

// Lock temps are named TempPrefix + <uuid> + TempSuffix.
const (
	TempPrefix = ".lock-"
	TempSuffix = ".tmp"
)

// Defaults for Options.
const (
	DefaultWait  = 2 * time.Second
	DefaultStale = 30 * time.Second
)

// Bounds of the backoff between attempts.
const (
	backoffMin = time.Millisecond
	backoffMax = 50 * time.Millisecond
)

// maxHolderSize bounds how much of a lock file is read for its holder info. A larger
// file is treated as having no parseable holder info.
const maxHolderSize = 4096

// The errors of this package; test with errors.Is. The store maps them to its codes
// (ErrBusy → OUTBOX_STORE_BUSY, ErrInvalid → OUTBOX_STORE_INVALID).
var (
	// ErrBusy: the lock stayed held (live, or present and not stale) for the whole
	// wait bound. The message names the holder's pid and host when known.
	ErrBusy = errors.New("lockfile: store is locked by another writer")
	// ErrLost: ".lock" no longer names the inode this Lock holds (someone removed or
	// replaced it by means other than this package), or the Lock was already released.
	ErrLost = errors.New("lockfile: lock lost")
	// ErrInvalid: ".lock" (or a file this package created) is a symbolic link, not a
	// regular file, or owned by another user. Nothing was followed or removed.
	ErrInvalid = errors.New("lockfile: invalid lock file")
)

// Options tune Acquire, Inspect, BreakStale and CleanOrphans. The zero value means the
// defaults.
type Options struct {
	// Wait bounds how long Acquire waits for a held lock (default 2 s). A negative
	// Wait means a single attempt, no waiting.
	Wait time.Duration
	// Stale is the age past which an unflocked lock or lock temp is stale whatever its
	// holder info says (default 30 s; lock holds are milliseconds). Zero or negative
	// means the default.
	Stale time.Duration
	// Now is the clock for holder times and ages (default time.Now). It is not used for
	// the wait bound, which is always measured on the monotonic clock.
	Now func() time.Time
	// Host is this host's name for holder info and the same-host rule (default
	// os.Hostname; if that fails, the empty string, which disables the pid rule).
	Host string
}

func (o Options) withDefaults() Options {
	if o.Wait == 0 {
		o.Wait = DefaultWait
	}
	if o.Stale <= 0 {
		o.Stale = DefaultStale
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Host == "" {
		o.Host = hostname()
	}
	return o
}

// Lock is a held lock. A Lock is used by one goroutine.
type Lock struct {
	fsys     fsx.FS
	fl       *flock.Flock
	dev, ino uint64
	holder   Holder
	released bool
}

// Holder returns the holder info this Lock wrote.
func (l *Lock) Holder() Holder { return l.holder }

// Acquire takes the lock of the store rooted at fsys, waiting as described in the
// package documentation. It returns ErrBusy (wrapped, naming the holder) when the wait
// bound passes, ctx's error (wrapped) when ctx ends first, ErrInvalid for a planted
// ".lock", and the file-system error of any failed call otherwise; on every error,
// nothing of this attempt is left held and, unless a cleanup call failed too, nothing is
// left on disk. The caller must call Unlock (or use With).
func Acquire(ctx context.Context, fsys fsx.FS, opts Options) (*Lock, error) {
	o := opts.withDefaults()
	deadline := time.Now().Add(o.Wait)
	if o.Wait < 0 {
		deadline = time.Now()
	}
	delay := backoffMin
	var holder *Holder
	seen := false // we met a lock at least once
	immediate := 0
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("lockfile: waiting for %s: %w", lockPath(fsys), err)
		}
		l, res, h, err := tryOnce(fsys, o)
		switch res {
		case resAcquired:
			_, _ = cleanOrphans(fsys, o) // best effort, under the lock
			return l, nil
		case resFailed:
			return nil, err
		case resBusy:
			holder, seen = h, true
			immediate = 0
		case resRetry:
			// The lock vanished, changed or was just broken: try again at once, a
			// few times (even past the deadline: progress was made), before falling
			// back to the backoff.
			if immediate < 8 {
				immediate++
				continue
			}
			immediate = 0
		}
		now := time.Now()
		if !now.Before(deadline) {
			return nil, busyError(fsys, holder, seen)
		}
		d := delay/2 + rand.N(delay/2+1)
		if rest := deadline.Sub(now); d > rest {
			d = rest
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("lockfile: waiting for %s: %w", lockPath(fsys), ctx.Err())
		case <-t.C:
		}
		delay = min(delay*2, backoffMax)
	}
}

func busyError(fsys fsx.FS, h *Holder, seen bool) error {
	switch {
	case h != nil:
		return fmt.Errorf("%w: %s held by pid %d on host %q", ErrBusy, lockPath(fsys), h.Pid, h.Host)
	case seen:
		return fmt.Errorf("%w: %s held (no holder info)", ErrBusy, lockPath(fsys))
	default:
		return fmt.Errorf("%w: %s", ErrBusy, lockPath(fsys))
	}
}

type result int

const (
	resFailed result = iota
	resAcquired
	resBusy  // the lock is held (live, or not stale): wait
	resRetry // something changed under us: try again
)

// tryOnce makes one attempt: temp, flock, link, unlink temp, verify; on EEXIST it
// inspects the existing lock and breaks it if stale.
func tryOnce(fsys fsx.FS, o Options) (*Lock, result, *Holder, error) {
	name := newTempName()
	f, err := fsys.OpenFile(name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o600)
	if err != nil {
		if fsx.IsExist(err) { // a uuid collision: never, but harmless
			return nil, resRetry, nil, nil
		}
		return nil, resFailed, nil, err
	}
	holder := newHolder(o)
	data, _ := json.Marshal(holder) // cannot fail
	_, err = f.Write(append(data, '\n'))
	tinfo, serr := f.Stat()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = serr
	}
	if err != nil {
		removeQuiet(fsys, name)
		return nil, resFailed, nil, err
	}

	fl := newFlock(fsys, name)
	ok, err := fl.TryLock()
	switch {
	case err != nil && fsx.Errno(err) == syscall.ENOENT:
		// Our temp was removed (an orphan sweep with a clock far ahead): try again.
		return nil, resRetry, nil, nil
	case err != nil:
		removeQuiet(fsys, name)
		return nil, resFailed, nil, fmt.Errorf("lockfile: flock %s: %w", fl.Path(), err)
	case !ok:
		// An orphan sweeper holds our fresh temp: it will remove it; so do we.
		removeQuiet(fsys, name)
		return nil, resRetry, nil, nil
	}
	if st, ok := flockStat(fl); !ok || st.Dev != tinfo.Dev || st.Ino != tinfo.Ino {
		release(fl)
		return nil, resFailed, nil, fmt.Errorf("%w: %s was replaced after it was created", ErrInvalid, fl.Path())
	}

	err = fsys.Link(name, LockName)
	switch {
	case err == nil:
	case fsx.IsExist(err):
		rerr := fsys.Remove(name)
		release(fl)
		if rerr != nil && !fsx.IsNotExist(rerr) {
			return nil, resFailed, nil, rerr
		}
		return contend(fsys, o)
	case fsx.IsNotExist(err) && fsx.Errno(lstatErr(fsys, name)) == syscall.ENOENT:
		// Our temp vanished (see above); the root itself is still there.
		release(fl)
		return nil, resRetry, nil, nil
	default:
		removeQuiet(fsys, name)
		release(fl)
		return nil, resFailed, nil, err
	}

	// ".lock" names our flocked inode: nobody following the protocol can break it now.
	l := &Lock{fsys: fsys, fl: fl, dev: tinfo.Dev, ino: tinfo.Ino, holder: holder}
	if err := fsys.Remove(name); err != nil && !fsx.IsNotExist(err) {
		l.undo()
		removeQuiet(fsys, name)
		return nil, resFailed, nil, err
	}
	info, err := fsys.Lstat(LockName)
	if err == nil && (!info.IsRegular() || info.Dev != l.dev || info.Ino != l.ino) {
		err = fmt.Errorf("%w: %s was replaced right after it was linked", ErrLost, lockPath(fsys))
	}
	if err == nil {
		if st, ok := flockStat(fl); !ok || st.Nlink == 0 {
			err = fmt.Errorf("%w: %s: our inode has no links", ErrLost, lockPath(fsys))
		}
	}
	if err != nil {
		if fsx.IsNotExist(err) {
			err = fmt.Errorf("%w: %s vanished right after it was linked", ErrLost, lockPath(fsys))
		}
		l.undo()
		return nil, resFailed, nil, err
	}
	return l, resAcquired, nil, nil
}

// contend handles an existing ".lock": invalid, live, held-not-stale or stale.
func contend(fsys fsx.FS, o Options) (*Lock, result, *Holder, error) {
	p, err := probe(fsys, o)
	switch {
	case errors.Is(err, errChanged):
		return nil, resRetry, nil, nil
	case err != nil:
		return nil, resFailed, nil, err
	case !p.present:
		return nil, resRetry, nil, nil
	case p.live:
		return nil, resBusy, p.holder, nil
	case !isStale(p, o):
		release(p.fl)
		return nil, resBusy, p.holder, nil
	}
	if err := breakHeld(fsys, p); err != nil && !errors.Is(err, errChanged) {
		return nil, resFailed, nil, err
	}
	return nil, resRetry, nil, nil
}

// undo removes ".lock" if it still names our inode (we hold its flock, so nobody
// else will touch it), then releases the flock. Used on failure after the link.
func (l *Lock) undo() {
	if info, err := l.fsys.Lstat(LockName); err == nil && info.Dev == l.dev && info.Ino == l.ino {
		_ = l.fsys.Remove(LockName)
	}
	release(l.fl)
	l.released = true
}

// Check returns nil if ".lock" still names the inode this Lock holds, and an error
// wrapping ErrLost if it does not (removed or replaced behind our back) or if the Lock
// was released. Any other error is the Lstat's. The store calls Check before
// publishing anything.
func (l *Lock) Check() error {
	if l.released {
		return fmt.Errorf("%w: %s already released", ErrLost, lockPath(l.fsys))
	}
	return l.verify()
}

func (l *Lock) verify() error {
	info, err := l.fsys.Lstat(LockName)
	switch {
	case fsx.IsNotExist(err):
		return fmt.Errorf("%w: %s was removed", ErrLost, lockPath(l.fsys))
	case err != nil:
		return err
	case !info.IsRegular() || info.Dev != l.dev || info.Ino != l.ino:
		return fmt.Errorf("%w: %s was replaced", ErrLost, lockPath(l.fsys))
	}
	return nil
}

// Unlock releases the lock: it checks that ".lock" still names our inode (else an
// error wrapping ErrLost, and ".lock" is left alone), unlinks it, then releases the
// flock and closes the descriptor. The flock is released whatever happens. Unlock is
// idempotent: after the first call it returns nil. The unlink is not fsynced (see the
// package documentation).
func (l *Lock) Unlock() error {
	if l == nil || l.released {
		return nil
	}
	l.released = true
	err := l.verify()
	if err == nil {
		if rerr := l.fsys.Remove(LockName); rerr != nil {
			if fsx.IsNotExist(rerr) {
				err = fmt.Errorf("%w: %s was removed", ErrLost, lockPath(l.fsys))
			} else {
				err = rerr
			}
		}
	}
	if uerr := release(l.fl); err == nil && uerr != nil {
		err = fmt.Errorf("lockfile: release %s: %w", lockPath(l.fsys), uerr)
	}
	return err
}

// With runs fn while holding the lock and always unlocks afterwards, even if fn
// panics. Its error is Acquire's, or fn's joined with Unlock's (errors.Join: both stay
// reachable with errors.Is). An ErrLost from Unlock means fn ran while the lock may
// not have been exclusive.
func With(ctx context.Context, fsys fsx.FS, opts Options, fn func() error) (err error) {
	l, err := Acquire(ctx, fsys, opts)
	if err != nil {
		return err
	}
	defer func() {
		if uerr := l.Unlock(); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return fn()
}

// IsTempName reports whether base has the shape of a lock temp, ".lock-<uuid>.tmp".
func IsTempName(base string) bool {
	if len(base) <= len(TempPrefix)+len(TempSuffix) || base[:len(TempPrefix)] != TempPrefix || base[len(base)-len(TempSuffix):] != TempSuffix {
		return false
	}
	// fsx.IsTempName checks ".<uuid>.tmp".
	return fsx.IsTempName(fsx.TempPrefix + base[len(TempPrefix):])
}

func newTempName() string {
	t := fsx.TempName() // ".<uuid>.tmp"
	return TempPrefix + t[len(fsx.TempPrefix):]
}

func lockPath(fsys fsx.FS) string { return absName(fsys, LockName) }

func absName(fsys fsx.FS, name string) string {
	root := fsys.Root()
	if len(root) > 0 && root[len(root)-1] == '/' {
		return root + name
	}
	return root + "/" + name
}

// newFlock returns a flock on root/name that never creates, never follows a final
// symlink and never blocks on a FIFO.
func newFlock(fsys fsx.FS, name string) *flock.Flock {
	return flock.New(absName(fsys, name), flock.SetFlag(os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK))
}

// flockStat fstats the descriptor of a held flock (gofrs' Stat stats by path when it
// holds no descriptor, which would follow links: call it only while locked).
func flockStat(fl *flock.Flock) (*syscall.Stat_t, bool) {
	if !fl.Locked() {
		return nil, false
	}
	fi, err := fl.Stat()
	if err != nil {
		return nil, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return st, ok
}

// release unlocks and closes fl; nil is a no-op. A failed LOCK_UN is retried once
// (gofrs keeps the descriptor open when LOCK_UN fails).
func release(fl *flock.Flock) error {
	if fl == nil {
		return nil
	}
	err := fl.Unlock()
	if err != nil {
		err = fl.Unlock()
	}
	return err
}

func removeQuiet(fsys fsx.FS, name string) { _ = fsys.Remove(name) }

func lstatErr(fsys fsx.FS, name string) error {
	_, err := fsys.Lstat(name)
	return err
}

// checkLockInfo refuses a lock file that is a symlink, not regular, or not ours.
func checkLockInfo(path string, info fsx.Info) error {
	switch {
	case info.IsSymlink():
		return fmt.Errorf("%w: %s is a symbolic link", ErrInvalid, path)
	case !info.IsRegular():
		return fmt.Errorf("%w: %s is not a regular file (mode %s)", ErrInvalid, path, fs.FileMode(info.Mode&0o777)|typeBits(info.Mode))
	case int(info.Uid) != os.Geteuid():
		return fmt.Errorf("%w: %s is owned by uid %d", ErrInvalid, path, info.Uid)
	}
	return nil
}

func typeBits(mode uint32) fs.FileMode {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return fs.ModeDir
	case syscall.S_IFIFO:
		return fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		return fs.ModeSocket
	case syscall.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		return fs.ModeDevice
	case syscall.S_IFLNK:
		return fs.ModeSymlink
	}
	return 0
}
