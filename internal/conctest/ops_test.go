package conctest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sealbridge/sealbridge/internal/conctest"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The operations a worker issues, each through the store's (or the carrier's) public
// API, each recorded as one history operation (a listing: one per message).

var ctx = context.Background()

// outErr is the Output of a call that returned err.
func outErr(err error) conctest.Output {
	if err == nil {
		return conctest.Output{}
	}
	code := errcode.Of(err)
	if code == "" {
		code = "UNCODED"
	}
	return conctest.Output{Code: code, Err: err.Error()}
}

// begin calls BeginOperation and, when it started the operation, completes it (with a
// response naming this call) or releases it, as a daemon does after a request that
// failed transiently.
func (w *worker) begin(key string, body int) {
	n := w.n
	out := n.rec.Do(w.id, conctest.Input{Kind: conctest.OpBegin, Key: key, Body: body}, func() conctest.Output {
		st, err := n.st.BeginOperation(ctx, key, request(key, body))
		out := outErr(err)
		if err == nil {
			out.OpID, out.Done = st.Operation.OperationID, st.Done
			if st.Done {
				out.Resp = string(st.Operation.Response)
			}
		}
		return out
	})
	if out.Code != "" || out.Done {
		return
	}
	if w.rng.IntN(10) < 7 {
		resp := fmt.Sprintf(`{"by":"p%dw%d","at":%d}`, n.cfg.Proc, w.id, conctest.Mono())
		n.rec.Do(w.id, conctest.Input{Kind: conctest.OpComplete, Key: key, OpID: out.OpID, Resp: resp}, func() conctest.Output {
			return outErr(n.st.CompleteOperation(ctx, out.OpID, json.RawMessage(resp)))
		})
		return
	}
	n.rec.Do(w.id, conctest.Input{Kind: conctest.OpRelease, Key: key, OpID: out.OpID}, func() conctest.Output {
		return outErr(n.st.ReleaseOperation(ctx, out.OpID))
	})
}

// messageOut is the Output of a read (or enqueue) that returned message r of m.
func messageOut(m *msgSpec, r *record.Message) conctest.Output {
	if r == nil {
		return conctest.Output{Variant: -1}
	}
	return conctest.Output{Found: true, Variant: m.variantOf(r.EnvelopeDigest), Status: r.Status, ClosedBy: r.ClosedBy, Held: r.Held != nil}
}

// enqueue enqueues variant v of m, whether or not m is accepted already (an enqueue
// of an accepted message, also of one whose envelopes maintenance removed, writes
// nothing).
func (w *worker) enqueue(m *msgSpec, v int) {
	x := m.variants[v]
	in := conctest.Input{Kind: conctest.OpEnqueue, Msg: m.id, Variant: v, Envelopes: len(x.req.Envelopes),
		Deadline: m.deadline, Refusable: x.refusable}
	w.n.rec.Do(w.id, in, func() conctest.Output {
		r, err := w.n.st.Enqueue(ctx, x.req)
		if err != nil {
			out := outErr(err)
			out.Variant = -1
			return out
		}
		return messageOut(m, r)
	})
	w.n.car.Kick()
}

// readMessage reads m with Message, or with AcceptedMessage (which also fsyncs its
// directories).
func (w *worker) readMessage(m *msgSpec, accepted bool) conctest.Output {
	kind, read := conctest.OpMessage, w.n.st.Message
	if accepted {
		kind, read = conctest.OpAccepted, w.n.st.AcceptedMessage
	}
	return w.n.rec.Do(w.id, conctest.Input{Kind: kind, Msg: m.id}, func() conctest.Output {
		r, err := read(m.id)
		if err != nil {
			out := outErr(err)
			out.Variant = -1
			return out
		}
		return messageOut(m, r)
	})
}

