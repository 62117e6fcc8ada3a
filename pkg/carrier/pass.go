package carrier

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// verdicts of the lease step.
const (
	skipped = iota // changed, settled or leased by another live holder meanwhile
	closed         // its deadline had passed: closed without a send
	sent           // leased and sent; outcome says how it went
)

// runChunk bounds the envelopes of a target leased, sent and settled together: one
// lease transaction, one batch request, one settlement transaction. It is half what the
// relay protocol allows: a settlement publishes its records under the store lock, and
// with 32 the p99 lock hold of a 10,000-envelope unreachable/back cycle is about 7 ms
// instead of 14 ms, while delivery keeps the relay's raw accept rate
// (docs/PERFORMANCE.md).
const runChunk = relayproto.MaxBatchEnvelopes / 2

// pass is one dispatch of a target: its due envelopes in (message, ordinal) order, in
// runs of up to runChunk leased together, sent in one batch request when the
// transport has batches for the target (else one envelope at a time) and settled
// together. In a target wait, only one envelope is sent (the probe).
// It runs in its own goroutine; it touches no loop state.
func (c *Carrier) pass(ctx context.Context, tp *targetPlan) passResult {
	r := passResult{target: tp.url}
	if c.onPass != nil {
		c.onPass(tp.url)
	}
	start := c.nowMs()
	if tp.waiting && start-tp.since >= c.o.OfflineLimit.Milliseconds() {
		n, err := c.expireTarget(ctx, tp)
		r.progress, r.err = n > 0, err
		return r
	}
	bt, _ := c.t.(BatchTransport)
	single := bt == nil // this pass sends one envelope at a time
	sends := 0
	for i := 0; i < len(tp.envs); {
		if ctx.Err() != nil || sends >= c.o.MaxPerPass || (tp.waiting && sends > 0) {
			break
		}
		batch := !single && !tp.waiting && bt.Batches(tp.url)
		limit := 1
		if batch {
			limit = min(runChunk, c.o.MaxPerPass-sends)
		}
		var run []int
		for ; i < len(tp.envs) && len(run) < limit; i++ {
			if tp.dues[i] <= start {
				run = append(run, i)
			}
		}
		if len(run) == 0 {
			break
		}
		rr, err := c.attemptRun(ctx, tp, run, batch)
		if err != nil {
			r.err = err
			return r
		}
		if rr.consumed < len(run) {
			i = run[rr.consumed] // the rest did not fit the batch (or it must go singly)
		}
		if rr.unbatched {
			single = true
		}
		r.progress = r.progress || rr.progress
		sends += rr.sends
		if rr.unreachable {
			return r // the target waits; the rest of its envelopes were told so
		}
		if tp.waiting && rr.sends > 0 {
			// The probe was answered: the wait is over and the rest are due now.
			r.err = c.clearWait(ctx, tp)
			return r
		}
	}
	return r
}

func (c *Carrier) nowMs() int64 { return c.o.Clock.Now().UnixMilli() }

// runResult is what one run of a pass did.
type runResult struct {
	consumed    int  // how many of the run went through the lease step
	sends       int  // envelopes sent
	progress    bool // something was sent or closed
	unreachable bool // the target did not answer: it now waits
	unbatched   bool // the relay took no batch: the run was released, to go singly
}

// leased is an envelope this holder leased for a send.
type leased struct {
	e    *store.OutboxSummary
	env  []byte
	blob *envelope.BlobRef // its body is this blob: it is sent alone (sendBlob)
}

