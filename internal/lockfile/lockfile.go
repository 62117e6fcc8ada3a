// Package lockfile is the store's writer lock (DESIGN §6): a file named ".lock" in the
// root of an fsx.FS, created once and never removed, whose exclusive flock(2) is held by
// the writer that holds the store and whose content says who that is.
//
// # The lock file
//
// ".lock" holds one lock record, padded with spaces and a final newline to at least
// 512 bytes: the free record {"free":true,"time":"1970-01-01T00:00:00Z"} when nobody
// holds the store, or the holder's details (a JSON Holder: pid, host, boot id, process
// start time, time). Every write of it covers the whole file in one pwrite(2) at offset
// 0. It is made the first time a writer finds no ".lock": a private temp
// ".lock-<uuid>.tmp" (O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW, 0600) gets the free record,
// is fsynced, and is link(2)ed to ".lock" — so ".lock" never appears without its first
// contents, not even after a power cut, and two first writers make one file between
// them (the second link fails with EEXIST) — then the temp is unlinked and the root
// directory fsynced. From then on no lock hold creates or removes a file.
//
// # Protocol
//
// To acquire, a writer lstats ".lock", opens it read-write (O_NOFOLLOW|O_NONBLOCK,
// never O_CREAT), takes an exclusive non-blocking flock on that descriptor, checks that
// the descriptor is the file it lstat'ed and, once it holds the flock, that ".lock"
// still names it (same device and inode), and reads the record. If the record is free,
// it writes its holder details: it holds the store. Release is: check, write the free
// record, close (which releases the flock). A holder therefore holds the flock of the
// inode that ".lock" names for as long as it holds the store, and the record is only
// ever written by whoever holds that flock (or, before ".lock" exists, by its creator,
// into the temp that becomes it).
//
// A contender refuses (ErrInvalid) a ".lock" that is a symbolic link, not a regular
// file, or owned by another user; it never follows, opens for writing, or removes such
// a file. Otherwise:
//
//   - the flock is held by someone: the lock is live. It is never broken, whatever its
//     age or its record.
//   - the flock is free and the record is free: the lock is the contender's.
//   - the flock is free and the record names no holder — the file is empty, or torn,
//     or holds anything but whole holder details (a pid and a time), as a crash leaves
//     it (after a power cut the record, never fsynced, may read empty or torn): the
//     lock is stale at once. The free flock proves that no holder is there: every
//     holder holds it, and no ".lock" is ever seen before its first contents are
//     written. Two contenders that find it so at the same moment are serialised by
//     the flock, and each reads the record only once it holds the flock.
//   - the flock is free and the record holds whole holder details (left by a holder
//     that crashed): the lock is stale when
//     (a) its holder info names this host (Options.Host) and that holder is gone: its pid
//     does not exist (kill(pid, 0) = ESRCH), is a zombie, was reused (its start time in
//     /proc/<pid>/stat differs from the recorded one), the host rebooted since (the
//     recorded boot id differs), or the pid is this very process (which holds the flock
//     of every lock it holds, so a free flock means a leaked lock); or
//     (b) its recorded time is older than Options.Stale; or
//     (c) its mtime lies before this host's last boot: no holder survives a reboot.
//     A lock that is not stale is waited for like a live one. Rule (a) trusts host
//     names to be unique among the hosts that share a store; it never overrides a
//     held flock. Details naming another host are honoured until (b) or (c), as a
//     file system whose flocks do not reach across hosts needs.
//
// A stale lock is taken over in place: still holding its flock and having confirmed
// that ".lock" names the inode it holds, the contender writes the free record and then
// its own holder details. (The free record first, so that no write ever lands on
// holder details with other holder details: see "Torn records".) A ".lock" larger than
// 4 KiB, which no write of this package makes, cannot be overwritten whole; it is
// unlinked instead and made afresh. A writer killed with SIGKILL releases its flock in
// the kernel, so its lock is taken over at once on the same host (rule a) and after
// Options.Stale anywhere (rule b); a lock a power cut left empty or torn is taken over
// at once everywhere: the store never wedges.
//
// Waiting is bounded: retries back off from about 1 ms, doubling to about 50 ms, with
// jitter, for at most Options.Wait (default 2 s, measured on the monotonic clock) and
// never past ctx; then Acquire returns ErrBusy naming the holder's pid and host.
//
// # Torn records
//
// The record is not fsynced after its first contents, so a power cut may leave any
// prefix of the last write over the record before it. Every write is the free record
// over holder details (or over anything else, when a stale lock is taken over), or
// holder details over the free record. The free record over holder details reads as
// the free record (the whole write), as those holder details (a prefix of at most
// two bytes: the same "{\"" begins both), or as no whole holder details (a longer
// prefix replaces the "pid" key, or the JSON no longer parses); holder details over
// the free record read as those details (the whole write), as no whole holder details
// (not parseable, or without a pid: the free record holds none), or as a pid with the
// free record's time, the epoch (stale at once by rule b). So a torn record is taken
// over at once, or is the whole holder details of a holder that is gone (the flock is
// free), stale by rules (a) to (c) as any crashed holder's. A free record that
// reads as free is what the crash left: nobody holds the flock after a crash, so nobody
// holds the store.
//
// # What a caller may rely on
//
//   - Between a successful Acquire and Unlock, no other caller of this package — another
//     process or another goroutine of this one (flock belongs to an open file
//     description, and each Acquire opens its own) — holds the lock, as long as nobody
//     tampers with ".lock" by other means. Lock.Check detects the replacement or
//     removal of ".lock" (ErrLost); the store calls it before publishing.
//   - A live lock (flock held) is never broken, by Acquire, BreakStale or CleanOrphans.
//   - Inspect changes nothing on disk.
//
// # Durability
//
// ".lock" is made durably (create: the temp fsynced before the link, the directory
// after it), so after a power cut it is missing or holds a record this package wrote
// — possibly torn, never empty unless an earlier version made it. Its later writes (the
// holder's details, the free record) are not fsynced: a lock is a property of running
// processes, and what a crash leaves of its record is read by the rules above, never
// waited for longer than a dead holder's. Removals of orphan temps are not durable
// either, which is harmless.
//
// # Orphans
//
// A crash between creating the temp and linking it leaves an orphan ".lock-<uuid>.tmp".
// Acquire, once it holds the lock and only when it has just made ".lock" or taken over
// a stale lock, removes (best effort) every lock temp older than Options.Stale whose
// flock is free; CleanOrphans does the same on demand and Inspect lists lock temps.
// IsTempName recognises their names (they are not fsx.IsTempName names).
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
	"syscall"
	"time"

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

