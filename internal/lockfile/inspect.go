package lockfile

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/gofrs/flock"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// errChanged: ".lock" changed between two looks at it; look again.
var errChanged = errors.New("lockfile: lock file changed while inspected")

// probed is one look at ".lock".
type probed struct {
	present bool
	info    fsx.Info // Lstat of ".lock"
	live    bool     // someone holds its flock
	fl      *flock.Flock
	holder  *Holder
}

// probe looks at ".lock": Lstat, refuse invalid, TryLock its flock, read its holder
// info. When the lock is present and not live, the result holds its flock (p.fl) and
// the caller must release it. On error nothing is held.
func probe(fsys fsx.FS, o Options) (p probed, err error) {
	info, err := fsys.Lstat(LockName)
	if fsx.IsNotExist(err) {
		return p, nil
	}
	if err != nil {
		return p, err
	}
	if err := checkLockInfo(lockPath(fsys), info); err != nil {
		return probed{present: true, info: info}, err
	}
	p = probed{present: true, info: info}

	fl := newFlock(fsys, LockName)
	ok, err := fl.TryLock()
	if err != nil {
		switch fsx.Errno(err) {
		case 0:
		case syscall.ENOENT:
			return probed{}, errChanged
		case syscall.ELOOP, syscall.ENXIO:
			return p, fmt.Errorf("%w: %s was replaced by a symbolic link or special file", ErrInvalid, lockPath(fsys))
		}
		return p, fmt.Errorf("lockfile: flock %s: %w", lockPath(fsys), err)
	}
	if ok {
		if st, sok := flockStat(fl); !sok || st.Dev != info.Dev || st.Ino != info.Ino {
			release(fl)
			return probed{}, errChanged
		}
		p.fl = fl
	} else {
		p.live = true
	}

	data, rinfo, err := fsx.ReadFile(fsys, LockName, maxHolderSize)
	switch {
	case err == nil && (rinfo.Dev != info.Dev || rinfo.Ino != info.Ino):
		err = errChanged
	case err == nil:
		p.holder = parseHolder(data)
	case errors.Is(err, fsx.ErrTooLarge):
		err = nil // not our holder info: age from mtime
	case fsx.IsNotExist(err):
		err = errChanged
	}
	if err != nil {
		release(p.fl)
		if errors.Is(err, errChanged) {
			return probed{}, err
		}
		return probed{}, fmt.Errorf("lockfile: reading %s: %w", lockPath(fsys), err)
	}
	return p, nil
}

// breakHeld removes a stale ".lock" whose flock p holds, after confirming that the name
// still names the inode we hold (which stays open, so its number cannot be reused).
// It always releases p.fl. errChanged means someone else already replaced it.
func breakHeld(fsys fsx.FS, p probed) error {
	defer release(p.fl)
	info, err := fsys.Lstat(LockName)
	if fsx.IsNotExist(err) {
		return errChanged
	}
	if err != nil {
		return err
	}
	if info.Dev != p.info.Dev || info.Ino != p.info.Ino {
		return errChanged
	}
	if err := fsys.Remove(LockName); err != nil {
		if fsx.IsNotExist(err) {
			return errChanged
		}
		return err
	}
	return nil
}

// State is what Inspect saw.
type State struct {
	// Present: ".lock" exists (Info describes it, even when it is invalid).
	Present bool
	// Live: someone holds the flock of ".lock" — a running holder. Never broken.
	Live bool
	// Stale: present, not live, and stale by the rule of the package documentation —
	// BreakStale (and any Acquire) would break it. Present && !Live && !Stale means a
	// lock without a flock holder that is not stale yet (for instance an O_EXCL lock of
	// another implementation): Acquire waits for it.
	Stale bool
	// Holder is the parsed holder info; nil if the file is empty or not ours.
	Holder *Holder
	// Info is the Lstat of ".lock".
	Info fsx.Info
	// Orphans lists the lock temps (IsTempName) in the root, sorted. It may include,
	// for a moment, the temp of an Acquire in progress; CleanOrphans removes only those
	// older than Options.Stale whose flock is free.
	Orphans []string
}