// summaries lists the messages index (or the outbox index) and records what it says
// of each message of the space up to now: its entry, or its absence.
func (w *worker) summaries(outbox bool) {
	n := w.n
	call := conctest.Mono()
	msgs := n.space.upTo(n.space.epochAt(call))
	if !outbox {
		sums, err := n.st.MessageSummaries(ctx)
		ret := conctest.Mono()
		if err != nil {
			n.problem("MessageSummaries: %v", err)
			return
		}
		by := map[string]store.MessageSummary{}
		for _, s := range sums {
			by[s.MessageID] = s
		}
		for _, m := range msgs {
			out := conctest.Output{Variant: -1}
			if s, ok := by[m.id]; ok {
				out = conctest.Output{Found: true, Variant: -1, Status: s.Status, ClosedBy: s.ClosedBy, Held: s.Held != nil}
			}
			n.rec.Add(w.id, call, ret, conctest.Input{Kind: conctest.OpMessageSummary, Msg: m.id}, out)
		}
		return
	}
	sums, err := n.st.OutboxSummaries(ctx)
	ret := conctest.Mono()
	if err != nil {
		n.problem("OutboxSummaries: %v", err)
		return
	}
	variants := map[string]uint64{}
	for _, s := range sums {
		m := n.space.byIDOf(s.MessageID)
		if m == nil {
			n.problem("OutboxSummaries lists envelope %s of message %s, which the explorer never enqueued", s.EnvelopeID, s.MessageID)
			continue
		}
		v := m.variantOfEnvelope(s.EnvelopeID)
		if v < 0 {
			n.problem("OutboxSummaries lists envelope %s under message %s, which has no such envelope", s.EnvelopeID, s.MessageID)
			continue
		}
		variants[m.id] |= 1 << v
	}
	for _, m := range msgs {
		n.rec.Add(w.id, call, ret, conctest.Input{Kind: conctest.OpOutboxSummary, Msg: m.id}, conctest.Output{Variant: -1, Variants: variants[m.id]})
	}
}

// operatorAction is an action of the explorer's operator, made now.
func operatorAction(op string) record.Action {
	return record.Action{Op: op, By: "conctest", At: time.Now().UnixMilli(), Reason: "explorer"}
}

// act applies action op to message m (carrier.Apply naming it).
func (w *worker) act(m *msgSpec, op string) {
	w.n.rec.Do(w.id, conctest.Input{Kind: conctest.OpAction, Msg: m.id, Action: op}, func() conctest.Output {
		rs, err := carrier.Apply(ctx, w.n.st, carrier.Selector{MessageIDs: []string{m.id}}, operatorAction(op))
		out := outErr(err)
		out.Variant = -1
		switch {
		case err != nil:
		case len(rs) != 1 || rs[0].MessageID != m.id:
			out.Code, out.Err = "UNCODED", fmt.Sprintf("Apply answered %+v for one message", rs)
		default:
			out.Outcome, out.Changed, out.Note = rs[0].Code, rs[0].Changed, rs[0].Message
		}
		return out
	})
	w.n.car.Kick()
}

// actOnTarget applies action op to every message with envelopes pending to target,
// and records each message's result. A call that failed may have changed any message
// of the target: it is recorded, as failed, on every message of the space.
func (w *worker) actOnTarget(target, op string) {
	n := w.n
	call := conctest.Mono()
	rs, err := carrier.Apply(ctx, n.st, carrier.Selector{Target: target}, operatorAction(op))
	ret := conctest.Mono()
	n.car.Kick()
	in := func(msg string) conctest.Input {
		return conctest.Input{Kind: conctest.OpAction, Msg: msg, Action: op, Target: target}
	}
	if err != nil {
		out := outErr(err)
		out.Variant = -1
		for _, m := range n.space.upTo(n.space.epochAt(ret)) {
			n.rec.Add(w.id, call, ret, in(m.id), out)
		}
		return
	}
	for _, r := range rs {
		n.rec.Add(w.id, call, ret, in(r.MessageID), conctest.Output{Variant: -1, Outcome: r.Code, Changed: r.Changed, Note: r.Message})
	}
}

// Receipt outcome codes of the daemon's inbox follower (pkg/daemon/inbound.go).
const (
	outcomeApplied = "DELIVERY_STATUS_APPLIED"
	outcomeRefused = "DELIVERY_STATUS_REFUSED"
)

// errWrittenConcurrently is the daemon's answer when a receipt appeared between its
// first look and its transaction: the envelope is left at the relay, fetched again and
// then found to be a duplicate.
var errWrittenConcurrently = errors.New("receipt written concurrently")

// confirmation returns this process's confirmation envelope number k for variant v
// of m (-1: signed by a stranger instead of the message's recipient), building it on
// first use: the same envelope delivered twice is a duplicate. Conf is its number in
// the history (a bit of the model's receipts).
func (n *node) confirmation(m *msgSpec, v, k int) (*envelope.Envelope, int) {
	conf := n.cfg.Proc*8 + (v+1)*2 + k
	key := fmt.Sprintf("%s/%d", m.id, conf)
	if e, ok := n.confs.Load(key); ok {
		return e.(*envelope.Envelope), conf
	}
	signer, digest := n.keys.peer, m.variants[max(v, 0)].digest
	if v < 0 {
		signer = n.keys.stranger // confirms variant 0, but is not the recipient's
	}
	now := time.Now()
	env, _, err := envelope.NewDeliveryStatus(signer, n.keys.owner.DID(),
		envelope.Confirmation{MessageID: m.id, EnvelopeDigest: digest, Status: envelope.StatusDelivered}, now.Add(24*time.Hour), now)
	if err != nil {
		panic(err) // the arguments are the explorer's own
	}
	e, _ := n.confs.LoadOrStore(key, env)
	return e.(*envelope.Envelope), conf
}