// attemptRun leases the envelopes run (indexes into tp.envs, in order) in one
// transaction, sends the leased ones outside any lock — in one batch request if
// batch — and settles their outcomes in one transaction. The lease stops early when
// the next envelope would not fit the batch body: consumed says how far it got.
func (c *Carrier) attemptRun(ctx context.Context, tp *targetPlan, run []int, batch bool) (runResult, error) {
	var rr runResult
	now := c.nowMs()
	var taken []leased
	var verdicts []int
	err := c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
		taken, verdicts, rr.consumed = nil, make([]int, len(run)), 0
		markers := map[string][]*record.Outbox{}
		size := relayproto.BatchBodySize()
		for k, i := range run {
			e := &tp.envs[i]
			v, o, err := c.leaseTx(tx, e, now, markers)
			if err != nil {
				return err
			}
			alone := false
			if v == sent {
				var blob *envelope.BlobRef
				if ref, ok := blobOf(o.Envelope); ok {
					blob = &ref
				}
				if len(taken) > 0 && (blob != nil || batch && size+1+len(o.Envelope) > relayproto.MaxBatchBodySize) {
					break // a blob envelope goes alone; it begins the next run
				}
				size += 1 + len(o.Envelope)
				o.Lease = &record.Lease{Holder: c.o.HolderID, Until: now + c.o.LeaseFor.Milliseconds()}
				if err := tx.Put(o); err != nil {
					return err
				}
				taken = append(taken, leased{e: e, env: o.Envelope, blob: blob})
				alone = blob != nil
			}
			verdicts[k] = v
			rr.consumed = k + 1
			if alone {
				break // nothing goes with a blob envelope
			}
		}
		return nil
	})
	if err == nil {
		ids := make([]string, 0, rr.consumed)
		for _, i := range run[:rr.consumed] {
			ids = append(ids, tp.envs[i].EnvelopeID)
		}
		c.unexpedite(ids...) // an operator's retry ends at the lease step it asked for
	}
	if c.onLease != nil {
		for k, i := range run[:max(rr.consumed, 1)] {
			c.onLease(tp.envs[i].EnvelopeID, err == nil && k < len(verdicts) && verdicts[k] == sent)
		}
	}
	if err != nil {
		return runResult{}, err
	}
	for _, v := range verdicts[:rr.consumed] {
		switch v {
		case skipped:
			c.st.leaseSkips.Add(1)
		case closed:
			rr.progress = true
			c.st.close(record.ClosedByDeadline)
		}
	}
	if len(taken) == 0 {
		return rr, nil
	}
	ctx = WithHead(ctx, c.head()) // every post carries the store's head
	var results []Result
	if batch && len(taken) > 1 {
		envs := make([][]byte, len(taken))
		for k, l := range taken {
			envs[k] = l.env
		}
		sendCtx, cancel := context.WithTimeout(ctx, c.o.SendTimeout)
		results = c.t.(BatchTransport).SendBatch(sendCtx, tp.url, envs)
		cancel()
		if results == nil {
			// Nothing was accepted as a batch: release the run and send it singly.
			rr.unbatched = true
			rr.consumed = slices.Index(verdicts, sent) // the ones before were skipped or closed
			sctx, stop := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
			defer stop()
			_, err := c.settleRun(sctx, tp, taken, nil, false)
			return rr, err
		}
		if len(results) != len(taken) {
			results = nil // a transport's bug: count nothing as sent
		}
	} else {
		for _, l := range taken {
			res := c.sendOne(ctx, tp.url, l)
			results = append(results, res)
			if res.Outcome == Unreachable || ctx.Err() != nil {
				break // the rest are released unsent
			}
		}
	}
	// Settle even if Run is being stopped: an accepted envelope must be recorded.
	sctx, stopping := ctx, ctx.Err() != nil
	if stopping {
		var stop context.CancelFunc
		sctx, stop = context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer stop()
	}
	rr.sends, rr.progress = len(results), rr.progress || len(results) > 0
	for k, res := range results {
		if stopping && res.Outcome != Accepted {
			continue // interrupted by our own shutdown: no verdict
		}
		c.st.attempt(res.Outcome)
		c.o.Logger.Debug("carrier: attempt", "target", tp.url, "envelope", taken[k].e.EnvelopeID, "outcome", res.Outcome.String(),
			"status", res.Status, "err", res.Err, "run", len(taken))
		if res.Outcome == Unreachable {
			rr.unreachable = true
		}
	}
	if err := c.witness(sctx, tp.url, results); err != nil {
		// The store is rolled back: nothing is settled (the store refuses it
		// anyway); what the relay accepted stays pending, its record as it was.
		return rr, err
	}
	nexts, err := c.settleRun(sctx, tp, taken, results, stopping)
	if err != nil {
		return rr, err
	}
	for k, res := range results {
		if stopping && res.Outcome != Accepted {
			continue
		}
		c.event(Event{Kind: EventAttempt, Target: tp.url, EnvelopeID: taken[k].e.EnvelopeID, Outcome: res.Outcome,
			Status: res.Status, Reason: describe(res), NextAttempt: dueTime(nexts[k])})
	}
	if rr.unreachable {
		settled := map[string]bool{}
		probeAt := int64(0)
		for k, res := range results {
			settled[taken[k].e.EnvelopeID] = true
			if res.Outcome == Unreachable {
				probeAt = max(probeAt, nexts[k])
			}
		}
		err = c.markWaiting(sctx, tp, now, probeAt, settled)
	}
	return rr, err
}