// Inspect reports the state of the lock without changing anything on disk: it only
// lstats, lists, reads, and tries (and at once releases) the flock of ".lock". A ".lock"
// that is a symlink, not regular, or owned by another user yields the State so far
// (Present, Info) and an error wrapping ErrInvalid. For fsck.
func Inspect(fsys fsx.FS, opts Options) (State, error) {
	o := opts.withDefaults()
	var p probed
	var err error
	for range 8 {
		p, err = probe(fsys, o)
		if !errors.Is(err, errChanged) {
			break
		}
	}
	st := State{Present: p.present, Live: p.live, Holder: p.holder, Info: p.info}
	if err == nil && p.present && !p.live {
		st.Stale = isStale(p, o)
	}
	release(p.fl)
	orphans, lerr := listTemps(fsys)
	st.Orphans = orphans
	if err == nil {
		err = lerr
	}
	return st, err
}

// BreakStale removes ".lock" if, and only if, it is stale by the rule of the package
// documentation (never a live one: it holds the lock's flock while it checks and
// removes). It reports whether it removed it. A planted ".lock" yields ErrInvalid and is
// left alone. For fsck --repair; Acquire does the same by itself. Not durable.
func BreakStale(fsys fsx.FS, opts Options) (broke bool, err error) {
	o := opts.withDefaults()
	for range 8 {
		p, err := probe(fsys, o)
		switch {
		case errors.Is(err, errChanged):
			continue
		case err != nil:
			return false, err
		case !p.present || p.live:
			return false, nil
		case !isStale(p, o):
			release(p.fl)
			return false, nil
		}
		err = breakHeld(fsys, p)
		if errors.Is(err, errChanged) {
			continue
		}
		return err == nil, err
	}
	return false, fmt.Errorf("%w: %s keeps changing", errChanged, lockPath(fsys))
}

// CleanOrphans removes lock temps (IsTempName) in the root that are regular files owned
// by this user, older (by mtime) than Options.Stale, and whose flock is free — temps
// left by a crash between creating the temp and linking it. It returns the names it
// removed and the first error; it carries on past errors. Each removal holds the
// temp's flock and first confirms the name still names the inode it holds. Not durable.
func CleanOrphans(fsys fsx.FS, opts Options) (removed []string, err error) {
	return cleanOrphans(fsys, opts.withDefaults())
}

func cleanOrphans(fsys fsx.FS, o Options) (removed []string, err error) {
	names, err := listTemps(fsys)
	if err != nil {
		return nil, err
	}
	now := o.Now()
	for _, name := range names {
		ok, rerr := cleanOrphan(fsys, name, now, o.Stale)
		if ok {
			removed = append(removed, name)
		}
		if err == nil {
			err = rerr
		}
	}
	return removed, err
}

func cleanOrphan(fsys fsx.FS, name string, now time.Time, stale time.Duration) (bool, error) {
	info, err := fsys.Lstat(name)
	if err != nil {
		if fsx.IsNotExist(err) {
			return false, nil
		}
		return false, err
	}
	if checkLockInfo(name, info) != nil || now.Sub(time.Unix(0, info.MtimeNs)) <= stale {
		return false, nil
	}
	fl := newFlock(fsys, name)
	ok, err := fl.TryLock()
	if err != nil || !ok {
		return false, nil // vanished, replaced by something odd, or in use
	}
	defer release(fl)
	st, sok := flockStat(fl)
	if !sok || st.Dev != info.Dev || st.Ino != info.Ino {
		return false, nil
	}
	again, err := fsys.Lstat(name)
	if err != nil || again.Dev != info.Dev || again.Ino != info.Ino {
		return false, nil
	}
	if err := fsys.Remove(name); err != nil {
		if fsx.IsNotExist(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// listTemps lists the lock temps in the root, sorted.
func listTemps(fsys fsx.FS) ([]string, error) {
	ents, err := fsys.ReadDir(".")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if IsTempName(e.Name) {
			out = append(out, e.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}
