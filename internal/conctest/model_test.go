package conctest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/conctest"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The model on small hand-written histories: each history a correct store could
// produce must be explained, and each that one of the store's bugs (or a wrong model)
// would produce must not. Times are in ms; concurrent calls overlap.

const (
	tk = "key"
	tm = "11111111-1111-4111-8111-111111111111"
)

// h builds a history: each op is (worker, call ms, return ms, input, output).
type hop struct {
	w         int
	call, ret int64
	in        conctest.Input
	out       conctest.Output
}

func hist(ops ...hop) []conctest.Op {
	out := make([]conctest.Op, len(ops))
	for i, o := range ops {
		if o.out.Wall == 0 {
			o.out.Wall = 1e12 + o.ret
		}
		out[i] = conctest.Op{Worker: o.w, Call: o.call * 1e6, Return: o.ret * 1e6, In: o.in, Out: o.out}
	}
	return out
}

func begin(body int) conctest.Input {
	return conctest.Input{Kind: conctest.OpBegin, Key: tk, Body: body}
}
func started(op string) conctest.Output { return conctest.Output{OpID: op} }
func code(c string) conctest.Output     { return conctest.Output{Code: c, Variant: -1} }
func enq(v, n int) conctest.Input {
	return conctest.Input{Kind: conctest.OpEnqueue, Msg: tm, Variant: v, Envelopes: n, Deadline: 2e12}
}
func read() conctest.Input { return conctest.Input{Kind: conctest.OpMessage, Msg: tm} }
func found(v int, status, closedBy string, held bool) conctest.Output {
	return conctest.Output{Found: true, Variant: v, Status: status, ClosedBy: closedBy, Held: held}
}
func absent() conctest.Output { return conctest.Output{Variant: -1} }
func act(action string) conctest.Input {
	return conctest.Input{Kind: conctest.OpAction, Msg: tm, Action: action}
}
func acted(outcome string, changed int) conctest.Output {
	return conctest.Output{Variant: -1, Outcome: outcome, Changed: changed}
}
func inbound(v, conf int) conctest.Input {
	return conctest.Input{Kind: conctest.OpInbound, Msg: tm, Variant: v, Conf: conf}
}
func inboundOut(outcome string) conctest.Output {
	return conctest.Output{Variant: -1, Outcome: outcome}
}

const (
	queued, relayed, delivered, closed = record.StatusQueued, record.StatusRelayed, record.StatusDelivered, record.StatusClosed
	inProgress, keyReused, conflict    = "IDEMPOTENCY_IN_PROGRESS", "IDEMPOTENCY_KEY_REUSED", "DELIVERY_RECORD_CONFLICT"
	busyStore                          = "OUTBOX_STORE_BUSY"
)