// dueTime is a due time in ms as a time (zero for 0).
func dueTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// leaseTx is the lease step of e inside a lease transaction: skipped (changed,
// settled, not dispatchable, held, not due, or leased by another live holder), closed
// (its deadline passed, held or not: closed here), or sent with the record to lease (not yet put).
// markers caches the batch markers read in this transaction.
func (c *Carrier) leaseTx(tx *store.Tx, e *store.OutboxSummary, now int64, markers map[string][]*record.Outbox) (int, *record.Outbox, error) {
	o, err := store.TxGet[*record.Outbox](tx, e.EnvelopeID)
	if err != nil || o == nil || o.State != record.StatePending {
		return skipped, nil, err
	}
	if l := o.Lease; l != nil && l.Until > now && l.Holder != c.o.HolderID {
		return skipped, nil, nil
	}
	members, ok := markers[o.BatchID]
	if !ok {
		if members, err = tx.Committed(o.BatchID); err != nil {
			return skipped, nil, err
		}
		markers[o.BatchID] = members
	}
	if o.Ordinal >= len(members) || members[o.Ordinal].EnvelopeID != o.EnvelopeID {
		return skipped, nil, nil // its marker does not list it: not dispatchable
	}
	if o.DeliveryDeadline <= now {
		return closed, nil, c.closeTx(tx, o, now, record.ClosedByDeadline, errcode.OutboxDeadlineExpired.String(), markers)
	}
	// A member still pending of a cancelled message is what a cancel interrupted
	// after the message's close leaves: never sent, closed as the cancel would have.
	m, err := store.TxGet[*record.Message](tx, o.MessageID)
	if err != nil {
		return skipped, nil, err
	}
	if m != nil && m.Status == record.StatusClosed && m.ClosedBy == record.ClosedByCancelled {
		// The operator's cancel, copied: not the carrier's decision.
		o.State, o.LastError, o.Held, o.Lease, o.Operator = record.StateClosed, m.LastError, nil, nil, record.CloneAction(m.Operator)
		return closed, nil, tx.Put(o)
	}
	if o.Held != nil || o.NextAttemptAt > now {
		return skipped, nil, nil // held by an operator, or not due
	}
	return sent, o, nil
}

