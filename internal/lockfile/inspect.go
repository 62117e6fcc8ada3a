package lockfile

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// errChanged: ".lock" changed between two looks at it; look again.
var errChanged = errors.New("lockfile: lock file changed while inspected")

// probed is one look at ".lock".
type probed struct {
	present bool
	info    fsx.Info // fstat of ".lock" (its Lstat when it was refused)
	live    bool     // someone holds its flock
	f       fsx.File // ".lock", open; flocked by us unless live
	free    bool     // it holds the free record
	holder  *Holder
}

// close closes the probed file, releasing its flock if we hold it.
func (p *probed) close() {
	if p.f != nil {
		_ = p.f.Close()
		p.f = nil
	}
}

// probe looks at ".lock": Lstat, refuse invalid, open it (read-write if write), try its
// flock, check the descriptor is the file the Lstat saw and — if we got the flock — that
// ".lock" still names it, and read its record. When the lock is present, the result
// holds the open file (p.f; flocked unless p.live) and the caller must close it. On
// error nothing is held or open.
func probe(fsys fsx.FS, write bool) (p probed, err error) {
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
	flag := syscall.O_RDONLY | syscall.O_NONBLOCK
	if write {
		flag = syscall.O_RDWR | syscall.O_NONBLOCK
	}
	f, err := fsys.OpenFile(LockName, flag, 0)
	if err != nil {
		switch fsx.Errno(err) {
		case syscall.ENOENT:
			return probed{}, errChanged
		case syscall.ELOOP, syscall.ENXIO, syscall.EISDIR:
			return probed{present: true, info: info}, fmt.Errorf("%w: %s was replaced by a symbolic link or special file", ErrInvalid, lockPath(fsys))
		}
		return probed{}, fmt.Errorf("lockfile: opening %s: %w", lockPath(fsys), err)
	}
	p = probed{present: true, info: info, f: f}
	fail := func(err error) (probed, error) {
		p.close()
		if errors.Is(err, errChanged) {
			return probed{}, err
		}
		return probed{}, fmt.Errorf("lockfile: inspecting %s: %w", lockPath(fsys), err)
	}
	ok, err := tryFlock(f)
	if err != nil {
		return fail(err)
	}
	p.live = !ok
	st, err := f.Stat()
	switch {
	case err != nil:
		return fail(err)
	case st.Dev != info.Dev || st.Ino != info.Ino:
		return fail(errChanged)
	case !st.IsRegular():
		return fail(fmt.Errorf("%w: replaced by a special file", ErrInvalid))
	}
	p.info = st
	if ok {
		// We hold the flock: does ".lock" still name what we hold?
		again, err := fsys.Lstat(LockName)
		switch {
		case fsx.IsNotExist(err):
			return fail(errChanged)
		case err != nil:
			return fail(err)
		case again.Dev != st.Dev || again.Ino != st.Ino:
			return fail(errChanged)
		}
	}
	// One pread of the size fstat reported (a larger file is not read past the bound).
	buf := make([]byte, min(max(st.Size, 0), maxHolderSize+1))
	n, err := f.ReadAt(buf, 0)
	switch {
	case err != nil && err != io.EOF:
		return fail(fmt.Errorf("reading: %w", err))
	case n <= maxHolderSize:
		p.free, p.holder = parseRecord(buf[:n])
	} // else not our record: age from mtime
	return p, nil
}

// takeBack makes a stale ".lock" whose flock p holds (and whose name p has confirmed)
// say free again, writing the free record over the whole file; broke reports that the
// file was too large to overwrite whole and was unlinked instead (the next attempt
// makes it afresh). p stays open.
func takeBack(fsys fsx.FS, p probed) (broke bool, err error) {
	if p.info.Size > maxHolderSize {
		if err := fsys.Remove(LockName); err != nil {
			if fsx.IsNotExist(err) {
				return true, nil
			}
			return false, err
		}
		return true, nil
	}
	if err := writeFree(p.f, p.info.Size); err != nil {
		return false, fmt.Errorf("lockfile: writing %s: %w", lockPath(fsys), err)
	}
	return false, nil
}

// State is what Inspect saw.
type State struct {
	// Present: ".lock" exists and is held, or was left held (Info describes it, even
	// when it is invalid). A ".lock" that says free and whose flock nobody holds is
	// not present: it is the lock file of a store nobody writes.
	Present bool
	// Live: someone holds the flock of ".lock" — a running holder. Never broken.
	Live bool
	// Stale: present, not live, and stale by the rule of the package documentation —
	// BreakStale (and any Acquire) would take it back. Present && !Live && !Stale means
	// a lock without a flock holder that is not stale yet (the whole details of a
	// holder on another host, younger than Options.Stale): Acquire waits for it.
	Stale bool
	// Holder is the parsed holder info; nil if the file is free, empty or not
	// parseable (a torn record may parse to details that are not whole: no pid or no
	// time).
	Holder *Holder
	// Info is the fstat of ".lock" (its Lstat when it is invalid).
	Info fsx.Info
	// Orphans lists the lock temps (IsTempName) in the root, sorted. It may include,
	// for a moment, the temp of a first Acquire making ".lock"; CleanOrphans removes
	// only those older than Options.Stale whose flock is free.
	Orphans []string
}

// Inspect reports the state of the lock without changing anything on disk: it only
// lstats, lists, opens read-only, reads, and tries (and at once releases) the flock of
// ".lock". A ".lock" that is a symlink, not regular, or owned by another user yields the
// State so far (Present, Info) and an error wrapping ErrInvalid. For fsck.
func Inspect(fsys fsx.FS, opts Options) (State, error) {
	o := opts.withDefaults()
	var p probed
	var err error
	for range 8 {
		p, err = probe(fsys, false)
		if !errors.Is(err, errChanged) {
			break
		}
	}
	st := State{Present: p.present && (p.live || !p.free), Live: p.live, Holder: p.holder, Info: p.info}
	if err == nil && st.Present && !p.live {
		st.Stale = isStale(p, o)
	}
	p.close()
	orphans, lerr := listTemps(fsys)
	st.Orphans = orphans
	if err == nil {
		err = lerr
	}
	return st, err
}

// BreakStale makes ".lock" say free if, and only if, it is stale by the rule of the
// package documentation (never a live one: it holds the lock's flock while it checks
// and writes). It reports whether it did. A planted ".lock" yields ErrInvalid and is
// left alone. For fsck --repair; Acquire does the same by itself. Not durable.
func BreakStale(fsys fsx.FS, opts Options) (broke bool, err error) {
	o := opts.withDefaults()
	for range 8 {
		p, err := probe(fsys, true)
		switch {
		case errors.Is(err, errChanged):
			continue
		case err != nil:
			return false, err
		case !p.present:
			return false, nil
		case p.live || p.free || !isStale(p, o):
			p.close()
			return false, nil
		}
		_, err = takeBack(fsys, p)
		p.close()
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
	f, err := fsys.OpenFile(name, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false, nil // vanished, or replaced by something odd
	}
	defer f.Close()
	if ok, err := tryFlock(f); err != nil || !ok {
		return false, nil // in use
	}
	st, err := f.Stat()
	if err != nil || st.Dev != info.Dev || st.Ino != info.Ino {
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
