package store

import (
	"context"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// Internals the package's external tests assert against; they are not part of the API.
const (
	MaxPlanRounds             = maxPlanRounds
	DefaultOperationRetention = defaultOperationRetention
)

// ErrStalePlan is what CommitAsOneGroup answers for a plan found stale.
var ErrStalePlan = errStalePlan

// PlanBegin returns BeginOperation's plan for key and request, for CommitAsOneGroup.
func (s *Store) PlanBegin(key string, request []byte) func(tx *Tx) error {
	keyHash, reqDigest := record.IdempotencyID(key), envelope.Digest(request)
	return func(tx *Tx) error { _, err := s.planBegin(tx, keyHash, reqDigest); return err }
}

// PlanEnqueue returns Enqueue's plan for req, for CommitAsOneGroup.
func (s *Store) PlanEnqueue(req SendRequest) func(tx *Tx) error {
	return func(tx *Tx) error { _, err := s.planEnqueue(tx, req); return err }
}

// CommitAsOneGroup plans each of fns in turn, stages them all, and publishes them in
// one group commit, in order, as the leader does for publications queued together.
// It returns each plan's outcome (ErrStalePlan for one found stale; it is not run
// again). The crash explorer of conflicting groups needs the group to be exactly this.
func (s *Store) CommitAsOneGroup(ctx context.Context, fns ...func(tx *Tx) error) []error {
	errs := make([]error, len(fns))
	var group []*publication
	for i, fn := range fns {
		plan, _, err := s.plan(ctx, fn)
		if err == nil {
			err = s.stage(ctx, plan.writes)
		}
		if errs[i] = err; err == nil {
			group = append(group, &publication{plan: plan, done: make(chan struct{}), lead: make(chan struct{})})
		}
	}
	unlock, h, err := s.lockStore(ctx, exclusive)
	if err != nil {
		panic(err)
	}
	s.publishGroup(h.lock, group)
	if err := unlock(); err != nil {
		panic(err)
	}
	j := 0
	for i := range errs {
		if errs[i] == nil {
			errs[i] = group[j].err
			discard(group[j].plan.writes)
			j++
		}
	}
	return errs
}

// QueuedPublications returns how many staged publications wait for the next group.
func QueuedPublications(s *Store) int {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	return len(s.pubQueue)
}

// NoInFlightWaits makes index readers that meet a publication of this process in
// flight refresh around it at once instead of waiting for it (indexRound), until the
// test ends: for tests that read an index from inside the publication itself.
func NoInFlightWaits(t interface{ Cleanup(func()) }) {
	waits := maxInFlightWaits
	maxInFlightWaits = 0
	t.Cleanup(func() { maxInFlightWaits = waits })
}

// OnBlobsScanned makes fn run between maintenance's scan of the blob references
// outside the lock and its removal step under it, until the test ends.
func OnBlobsScanned(t interface{ Cleanup(func()) }, fn func()) {
	blobsScanned = fn
	t.Cleanup(func() { blobsScanned = nil })
}