// settleRun records the outcomes of a run in one transaction, under the lock, on the
// records as they are now: results[k] is taken[k]'s; an envelope without a result
// (not sent), or with one other than Accepted while stopping, only has its lease
// released. It returns when each envelope is due again (zero if it is not pending
// any more or was only released).
func (c *Carrier) settleRun(ctx context.Context, tp *targetPlan, taken []leased, results []Result, stopping bool) ([]int64, error) {
	now := c.nowMs()
	delays := make([]time.Duration, len(taken))
	for k, res := range results {
		if res.Outcome == Failed {
			delays[k] = c.backoff(taken[k].e.Attempts+1, res.RetryAfter)
		}
	}
	var nexts []int64
	deadlineClosed := 0
	err := c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
		nexts, deadlineClosed = make([]int64, len(taken)), 0
		batches := map[string][]*record.Outbox{}
		for k, l := range taken {
			o, err := store.TxGet[*record.Outbox](tx, l.e.EnvelopeID)
			if err != nil {
				return err
			}
			if o == nil || o.State != record.StatePending {
				continue
			}
			if k >= len(results) || (stopping && results[k].Outcome != Accepted) {
				if o.Lease == nil || o.Lease.Holder != c.o.HolderID {
					continue
				}
				o.Lease = nil
				if err := tx.Put(o); err != nil {
					return err
				}
				continue
			}
			closedNow, next, err := c.settleTx(tx, tp, o, results[k], now, delays[k], batches)
			if err != nil {
				return err
			}
			if closedNow {
				deadlineClosed++
			}
			nexts[k] = next
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for range deadlineClosed {
		c.st.close(record.ClosedByDeadline)
	}
	return nexts, nil
}

// settleTx records one attempt's outcome on o. It reports whether the deadline closed
// o and when o is due again (0 if not pending any more). batches is messageTx's.
func (c *Carrier) settleTx(tx *store.Tx, tp *targetPlan, o *record.Outbox, res Result, now int64, delay time.Duration, batches map[string][]*record.Outbox) (bool, int64, error) {
	if res.Outcome == Accepted {
		return false, 0, settleAccepted(tx, o, now, batches)
	}
	if l := o.Lease; l != nil && l.Holder != c.o.HolderID && l.Until > now {
		return false, 0, nil // another holder took it over after our lease ran out
	}
	why := describe(res)
	o.Attempts++
	o.Lease = nil
	switch res.Outcome {
	case Refused:
		prefix := record.RefusedPrefix
		if res.local {
			prefix = record.CarrierRefusedPrefix // the carrier's own verdict (a missing blob)
		}
		return false, 0, c.closeTx(tx, o, now, record.ClosedByRefused, clip(prefix+why), batches)
	}
	if o.DeliveryDeadline <= now {
		return true, 0, c.closeTx(tx, o, now, record.ClosedByDeadline, clip(errcode.OutboxDeadlineExpired.String()+": last attempt: "+why), batches)
	}
	if res.Outcome == Failed {
		o.NextAttemptAt, o.LastError, o.UnreachableSince = now+delay.Milliseconds(), clip(why), 0
		if err := tx.Put(o); err != nil {
			return false, 0, err
		}
		return false, o.NextAttemptAt, messageTx(tx, o, now, "", "", "", batches)
	}
	// Unreachable: the target waits. This envelope carries the next probe; the
	// others that do not know of the wait yet learn it afterwards (markWaiting).
	if o.UnreachableSince == 0 {
		o.UnreachableSince = c.waitSince(tp, now)
	}
	since := o.UnreachableSince
	if tp.waiting {
		since = min(since, tp.since)
	}
	o.NextAttemptAt, o.LastError = now+c.probeDelay(since, now).Milliseconds(), clip("relay "+why) // "relay unreachable: …": why begins with the outcome
	if err := tx.Put(o); err != nil {
		return false, 0, err
	}
	return false, o.NextAttemptAt, messageTx(tx, o, now, "", "", "", batches)
}

// settleAccepted records on the pending o that its relay accepted it: the attempt
// counted, o relayed (its lease, wait and lastError gone; a hold that came while
// it was in flight ends with the send) and its message moved forward
// (messageTx). An accepted envelope is settled whoever holds its lease now: the
// relay has it. batches is messageTx's.
func settleAccepted(tx *store.Tx, o *record.Outbox, now int64, batches map[string][]*record.Outbox) error {
	o.Attempts++
	o.State, o.Lease, o.LastError, o.UnreachableSince, o.Held = record.StateRelayed, nil, "", 0, nil
	if err := tx.Put(o); err != nil {
		return err
	}
	return messageTx(tx, o, now, record.StatusRelayed, "", "", batches)
}

// SettleAccepted applies, in tx, the carrier's settlement of an accepted attempt
// (settleAccepted: DESIGN §11's "accepted" edge) to o, a pending outbox record
// as tx reads it, for rcpt, the relay's parsed and verified receipt
// (envelope.ParseRelayReceipt), which must be a persisted receipt for exactly o
// (its id and digest): otherwise nothing changes and the error says why. It is
// how sealbridge-fsck --reconcile (pkg/reconcile) settles an envelope a relay
// says it holds, with the very rule the carrier applies to a receipt. It writes
// o and its message through tx, durable as tx's writes are. now is in Unix ms.
func SettleAccepted(tx *store.Tx, o *record.Outbox, rcpt *envelope.RelayReceipt, now int64) error {
	switch {
	case o == nil:
		return errors.New("carrier: no outbox record to settle")
	case o.State != record.StatePending:
		return fmt.Errorf("carrier: envelope %s is %s, not pending", o.EnvelopeID, o.State)
	case !rcpt.Matches(o.EnvelopeID, o.EnvelopeDigest):
		return fmt.Errorf("carrier: the receipt is not a persisted receipt for envelope %s", o.EnvelopeID)
	}
	return settleAccepted(tx, o, now, map[string][]*record.Outbox{})
}

// probeDelay is how long after now a target waiting since since (ms) is probed
// next: the wait's length so far, kept within [ProbeMin, ProbeEvery], times a jitter
// factor in [1, 2), kept within the same bounds. The first probe comes 1–2 s after
// the target stopped answering, and each next one about two to three times as far
// into the wait as the last, up to ProbeEvery; the wait is persisted (since), so a
// restart keeps its place in the sequence.
func (c *Carrier) probeDelay(since, now int64) time.Duration {
	base := time.Duration(max(now-since, 0)) * time.Millisecond
	base = min(max(base, c.o.ProbeMin), c.o.ProbeEvery)
	d := time.Duration(float64(base) * (1 + c.o.Jitter()))
	return min(max(d, c.o.ProbeMin), c.o.ProbeEvery)
}

// waitSince is when tp's wait began: now, unless it was waiting already.
func (c *Carrier) waitSince(tp *targetPlan, now int64) int64 {
	if tp.waiting {
		return tp.since
	}
	return now
}

// markWaiting tells tp's other pending envelopes (all but settled) that do not know
// of the target's wait yet, without an attempt, that they wait for the next probe at
// probeAt (ms; the probe's own next attempt), in transactions of at most
// expireChunk envelopes: no lock hold grows with the target's backlog. A crash
// between two leaves some unmarked; the wait still holds them back (the plan sees
// the target waiting), and the next probe marks them.
func (c *Carrier) markWaiting(ctx context.Context, tp *targetPlan, now, probeAt int64, settled map[string]bool) error {
	since := c.waitSince(tp, now)
	var ids []string
	for i := range tp.envs {
		if e := &tp.envs[i]; !settled[e.EnvelopeID] && e.UnreachableSince == 0 && !e.Held {
			ids = append(ids, e.EnvelopeID)
		}
	}
	return c.inChunks(ctx, ids, func(tx *store.Tx, x *record.Outbox) (bool, error) {
		if x.UnreachableSince != 0 || x.Held != nil {
			return false, nil
		}
		x.UnreachableSince, x.NextAttemptAt = since, max(probeAt, now)
		return true, nil
	})
}

// clearWait ends tp's target wait: every waiting envelope is due now. It works in
// transactions of at most expireChunk envelopes; a crash between two leaves the rest
// waiting until the next probe, which clears them.
func (c *Carrier) clearWait(ctx context.Context, tp *targetPlan) error {
	now := c.nowMs()
	var ids []string
	for i := range tp.envs {
		if tp.envs[i].UnreachableSince != 0 {
			ids = append(ids, tp.envs[i].EnvelopeID)
		}
	}
	return c.inChunks(ctx, ids, func(tx *store.Tx, o *record.Outbox) (bool, error) {
		if o.UnreachableSince == 0 {
			return false, nil
		}
		o.UnreachableSince = 0
		o.NextAttemptAt = min(o.NextAttemptAt, now)
		return true, nil
	})
}

// takeOverLeases releases the lease of every pending envelope held by another
// holder (Options.TakeOverLeases: they are all dead), in transactions of at most
// expireChunk records. It returns how many leases the index showed.
func (c *Carrier) takeOverLeases(ctx context.Context) (int, error) {
	sums, err := c.s.OutboxSummaries(ctx)
	if err != nil {
		return 0, err
	}
	var ids []string
	for i := range sums {
		if e := &sums[i]; e.State == record.StatePending && e.Lease != nil && e.Lease.Holder != c.o.HolderID {
			ids = append(ids, e.EnvelopeID)
		}
	}
	return len(ids), c.inChunks(ctx, ids, func(tx *store.Tx, o *record.Outbox) (bool, error) {
		if o.Lease == nil || o.Lease.Holder == c.o.HolderID {
			return false, nil
		}
		o.Lease = nil
		return true, nil
	})
}

// inChunks runs change on the pending outbox records of ids, in transactions of at
// most expireChunk records each; a record change reports changed is written.
func (c *Carrier) inChunks(ctx context.Context, ids []string, change func(tx *store.Tx, o *record.Outbox) (bool, error)) error {
	for len(ids) > 0 {
		chunk := ids[:min(expireChunk, len(ids))]
		ids = ids[len(chunk):]
		err := c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
			for _, id := range chunk {
				o, err := store.TxGet[*record.Outbox](tx, id)
				if err != nil {
					return err
				}
				if o == nil || o.State != record.StatePending {
					continue
				}
				changed, err := change(tx, o)
				if err != nil {
					return err
				}
				if changed {
					if err := tx.Put(o); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// expireChunk bounds the envelopes one expiry transaction closes, and those one
// transaction of markWaiting or clearWait changes.
const expireChunk = runChunk

// expireTarget closes every waiting envelope of a target that stayed unreachable for
// OfflineLimit, recording why; their messages close as expired.
func (c *Carrier) expireTarget(ctx context.Context, tp *targetPlan) (int, error) {
	now := c.nowMs()
	total := 0
	var ids []string
	for i := range tp.envs {
		if tp.envs[i].UnreachableSince > 0 && !tp.envs[i].Held {
			ids = append(ids, tp.envs[i].EnvelopeID)
		}
	}
	for len(ids) > 0 {
		chunk := ids[:min(expireChunk, len(ids))]
		ids = ids[len(chunk):]
		n := 0
		err := c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
			n = 0
			batches := map[string][]*record.Outbox{}
			for _, id := range chunk {
				o, err := store.TxGet[*record.Outbox](tx, id)
				if err != nil {
					return err
				}
				if o == nil || o.State != record.StatePending || o.UnreachableSince == 0 || o.Held != nil {
					continue // a held envelope takes no part in the wait: only its deadline closes it
				}
				if l := o.Lease; l != nil && l.Until > now && l.Holder != c.o.HolderID {
					continue
				}
				reason := record.ExpiredPrefix + fmt.Sprintf("relay %s unreachable for %s (since %s, %d attempts)",
					tp.url, days(c.o.OfflineLimit), time.UnixMilli(o.UnreachableSince).UTC().Format(time.RFC3339), o.Attempts)
				if o.LastError != "" {
					reason += "; last error: " + o.LastError
				}
				if err := c.closeTx(tx, o, now, record.ClosedByExpired, clip(reason), batches); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		for range n {
			c.st.close(record.ClosedByExpired)
		}
		total += n
	}
	c.o.Logger.Info("carrier: target expired", "target", tp.url, "envelopes", total)
	return total, nil
}

func days(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	return d.String()
}

// closeTx closes o (and its message, if o speaks for it) with a reason; a hold on
// them ends. batches is messageTx's.
func (c *Carrier) closeTx(tx *store.Tx, o *record.Outbox, now int64, closedBy, reason string, batches map[string][]*record.Outbox) error {
	o.State, o.LastError, o.Lease, o.Held = record.StateClosed, reason, nil, nil
	if err := tx.Put(o); err != nil {
		return err
	}
	return messageTx(tx, o, now, record.StatusClosed, closedBy, reason, batches)
}

// messageTx moves o's message forward (never back) in the transaction that settles,
// closes or fails o: relayed if it was queued, closed if it was queued or relayed, and
// keeps its attempts count — when o speaks for its message (record.Speaks: an envelope
// of kind message does, and so does a confirmation's delivery-status, the one envelope
// of its message). Whatever o's kind, a hold never outlives the last pending envelope
// of its message: once o settled or closed and no envelope of the message is pending,
// the message's hold goes in the same transaction (closing the message clears it
// anyway). batches caches the committed members of the batches tx read, for their
// kinds, which never change.
func messageTx(tx *store.Tx, o *record.Outbox, now int64, status, closedBy, reason string, batches map[string][]*record.Outbox) error {
	m, err := store.TxGet[*record.Message](tx, o.MessageID)
	if err != nil || m == nil {
		return err
	}
	speaks := o.EnvelopeKind == record.EnvelopeMessage
	if !speaks {
		members, ok := batches[o.BatchID]
		if !ok {
			if members, err = tx.Committed(o.BatchID); err != nil {
				return err
			}
			batches[o.BatchID] = members
		}
		speaks = members != nil && record.Speaks(o, members)
	}
	changed := false
	switch {
	case !speaks:
	case status == record.StatusRelayed:
		if m.Status == record.StatusQueued {
			m.Status, changed = record.StatusRelayed, true
		}
	case status == record.StatusClosed:
		if m.Status == record.StatusQueued || m.Status == record.StatusRelayed {
			tx.EndMessage(m, record.StatusClosed, closedBy, reason, now)
			changed = true
		}
	}
	if speaks && o.Attempts > m.Attempts {
		m.Attempts, changed = o.Attempts, true
	}
	if m.Held != nil && o.State != record.StatePending {
		// The members as this transaction leaves them (o's write included).
		members, err := tx.Committed(o.BatchID)
		if err != nil {
			return err
		}
		if members != nil && !record.AnyPending(members) {
			m.Held, changed = nil, true // nothing of it is left to hold
		}
	}
	if !changed {
		return nil
	}
	m.UpdatedAt = max(now, 1)
	return tx.Put(m)
}

// backoff returns the delay after the attempts-th failed attempt: BackoffMin doubling
// to BackoffMax, times a jitter factor in [0.8, 1.2), kept within [BackoffMin,
// BackoffMax]; a Retry-After within that range is honoured when it asks for longer.
func (c *Carrier) backoff(attempts int, retryAfter time.Duration) time.Duration {
	base := c.o.BackoffMin
	for i := 1; i < attempts && base < c.o.BackoffMax; i++ {
		base *= 2
	}
	base = min(base, c.o.BackoffMax)
	d := time.Duration(float64(base) * (0.8 + 0.4*c.o.Jitter()))
	d = min(max(d, c.o.BackoffMin), c.o.BackoffMax)
	if retryAfter > 0 {
		d = max(d, min(max(retryAfter, c.o.BackoffMin), c.o.BackoffMax))
	}
	return d
}

// describe is an attempt's outcome in words for lastError: status and error, never
// payload bytes.
func describe(res Result) string {
	var b strings.Builder
	b.WriteString(res.Outcome.String())
	if res.Status != 0 && (res.Err == nil || !strings.HasPrefix(res.Err.Error(), fmt.Sprintf("HTTP %d", res.Status))) {
		fmt.Fprintf(&b, " (HTTP %d)", res.Status) // unless the error says it
	}
	if res.Err != nil {
		b.WriteString(": ")
		b.WriteString(res.Err.Error())
	}
	return b.String()
}

// clip bounds a lastError to the store's 1024 bytes, as valid UTF-8.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= 1024 {
		return s
	}
	cut := 1024 - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
