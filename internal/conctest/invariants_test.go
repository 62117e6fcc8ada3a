package conctest_test

import (
	"fmt"
	"slices"
	"sort"

	"github.com/sealbridge/sealbridge/internal/conctest"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The invariants checked after every run, once every process is quiet, on a store
// opened afresh (no cache) on the run's directory, against the merged history. The
// order of the answers is the model's (conctest.Check); these are the facts that must
// hold of the store the run left behind:
//
//   - every error a call returned is an answer of the API (key reused, in progress, a
//     conflicting envelope set, a passed deadline) or a busy store;
//   - each key is bound to one operation: every BeginOperation that started an
//     operation for it started that one, and a completed operation is stored done
//     with the response its completion gave;
//   - every message whose Enqueue returned nil is accepted with the envelope set that
//     enqueue gave (no two enqueues of one id succeeded with different sets), and is
//     queued with that set committed, relayed, delivered, or closed with its reason;
//   - every outbox record belongs to a committed message (no orphan: nothing
//     maintenance would remove as never accepted);
//   - the relay was sent only envelopes of accepted sets, and accepted each at most
//     once (a lease never runs out within a run, so nothing relayed is sent again);
//   - fsck finds no problem (notes are allowed).
//
// Each process's indexes equal a fresh scan: checked by each process itself
// (node.checkIndexes) before it exits.
func invariants(fresh *store.Store, k keys, sp *space, history []conctest.Op) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	unexpected := 0
	for _, o := range history {
		if !conctest.Expected(o) {
			if unexpected++; unexpected <= 10 {
				add("an unexpected error: %s", o)
			}
		}
	}
	if unexpected > 10 {
		add("… and %d more unexpected errors", unexpected-10)
	}
	problems = append(problems, keyInvariants(fresh, history)...)
	problems = append(problems, messageInvariants(fresh, sp, history)...)
	rep, err := fsck.Check(ctx, fresh.Dir(), fsck.Options{Owner: k.owner.DID()})
	if err != nil {
		add("fsck: %v", err)
	} else {
		for _, f := range rep.Findings {
			if f.Severity == fsck.Problem {
				add("fsck: %s %s: %s", f.Code, f.Path, f.Explanation)
			}
		}
	}
	return problems
}

// keyInvariants: each key bound to one operation, the one every start answered.
func keyInvariants(fresh *store.Store, history []conctest.Op) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	started := map[string][]string{} // key → operation ids started, in call order
	completed := map[string]string{} // operation id → the response its completion stored
	for _, o := range history {
		switch {
		case o.In.Kind == conctest.OpBegin && o.Out.Code == "" && !o.Out.Done:
			if !slices.Contains(started[o.In.Key], o.Out.OpID) {
				started[o.In.Key] = append(started[o.In.Key], o.Out.OpID)
			}
		case o.In.Kind == conctest.OpComplete && o.Out.Code == "":
			completed[o.In.OpID] = o.In.Resp
		}
	}
	for _, key := range sortedKeys(started) {
		ids := started[key]
		if len(ids) > 1 {
			add("key %s: %d operations were started for it: %v", key, len(ids), ids)
		}
		b, err := store.GetAs[*record.Binding](fresh, record.IdempotencyID(key))
		switch {
		case err != nil:
			add("key %s: reading its binding: %v", key, err)
			continue
		case b == nil:
			add("key %s: started operation %s, but the key is bound to nothing", key, ids[0])
			continue
		case !slices.Contains(ids, b.OperationID):
			add("key %s: bound to operation %s, which no call started (started: %v)", key, b.OperationID, ids)
			continue
		}
		op, err := store.GetAs[*record.Operation](fresh, b.OperationID)
		resp, done := completed[b.OperationID]
		switch {
		case err != nil || op == nil:
			add("key %s: its operation %s cannot be read (%v)", key, b.OperationID, err)
		case done && (op.State != record.OperationDone || string(op.Response) != resp):
			add("key %s: operation %s was completed with %s but is stored %s with %s", key, op.OperationID, resp, op.State, op.Response)
		}
	}
	return problems
}

