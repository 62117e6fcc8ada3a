package carrier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Selector picks the messages an operator action applies to: the listed message
// ids, or (Target set, MessageIDs empty) every message with pending envelopes to that
// relay URL.
type Selector struct {
	MessageIDs []string
	Target     string
}

// ActionResult is what an action did to one message.
type ActionResult struct {
	MessageID string
	Changed   int    // envelopes this call changed (0: already so — idempotent)
	Code      string // "" when applied or already so; else a stable errcode code
	Message   string // the refusal's reason, or a note such as "1 envelope already relayed is not recalled"
	// Effect, for a retry that applied, is what happens now (EffectAttempting,
	// EffectProbing, EffectInFlight, EffectHeld), whether or not a record changed.
	Effect string
	// InFlight counts the message's envelopes with an attempt under way (a live
	// lease) when the action ran: a cancel does not recall them, so they may still
	// be delivered; Message says so.
	InFlight int

	expedite []string // a retry's envelopes to attempt at once (Carrier.Act)
}

// Effects of a retry (ActionResult.Effect).
const (
	// EffectAttempting: an attempt of the message is made now.
	EffectAttempting = "attempting"
	// EffectProbing: its target is in an unreachable wait; an attempt of the
	// message is made now as the target's probe, and an answer ends the wait.
	EffectProbing = "probing-target"
	// EffectInFlight: an attempt is already under way (a live lease); its outcome
	// decides what comes next.
	EffectInFlight = "in-flight"
	// EffectHeld: every pending envelope is held: nothing is attempted until a release.
	EffectHeld = "held"
)

// Act is Apply with this carrier: a retry's messages are attempted at once
// (Expedite), as their target's probe if it waits, and — the carrier's
// TakeOverLeases proving every other lease holder dead — a retry also ends a dead
// holder's lease on them. The carrier is kicked after a release or a retry.
func (c *Carrier) Act(ctx context.Context, sel Selector, a record.Action) ([]ActionResult, error) {
	dead := func(string) bool { return false }
	if c.o.TakeOverLeases {
		dead = func(holder string) bool { return holder != c.o.HolderID }
	}
	results, err := apply(ctx, c.s, sel, a, dead)
	var ids []string
	for _, r := range results {
		ids = append(ids, r.expedite...)
	}
	c.Expedite(ids)
	if a.Op == record.ActionRelease || a.Op == record.ActionRetry {
		c.Kick()
	}
	return results, err
}

// actionChunk bounds the envelopes one transaction of a target's action changes, so
// that no lock hold grows with the target's backlog (a message has at most
// record.MaxBatchMembers, which is this).
const actionChunk = record.MaxBatchMembers

// Apply performs operator action a (a.Op) on the selected messages, each message's
// change a durable store transaction (a target's in chunks of at most 64 envelopes).
// a.At is the action's time: a retry makes the envelopes due then. Every record an
// action changes keeps a as its Operator, so a reader can tell the operator's
// decision from the carrier's. Repeating an action changes nothing (Changed 0). The
// error is for a bad action or selector, or the store's; a refusal for one message
// (MESSAGE_NOT_FOUND, MESSAGE_CLOSED) is in its result. The carrier, if running,
// should be kicked after a release or retry (Carrier.Act does that, and more). A
// target is compared by its canonical form (relayproto.CanonicalRelayURL).
func Apply(ctx context.Context, s *store.Store, sel Selector, a record.Action) ([]ActionResult, error) {
	return apply(ctx, s, sel, a, func(string) bool { return false })
}

