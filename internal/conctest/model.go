package conctest

import (
	"fmt"

	"github.com/anishathalye/porcupine"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// This file is the sequential model of the store's API that a history must be
// linearizable against: one model per idempotency key and one per message id
// (the partitions of a history, Partition). It checks that every answer a caller got
// is explained by one order of the calls in which
//
//   - one key is bound to one operation and one request: a new key starts exactly one
//     operation, a second call with the same request answers that operation (in
//     progress while its holder has it, taken over by one caller after a release, its
//     stored response once done), and another request answers KEY_REUSED;
//   - one message id accepts one envelope set: the first enqueue that succeeds fixes
//     it, enqueueing it again answers the stored message, another set answers
//     DELIVERY_RECORD_CONFLICT, and no reader ever sees envelopes of another set;
//   - a message's status only moves forward (absent → queued → relayed → delivered, or
//     queued | relayed → closed, each with its closer), an accepted message never
//     becomes absent again, and its hold follows the operator's actions;
//   - the operator's actions answer as carrier.Apply documents, and an inbound
//     delivery-status moves the message to delivered only if it confirms the accepted
//     envelope set, once per confirmation envelope.
//
// What the background actors do is a spontaneous transition, allowed between any two
// calls: the carrier relays a queued message, its relay refuses it (closed, "refused";
// only where the relay may refuse), or its deadline passes (closed, "deadline"; only
// once the wall clock has reached it); and a relayed message's hold may end (the
// settlement of a single ends it; a message of several envelopes keeps it while one is
// pending, and later stores end it with the last one). Nothing else happens by itself:
// in particular no message is delivered, cancelled or expired, or held, without a call
// that says so, and a queued message (whose envelope of kind message is pending) keeps
// its hold.
//
// A call that failed with an error that does not say whether it took effect (a busy
// store) may or may not have made its change: both states follow it.

// Status values of the model (record's, and "" for a message not accepted).
const (
	statusAbsent    = ""
	statusQueued    = record.StatusQueued
	statusRelayed   = record.StatusRelayed
	statusDelivered = record.StatusDelivered
	statusClosed    = record.StatusClosed
)

// deadlineSlack is how far before a message's deadline, by the wall clock read when a
// later call returned, the model lets the deadline have closed it: a margin for the
// clock being stepped, never needed otherwise.
const deadlineSlack = 250 // ms

// The states of one operation of a key.
const (
	opHeld     = 1 // in flight, its lease held by the caller that began it
	opReleased = 2 // in flight, its lease ended by ReleaseOperation: the next caller takes it over
	opDone     = 3 // completed with resp
)

// keyState is the model of one idempotency key.
type keyState struct {
	bound bool
	body  int    // the request bound
	op    string // the operation bound; "" if unknown (a call that failed may have bound it)
	st    int    // opHeld, opReleased or opDone
	resp  string // the stored response, once done
}

// msgState is the model of one message id.
type msgState struct {
	accepted  int   // the envelope set accepted, -1 none
	envelopes int   // its number of envelopes (1: a single)
	refusable bool  // its relay may refuse it
	deadline  int64 // its delivery deadline, Unix ms
	status    string
	closedBy  string
	held      bool
	receipts  uint64 // bit c: inbound confirmation envelope c was stored
}

var (
	codeInProgress = errcode.IdempotencyInProgress.String()
	codeKeyReused  = errcode.IdempotencyKeyReused.String()
	codeConflict   = errcode.DeliveryRecordConflict.String()
	codeExpired    = errcode.OutboxDeadlineExpired.String()
	codeNotFound   = errcode.MessageNotFound.String()
	codeClosed     = errcode.MessageClosed.String()
	// busyCodes are the errors a loaded store may answer with: they say nothing of
	// whether the call took effect, and are no failure of the store.
	busyCodes = map[string]bool{errcode.OutboxStoreBusy.String(): true, errcode.IdempotencyStoreBusy.String(): true}
)

// KeyModel is the model of one partition "key:…" of a history.
var KeyModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{keyState{}} },
	Step: func(state, input, output any) []any {
		return wrap(stepKey(state.(keyState), input.(Input), output.(Output)))
	},
	DescribeOperation: describe,
	DescribeState:     func(s any) string { return fmt.Sprintf("%+v", s.(keyState)) },
}).ToModel()

