package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// maxPlanRounds bounds how often a prepared transaction's fn runs before the
// transaction gives up with OUTBOX_STORE_BUSY.
const maxPlanRounds = 8

// errStalePlan reports that a publication since the plan touched what it depends on.
var errStalePlan = errors.New("store: plan invalidated by a concurrent publication")

// publication is one prepared transaction waiting for a lock hold.
type publication struct {
	plan  *Tx
	check func(pub *Tx) error // run under the lock just before publishing (capacity)
	err   error
	done  chan struct{} // closed when err is final
	lead  chan struct{} // closed when this publication's goroutine must lead the next hold
}

// PreparedTransaction runs fn under the lock only to read and plan; the lock is never
// held across a signature or an fsync.
//
//  1. Plan: under the lock, fn reads records and plans Put and Delete calls.
//  2. Stage, outside the lock: every planned record is signed and written to a fresh
//     temp, in parallel, and each temp is fsynced.
//  3. Publish: under the lock again — shared with every other prepared transaction of
//     this Store waiting at that moment (group commit) — the plan is checked: if any
//     publication since the plan changed a record fn read (or any record of a kind fn
//     listed), the temps are removed and fn runs again, after a jittered backoff, up
//     to a fixed number of rounds (then OUTBOX_STORE_BUSY). Otherwise the temps
//     are renamed into place, each directory touched is fsynced once, then the
//     records planned to go last (a batch marker) are renamed and their directories
//     fsynced.
//
// Progress: conflicting read-modify-write transactions from two processes can starve
// one another optimistically (the one that planned later always loses). So the last
// round is run locked: fn, signing, staging and publication in one lock hold, which
// cannot be invalidated. Options.OptimisticOnly turns that round off; the transaction
// then gives up with OUTBOX_STORE_BUSY after its optimistic rounds.
//
// When PreparedTransaction returns nil every planned write is durable. fn may run more
// than once and must have no side effects besides its plan; an error from fn aborts
// the transaction with nothing written. A failure during publication keeps what was
// published before it and returns the error (nothing is acknowledged).
func (s *Store) PreparedTransaction(ctx context.Context, fn func(tx *Tx) error) error {
	return s.preparedTx(ctx, fn, nil)
}