// apply is Apply; dead reports whether a lease holder is known to be dead (a retry
// ends its lease).
func apply(ctx context.Context, s *store.Store, sel Selector, a record.Action, dead func(holder string) bool) ([]ActionResult, error) {
	if err := checkAction(a); err != nil {
		return nil, err
	}
	if (len(sel.MessageIDs) == 0) == (sel.Target == "") {
		return nil, errors.New("carrier: an operator action needs message ids or a target, not both")
	}
	sums, err := s.OutboxSummaries(ctx)
	if err != nil {
		return nil, err
	}
	canon := canonicalizer()
	target := ""
	if sel.Target != "" {
		target = canon(sel.Target)
	}
	selected := map[string]bool{}
	for _, id := range sel.MessageIDs {
		selected[id] = true
	}
	batchOf := map[string]string{} // message id → its batch id
	var order []string             // the target's messages with pending envelopes, in order
	count := map[string]int{}      // message id → its envelopes
	waiting := map[string]bool{}   // targets in a wait kept by messages not selected
	for i := range sums {
		e := &sums[i]
		if _, ok := batchOf[e.MessageID]; !ok {
			batchOf[e.MessageID] = e.BatchID
		}
		count[e.MessageID]++
		if e.State != record.StatePending {
			continue
		}
		u := canon(e.RelayURL)
		if target != "" && u == target && (len(order) == 0 || order[len(order)-1] != e.MessageID) {
			order = append(order, e.MessageID)
		}
		if e.UnreachableSince > 0 && !e.Held && !selected[e.MessageID] {
			waiting[u] = true
		}
	}
	env := actionEnv{a: a, dead: dead, probing: func(url string) bool { return target == "" && waiting[canon(url)] }}
	var results []ActionResult
	if sel.Target == "" {
		seen := map[string]bool{}
		for _, id := range sel.MessageIDs {
			if seen[id] {
				continue
			}
			seen[id] = true
			var r ActionResult
			err := s.PreparedTransaction(ctx, func(tx *store.Tx) error {
				var err error
				r, err = applyTx(tx, id, batchOf[id], env)
				return err
			})
			if err != nil {
				return results, err
			}
			results = append(results, r)
		}
		return results, nil
	}
	// A target's messages, whole messages per transaction, up to actionChunk envelopes.
	for len(order) > 0 {
		n, size := 0, 0
		for n < len(order) && (n == 0 || size+count[order[n]] <= actionChunk) {
			size += count[order[n]]
			n++
		}
		chunk := order[:n]
		order = order[n:]
		var rs []ActionResult
		err := s.PreparedTransaction(ctx, func(tx *store.Tx) error {
			rs = rs[:0]
			for _, id := range chunk {
				r, err := applyTx(tx, id, batchOf[id], env)
				if err != nil {
					return err
				}
				rs = append(rs, r)
			}
			return nil
		})
		if err != nil {
			return results, err
		}
		results = append(results, rs...)
	}
	return results, nil
}

// checkAction refuses an action the records could not keep.
func checkAction(a record.Action) error {
	switch a.Op {
	case record.ActionHold, record.ActionRelease, record.ActionCancel, record.ActionRetry:
	default:
		return fmt.Errorf("carrier: operator action %q is not hold, release, cancel or retry", a.Op)
	}
	if a.By == "" || len(a.By) > record.MaxActionBy || len(a.Reason) > record.MaxActionReason || a.At <= 0 {
		return fmt.Errorf("carrier: operator action %s needs a by of 1..%d bytes, a reason of at most %d and a time",
			a.Op, record.MaxActionBy, record.MaxActionReason)
	}
	return nil
}

// actionEnv is what applyTx knows besides the action: which lease holders are
// dead, and whether a message's target stays in a wait after a retry of it.
type actionEnv struct {
	a       record.Action
	dead    func(holder string) bool
	probing func(relayURL string) bool
}

