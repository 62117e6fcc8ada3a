package carrier

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Target states of a TargetView.
const (
	TargetReady       = "ready"       // an envelope is due now or being sent
	TargetBackingOff  = "backing-off" // every unheld envelope waits for its next attempt (BackoffUntil)
	TargetUnreachable = "unreachable" // in a persisted unreachable wait (UnreachableSince, NextProbeAt)
	TargetHeld        = "held"        // every pending envelope is held by an operator
)

// AgeBuckets are the upper bounds of TargetView.Ages' buckets (like qshape's); the
// last bucket counts the older ones.
var AgeBuckets = [len(TargetView{}.Ages) - 1]time.Duration{5 * time.Minute, 10 * time.Minute,
	20 * time.Minute, 40 * time.Minute, 80 * time.Minute, 160 * time.Minute}

// TargetView is one relay target's backlog at one moment. It counts the pending
// envelopes the carrier would dispatch (those of a committed batch or single, by the
// plan's rules) and the held ones among them. Times are Unix milliseconds, 0 for none.
type TargetView struct {
	RelayURL string
	Pending  int   // pending envelopes, held ones included
	Held     int   // of Pending, those an operator holds
	Bytes    int64 // signed envelope bytes of the pending envelopes
	// OldestPendingAt is when the oldest pending envelope's message was created (its
	// first due time if the message record is missing).
	OldestPendingAt int64
	// InFlight is the pending envelopes with a live lease (an attempt under way).
	InFlight int
	State    string // TargetReady, TargetBackingOff, TargetUnreachable or TargetHeld
	// BackoffUntil, in state backing-off, is when the first unheld envelope is due.
	BackoffUntil int64
	// UnreachableSince and NextProbeAt, in state unreachable (and when a target whose
	// envelopes are all held keeps its wait), are when the wait began and when its next
	// probe is due.
	UnreachableSince int64
	NextProbeAt      int64
	// Attempts is the sum of the pending envelopes' attempts.
	Attempts int
	// LastError is the last error of the pending envelope tried most often (the one
	// due latest among those on a tie); "" when none failed.
	LastError string
	// Ages counts the pending envelopes by their message's age at now: under each of
	// AgeBuckets in turn, then older.
	Ages [7]int
}

// Targets returns the backlog of every relay target with pending dispatchable
// envelopes, ordered by relay URL, as the store's indexes say at now. It reads only
// the store (a carrier need not run).
func Targets(ctx context.Context, s *store.Store, now time.Time) ([]TargetView, error) {
	sums, batches, messages, err := planInputs(ctx, s)
	if err != nil {
		return nil, err
	}
	msgs, err := s.MessageSummaries(ctx)
	if err != nil {
		return nil, err
	}
	return targetViews(sums, msgs, batches, messages, now.UnixMilli()), nil
}

