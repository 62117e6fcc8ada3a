package carrier

import (
	"context"
	"slices"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// targetPlan is one target's dispatchable envelopes at one moment.
type targetPlan struct {
	url     string // the target's canonical relay URL (relayproto.CanonicalRelayURL)
	due     int64  // ms: the earliest due time of its envelopes
	waiting bool   // in a persisted unreachable wait
	since   int64  // ms: when the wait began (waiting only)
	probeAt int64  // ms: when the wait's next probe is due (waiting only)
	envs    []store.OutboxSummary
	dues    []int64 // ms: each envelope's effective due time
}

// plan reads the outbox index, the batch markers and the message ids (a single's
// commit, DESIGN §7) and groups the dispatchable envelopes by target.
func (c *Carrier) plan(ctx context.Context, now time.Time, expedite map[string]bool) ([]*targetPlan, error) {
	sums, batches, messages, err := planInputs(ctx, c.s)
	if err != nil {
		return nil, err
	}
	return buildPlan(sums, batches, messages, now.UnixMilli(), c.o.HolderID, expedite), nil
}

// buildPlan groups sums (sorted by message and ordinal, as OutboxSummaries returns
// them) into per-target plans, keeping only dispatchable envelopes: pending members
// of a batch whose marker exists (batches is sorted), and singles without a marker
// whose message record exists (messages is sorted; the lease checks that it commits
// the single). The result is ordered by due time, oldest first.
//
// An envelope's effective due time is its nextAttemptAt; in a target wait, not before
// the wait's next probe (the latest nextAttemptAt among the waiting envelopes: each
// probe pushes only the probed envelope forward); never after its deadline (so the
// deadline closes it on time); and never before a live lease of another holder ends.
// An expedited envelope (an operator's retry, Carrier.Expedite) is due now, whatever
// the wait. A held envelope is due only at its deadline, which still closes it, and
// takes no part in a target wait: an operator's hold never makes the timer fire
// earlier. Envelopes are grouped by their relay URL's canonical form, so that two
// spellings of one relay are one target.
func buildPlan(sums []store.OutboxSummary, batches, messages []string, now int64, holder string, expedite map[string]bool) []*targetPlan {
	byURL := map[string]*targetPlan{}
	canon := canonicalizer()
	var order []*targetPlan
	for i := range sums {
		e := &sums[i]
		if e.State != record.StatePending {
			continue
		}
		if _, ok := slices.BinarySearch(batches, e.BatchID); !ok {
			if !record.IsSingle(e.BatchID, e.EnvelopeID, e.Ordinal) {
				continue
			}
			if _, ok := slices.BinarySearch(messages, e.MessageID); !ok {
				continue
			}
		}
		u := canon(e.RelayURL)
		tp := byURL[u]
		if tp == nil {
			tp = &targetPlan{url: u}
			byURL[u] = tp
			order = append(order, tp)
		}
		tp.envs = append(tp.envs, *e)
		if e.UnreachableSince > 0 && !e.Held {
			if !tp.waiting || e.UnreachableSince < tp.since {
				tp.since = e.UnreachableSince
			}
			tp.waiting = true
			tp.probeAt = max(tp.probeAt, e.NextAttemptAt)
		}
	}
	for _, tp := range order {
		tp.dues = make([]int64, len(tp.envs))
		for i := range tp.envs {
			d := effectiveDue(&tp.envs[i], tp, now, holder, expedite[tp.envs[i].EnvelopeID])
			tp.dues[i] = d
			if i == 0 || d < tp.due {
				tp.due = d
			}
		}
	}
	slices.SortStableFunc(order, func(a, b *targetPlan) int {
		switch {
		case a.due < b.due:
			return -1
		case a.due > b.due:
			return 1
		}
		return 0
	})
	return order
}

func effectiveDue(e *store.OutboxSummary, tp *targetPlan, now int64, holder string, expedited bool) int64 {
	d := e.NextAttemptAt
	switch {
	case e.Held:
		d = e.DeliveryDeadline
	case expedited:
		d = min(d, now)
	case tp.waiting:
		d = max(d, tp.probeAt)
	}
	d = min(d, e.DeliveryDeadline)
	if l := e.Lease; l != nil && l.Until > now && l.Holder != holder {
		d = max(d, l.Until)
	}
	return d
}

// canonicalizer returns a memoizing relayproto.CanonicalRelayURL for one plan: a URL
// it refuses (a record written before URLs were canonical) stays as it is.
func canonicalizer() func(string) string {
	memo := map[string]string{}
	return func(raw string) string {
		if u, ok := memo[raw]; ok {
			return u
		}
		u, err := relayproto.CanonicalRelayURL(raw)
		if err != nil {
			u = raw
		}
		memo[raw] = u
		return u
	}
}
