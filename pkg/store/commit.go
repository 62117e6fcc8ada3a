package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The commit engine (DESIGN §9). A prepared transaction is planned under the lock,
// staged outside it, then validated and published in a group commit with the other
// prepared transactions of this Store waiting at that moment. This file holds the
// plan, the rounds, the group and the validation; publish.go holds the publication,
// the marks and the adoption into this process's listings and indexes, which no other
// code changes.

// maxPlanRounds bounds how often a prepared transaction's fn runs before the
// transaction gives up with OUTBOX_STORE_BUSY.
const maxPlanRounds = 8

// errStalePlan reports that a publication since the plan touched what it depends on.
var errStalePlan = errors.New("store: plan invalidated by a concurrent publication")

// capacityCheck runs under the lock just before a plan is published; publisher is the
// group's Tx (its unpublishedCreates counts what earlier plans of the group create
// last). Its error refuses the plan with nothing written.
type capacityCheck func(publisher *Tx) error

// publication is one staged plan waiting for, or in, a group commit.
type publication struct {
	plan  *Tx
	check capacityCheck // nil: none
	err   error
	done  chan struct{} // closed when err is final
	lead  chan struct{} // closed when this publication's goroutine must lead the next group
}

// PreparedTransaction runs fn under the lock only to read and plan; the lock is never
// held across a signature or an fsync of a record file (DESIGN §9).
//
//  1. Plan: under the lock, fn reads records and plans Put and Delete calls.
//  2. Stage, outside the lock: every planned record is signed and written to a fresh
//     temp, in parallel, and each temp is fsynced.
//  3. Validate, under the lock again, in a group commit with the other prepared
//     transactions of this Store waiting then: if a publication since the plan, or a
//     plan before it in the group, changed a record fn read (or any record of a kind
//     fn listed), the temps are removed and fn runs again, up to a bound of rounds.
//  4. Publish: the temps are renamed into place and each directory touched is fsynced
//     once; then those planned to go last (a batch marker), and their directories.
//
// The last round is run locked (fn, staging and publication in one hold, which nothing
// can invalidate), so that conflicting writers of two processes cannot starve each
// other; with Options.OptimisticOnly it gives up with OUTBOX_STORE_BUSY instead.
//
// When it returns nil every planned write is durable, and the transaction behaved as
// if it ran alone at its publication: two that read one record and both write it are
// never both acknowledged. fn may run more than once and must have no side effects
// besides its plan; its error aborts the transaction with nothing written. A failure
// during publication keeps what was published before it (nothing is acknowledged).
// A rolled-back Store refuses it (STORE_ROLLED_BACK, RolledBack).
func (s *Store) PreparedTransaction(ctx context.Context, fn func(tx *Tx) error) error {
	return s.preparedTx(ctx, fn, nil)
}