// applyTx performs env.a on message id (whose envelopes are batch batchID, "" if it
// has none) inside tx, on the records as they are now: the members first, the
// message last, so that a crash between them leaves a state the same action
// completes.
func applyTx(tx *store.Tx, id, batchID string, env actionEnv) (ActionResult, error) {
	a := env.a
	r := ActionResult{MessageID: id}
	m, err := store.TxGet[*record.Message](tx, id)
	if err != nil {
		return r, err
	}
	var members []*record.Outbox
	if m != nil && batchID != "" {
		if members, err = tx.Committed(batchID); err != nil {
			return r, err
		}
	}
	if m == nil || (m.Status == record.StatusQueued && members == nil) {
		r.Code, r.Message = errcode.MessageNotFound.String(), "no such message"
		return r, nil
	}
	if m.Status == record.StatusDelivered || m.Status == record.StatusClosed {
		if a.Op == record.ActionCancel && m.ClosedBy == record.ClosedByCancelled {
			// A cancel interrupted after the message's close (its members' writes
			// lost in a crash) is completed by the same action repeated.
			for _, o := range members {
				if o.State != record.StatePending {
					continue
				}
				c := a
				o.State, o.LastError, o.Held, o.Lease, o.Operator = record.StateClosed, m.LastError, nil, nil, &c
				if err := tx.Put(o); err != nil {
					return r, err
				}
				r.Changed++
			}
			if r.Changed == 0 {
				r.Message = "already cancelled"
			}
			return r, nil
		}
		r.Code, r.Message = errcode.MessageClosed.String(), "the message is already "+m.Status
		if m.ClosedBy != "" {
			r.Message += " (" + m.ClosedBy + ")"
		}
		return r, nil
	}
	if a.Op == record.ActionCancel && !record.AnyPending(members) {
		// Relayed, or queued behind members a crash left settled (maintenance
		// brings it forward): nothing is pending, and nothing is recalled.
		r.Code, r.Message = errcode.MessageClosed.String(), "nothing to cancel: no envelope is pending, and an envelope at the relay is not recalled"
		return r, nil
	}
	act := func() *record.Action { c := a; return &c }
	pending, relayed, heldSkipped := 0, 0, 0
	var leaseUntil int64 // the latest live lease of a retried envelope
	var url string       // the message's target
	for _, o := range members {
		if o.State == record.StateRelayed {
			relayed++
		}
		if o.State != record.StatePending {
			continue
		}
		pending++
		url = o.RelayURL
		change := false
		live := o.Lease != nil && o.Lease.Until > a.At
		if live && !env.dead(o.Lease.Holder) {
			r.InFlight++
		}
		switch a.Op {
		case record.ActionHold:
			if o.Held == nil {
				// A held envelope takes no part in its target's wait: it leaves the
				// wait it was in, so that neither the wait's expiry nor, after a
				// long hold, the release closes it unprobed.
				held := act()
				o.Held, o.Operator, o.UnreachableSince, change = held, act(), 0, true
			}
		case record.ActionRelease:
			if o.Held != nil {
				o.Held, o.Operator, change = nil, act(), true
			}
		case record.ActionCancel:
			o.State, o.LastError, o.Held, o.Lease, o.Operator = record.StateClosed, cancelReason(a), nil, nil, act()
			change = true
		case record.ActionRetry:
			if o.Held != nil {
				heldSkipped++
				if o.UnreachableSince != 0 { // the target's wait is cleared even so
					o.UnreachableSince, o.Operator, change = 0, act(), true
				}
				break
			}
			if o.Lease != nil && env.dead(o.Lease.Holder) {
				// A dead carrier's lease (TakeOverLeases): nothing is in flight.
				o.Lease, change = nil, true
			}
			if o.NextAttemptAt > a.At || o.UnreachableSince != 0 {
				o.NextAttemptAt, o.UnreachableSince, change = min(o.NextAttemptAt, a.At), 0, true
			}
			if change {
				o.Operator = act()
			}
			if o.Lease != nil && o.Lease.Until > a.At {
				leaseUntil = max(leaseUntil, o.Lease.Until)
			} else {
				r.expedite = append(r.expedite, o.EnvelopeID)
			}
		}
		if change {
			if err := tx.Put(o); err != nil {
				return r, err
			}
			r.Changed++
		}
	}
	mchange := false
	switch a.Op {
	case record.ActionHold:
		if m.Held == nil && pending > 0 {
			m.Held, m.Operator, mchange = act(), act(), true
		}
		if pending == 0 {
			r.Message = "no pending envelope to hold"
		}
	case record.ActionRelease:
		if m.Held != nil {
			m.Held, m.Operator, mchange = nil, act(), true
		}
	case record.ActionCancel:
		// Closed as the carrier closes a message whose envelope closes, through the
		// store's one rule for an ending message (closed retention, hold cleared).
		tx.EndMessage(m, record.StatusClosed, record.ClosedByCancelled, cancelReason(a), a.At)
		m.Operator, mchange = act(), true
		var notes []string
		if relayed > 0 {
			notes = append(notes, plural(relayed, "envelope")+" already relayed "+isAre(relayed)+" not recalled")
		}
		if r.InFlight > 0 {
			notes = append(notes, "in flight: "+plural(r.InFlight, "envelope")+" may still be delivered (a send under way is not recalled)")
		}
		r.Message = strings.Join(notes, "; ")
	case record.ActionRetry:
		if r.Changed > 0 {
			m.Operator, mchange = act(), true
		}
		var notes []string
		switch {
		case len(r.expedite) > 0 && env.probing(url):
			r.Effect = EffectProbing
			notes = append(notes, "probing its target now (the target is in an unreachable wait)")
		case len(r.expedite) > 0:
			r.Effect = EffectAttempting
			notes = append(notes, "attempting now")
		case leaseUntil > 0:
			r.Effect = EffectInFlight
			notes = append(notes, "in flight: an attempt is under way (leased until "+
				time.UnixMilli(leaseUntil).UTC().Format(time.RFC3339)+")")
		case heldSkipped > 0:
			r.Effect = EffectHeld
		}
		if heldSkipped > 0 {
			notes = append(notes, plural(heldSkipped, "held envelope")+" "+isAre(heldSkipped)+" not retried (release first)")
		}
		r.Message = strings.Join(notes, "; ")
	}
	if mchange {
		m.UpdatedAt = max(m.UpdatedAt, a.At)
		if err := tx.Put(m); err != nil {
			return r, err
		}
	}
	return r, nil
}

// cancelReason is the lastError a cancel leaves on its records.
func cancelReason(a record.Action) string {
	if a.Reason == "" {
		return "cancelled by operator"
	}
	return clip("cancelled by operator: " + a.Reason)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}