// MessageModel is the model of one partition "msg:…" of a history.
var MessageModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{msgState{accepted: -1}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(msgState), input.(Input), output.(Output)
		var next []msgState
		for _, t := range spontaneous(s, out.Wall) {
			next = append(next, stepMessage(t, in, out)...)
		}
		return wrap(next)
	},
	DescribeOperation: describe,
	DescribeState:     func(s any) string { return fmt.Sprintf("%+v", s.(msgState)) },
}).ToModel()

func wrap[T any](states []T) []any {
	out := make([]any, len(states))
	for i, s := range states {
		out[i] = s
	}
	return out
}

func describe(input, output any) string {
	return Op{In: input.(Input), Out: output.(Output)}.String()
}

// stepKey returns the states a key can be in after the call in answered out, from s.
func stepKey(s keyState, in Input, out Output) []keyState {
	ambiguous := out.Code != "" && out.Code != codeInProgress && out.Code != codeKeyReused
	switch in.Kind {
	case OpBegin:
		if ambiguous {
			next := []keyState{s}
			switch {
			case !s.bound:
				next = append(next, keyState{bound: true, body: in.Body, st: opHeld})
			case s.body == in.Body && s.st == opReleased:
				t := s
				t.st = opHeld
				next = append(next, t)
			}
			return next
		}
		switch {
		case out.Code == codeKeyReused:
			if s.bound && s.body != in.Body {
				return []keyState{s}
			}
		case !s.bound:
			if out.Code == "" && !out.Done && out.OpID != "" {
				return []keyState{{bound: true, body: in.Body, op: out.OpID, st: opHeld}}
			}
		case s.body != in.Body:
			// only KEY_REUSED, above
		case out.Code == codeInProgress:
			if s.st == opHeld {
				return []keyState{s}
			}
		case out.Done:
			if s.st == opDone && s.op == out.OpID && s.resp == out.Resp {
				return []keyState{s}
			}
		default: // started: a takeover of the released operation, under its id
			if s.st == opReleased && s.op != "" && s.op == out.OpID {
				t := s
				t.st = opHeld
				return []keyState{t}
			}
		}
		return nil
	case OpComplete:
		mine := s.bound && s.op != "" && s.op == in.OpID
		switch {
		case out.Code == "" && mine && s.st == opHeld:
			t := s
			t.st, t.resp = opDone, in.Resp
			return []keyState{t}
		case out.Code == "" && mine && s.st == opDone && s.resp == in.Resp:
			return []keyState{s}
		case out.Code != "" && mine && s.st == opHeld:
			t := s
			t.st, t.resp = opDone, in.Resp
			return []keyState{s, t}
		case out.Code != "":
			return []keyState{s}
		}
		return nil
	case OpRelease:
		mine := s.bound && s.op != "" && s.op == in.OpID
		switch {
		case mine && s.st == opHeld:
			t := s
			t.st = opReleased
			if out.Code != "" {
				return []keyState{s, t}
			}
			return []keyState{t}
		case mine || out.Code != "":
			return []keyState{s}
		}
		return nil
	}
	return nil
}

// spontaneous returns s and the states the background actors may have moved it to
// before a call that returned at wall (Unix ms).
func spontaneous(s msgState, wall int64) []msgState {
	out := []msgState{s}
	if s.status == statusRelayed && s.held {
		unheld := s
		unheld.held = false
		out = append(out, unheld)
	}
	if s.status != statusQueued {
		return out
	}
	relayed := s
	relayed.status = statusRelayed
	if s.envelopes == 1 {
		relayed.held = false // the settlement of a single ends its hold
	} else if s.held {
		unheld := relayed
		unheld.held = false
		out = append(out, unheld)
	}
	out = append(out, relayed)
	if s.refusable {
		out = append(out, closedState(s, record.ClosedByRefused))
	}
	if s.deadline <= wall+deadlineSlack {
		out = append(out, closedState(s, record.ClosedByDeadline))
	}
	return out
}

func closedState(s msgState, by string) msgState {
	s.status, s.closedBy, s.held = statusClosed, by, false
	return s
}