// preparedTx is PreparedTransaction with a capacity check at publication.
func (s *Store) preparedTx(ctx context.Context, fn func(tx *Tx) error, check capacityCheck) error {
	if err := s.checkWritable(); err != nil {
		return err
	}
	backoff := time.Millisecond
	for round := 0; round < maxPlanRounds; round++ {
		if round == maxPlanRounds-1 && !s.optimisticOnly {
			return s.lockedRound(ctx, fn, check)
		}
		plan, beside, err := s.plan(ctx, fn)
		if err != nil {
			return err
		}
		if len(plan.writes) == 0 {
			// An answer. Made beside a leader, it may rest on a publication that
			// leader has begun and not finished (renamed some records, not yet
			// others, not yet made durable): it is validated by the next group, after
			// that hold, like a plan with writes, and given only if nothing it read
			// changed since it was made and no rename or fsync of that hold failed.
			if beside == nil {
				return nil
			}
			if answerWaits != nil {
				answerWaits()
			}
			err := s.commit(ctx, &publication{plan: plan})
			if err == nil && !beside.failed {
				return nil
			}
			if err != nil && !errors.Is(err, errStalePlan) {
				return err
			}
			continue
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

// answerWaits, if set (by tests, before the Store is used), runs when an answer
// planned beside a leader goes to be validated by the next group.
var answerWaits func()

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

// lockedRound plans fn, stages its writes and publishes them in one lock hold, which
// no other writer can invalidate.
func (s *Store) lockedRound(ctx context.Context, fn func(tx *Tx) error, check capacityCheck) error {
	unlock, h, err := s.lockStore(ctx, exclusive)
	if err != nil {
		return err
	}
	plan, err := s.planLocked(ctx, h.lock, fn)
	if err == nil && len(plan.writes) > 0 {
		if err = s.stage(ctx, plan.writes); err == nil {
			p := &publication{plan: plan, check: check}
			s.publishGroup(h.lock, []*publication{p})
			err = p.err
			discard(plan.writes)
		}
	}
	if uerr := unlock(); err == nil {
		err = uerr
	}
	return err
}

// plan runs fn under the lock in prepared mode and returns the plan, and the hold of
// the group-commit leader it was planned beside (nil: none), which may not have made
// what the plan read durable yet.
func (s *Store) plan(ctx context.Context, fn func(tx *Tx) error) (*Tx, *groupHold, error) {
	unlock, h, err := s.lockStore(ctx, planning)
	if err != nil {
		return nil, nil, err
	}
	tx, err := s.planLocked(ctx, h.lock, fn)
	if uerr := unlock(); err == nil {
		err = uerr
	}
	if err != nil {
		return nil, nil, err
	}
	return tx, h.beside, nil
}

// planLocked runs fn in prepared mode under the lock the caller holds: it notes the
// generation state first, so that every publication after it is seen by validate.
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

// commit queues p for the next group commit and waits for its outcome. The first
// goroutine to queue while no group is pending leads: it takes the lock, publishes
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
	s.leadGroup(ctx)
	<-p.done
	return p.err
}

// leadGroup takes the lock once and publishes every queued publication as one group.
func (s *Store) leadGroup(ctx context.Context) {
	unlock, h, lockErr := s.lockStore(context.WithoutCancel(ctx), leading)
	s.pubMu.Lock()
	group := s.pubQueue
	s.pubQueue = nil
	s.pubMu.Unlock()
	if lockErr != nil {
		for _, p := range group {
			p.err = lockErr
		}
	} else {
		h.group.failed = s.publishGroup(h.lock, group)
		if err := unlock(); err != nil {
			for _, p := range group {
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
	for _, p := range group {
		close(p.done)
	}
}

// publishGroup validates and publishes the plans of group under the lock the caller
// holds, in two phases: every accepted plan's ordinary writes, then one fsync per
// directory touched; then the putLast writes of the plans whose first phase
// succeeded, and one fsync per directory again. Each plan's outcome is its err. It
// reports whether a rename, unlink or directory fsync failed: what the hold made
// visible may then not be durable.
func (s *Store) publishGroup(lock *lockfile.Lock, group []*publication) (failed bool) {
	var accepted groupWrites
	publisher := &Tx{s: s, ctx: context.Background(), lock: lock, reads: map[string]record.Record{}, group: &accepted,
		marks: marks{s: s}}
	defer publisher.end()
	// The handle on the generation file, opened before the first plan is validated:
	// under the lock, its state is the file's, and the validations read the marks
	// through it. (A compaction it needs comes at the first publication.)
	if err := publisher.marks.open(); err != nil {
		for _, p := range group {
			p.err = err
		}
		return false
	}
	for phase := 0; phase < 2; phase++ {
		touched := map[string][]*publication{}
		for _, p := range group {
			if p.err != nil {
				continue
			}
			if phase == 0 {
				if p.err = s.validate(p.plan, &accepted, &publisher.marks); p.err != nil {
					continue
				}
				if p.err = s.checkObservedBlobs(p.plan); p.err != nil {
					continue
				}
				if p.check != nil && len(p.plan.writes) > 0 {
					if p.err = p.check(publisher); p.err != nil {
						continue
					}
				}
				accepted.add(p.plan)
			}
			var ws []*write
			for _, w := range p.plan.writes {
				if w.last == (phase == 1) {
					ws = append(ws, w)
				}
			}
			dirs, err := publisher.publish(ws)
			p.err = err
			failed = failed || err != nil
			for d := range dirs {
				touched[d] = append(touched[d], p)
			}
		}
		for _, d := range sortedKeysOf(touched) {
			if err := s.fs.SyncDir(d); err != nil {
				failed = true
				for _, p := range touched[d] {
					if p.err == nil {
						p.err = writeError(d, err)
					}
				}
			}
		}
	}
	return failed
}

// groupWrites is what the plans accepted so far in one group commit write: all of
// it, including the putLast writes that are published (and marked) only in the second
// phase, after every plan of the group was validated.
type groupWrites struct {
	paths map[string]bool
	kinds map[record.Kind]bool
	// lastCreates counts, per kind, the records the accepted plans create with
	// putLast writes, which every later plan's capacity check must count although
	// they are not published yet (Tx.unpublishedCreates).
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

// validate reports errStalePlan if anything plan depends on may have changed since it
// was made: a publication since (the generation marks tell which kinds, fingerprints
// which records), or a write of a plan accepted earlier in its group (group). A plan
// made on another generation file than the current one — compacted, replaced, made or
// removed since — is stale: its tail is gone, so what changed cannot be told. marks is
// the publisher's handle on the generation file, open: the file's state is its
// state.
func (s *Store) validate(plan *Tx, group *groupWrites, marks *marks) error {
	for k := range plan.listed {
		if group.kinds[k] {
			return errStalePlan
		}
	}
	for p := range plan.deps {
		if group.paths[p] {
			return errStalePlan
		}
	}
	if marks.removed {
		return errStalePlan // removed in this hold (markFailed): what changed is unknown
	}
	cur := marks.state
	if cur == plan.gen0 {
		return nil // also absent then and now
	}
	if marks.f == nil {
		return errStalePlan
	}
	if !cur.sameFile(plan.gen0) || cur.size < plan.gen0.size {
		return errStalePlan
	}
	counts, known := countMarks(marks.f, plan.gen0, cur)
	if !known {
		return errStalePlan
	}
	for k, n := range counts {
		if n > 0 && plan.listed[k] {
			return errStalePlan
		}
	}
	for p, fp := range plan.deps {
		kind, _, _ := strings.Cut(p, "/")
		if counts[record.Kind(kind)] == 0 {
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
