package store

import (
	"context"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// holdMode is how a goroutine of this process holds the store lock (DESIGN §6).
type holdMode int

const (
	// planning: a prepared transaction's plan (reads only). Planners hold the lock
	// beside one another and beside a group-commit leader, so that the next group's
	// plans, and then their staging, overlap the fsyncs of the group being published.
	planning holdMode = iota
	// leading: the group-commit leader, which publishes; one at a time, and only once
	// no planner is left, so that the flock is released between two groups.
	leading
	// exclusive: alone (Transaction, a locked round, an index scan that must see no
	// publication).
	exclusive
)

// storeLock is this process's side of the store lock: it admits holders by mode, takes
// the flock (internal/lockfile) when the first is admitted, and releases it when the
// last one leaves. So the flock excludes other processes, and this process's holders
// share it by these rules: one leader or one exclusive holder at a time; planners
// beside a leader; a waiting leader or exclusive holder admits no new planner, so the
// holders drain and the flock is released between groups (other processes get their
// turn as before).
type storeLock struct {
	mu                 sync.Mutex
	changed            chan struct{} // closed and replaced whenever who holds changes
	held               [3]int        // holders admitted, by mode
	waitLead, waitExcl int
	flock              *flockHold // the flock while anyone holds, nil when none
	group              *groupHold // the hold of the admitted leader, nil if none
}

// flockHold is one continuous hold of the flock.
type flockHold struct {
	ready chan struct{} // closed once lock (or err) is set
	lock  *lockfile.Lock
	err   error
	since time.Time
}

// groupHold is one leader's hold: a planner admitted beside it may read what it is
// publishing before it is durable.
type groupHold struct {
	done   chan struct{} // closed when the leader left, its fsyncs done
	failed bool          // a rename, unlink or directory fsync failed (set before done)
}

func (l *storeLock) admits(m holdMode) bool {
	switch m {
	case exclusive:
		return l.held[planning]+l.held[leading]+l.held[exclusive] == 0
	case leading:
		return l.held[planning]+l.held[leading]+l.held[exclusive] == 0 && l.waitExcl == 0
	}
	return l.held[exclusive] == 0 && l.waitExcl == 0 && (l.held[leading] > 0 || l.waitLead == 0)
}

// broadcast wakes every waiter. Caller holds l.mu.
func (l *storeLock) broadcast() {
	if l.changed != nil {
		close(l.changed)
	}
	l.changed = make(chan struct{})
}

// lockHold is what lockStore hands its caller.
type lockHold struct {
	lock *lockfile.Lock
	// beside is the leader's hold a planner was admitted beside (nil: none): until it
	// is done, what the plan read may not be durable yet.
	beside *groupHold
	// group is a leader's own hold, to mark failed.
	group *groupHold
}

// lockStore admits the caller to the store lock in mode m, taking the flock if it is
// the first holder, and creates the store directory if needed. unlock leaves; the
// last holder to leave releases the flock. Waits honour ctx (OUTBOX_STORE_BUSY).
func (s *Store) lockStore(ctx context.Context, m holdMode) (unlock func() error, h lockHold, _ error) {
	start := time.Now()
	l := &s.lk
	l.mu.Lock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	waiting := map[holdMode]*int{leading: &l.waitLead, exclusive: &l.waitExcl}[m]
	if waiting != nil {
		*waiting++
	}
	for !l.admits(m) {
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			l.mu.Lock()
			if waiting != nil {
				*waiting--
			}
			l.broadcast()
			l.mu.Unlock()
			return nil, h, errcode.New(errcode.OutboxStoreBusy, s.dir, ctx.Err())
		}
		l.mu.Lock()
	}
	if waiting != nil {
		*waiting--
	}
	l.held[m]++
	first := l.flock == nil
	if first {
		l.flock = &flockHold{ready: make(chan struct{})}
	}
	fh := l.flock
	switch m {
	case planning:
		h.beside = l.group
	case leading:
		l.group = &groupHold{done: make(chan struct{})}
		h.group = l.group
	}
	l.broadcast()
	l.mu.Unlock()

	leave := func() error {
		var err error
		var held time.Duration
		released := false
		l.mu.Lock()
		l.held[m]--
		if m == leading {
			close(l.group.done)
			l.group = nil
		}
		if l.held[planning]+l.held[leading]+l.held[exclusive] == 0 && l.flock == fh {
			l.flock = nil
			if fh.lock != nil {
				err, held, released = fh.lock.Unlock(), time.Since(fh.since), true
			}
		}
		l.broadcast()
		l.mu.Unlock()
		if released && s.lockHeld != nil {
			s.lockHeld(held)
		}
		if err != nil {
			return lockError(s.dir, err)
		}
		return nil
	}
	if first {
		if err := s.ensureStoreDir(); err != nil {
			fh.err = err
		} else if lock, err := lockfile.Acquire(ctx, s.fs, s.lockOpts); err != nil {
			fh.err = lockError(s.dir, err)
		} else {
			fh.lock = lock
		}
		fh.since = time.Now()
		close(fh.ready)
	} else {
		select {
		case <-fh.ready:
		case <-ctx.Done():
			_ = leave()
			return nil, lockHold{}, errcode.New(errcode.OutboxStoreBusy, s.dir, ctx.Err())
		}
	}
	if fh.err != nil {
		_ = leave()
		return nil, lockHold{}, fh.err
	}
	s.lockHolds.Add(1)
	s.lockWait.Add(int64(time.Since(start)))
	h.lock = fh.lock
	return leave, h, nil
}
