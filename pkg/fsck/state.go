package fsck

import (
	"context"
	"errors"
	"fmt"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The state rules: what a message record and its committed outbox members must agree
// on, as the store's writers keep them. The carrier settles or closes an envelope and
// moves its message forward in one transaction (only an envelope that speaks for its
// message moves it, record.Speaks: one of kind message, or a confirmation's
// delivery-status), clearing the message's hold with its last pending envelope, and
// an operator's hold, release or cancel changes a message and its pending members
// together. A message behind its members, or a hold
// on only one side, is what a crash between the publications of such a transaction
// leaves (each is published before its directory's fsync, and either may be lost), or
// a write lost or undone (a restored backup, a replayed file); a hold on a closed
// record only the latter. Maintenance brings a message behind its members forward
// before it removes them (record.MessageFollow, the one rule of both).

// stateRule is one broken state rule: the finding, and the record that repairs it
// (nil: nothing can be written that keeps every acknowledged message).
type stateRule struct {
	code     Code
	severity Severity
	path     string
	why      string
	action   string
	fixed    record.Record
}

// stateRef names the records a state rule relates: a message and its batch ("" for a
// message that no intact batch or single commits any more, whose envelopes are gone).
type stateRef struct {
	messageID, batchID string
}

// stateRules returns the state rules that message m (nil if absent) and its committed
// members break. It is pure: the check calls it on what it read, and the repair again
// on what its transaction reads, so a repair is decided on the records it replaces.
func stateRules(m *record.Message, messageID string, members []*record.Outbox, nowMs int64) []stateRule {
	var out []stateRule
	msgPath := record.Path(record.KindMessages, messageID)
	for _, o := range members {
		if o.Held != nil && o.State != record.StatePending {
			c := record.Clone(o).(*record.Outbox)
			c.Held = nil
			out = append(out, stateRule{code: CodeHeldNotOpen, severity: Problem, path: record.Path(record.KindOutbox, o.EnvelopeID),
				why:    "a " + o.State + " envelope still held: only a pending envelope is held, and settling or closing one clears the hold",
				action: "clear the hold (the envelope stays " + o.State + ")", fixed: c})
		}
	}
	if m == nil {
		return out
	}
	if m.Held != nil && m.Status != record.StatusQueued && m.Status != record.StatusRelayed {
		c := record.Clone(m).(*record.Message)
		c.Held = nil
		out = append(out, stateRule{code: CodeHeldNotOpen, severity: Problem, path: msgPath,
			why:    "a " + m.Status + " message still held: only a queued or relayed message is held, and closing one clears the hold",
			action: "clear the hold (the message stays " + m.Status + ")", fixed: c})
	}
	if m.Status == record.StatusClosed && m.ClosedBy == record.ClosedByCancelled && (m.Operator == nil || m.Operator.Op != record.ActionCancel) {
		out = append(out, stateRule{code: CodeCancelUnrecorded, severity: Note, path: msgPath,
			why: "closed by cancel, but no operator's cancel is recorded on the message: who cancelled it cannot be told"})
	}
	if m.Status == record.StatusClosed && m.ClosedBy == record.ClosedByCancelled {
		out = append(out, cancelIncomplete(msgPath, m.LastError, m.Operator, members)...)
	}
	if m.Status != record.StatusQueued && m.Status != record.StatusRelayed {
		return out
	}
	var held, unheld []*record.Outbox
	for _, o := range members {
		if o.State == record.StatePending {
			if o.Held != nil {
				held = append(held, o)
			} else {
				unheld = append(unheld, o)
			}
		}
	}
	f := record.MessageFollow(m, members, nowMs)
	switch f.Status {
	case record.StatusClosed:
		op := record.Path(record.KindOutbox, f.Envelope.EnvelopeID)
		why := "a " + m.Status + " message whose envelope " + op + " is closed: closing an envelope closes its message in the same transaction"
		if f.ClosedBy == "" {
			return append(out, stateRule{code: CodeMessageNotClosed, severity: Problem, path: msgPath, why: why + "; its envelope does not say why it was closed",
				action: "none: the closer cannot be told; leave it, or cancel the message if that was meant"})
		}
		c := record.Clone(m).(*record.Message)
		c.Status, c.ClosedBy, c.LastError, c.Held = record.StatusClosed, f.ClosedBy, f.Reason, nil
		c.Attempts = max(c.Attempts, f.Attempts)
		c.UpdatedAt = max(nowMs, c.UpdatedAt, 1)
		out = append(out, stateRule{code: CodeMessageNotClosed, severity: Problem, path: msgPath, why: why,
			action: "close the message by " + f.ClosedBy + " with its envelope's reason, as the writer that closed the envelope would have", fixed: c})
		if f.ClosedBy == record.ClosedByCancelled {
			// The message closes by cancel: its other pending members too, in the
			// same run.
			c.Operator = record.CloneAction(f.Envelope.Operator)
			out = append(out, cancelIncomplete(msgPath, c.LastError, c.Operator, members)...)
		}
		return out
	case record.StatusRelayed:
		c := record.Clone(m).(*record.Message)
		c.Status = record.StatusRelayed
		c.Attempts = max(c.Attempts, f.Attempts)
		c.UpdatedAt = max(nowMs, c.UpdatedAt, 1)
		out = append(out, stateRule{code: CodeMessageBehind, severity: Problem, path: msgPath,
			why:    "a queued message whose envelope " + record.Path(record.KindOutbox, f.Envelope.EnvelopeID) + " is relayed: settling an envelope as relayed moves its message to relayed in the same transaction",
			action: "move the message forward to relayed, as the carrier would have", fixed: c})
	}
	if f.Unhold {
		// A hold never outlives the last pending envelope of its message: the
		// transaction that settles or closes that envelope clears it.
		c := record.Clone(m).(*record.Message)
		c.Held = nil
		why := "a " + m.Status + " message still held while none of its envelopes is pending"
		if len(members) == 0 {
			why = "a " + m.Status + " message still held whose envelopes are all settled and removed"
		}
		out = append(out, stateRule{code: CodeHeldWithoutPending, severity: Problem, path: msgPath,
			why:    why + ": nothing is left to hold (settling or closing a message's last pending envelope clears its hold in the same transaction)",
			action: "clear the hold (the message stays " + m.Status + ")", fixed: c})
	}
	// A hold or release changes a message and its pending members together; one side
	// held alone is an interrupted hold or release. Repair completes the hold: it never
	// lets go what an operator may have asked to stop.
	const hint = "; to let it go, release the message (sealbridge release) after the repair"
	hold := m.Held
	if hold == nil && len(held) > 0 {
		hold = held[0].Held
		c := record.Clone(m).(*record.Message)
		c.Held, c.Operator = record.CloneAction(hold), record.CloneAction(hold)
		out = append(out, stateRule{code: CodeHoldIncomplete, severity: Problem, path: msgPath,
			why:    fmt.Sprintf("a %s message not held while its pending envelope %s is held: an interrupted hold or release", m.Status, record.Path(record.KindOutbox, held[0].EnvelopeID)),
			action: "hold the message too, with its envelope's hold" + hint, fixed: c})
	}
	if hold != nil {
		for _, o := range unheld {
			c := record.Clone(o).(*record.Outbox)
			c.Held, c.Operator = record.CloneAction(hold), record.CloneAction(hold)
			out = append(out, stateRule{code: CodeHoldIncomplete, severity: Problem, path: record.Path(record.KindOutbox, o.EnvelopeID),
				why:    "a pending envelope not held while its message " + msgPath + " or another of its envelopes is held: an interrupted hold or release",
				action: "hold the envelope too, with its message's hold" + hint, fixed: c})
		}
	}
	return out
}

// cancelIncomplete returns a rule for each pending member of a message closed (or
// being closed) by cancel: a cancel closes the pending members with the message, and
// a crash between their publications can keep the message's close and lose a
// member's. Each is closed as the cancel would have (reason and operator's cancel).
func cancelIncomplete(msgPath, reason string, cancel *record.Action, members []*record.Outbox) []stateRule {
	var out []stateRule
	for _, o := range members {
		if o.State != record.StatePending {
			continue
		}
		c := record.Clone(o).(*record.Outbox)
		c.State, c.LastError, c.Held, c.Lease, c.Operator = record.StateClosed, reason, nil, nil, record.CloneAction(cancel)
		out = append(out, stateRule{code: CodeCancelIncomplete, severity: Problem, path: record.Path(record.KindOutbox, o.EnvelopeID),
			why:    "a pending envelope of the cancelled message " + msgPath + ": an interrupted cancel",
			action: "close the envelope as the cancel would have (the carrier never sends it)", fixed: c})
	}
	return out
}

// addStateFindings reports the state rules that a committed message breaks.
func (c *checker) addStateFindings(ref stateRef, m *record.Message, members []*record.Outbox) {
	for _, r := range stateRules(m, ref.messageID, members, c.now.UnixMilli()) {
		if r.severity == Note {
			c.add(note(r.code, r.path, r.why))
			continue
		}
		switch {
		case r.fixed == nil:
			c.add(problem(r.code, r.path, r.why, r.action, nil))
		case c.opts.Signer == nil:
			c.add(problem(r.code, r.path, r.why,
				"none without the owner's key: run the repair with --identity NAME (it signs the corrected record), which will "+r.action, nil))
		default:
			ref := ref
			c.add(problem(r.code, r.path, r.why, r.action, &fix{kind: fixState, phase: phaseState, state: &ref}))
		}
	}
}

// errStateGone: a state fix found nothing left to do (the records changed since the
// check, or a fix before it already made them consistent).
var errStateGone = errors.New("the records no longer break this rule")

// repairState rewrites the record that repairs f, through the store's own
// transaction (signed with opts.Signer, durable, under the store lock), after
// deciding the rule again on the records the transaction reads.
func (r *repairer) repairState(ctx context.Context, f Finding) error {
	if r.st == nil {
		st, err := store.Open(r.opts.Signer, store.Options{Dir: r.dir, Now: r.opts.Now, Limits: r.opts.Limits,
			LockWait: r.opts.LockWait, LockStale: r.opts.LockStale, WrapFS: r.opts.WrapFS, CacheEntries: -1})
		if err != nil {
			return err
		}
		r.st = st
	}
	ref := f.fix.state
	nowMs := r.opts.Now().UnixMilli()
	return r.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
		m, err := store.TxGet[*record.Message](tx, ref.messageID)
		if err != nil {
			return err
		}
		var members []*record.Outbox
		if ref.batchID != "" {
			if members, err = tx.Committed(ref.batchID); err != nil {
				return err
			}
			if members == nil {
				return errStateGone
			}
		} else if gone, err := r.noEnvelopes(ctx, ref.messageID); err != nil || !gone {
			if err == nil {
				err = errStateGone
			}
			return err
		}
		for _, rule := range stateRules(m, ref.messageID, members, nowMs) {
			if rule.code == f.Code && rule.path == f.Path && rule.fixed != nil {
				if fm, ok := rule.fixed.(*record.Message); ok && rule.code == CodeMessageNotClosed {
					// Ended as every writer ends a message (the closed retention).
					tx.EndMessage(fm, record.StatusClosed, fm.ClosedBy, fm.LastError, nowMs)
				}
				return tx.Put(rule.fixed)
			}
		}
		return errStateGone
	})
}

// noEnvelopes reports whether the store holds no outbox record of message id (the
// case of a state rule decided on a message whose envelopes are gone).
func (r *repairer) noEnvelopes(ctx context.Context, id string) (bool, error) {
	sums, err := r.st.OutboxSummaries(ctx)
	if err != nil {
		return false, err
	}
	for _, e := range sums {
		if e.MessageID == id {
			return false, nil
		}
	}
	return true, nil
}