func TestModel(t *testing.T) {
	for _, c := range []struct {
		name  string
		legal bool
		ops   []conctest.Op
	}{
		// Keys.
		{"one key, one started, the others in progress", true, hist(
			hop{0, 0, 10, begin(0), started("A")}, hop{1, 0, 10, begin(0), code(inProgress)}, hop{2, 1, 9, begin(0), code(inProgress)})},
		{"one key, two operations started (case a)", false, hist(
			hop{0, 0, 10, begin(0), started("A")}, hop{1, 0, 10, begin(0), started("B")}, hop{2, 1, 9, begin(0), code(inProgress)})},
		{"another request is KEY_REUSED, also while in flight", true, hist(
			hop{0, 0, 10, begin(0), started("A")}, hop{1, 11, 12, begin(1), code(keyReused)})},
		{"another request started an operation", false, hist(
			hop{0, 0, 10, begin(0), started("A")}, hop{1, 11, 12, begin(1), started("B")})},
		{"done answers the stored response", true, hist(
			hop{0, 0, 1, begin(0), started("A")},
			hop{0, 2, 3, conctest.Input{Kind: conctest.OpComplete, Key: tk, OpID: "A", Resp: "r"}, conctest.Output{}},
			hop{1, 4, 5, begin(0), conctest.Output{OpID: "A", Done: true, Resp: "r"}})},
		{"done with another response", false, hist(
			hop{0, 0, 1, begin(0), started("A")},
			hop{0, 2, 3, conctest.Input{Kind: conctest.OpComplete, Key: tk, OpID: "A", Resp: "r"}, conctest.Output{}},
			hop{1, 4, 5, begin(0), conctest.Output{OpID: "A", Done: true, Resp: "s"}})},
		{"in progress after the operation was done", false, hist(
			hop{0, 0, 1, begin(0), started("A")},
			hop{0, 2, 3, conctest.Input{Kind: conctest.OpComplete, Key: tk, OpID: "A", Resp: "r"}, conctest.Output{}},
			hop{1, 4, 5, begin(0), code(inProgress)})},
		{"a released operation is taken over once, under its id", true, hist(
			hop{0, 0, 1, begin(0), started("A")},
			hop{0, 2, 3, conctest.Input{Kind: conctest.OpRelease, Key: tk, OpID: "A"}, conctest.Output{}},
			hop{1, 4, 6, begin(0), started("A")}, hop{2, 4, 6, begin(0), code(inProgress)})},
		{"a released operation taken over twice", false, hist(
			hop{0, 0, 1, begin(0), started("A")},
			hop{0, 2, 3, conctest.Input{Kind: conctest.OpRelease, Key: tk, OpID: "A"}, conctest.Output{}},
			hop{1, 4, 6, begin(0), started("A")}, hop{2, 4, 6, begin(0), started("A")})},
		{"a busy begin may have bound the key to an operation nobody holds", true, hist(
			hop{0, 0, 1, begin(0), code("IDEMPOTENCY_STORE_BUSY")}, hop{1, 2, 3, begin(0), code(inProgress)})},

		// One message id, one envelope set.
		{"concurrent enqueues: one set accepted, the other a conflict", true, hist(
			hop{0, 0, 10, enq(0, 1), found(0, queued, "", false)}, hop{1, 0, 10, enq(1, 1), code(conflict)},
			hop{2, 0, 10, enq(0, 1), found(0, queued, "", false)})},
		{"concurrent enqueues of two sets both accepted (case b)", false, hist(
			hop{0, 0, 10, enq(0, 1), found(0, queued, "", false)}, hop{1, 0, 10, enq(1, 1), found(1, queued, "", false)})},
		{"a conflict before any set was accepted", false, hist(
			hop{0, 0, 1, enq(1, 1), code(conflict)}, hop{1, 2, 3, enq(0, 1), found(0, queued, "", false)})},
		{"enqueued again: the stored message as it is now", true, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 5, 6, enq(0, 1), found(0, relayed, "", false)})},
		{"an accepted message vanished", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, read(), absent()})},
		{"a reader saw another set than the one accepted", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, read(), found(1, queued, "", false)})},
		{"an outbox listing shows an in-flight enqueue's envelopes", true, hist(
			hop{0, 0, 10, enq(0, 1), found(0, queued, "", false)},
			hop{1, 1, 2, conctest.Input{Kind: conctest.OpOutboxSummary, Msg: tm}, conctest.Output{Variants: 1}},
			hop{2, 3, 4, read(), absent()})},
		{"an outbox listing shows envelopes of a set not accepted", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)},
			hop{1, 2, 3, conctest.Input{Kind: conctest.OpOutboxSummary, Msg: tm}, conctest.Output{Variants: 1<<0 | 1<<1}})},

		// Status only forward; the carrier's moves are spontaneous, nobody else's.
		{"queued, then relayed by the carrier", true, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, read(), found(0, relayed, "", false)})},
		{"relayed, then queued again", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, read(), found(0, relayed, "", false)},
			hop{1, 4, 5, read(), found(0, queued, "", false)})},
		{"delivered without a confirmation", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, read(), found(0, delivered, "", false)})},
		{"delivered by a confirmation of the accepted set", true, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, inbound(0, 1), inboundOut(conctest.OutcomeApplied)},
			hop{1, 4, 5, read(), found(0, delivered, "", false)}, hop{2, 6, 7, inbound(0, 1), inboundOut(conctest.OutcomeDuplicate)})},
		{"a confirmation of another set applied", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, inbound(1, 1), inboundOut(conctest.OutcomeApplied)})},
		{"a forged confirmation applied", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, inbound(-1, 1), inboundOut(conctest.OutcomeApplied)})},
		{"a confirmation stored twice", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, inbound(1, 1), inboundOut(conctest.OutcomeRefused)},
			hop{1, 4, 5, inbound(1, 1), inboundOut(conctest.OutcomeRefused)})},
		{"closed by its deadline before the deadline", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)},
			hop{1, 2, 3, read(), conctest.Output{Found: true, Variant: 0, Status: closed, ClosedBy: record.ClosedByDeadline, Wall: 1e12}})},
		{"closed by its deadline after it", true, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)},
			hop{1, 2, 3, read(), conctest.Output{Found: true, Variant: 0, Status: closed, ClosedBy: record.ClosedByDeadline, Wall: 3e12}})},
		{"refused by a relay that never refuses", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, read(), found(0, closed, record.ClosedByRefused, false)})},

		// Operator actions.
		{"hold, then held; the single relayed clears it", true, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, act(record.ActionHold), acted("", 1)},
			hop{1, 4, 5, read(), found(0, queued, "", true)}, hop{1, 6, 7, read(), found(0, relayed, "", false)})},
		{"held without a hold", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 4, 5, read(), found(0, queued, "", true)})},
		{"a relayed multi-envelope message's hold may end with its last pending envelope", true, hist(
			hop{0, 0, 1, enq(2, 3), found(2, queued, "", false)}, hop{1, 2, 3, act(record.ActionHold), acted("", 3)},
			hop{1, 4, 5, read(), found(2, relayed, "", true)}, hop{1, 6, 7, read(), found(2, relayed, "", false)})},
		{"a queued message loses its hold", false, hist(
			hop{0, 0, 1, enq(2, 3), found(2, queued, "", false)}, hop{1, 2, 3, act(record.ActionHold), acted("", 3)},
			hop{1, 4, 5, read(), found(2, queued, "", false)})},
		{"a relayed message held again by no one", false, hist(
			hop{0, 0, 1, enq(2, 3), found(2, queued, "", false)}, hop{1, 2, 3, act(record.ActionHold), acted("", 3)},
			hop{1, 4, 5, read(), found(2, relayed, "", false)}, hop{1, 6, 7, read(), found(2, relayed, "", true)})},
		{"cancel closes it, a second cancel finds it cancelled", true, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, act(record.ActionCancel), acted("", 1)},
			hop{1, 4, 5, act(record.ActionCancel), acted("", 0)}, hop{1, 6, 7, act(record.ActionHold), acted("MESSAGE_CLOSED", 0)},
			hop{1, 8, 9, read(), found(0, closed, record.ClosedByCancelled, false)})},
		{"cancel of a relayed single succeeds", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, read(), found(0, relayed, "", false)},
			hop{1, 4, 5, act(record.ActionCancel), acted("", 1)})},
		{"an action on a message not accepted", true, hist(
			hop{1, 0, 1, act(record.ActionHold), acted("MESSAGE_NOT_FOUND", 0)}, hop{0, 2, 3, enq(0, 1), found(0, queued, "", false)},
			hop{1, 4, 5, act(record.ActionRetry), acted("", 0)})},
		{"MESSAGE_NOT_FOUND for an accepted message", false, hist(
			hop{0, 0, 1, enq(0, 1), found(0, queued, "", false)}, hop{1, 2, 3, act(record.ActionHold), acted("MESSAGE_NOT_FOUND", 0)})},
		{"a busy enqueue may or may not have accepted", true, hist(
			hop{0, 0, 1, enq(0, 1), code(busyStore)}, hop{1, 2, 3, read(), found(0, queued, "", false)},
			hop{1, 4, 5, enq(1, 1), code(conflict)})},
	} {
		t.Run(c.name, func(t *testing.T) {
			vs, _ := conctest.Check(c.ops, 10*time.Second)
			switch {
			case c.legal && len(vs) > 0:
				t.Fatalf("a correct history was refused:\n%s", vs[0].Report(0))
			case !c.legal && len(vs) == 0:
				t.Fatalf("a wrong history was explained")
			case !c.legal && len(vs[0].Shrunk) == 0:
				t.Fatalf("a violation with no history")
			}
		})
	}
}