// maxHolderSize bounds how much of a lock file is read for its record. A larger file
// is treated as having no parseable holder info, and is never overwritten in place.
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
	f        fsx.File // ".lock", open read-write; we hold its flock
	dev, ino uint64
	size     int64 // the file's size: every write covers it
	holder   Holder
	tookOver bool // the lock was stale and taken over
	released bool
}

// Holder returns the holder info this Lock wrote.
func (l *Lock) Holder() Holder { return l.holder }

// Acquire takes the lock of the store rooted at fsys, waiting as described in the
// package documentation. It returns ErrBusy (wrapped, naming the holder) when the wait
// bound passes, ctx's error (wrapped) when ctx ends first, ErrInvalid for a planted
// ".lock", and the file-system error of any failed call otherwise; on every error,
// nothing of this attempt is left held and ".lock", if this attempt wrote it, says free
// again unless a write failed. The caller must call Unlock (or use With).
func Acquire(ctx context.Context, fsys fsx.FS, opts Options) (*Lock, error) {
	o := opts.withDefaults()
	deadline := time.Now().Add(o.Wait)
	if o.Wait < 0 {
		deadline = time.Now()
	}
	delay := backoffMin
	var holder *Holder
	seen := false    // we met a held lock at least once
	created := false // we made ".lock"
	immediate := 0
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("lockfile: waiting for %s: %w", lockPath(fsys), err)
		}
		l, res, h, err := tryOnce(fsys, o)
		switch res {
		case resAcquired:
			if created || l.tookOver {
				_, _ = cleanOrphans(fsys, o) // best effort, under the lock
			}
			return l, nil
		case resFailed:
			return nil, err
		case resBusy:
			holder, seen = h, true
			immediate = 0
		case resCreated, resRetry:
			// We just made the lock file, or the lock vanished, changed or was just
			// broken: try again at once, a few times (even past the deadline:
			// progress was made), before falling back to the backoff.
			created = created || res == resCreated
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
	resBusy    // the lock is held (live, or not stale): wait
	resRetry   // something changed under us: try again
	resCreated // we made ".lock" (free): try again at once
)