// messageInvariants: every acknowledged message accepted with its set, no orphan, and
// only accepted envelopes sent, once.
func messageInvariants(fresh *store.Store, sp *space, history []conctest.Op) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	acked := map[string][]int{} // message id → the variants whose Enqueue returned nil
	sent := map[string]int{}    // envelope id → how often the relay accepted it
	var order []string
	for _, o := range history {
		switch {
		case o.In.Kind == conctest.OpEnqueue && o.Out.Code == "":
			if !slices.Contains(acked[o.In.Msg], o.In.Variant) {
				acked[o.In.Msg] = append(acked[o.In.Msg], o.In.Variant)
			}
		case o.In.Kind == conctest.OpSend && o.Out.Outcome == "accepted":
			if sent[o.In.Env] == 0 {
				order = append(order, o.In.Env)
			}
			sent[o.In.Env]++
		}
	}
	sums, err := fresh.OutboxSummaries(ctx)
	if err != nil {
		return append(problems, fmt.Sprintf("OutboxSummaries: %v", err))
	}
	batchOf := map[string]string{}
	for _, e := range sums {
		batchOf[e.MessageID] = e.BatchID
	}
	for _, id := range sortedKeys(acked) {
		vs, m := acked[id], sp.byIDOf(id)
		if len(vs) > 1 {
			add("message %s: enqueues of %d different envelope sets returned success: variants %v", id, len(vs), vs)
		}
		r, err := fresh.Message(id)
		switch {
		case err != nil:
			add("message %s: reading it: %v", id, err)
			continue
		case r == nil:
			add("message %s: its enqueue (variant %d) returned success, but it is not accepted", id, vs[0])
			continue
		}
		v := m.variantOf(r.EnvelopeDigest)
		if !slices.Contains(vs, v) {
			add("message %s: accepted with variant %d, but the enqueues that succeeded gave %v", id, v, vs)
			continue
		}
		switch r.Status {
		case record.StatusQueued:
			var want []string
			for _, e := range m.variants[v].req.Envelopes {
				want = append(want, e.EnvelopeID)
			}
			members, err := fresh.Committed(batchOf[id])
			var got []string
			for _, o := range members {
				got = append(got, o.EnvelopeID)
			}
			if err != nil || !slices.Equal(got, want) {
				add("message %s: queued, but its committed envelopes are %v, not %v (%v)", id, got, want, err)
			}
		case record.StatusRelayed, record.StatusDelivered:
		case record.StatusClosed:
			if r.ClosedBy != record.ClosedByRefused && r.ClosedBy != record.ClosedByDeadline && r.ClosedBy != record.ClosedByCancelled {
				add("message %s: closed by %q, which nothing in the run does", id, r.ClosedBy)
			}
		default:
			add("message %s: status %q", id, r.Status)
		}
	}
	for _, e := range sums {
		members, err := fresh.Committed(e.BatchID)
		if err != nil || !slices.ContainsFunc(members, func(o *record.Outbox) bool { return o.EnvelopeID == e.EnvelopeID }) {
			add("outbox %s (message %s, %s): an orphan, committed by no marker or message record (%v)", e.EnvelopeID, e.MessageID, e.State, err)
		}
	}
	for _, env := range order {
		m := sp.byIDOf(sp.messageOf(env))
		if m == nil {
			add("the relay was sent envelope %s, which is no envelope of the run", env)
			continue
		}
		v := -1
		if r, err := fresh.Message(m.id); err == nil && r != nil {
			v = m.variantOf(r.EnvelopeDigest)
		}
		switch {
		case m.variantOfEnvelope(env) != v:
			add("the relay accepted envelope %s of message %s, variant %d, which is not the message's accepted set (%d)",
				env, m.id, m.variantOfEnvelope(env), v)
		case sent[env] > 1:
			add("the relay accepted envelope %s of message %s %d times: it was sent again after it was relayed", env, m.id, sent[env])
		}
	}
	return problems
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