func open(s msgState) bool { return s.status == statusQueued || s.status == statusRelayed }

// stepMessage returns the states a message can be in after the call in answered out,
// from s (the background actors' moves before it are spontaneous's).
func stepMessage(s msgState, in Input, out Output) []msgState {
	switch in.Kind {
	case OpEnqueue:
		return stepEnqueue(s, in, out)
	case OpMessage, OpAccepted:
		switch {
		case out.Code != "":
			return []msgState{s}
		case !out.Found && s.status == statusAbsent:
			return []msgState{s}
		case out.Found && s.status != statusAbsent && out.Variant == s.accepted && out.Status == s.status &&
			out.ClosedBy == s.closedBy && out.Held == s.held:
			return []msgState{s}
		}
		return nil
	case OpMessageSummary:
		// The messages index lists every message record, also the one of an enqueue
		// not committed yet (queued, never held), which the store reports as absent.
		switch {
		case !out.Found && s.status == statusAbsent:
			return []msgState{s}
		case out.Found && out.Status == statusQueued && s.status == statusAbsent && !out.Held:
			return []msgState{s}
		case out.Found && out.Status == s.status && out.ClosedBy == s.closedBy && out.Held == s.held:
			return []msgState{s}
		}
		return nil
	case OpOutboxSummary:
		// The outbox index lists an enqueue's envelopes as soon as they are published,
		// before the message record (a single) or the marker that commits them: an
		// absent message may show one set, an accepted one only its own.
		single := out.Variants&(out.Variants-1) == 0
		if out.Variants == 0 || (s.accepted < 0 && single) || (s.accepted >= 0 && out.Variants == 1<<s.accepted) {
			return []msgState{s}
		}
		return nil
	case OpAction:
		return stepAction(s, in, out)
	case OpInbound:
		return stepInbound(s, in, out)
	}
	return nil
}

func stepEnqueue(s msgState, in Input, out Output) []msgState {
	fresh := msgState{accepted: in.Variant, envelopes: in.Envelopes, refusable: in.Refusable, deadline: in.Deadline,
		status: statusQueued, receipts: s.receipts}
	switch out.Code {
	case "":
		switch {
		case s.accepted < 0 && out.Variant == in.Variant && out.Status == statusQueued && !out.Held:
			return []msgState{fresh}
		case s.accepted >= 0 && s.accepted == in.Variant && out.Variant == in.Variant && out.Status == s.status &&
			out.ClosedBy == s.closedBy && out.Held == s.held:
			return []msgState{s}
		}
	case codeConflict:
		if s.accepted >= 0 && s.accepted != in.Variant {
			return []msgState{s}
		}
	case codeExpired:
		if in.Deadline <= out.Wall {
			return []msgState{s}
		}
	default:
		if s.accepted < 0 {
			return []msgState{s, fresh}
		}
		return []msgState{s}
	}
	return nil
}

// stepAction is carrier.Apply on one message: MESSAGE_NOT_FOUND for a message not
// accepted; MESSAGE_CLOSED for one delivered or closed (a repeated cancel of a
// cancelled one excepted), and for a cancel of a relayed one with nothing pending;
// otherwise its change. A queued message's envelope of kind message is pending, so
// holding it unheld, or cancelling it, changes at least that envelope; a relayed
// single has nothing pending.
func stepAction(s msgState, in Input, out Output) []msgState {
	if out.Code != "" { // the call failed: its change may have been made
		next := []msgState{s}
		if open(s) {
			next = append(next, actionEffects(s, in.Action)...)
		}
		return next
	}
	switch out.Outcome {
	case codeNotFound:
		if s.status == statusAbsent {
			return []msgState{s}
		}
	case codeClosed:
		switch {
		case s.status == statusDelivered || s.status == statusClosed:
			if in.Action != record.ActionCancel || s.closedBy != record.ClosedByCancelled {
				return []msgState{s}
			}
		case s.status == statusRelayed && in.Action == record.ActionCancel:
			return []msgState{s}
		}
	case "":
		switch {
		case s.status == statusDelivered || s.status == statusClosed:
			if in.Action == record.ActionCancel && s.closedBy == record.ClosedByCancelled {
				return []msgState{s} // already cancelled
			}
		case open(s):
			return actionApplied(s, in.Action, out.Changed)
		}
	}
	return nil
}