// inbound delivers confirmation k of variant v of m to the store exactly as the
// daemon's inbox follower does with a delivery-status from its relay
// (pkg/daemon/inbound.go, processEnvelope and advance): a known receipt is a
// duplicate; otherwise one prepared transaction writes the receipt and, if the status
// is signed by the message's recipient and confirms its envelope digest, moves the
// queued or relayed message to delivered; then (the envelope acknowledged at the
// relay) the receipt is raised to terminal.
func (w *worker) inbound(m *msgSpec, v, k int) {
	n := w.n
	env, conf := n.confirmation(m, v, k)
	var rid string
	out := n.rec.Do(w.id, conctest.Input{Kind: conctest.OpInbound, Msg: m.id, Variant: v, Conf: conf}, func() conctest.Output {
		out := conctest.Output{Variant: -1}
		rid = record.ReceiptID(env.ID())
		prev, err := store.GetAs[*record.Receipt](n.st, rid)
		if err != nil {
			return outErr(err)
		}
		if prev != nil {
			out.Outcome = conctest.OutcomeDuplicate
			return out
		}
		now := time.Now().UnixMilli()
		rc := &record.Receipt{EnvelopeID: env.ID(), SenderDID: string(env.Sender()), EnvelopeDigest: env.Digest(),
			State: record.ReceiptPersisted, ReceivedAt: now, RetainUntil: env.DeliveryDeadlineMillis() + 7*24*time.Hour.Milliseconds()}
		c, _ := env.Confirmation()
		applied := false
		err = n.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
			applied = false
			if r, err := store.TxGet[*record.Receipt](tx, rid); err != nil || r != nil {
				if err == nil {
					err = errWrittenConcurrently
				}
				return err
			}
			msg, err := store.TxGet[*record.Message](tx, c.MessageID)
			if err != nil {
				return err
			}
			rc.OutcomeCode = outcomeRefused
			if msg != nil && env.ConfirmsDelivery(n.keys.owner.DID(), identity.DID(msg.PeerOwnerDID), msg.MessageID, msg.EnvelopeDigest) == nil {
				rc.OutcomeCode, applied = outcomeApplied, true
				if msg.Status == record.StatusQueued || msg.Status == record.StatusRelayed {
					tx.EndMessage(msg, record.StatusDelivered, "", "", now)
					if err := tx.Put(msg); err != nil {
						return err
					}
				}
			}
			return tx.Put(rc)
		})
		switch {
		case errors.Is(err, errWrittenConcurrently):
			out.Outcome = conctest.OutcomeDuplicate
		case err != nil:
			return outErr(err)
		case applied:
			out.Outcome = conctest.OutcomeApplied
		default:
			out.Outcome = conctest.OutcomeRefused
		}
		return out
	})
	if out.Code != "" || out.Outcome == conctest.OutcomeDuplicate {
		return
	}
	err := n.st.Update(ctx, record.KindReceipts, rid, func(cur record.Record) (record.Record, error) {
		r, _ := cur.(*record.Receipt)
		if r == nil {
			return nil, fmt.Errorf("receipt %s is missing", rid)
		}
		if r.State == record.ReceiptTerminal {
			return nil, nil
		}
		r.State = record.ReceiptTerminal
		return r, nil
	})
	if err != nil && !busy(err) {
		n.problem("raising receipt %s to terminal: %v", rid, err)
	}
}

// maintain runs a maintenance pass; any error of a step but a busy store is a
// problem.
func (w *worker) maintain() {
	n := w.n
	n.rec.Do(w.id, conctest.Input{Kind: conctest.OpMaintain}, func() conctest.Output {
		rep, err := n.st.Maintain(ctx)
		for _, e := range rep.Errors {
			if !busy(e) {
				n.problem("Maintain: a step failed: %v", e)
			}
		}
		out := outErr(err)
		out.Variant = -1
		return out
	})
}

// busy reports whether err is a busy store (no failure: the call may be repeated).
func busy(err error) bool {
	return errors.Is(err, errcode.OutboxStoreBusy) || errors.Is(err, errcode.IdempotencyStoreBusy)
}