// Shrink keeps the calls that contradict each other and drops the answers that only
// observed: of case (a) with six callers in progress, the two starts.
func TestShrinkKeepsTheContradiction(t *testing.T) {
	ops := []hop{{0, 0, 10, begin(0), started("A")}, {1, 0, 10, begin(0), started("B")}}
	for w := 2; w < 8; w++ {
		ops = append(ops, hop{w, 1, 9, begin(0), code(inProgress)})
	}
	ops = append(ops, hop{0, 11, 12, conctest.Input{Kind: conctest.OpComplete, Key: tk, OpID: "A", Resp: "r"}, conctest.Output{}})
	vs, _ := conctest.Check(hist(ops...), 10*time.Second)
	if len(vs) != 1 {
		t.Fatalf("%d violations, want 1", len(vs))
	}
	r := vs[0].Report(0)
	if len(vs[0].Shrunk) != 2 || !strings.Contains(r, "started A") || !strings.Contains(r, "started B") {
		t.Fatalf("shrunk to %d operations:\n%s", len(vs[0].Shrunk), r)
	}
}

// Expected tells the API's answers and a busy store from failures.
func TestExpected(t *testing.T) {
	for _, c := range []struct {
		kind, code string
		want       bool
	}{
		{conctest.OpBegin, inProgress, true}, {conctest.OpBegin, keyReused, true}, {conctest.OpEnqueue, conflict, true},
		{conctest.OpEnqueue, "OUTBOX_DEADLINE_EXPIRED", true}, {conctest.OpInbound, busyStore, true},
		{conctest.OpEnqueue, "OUTBOX_STORE_INVALID", false}, {conctest.OpBegin, conflict, false},
		{conctest.OpMessage, "OUTBOX_STORE_UNWRITABLE", false}, {conctest.OpAction, "UNCODED", false},
	} {
		if got := conctest.Expected(conctest.Op{In: conctest.Input{Kind: c.kind}, Out: conctest.Output{Code: c.code}}); got != c.want {
			t.Errorf("Expected(%s answering %s) = %v, want %v", c.kind, c.code, got, c.want)
		}
	}
}
