package carrier

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// verdicts of the lease step.
const (
	skipped = iota // changed, settled or leased by another live holder meanwhile
	closed         // its deadline had passed: closed without a send
	sent           // leased and sent; outcome says how it went
)

// pass is one dispatch of a target: its due envelopes in (message, ordinal) order,
// one attempt at a time. In a target wait, only one envelope is sent (the probe).
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
	sends := 0
	for i := range tp.envs {
		if ctx.Err() != nil || sends >= c.o.MaxPerPass || (tp.waiting && sends > 0) {
			break
		}
		if tp.dues[i] > start {
			continue
		}
		verdict, outcome, err := c.attempt(ctx, tp, &tp.envs[i])
		if err != nil {
			r.err = err
			return r
		}
		switch verdict {
		case skipped:
			c.st.leaseSkips.Add(1)
			continue
		case closed:
			r.progress = true
			continue
		}
		r.progress = true
		sends++
		if outcome == Unreachable {
			return r // the target waits; the rest of its envelopes were told so
		}
		if tp.waiting {
			// The probe was answered: the wait is over and the rest are due now.
			r.err = c.clearWait(ctx, tp)
			return r
		}
	}
	return r
}

func (c *Carrier) nowMs() int64 { return c.o.Clock.Now().UnixMilli() }

// attempt leases e, sends it outside any lock, and settles the outcome.
func (c *Carrier) attempt(ctx context.Context, tp *targetPlan, e *store.OutboxSummary) (verdict int, outcome Outcome, err error) {
	now := c.nowMs()
	var env []byte
	err = c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
		verdict, env = skipped, nil
		o, err := store.TxGet[*record.Outbox](tx, e.EnvelopeID)
		if err != nil || o == nil || o.State != record.StatePending {
			return err
		}
		if l := o.Lease; l != nil && l.Until > now && l.Holder != c.o.HolderID {
			return nil
		}
		members, err := tx.Committed(o.BatchID)
		if err != nil {
			return err
		}
		if o.Ordinal >= len(members) || members[o.Ordinal].EnvelopeID != o.EnvelopeID {
			return nil // its marker does not list it: not dispatchable
		}
		if o.DeliveryDeadline <= now {
			verdict = closed
			return c.closeTx(tx, o, now, record.ClosedByDeadline, errcode.OutboxDeadlineExpired.String())
		}
		if o.NextAttemptAt > now {
			return nil
		}
		o.Lease = &record.Lease{Holder: c.o.HolderID, Until: now + c.o.LeaseFor.Milliseconds()}
		verdict, env = sent, o.Envelope
		return tx.Put(o)
	})
	if c.onLease != nil {
		c.onLease(e.EnvelopeID, err == nil && verdict == sent)
	}
	if err != nil || verdict != sent {
		if err == nil && verdict == closed {
			c.st.close(record.ClosedByDeadline)
		}
		return verdict, 0, err
	}
	sendCtx, cancel := context.WithTimeout(ctx, c.o.SendTimeout)
	res := c.t.Send(sendCtx, tp.url, env)
	cancel()
	// Settle even if Run is being stopped: an accepted envelope must be recorded.
	sctx := ctx
	if ctx.Err() != nil {
		var stop context.CancelFunc
		sctx, stop = context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer stop()
		if res.Outcome != Accepted {
			// Interrupted by our own shutdown: no verdict; just release the lease.
			return sent, res.Outcome, c.release(sctx, e.EnvelopeID)
		}
	}
	c.st.attempt(res.Outcome)
	c.o.Logger.Debug("carrier: attempt", "target", tp.url, "envelope", e.EnvelopeID, "outcome", res.Outcome.String(), "status", res.Status, "err", res.Err)
	next, err := c.settle(sctx, tp, e, res)
	if err == nil {
		c.event(Event{Kind: EventAttempt, Target: tp.url, EnvelopeID: e.EnvelopeID, Outcome: res.Outcome,
			Status: res.Status, Reason: describe(res), NextAttempt: next})
	}
	return sent, res.Outcome, err
}

// release clears this holder's lease on id without counting an attempt.
func (c *Carrier) release(ctx context.Context, id string) error {
	return c.s.Update(ctx, record.KindOutbox, id, func(cur record.Record) (record.Record, error) {
		o, _ := cur.(*record.Outbox)
		if o == nil || o.State != record.StatePending || o.Lease == nil || o.Lease.Holder != c.o.HolderID {
			return nil, nil
		}
		o.Lease = nil
		return o, nil
	})
}