// tryOnce makes one attempt: open, flock and read ".lock" (making it first if there is
// none), then take it if it is free or stale.
func tryOnce(fsys fsx.FS, o Options) (*Lock, result, *Holder, error) {
	p, err := probe(fsys, true)
	switch {
	case errors.Is(err, errChanged):
		return nil, resRetry, nil, nil
	case err != nil:
		return nil, resFailed, nil, err
	case !p.present:
		made, err := create(fsys)
		switch {
		case err != nil:
			return nil, resFailed, nil, err
		case made:
			return nil, resCreated, nil, nil
		}
		return nil, resRetry, nil, nil
	case p.live:
		p.close()
		return nil, resBusy, p.holder, nil
	}
	// We hold the flock of the inode ".lock" names: nobody following the protocol
	// writes it or breaks it now.
	tookOver := false
	if !p.free {
		if !isStale(p, o) {
			p.close()
			return nil, resBusy, p.holder, nil
		}
		broke, err := takeBack(fsys, p)
		if err != nil || broke {
			p.close()
			if err != nil {
				return nil, resFailed, nil, err
			}
			return nil, resRetry, nil, nil
		}
		tookOver = true
	}
	holder := newHolder(o)
	data, _ := json.Marshal(holder) // cannot fail
	rec, err := encodeRecord(data, p.info.Size)
	if err == nil {
		_, err = p.f.WriteAt(rec, 0)
		if err != nil {
			// The record may be torn: make it say free again (best effort).
			_ = writeFree(p.f, int64(len(rec)))
		}
	}
	if err != nil {
		p.close()
		return nil, resFailed, nil, fmt.Errorf("lockfile: writing %s: %w", lockPath(fsys), err)
	}
	return &Lock{fsys: fsys, f: p.f, dev: p.info.Dev, ino: p.info.Ino, size: int64(len(rec)), holder: holder, tookOver: tookOver}, resAcquired, nil, nil
}

// create makes ".lock", saying free: a temp with the free record, fsynced, linked to
// ".lock", then unlinked, and the root directory fsynced. So ".lock" never appears
// without its first contents, not even after a power cut: the inode any surviving
// ".lock" names holds the free record on disk before the name exists. It reports
// whether our link made ".lock" (false with a nil error: it was made by someone else
// meanwhile, or our temp vanished — try again). A failed fsync is reported, never
// retried (the temp is removed); a failed directory fsync is reported too, though
// ".lock" is then in place (its contents are durable, its name may not be).
func create(fsys fsx.FS) (bool, error) {
	name := newTempName()
	f, err := fsys.OpenFile(name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o600)
	if err != nil {
		if fsx.IsExist(err) { // a uuid collision: never, but harmless
			return false, nil
		}
		return false, err
	}
	rec, _ := encodeRecord(freeRecord, 0) // cannot fail
	_, err = f.Write(rec)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		removeQuiet(fsys, name)
		return false, err
	}
	err = fsys.Link(name, LockName)
	made := err == nil
	switch {
	case made, fsx.IsExist(err):
		err = nil
	case fsx.IsNotExist(err) && fsx.Errno(lstatErr(fsys, name)) == syscall.ENOENT:
		// Our temp was removed (an orphan sweep with a clock far ahead); the root
		// itself is still there.
		return false, nil
	}
	if err != nil {
		removeQuiet(fsys, name)
		return false, err
	}
	// The temp is only a second name of the file now; a failure to remove it leaves
	// an orphan that a later sweep or fsck removes.
	if err := fsys.Remove(name); err != nil && !fsx.IsNotExist(err) {
		return made, err
	}
	if !made {
		return false, nil // whoever made ".lock" fsyncs it
	}
	// The name (and the temp's removal) durable: ".lock" survives a power cut.
	return true, fsys.SyncDir(".")
}

// writeFree writes the free record over the first size bytes of f.
func writeFree(f fsx.File, size int64) error {
	rec, err := encodeRecord(freeRecord, size)
	if err == nil {
		_, err = f.WriteAt(rec, 0)
	}
	return err
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
// error wrapping ErrLost, and nothing is written), writes the free record over the
// whole file, and closes the descriptor, which releases the flock whatever happens.
// Unlock is idempotent: after the first call it returns nil. The write is not fsynced
// (see the package documentation); if it fails, the holder details stay, and the lock
// is stale at once for this process and once this process is gone for the others.
func (l *Lock) Unlock() error {
	if l == nil || l.released {
		return nil
	}
	l.released = true
	err := l.verify()
	if err == nil {
		if werr := writeFree(l.f, l.size); werr != nil {
			err = fmt.Errorf("lockfile: releasing %s: %w", lockPath(l.fsys), werr)
		}
	}
	// Close frees the descriptor, and with it the flock, even when it reports an
	// error; the record needs no flush, so there is nothing to report.
	_ = l.f.Close()
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

// tryFlock takes an exclusive flock on f without blocking; false if someone holds it.
func tryFlock(f fsx.File) (bool, error) {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch err {
		case nil:
			return true, nil
		case syscall.EINTR:
			continue
		case syscall.EWOULDBLOCK:
			return false, nil
		}
		return false, &fs.PathError{Op: "flock", Path: f.Name(), Err: err}
	}
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
	case int(info.Uid) != selfInfo().euid:
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