// planInputs reads what a plan is built from: the outbox index, the batch listing
// and the message listing (sorted).
func planInputs(ctx context.Context, s *store.Store) ([]store.OutboxSummary, []string, []string, error) {
	sums, err := s.OutboxSummaries(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	batches, err := s.List(record.KindBatches)
	if err != nil {
		return nil, nil, nil, err
	}
	messages, err := s.List(record.KindMessages)
	if err != nil {
		return nil, nil, nil, err
	}
	return sums, batches, messages, nil
}

// targetLastError is the last error of tp's pending envelope tried most often (the
// one due latest among those on a tie); "" when none failed.
func targetLastError(tp *targetPlan) string {
	last, mostTried, latest := "", -1, int64(0)
	for i := range tp.envs {
		if e := &tp.envs[i]; e.LastError != "" && (e.Attempts > mostTried || (e.Attempts == mostTried && tp.dues[i] > latest)) {
			last, mostTried, latest = e.LastError, e.Attempts, tp.dues[i]
		}
	}
	return last
}

// targetViews builds the views from the plan of sums (buildPlan decides what is
// dispatchable and the due times). The plan leaves held envelopes out of the
// schedule, so it is built with the holds lifted and the holds are counted here.
func targetViews(sums []store.OutboxSummary, msgs []store.MessageSummary, batches, messages []string, now int64) []TargetView {
	held := map[string]bool{}
	for i := range sums {
		if sums[i].Held {
			held[sums[i].EnvelopeID] = true
			sums[i].Held = false
		}
	}
	createdAt := make(map[string]int64, len(msgs))
	for _, m := range msgs {
		createdAt[m.MessageID] = m.CreatedAt
	}
	plans := buildPlan(sums, batches, messages, now, "", nil)
	out := make([]TargetView, 0, len(plans))
	for _, tp := range plans {
		v := TargetView{RelayURL: tp.url, LastError: targetLastError(tp)}
		due, dueSet, ready := int64(0), false, false
		for i := range tp.envs {
			e := &tp.envs[i]
			v.Pending++
			v.Bytes += e.Bytes
			v.Attempts += e.Attempts
			born, ok := createdAt[e.MessageID]
			if !ok || born == 0 {
				born = e.NextAttemptAt
			}
			if v.OldestPendingAt == 0 || born < v.OldestPendingAt {
				v.OldestPendingAt = born
			}
			v.Ages[ageBucket(now-born)]++
			inFlight := e.Lease != nil && e.Lease.Until > now
			if inFlight {
				v.InFlight++
			}
			if held[e.EnvelopeID] {
				v.Held++
				continue
			}
			switch {
			case inFlight || tp.dues[i] <= now:
				ready = true
			case !dueSet || tp.dues[i] < due:
				due, dueSet = tp.dues[i], true
			}
		}
		if tp.waiting {
			v.UnreachableSince, v.NextProbeAt = tp.since, tp.probeAt
		}
		switch {
		case v.Held == v.Pending:
			v.State = TargetHeld
		case tp.waiting:
			v.State = TargetUnreachable
		case ready:
			v.State = TargetReady
		default:
			v.State, v.BackoffUntil = TargetBackingOff, due
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b TargetView) int { return strings.Compare(a.RelayURL, b.RelayURL) })
	return out
}

// ageBucket is the index in TargetView.Ages of an age in ms.
func ageBucket(ms int64) int {
	for i, b := range AgeBuckets {
		if ms < b.Milliseconds() {
			return i
		}
	}
	return len(AgeBuckets)
}

// What a pending envelope waits for (EnvelopeWait.WaitingFor).
const (
	// WaitNone: it is due now.
	WaitNone = ""
	// WaitTarget: its target is in an unreachable wait; DueAt is the target's next
	// probe (an operator's retry of it, or of the target, attempts it now).
	WaitTarget = "target"
	// WaitBackoff: its own retry delay after a failed attempt.
	WaitBackoff = "backoff"
	// WaitLease: a lease: an attempt under way, or one a carrier that died left,
	// until it ends (a daemon that starts takes its dead predecessor's leases over).
	WaitLease = "lease"
	// WaitHeld: an operator holds it; only its deadline closes it.
	WaitHeld = "held"
)

// EnvelopeWait is what one pending dispatchable envelope waits for at one moment.
// Times are Unix milliseconds.
type EnvelopeWait struct {
	// DueAt is when the carrier attempts it (its effective due time, the plan's:
	// the target's next probe in a wait, the end of a live lease); for a held
	// envelope, its own nextAttemptAt.
	DueAt      int64
	WaitingFor string // WaitNone, WaitTarget, WaitBackoff, WaitLease or WaitHeld
	LeaseUntil int64  // the live lease's end, if it has one
	// LastError is its own last error or, when it has none and its target waits
	// (or backs off), the target's (TargetView.LastError).
	LastError string
}

// Waits returns what every pending dispatchable envelope waits for, by envelope
// id, as the store's indexes say at now, by the rules the carrier plans with. It
// reads only the store (a carrier need not run); a lease of any holder counts.
func Waits(ctx context.Context, s *store.Store, now time.Time) (map[string]EnvelopeWait, error) {
	sums, batches, messages, err := planInputs(ctx, s)
	if err != nil {
		return nil, err
	}
	return envelopeWaits(sums, batches, messages, now.UnixMilli()), nil
}

func envelopeWaits(sums []store.OutboxSummary, batches, messages []string, now int64) map[string]EnvelopeWait {
	out := map[string]EnvelopeWait{}
	for _, tp := range buildPlan(sums, batches, messages, now, "", nil) {
		targetErr := targetLastError(tp)
		for i := range tp.envs {
			e := &tp.envs[i]
			w := EnvelopeWait{DueAt: tp.dues[i], LastError: e.LastError}
			if l := e.Lease; l != nil && l.Until > now {
				w.LeaseUntil = l.Until
			}
			switch {
			case e.Held:
				w.WaitingFor, w.DueAt = WaitHeld, e.NextAttemptAt
			case w.DueAt <= now:
				w.WaitingFor = WaitNone
			case w.LeaseUntil != 0 && w.DueAt == w.LeaseUntil:
				w.WaitingFor = WaitLease
			case tp.waiting:
				w.WaitingFor = WaitTarget
			default:
				w.WaitingFor = WaitBackoff
			}
			if w.LastError == "" && w.WaitingFor != WaitNone && w.WaitingFor != WaitHeld {
				w.LastError = targetErr
			}
			out[e.EnvelopeID] = w
		}
	}
	return out
}