// actionApplied is the change of a successful action on the open message s that
// changed that many envelopes.
func actionApplied(s msgState, action string, changed int) []msgState {
	queued, single := s.status == statusQueued, s.envelopes == 1
	switch action {
	case record.ActionHold:
		switch {
		case changed > 0 && (queued || !single):
			s.held = true
			return []msgState{s}
		case changed == 0 && (s.held || !queued):
			return []msgState{s} // already held, or nothing pending
		}
		return nil
	case record.ActionRelease:
		s.held = false
		return []msgState{s}
	case record.ActionCancel:
		if changed > 0 && (queued || !single) {
			s = closedState(s, record.ClosedByCancelled)
			return []msgState{s}
		}
		return nil
	case record.ActionRetry:
		return []msgState{s}
	}
	return nil
}

// actionEffects are the states a successful action may leave the open message s in.
func actionEffects(s msgState, action string) []msgState {
	switch action {
	case record.ActionHold:
		s.held = true
	case record.ActionRelease:
		s.held = false
	case record.ActionCancel:
		s = closedState(s, record.ClosedByCancelled)
	default:
		return nil
	}
	return []msgState{s}
}

// stepInbound is a delivery-status applied as the daemon's inbox follower applies it:
// its receipt is stored once (a second delivery of the same envelope is a duplicate);
// it confirms the message only if it names the accepted envelope set and is signed by
// the message's recipient, and then a queued or relayed message becomes delivered.
func stepInbound(s msgState, in Input, out Output) []msgState {
	bit := uint64(1) << uint(in.Conf)
	confirms := in.Variant >= 0 && s.accepted == in.Variant
	received := s
	received.receipts |= bit
	if confirms && open(s) {
		received.status, received.closedBy, received.held = statusDelivered, "", false
	}
	switch {
	case out.Code != "":
		if s.receipts&bit == 0 {
			return []msgState{s, received}
		}
		return []msgState{s}
	case out.Outcome == OutcomeDuplicate:
		if s.receipts&bit != 0 {
			return []msgState{s}
		}
	case s.receipts&bit != 0:
		// stored already: only a duplicate
	case out.Outcome == OutcomeApplied && confirms, out.Outcome == OutcomeRefused && !confirms:
		return []msgState{received}
	}
	return nil
}

// Observer reports whether o changes no state of the model, whatever the state: a
// read, or an answer that says nothing was changed. Removing such an operation from a
// history that no order explains leaves one that no order explains either, and is
// how Shrink makes a failing history short.
func Observer(o Op) bool {
	switch o.In.Kind {
	case OpMessage, OpAccepted, OpMessageSummary, OpOutboxSummary:
		return true
	case OpBegin:
		return o.Out.Code == codeInProgress || o.Out.Code == codeKeyReused || (o.Out.Code == "" && o.Out.Done)
	case OpEnqueue:
		// A first enqueue answers queued; any other status is the stored message's.
		return o.Out.Code == codeConflict || o.Out.Code == codeExpired || (o.Out.Code == "" && o.Out.Status != statusQueued)
	case OpAction:
		return o.Out.Code == "" && (o.Out.Outcome == codeNotFound || o.Out.Outcome == codeClosed || o.In.Action == record.ActionRetry)
	case OpInbound:
		return o.Out.Code == "" && o.Out.Outcome == OutcomeDuplicate
	}
	return false
}

// Expected reports whether o's error, if any, is one the explorer expects: an answer
// of the model (KEY_REUSED, IN_PROGRESS, DELIVERY_RECORD_CONFLICT, a deadline passed),
// or a busy store. Any other error (an invalid record, an unwritable store) is a
// failure of its own.
func Expected(o Op) bool {
	c := o.Out.Code
	if c == "" || busyCodes[c] {
		return true
	}
	switch o.In.Kind {
	case OpBegin:
		return c == codeInProgress || c == codeKeyReused
	case OpEnqueue:
		return c == codeConflict || c == codeExpired
	}
	return false
}