func (s *Store) preparedTx(ctx context.Context, fn func(tx *Tx) error, check func(pub *Tx) error) error {
	backoff := time.Millisecond
	for round := 0; round < maxPlanRounds; round++ {
		if round == maxPlanRounds-1 && !s.optimisticOnly {
			return s.lockedRound(ctx, fn, check)
		}
		plan, err := s.plan(ctx, fn)
		if err != nil {
			return err
		}
		if len(plan.writes) == 0 {
			return nil
		}
		if err := s.stage(ctx, plan.writes); err != nil {
			return err
		}
		err = s.commit(ctx, &publication{plan: plan, check: check})
		discard(plan.writes)
		if !errors.Is(err, errStalePlan) {
			return err
		}
		if err := sleepJittered(ctx, backoff); err != nil {
			return errcode.New(errcode.OutboxStoreBusy, s.dir, err)
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
	return errcode.New(errcode.OutboxStoreBusy, s.dir, errors.New("the plan was invalidated by concurrent writers in every round"))
}

// sleepJittered waits a random duration in [d/2, d], or until ctx is done.
func sleepJittered(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d/2 + rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lockedRound runs fn, stages its writes and publishes them in one lock hold.
func (s *Store) lockedRound(ctx context.Context, fn func(tx *Tx) error, check func(pub *Tx) error) error {
	unlock, lock, err := s.lockStore(ctx)
	if err != nil {
		return err
	}
	plan, err := s.planLocked(ctx, lock, fn)
	if err == nil && len(plan.writes) > 0 {
		if err = s.stage(ctx, plan.writes); err == nil {
			p := &publication{plan: plan, check: check}
			s.publishBatch(lock, []*publication{p})
			err = p.err
			discard(plan.writes)
		}
	}
	if uerr := unlock(); err == nil {
		err = uerr
	}
	return err
}

// planLocked runs fn in prepared mode under the lock the caller holds.
func (s *Store) planLocked(ctx context.Context, lock *lockfile.Lock, fn func(tx *Tx) error) (*Tx, error) {
	tx := &Tx{s: s, ctx: ctx, lock: lock, reads: map[string]record.Record{}, prepared: true,
		deps: map[string]fsx.Fingerprint{}, listed: map[record.Kind]bool{}}
	var err error
	tx.gen0, err = s.generation()
	if err == nil {
		err = fn(tx)
	}
	tx.end()
	return tx, err
}

// plan runs fn under the lock in prepared mode and returns the plan.
func (s *Store) plan(ctx context.Context, fn func(tx *Tx) error) (*Tx, error) {
	unlock, lock, err := s.lockStore(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := s.planLocked(ctx, lock, fn)
	if uerr := unlock(); err == nil {
		err = uerr
	}
	if err != nil {
		return nil, err
	}
	return tx, nil
}

// commit queues p for the next lock hold and waits for its outcome. The first
// goroutine to queue while no hold is pending leads: it takes the lock, publishes
// everything queued by then, and hands the lead to the first publication queued
// meanwhile.
func (s *Store) commit(ctx context.Context, p *publication) error {
	p.done, p.lead = make(chan struct{}), make(chan struct{})
	s.pubMu.Lock()
	s.pubQueue = append(s.pubQueue, p)
	leader := !s.pubLeader
	s.pubLeader = true
	s.pubMu.Unlock()
	if !leader {
		select {
		case <-p.done:
			return p.err
		case <-p.lead:
		}
	}
	s.leadHold(ctx)
	<-p.done
	return p.err
}

// leadHold takes the lock once and publishes every queued publication.
func (s *Store) leadHold(ctx context.Context) {
	unlock, lock, lockErr := s.lockStore(context.WithoutCancel(ctx))
	s.pubMu.Lock()
	batch := s.pubQueue
	s.pubQueue = nil
	s.pubMu.Unlock()
	if lockErr != nil {
		for _, p := range batch {
			p.err = lockErr
		}
	} else {
		s.publishBatch(lock, batch)
		if err := unlock(); err != nil {
			for _, p := range batch {
				if p.err == nil {
					p.err = err
				}
			}
		}
	}
	s.pubMu.Lock()
	if len(s.pubQueue) > 0 {
		close(s.pubQueue[0].lead)
	} else {
		s.pubLeader = false
	}
	s.pubMu.Unlock()
	for _, p := range batch {
		close(p.done)
	}
}

// publishBatch publishes the plans of batch under one lock hold: first every plan's
// ordinary writes, then one fsync per directory, then the putLast writes of the plans
// that succeeded, then one fsync per directory again.
func (s *Store) publishBatch(lock *lockfile.Lock, batch []*publication) {
	var earlier groupWrites
	pub := &Tx{s: s, ctx: context.Background(), lock: lock, reads: map[string]record.Record{}, group: &earlier}
	defer pub.end()
	for phase := 0; phase < 2; phase++ {
		touched := map[string][]*publication{}
		for _, p := range batch {
			if p.err != nil {
				continue
			}
			if phase == 0 {
				if p.err = earlier.validate(p.plan); p.err != nil {
					continue
				}
				if p.err = s.validatePlan(p.plan); p.err != nil {
					continue
				}
				if p.check != nil {
					if p.err = p.check(pub); p.err != nil {
						continue
					}
				}
				earlier.add(p.plan)
			}
			var ws []*write
			for _, w := range p.plan.writes {
				if w.last == (phase == 1) {
					ws = append(ws, w)
				}
			}
			dirs, err := pub.publish(ws)
			p.err = err
			for d := range dirs {
				touched[d] = append(touched[d], p)
			}
		}
		for _, d := range sortedKeysOf(touched) {
			if err := s.fs.SyncDir(d); err != nil {
				for _, p := range touched[d] {
					if p.err == nil {
						p.err = writeError(d, err)
					}
				}
			}
		}
	}
}

// groupWrites is what the plans accepted earlier in one group commit write, all of
// it, including the writes they publish last (putLast): a later plan of the group
// that read one of those records, or listed one of those kinds, was planned before
// they were published and is stale, even though the generation marks of the last
// writes are not written yet when it is validated.
type groupWrites struct {
	paths map[string]bool
	kinds map[record.Kind]bool
	// lastCreates counts, per kind, the records the accepted plans create with
	// putLast writes: published after every plan's capacity check, they are counted
	// by those checks all the same (unpublishedCreates).
	lastCreates map[record.Kind]int
}

func (g *groupWrites) add(plan *Tx) {
	if g.paths == nil {
		g.paths, g.kinds, g.lastCreates = map[string]bool{}, map[record.Kind]bool{}, map[record.Kind]int{}
	}
	for _, w := range plan.writes {
		g.paths[w.path()] = true
		g.kinds[w.kind] = true
		if fp, read := plan.deps[w.path()]; w.last && w.rec != nil && read && fp == (fsx.Fingerprint{}) {
			g.lastCreates[w.kind]++
		}
	}
}

// validate reports errStalePlan if plan read or listed what an earlier plan of the
// group writes.
func (g *groupWrites) validate(plan *Tx) error {
	for k := range plan.listed {
		if g.kinds[k] {
			return errStalePlan
		}
	}
	for p := range plan.deps {
		if g.paths[p] {
			return errStalePlan
		}
	}
	return nil
}

func sortedKeysOf[V any](m map[string]V) []string {
	keys := make(map[string]bool, len(m))
	for k := range m {
		keys[k] = true
	}
	return sortedKeys(keys)
}

// validatePlan reports errStalePlan if a publication since plan was made touched a
// record the plan read, or any record of a kind the plan listed. The generation file
// tells which kinds were published to since (one mark byte per publication). A plan
// made on another generation file than the current one — compacted, replaced, made or
// removed since — is stale: its tail is gone, so what changed cannot be told.
func (s *Store) validatePlan(plan *Tx) error {
	cur, err := s.generation()
	if err != nil {
		return err
	}
	if cur == plan.gen0 {
		return nil
	}
	if !cur.sameFile(plan.gen0) || cur.size < plan.gen0.size {
		return errStalePlan
	}
	changed := s.changedKinds(plan.gen0, cur)
	for k := range changed {
		if plan.listed[k] {
			return errStalePlan
		}
	}
	for p, fp := range plan.deps {
		kind, _, _ := strings.Cut(p, "/")
		if !changed[record.Kind(kind)] {
			continue
		}
		var now fsx.Fingerprint
		info, err := s.fs.Lstat(p)
		switch {
		case err == nil:
			now = info.Fingerprint()
		case !fsx.IsNotExist(err):
			return invalidAt(p, err)
		}
		if now != fp {
			return errStalePlan
		}
	}
	return nil
}

var markKind = func() map[byte]record.Kind {
	m := map[byte]record.Kind{}
	for k, b := range kindMark {
		m[b] = k
	}
	return m
}()

// Update is a staged single write: it reads record kind/id, gives fn a copy (nil if
// absent), and durably writes the record fn returns (nil: nothing) — signed and
// fsynced outside the lock, and published only if the record is still the one fn saw;
// otherwise fn runs again on the new version. fn must have no side effects.
func (s *Store) Update(ctx context.Context, k record.Kind, id string, fn func(cur record.Record) (record.Record, error)) error {
	return s.PreparedTransaction(ctx, func(tx *Tx) error {
		cur, err := tx.getCopy(k, id)
		if err != nil {
			return err
		}
		next, err := fn(cur)
		if err != nil || next == nil {
			return err
		}
		if next.Kind() != k || next.RecordID() != id {
			return invalidAt(where(next), errors.New("Update must write the record it read"))
		}
		return tx.Put(next)
	})
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