// settle records an attempt's outcome: under the lock, on the record as it is now.
// It returns when the envelope is due again (zero if it is not pending any more).
func (c *Carrier) settle(ctx context.Context, tp *targetPlan, e *store.OutboxSummary, res Result) (time.Time, error) {
	now := c.nowMs()
	var delay time.Duration
	if res.Outcome == Failed {
		delay = c.backoff(e.Attempts+1, res.RetryAfter)
	}
	why := describe(res)
	deadlineClosed := false
	var next int64
	err := c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
		deadlineClosed, next = false, 0
		o, err := store.TxGet[*record.Outbox](tx, e.EnvelopeID)
		if err != nil || o == nil || o.State != record.StatePending {
			return err
		}
		if l := o.Lease; res.Outcome != Accepted && l != nil && l.Holder != c.o.HolderID && l.Until > now {
			return nil // another holder took it over after our lease ran out
		}
		o.Attempts++
		o.Lease = nil
		switch res.Outcome {
		case Accepted:
			o.State, o.LastError, o.UnreachableSince = record.StateRelayed, "", 0
			if err := tx.Put(o); err != nil {
				return err
			}
			return c.messageTx(tx, o, now, record.StatusRelayed, "", "")
		case Refused:
			return c.closeTx(tx, o, now, record.ClosedByRefused, clip("refused by the relay: "+why))
		}
		if o.DeliveryDeadline <= now {
			deadlineClosed = true
			return c.closeTx(tx, o, now, record.ClosedByDeadline, clip(errcode.OutboxDeadlineExpired.String()+": last attempt: "+why))
		}
		if res.Outcome == Failed {
			o.NextAttemptAt, o.LastError, o.UnreachableSince = now+delay.Milliseconds(), clip(why), 0
			next = o.NextAttemptAt
			if err := tx.Put(o); err != nil {
				return err
			}
			return c.messageTx(tx, o, now, "", "", "")
		}
		// Unreachable: the target waits. This envelope carries the next probe; the
		// others that do not know of the wait yet learn it, without an attempt.
		since := now
		if tp.waiting {
			since = tp.since
		}
		if o.UnreachableSince == 0 {
			o.UnreachableSince = since
		}
		o.NextAttemptAt, o.LastError = now+c.o.ProbeEvery.Milliseconds(), clip("relay unreachable: "+why)
		next = o.NextAttemptAt
		if err := tx.Put(o); err != nil {
			return err
		}
		if err := c.messageTx(tx, o, now, "", "", ""); err != nil {
			return err
		}
		for i := range tp.envs {
			other := &tp.envs[i]
			if other.EnvelopeID == o.EnvelopeID || other.UnreachableSince != 0 {
				continue
			}
			x, err := store.TxGet[*record.Outbox](tx, other.EnvelopeID)
			if err != nil {
				return err
			}
			if x == nil || x.State != record.StatePending || x.UnreachableSince != 0 {
				continue
			}
			x.UnreachableSince, x.NextAttemptAt = since, now+c.o.ProbeEvery.Milliseconds()
			if err := tx.Put(x); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && deadlineClosed {
		c.st.close(record.ClosedByDeadline)
	}
	if err != nil || next == 0 {
		return time.Time{}, err
	}
	return time.UnixMilli(next), nil
}

// clearWait ends tp's target wait: every waiting envelope is due now.
func (c *Carrier) clearWait(ctx context.Context, tp *targetPlan) error {
	now := c.nowMs()
	return c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
		for i := range tp.envs {
			if tp.envs[i].UnreachableSince == 0 {
				continue
			}
			o, err := store.TxGet[*record.Outbox](tx, tp.envs[i].EnvelopeID)
			if err != nil {
				return err
			}
			if o == nil || o.State != record.StatePending || o.UnreachableSince == 0 {
				continue
			}
			o.UnreachableSince = 0
			o.NextAttemptAt = min(o.NextAttemptAt, now)
			if err := tx.Put(o); err != nil {
				return err
			}
		}
		return nil
	})
}

// expireChunk bounds the envelopes one expiry transaction closes.
const expireChunk = 64

// expireTarget closes every waiting envelope of a target that stayed unreachable for
// OfflineLimit, recording why; their messages close as expired.
func (c *Carrier) expireTarget(ctx context.Context, tp *targetPlan) (int, error) {
	now := c.nowMs()
	total := 0
	var ids []string
	for i := range tp.envs {
		if tp.envs[i].UnreachableSince > 0 {
			ids = append(ids, tp.envs[i].EnvelopeID)
		}
	}
	for len(ids) > 0 {
		chunk := ids[:min(expireChunk, len(ids))]
		ids = ids[len(chunk):]
		n := 0
		err := c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
			n = 0
			for _, id := range chunk {
				o, err := store.TxGet[*record.Outbox](tx, id)
				if err != nil {
					return err
				}
				if o == nil || o.State != record.StatePending || o.UnreachableSince == 0 {
					continue
				}
				if l := o.Lease; l != nil && l.Until > now && l.Holder != c.o.HolderID {
					continue
				}
				reason := fmt.Sprintf("expired: relay %s unreachable for %s (since %s, %d attempts)",
					tp.url, days(c.o.OfflineLimit), time.UnixMilli(o.UnreachableSince).UTC().Format(time.RFC3339), o.Attempts)
				if o.LastError != "" {
					reason += "; last error: " + o.LastError
				}
				if err := c.closeTx(tx, o, now, record.ClosedByExpired, clip(reason)); err != nil {
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

// closeTx closes o (and its message) with a reason.
func (c *Carrier) closeTx(tx *store.Tx, o *record.Outbox, now int64, closedBy, reason string) error {
	o.State, o.LastError, o.Lease = record.StateClosed, reason, nil
	if err := tx.Put(o); err != nil {
		return err
	}
	return c.messageTx(tx, o, now, record.StatusClosed, closedBy, reason)
}

// messageTx moves o's message forward (never back): relayed if it was queued, closed
// if it was queued or relayed; and keeps its attempts count. Only the envelope of
// kind message speaks for its message.
func (c *Carrier) messageTx(tx *store.Tx, o *record.Outbox, now int64, status, closedBy, reason string) error {
	if o.EnvelopeKind != record.EnvelopeMessage {
		return nil
	}
	m, err := store.TxGet[*record.Message](tx, o.MessageID)
	if err != nil || m == nil {
		return err
	}
	changed := false
	switch status {
	case record.StatusRelayed:
		if m.Status == record.StatusQueued {
			m.Status, changed = record.StatusRelayed, true
		}
	case record.StatusClosed:
		if m.Status == record.StatusQueued || m.Status == record.StatusRelayed {
			m.Status, m.ClosedBy, m.LastError, changed = record.StatusClosed, closedBy, reason, true
		}
	}
	if o.Attempts > m.Attempts {
		m.Attempts, changed = o.Attempts, true
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
	if res.Status != 0 {
		fmt.Fprintf(&b, " (HTTP %d)", res.Status)
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
