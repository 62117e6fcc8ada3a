package carrier

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func (h *harness) actNow(sel Selector, op string) []ActionResult {
	h.t.Helper()
	g := h.c.gen()
	rs, err := h.c.Act(context.Background(), sel, record.Action{Op: op, By: "uid:1000", At: h.clock.Now().UnixMilli()})
	if err != nil {
		h.t.Fatalf("%s: %v", op, err)
	}
	waitFor(h.t, "the carrier to act", func() bool { return h.c.quiet(g, 0) && !h.clock.pending() })
	return rs
}

// Retry of one message of a waiting target attempts it at once, as the target's
// probe (no other envelope is sent), and says so; when the probe is answered, the
// wait ends and every other envelope of the target goes at once.
func TestRetryMessageProbesWaitingTarget(t *testing.T) {
	h := newHarness(t, Options{ProbeMin: time.Hour, ProbeEvery: time.Hour}, store.Options{})
	h.tr.answer = unreachable
	var reqs []store.SendRequest
	for range 4 {
		reqs = append(reqs, h.enqueue(relayA, 1, 24*time.Hour))
	}
	h.start()
	h.settle()
	if n := h.tr.count(); n != 1 {
		t.Fatalf("%d sends before the wait", n)
	}
	probe := h.tr.log()[0].envelopeID
	pick := reqs[2]
	if pick.Envelopes[0].EnvelopeID == probe {
		pick = reqs[3]
	}
	// Enqueued during the wait: never marked, still waits on the target.
	late := h.enqueue(relayA, 1, 24*time.Hour)
	h.kick()
	h.clock.set(h.clock.Now().Add(time.Minute))
	rs := h.actNow(ids(pick.MessageID), record.ActionRetry)
	if len(rs) != 1 || rs[0].Effect != EffectProbing || !strings.Contains(rs[0].Message, "probing") {
		t.Fatalf("retry: %+v", rs)
	}
	sends := h.tr.log()
	if len(sends) != 2 || sends[1].envelopeID != pick.Envelopes[0].EnvelopeID || !sends[1].at.Equal(h.clock.Now()) {
		t.Fatalf("sends %+v, want one more: %s at once", sends, pick.Envelopes[0].EnvelopeID)
	}
	// Unanswered: the target keeps waiting; a retry made no record change, it
	// still attempts.
	h.clock.set(h.clock.Now().Add(time.Minute))
	h.tr.answer = nil
	pick2 := late
	rs = h.actNow(ids(pick2.MessageID), record.ActionRetry)
	if len(rs) != 1 || rs[0].Effect != EffectProbing {
		t.Fatalf("retry of a message enqueued in the wait: %+v", rs)
	}
	h.settle()
	if n := h.tr.count(); n != 2+5 {
		t.Fatalf("%d sends, want the probe and then all 5 at once", n)
	}
	for _, r := range append(reqs, late) {
		if o := h.outbox(r.Envelopes[0].EnvelopeID); o.State != record.StateRelayed || o.UnreachableSince != 0 {
			t.Fatalf("after the answered probe: %+v", o)
		}
	}
}

// Retry --target answers per message what happens: attempting for every one,
// whether or not its record changed.
func TestRetryTargetSaysAttempting(t *testing.T) {
	h := newHarness(t, Options{ProbeMin: time.Hour, ProbeEvery: time.Hour}, store.Options{})
	h.tr.answer = unreachable
	var reqs []store.SendRequest
	for range 3 {
		reqs = append(reqs, h.enqueue(relayA, 1, 24*time.Hour))
	}
	h.start()
	h.settle()
	reqs = append(reqs, h.enqueue(relayA, 1, 24*time.Hour)) // not marked, due by its record
	h.kick()
	h.tr.answer = nil
	rs := h.actNow(Selector{Target: relayA + "/"}, record.ActionRetry)
	if len(rs) != 4 {
		t.Fatalf("retry --target: %+v", rs)
	}
	for _, r := range rs {
		if r.Effect != EffectAttempting || r.Message != "attempting now" {
			t.Fatalf("result %+v", r)
		}
	}
	h.settle()
	for _, r := range reqs {
		if o := h.outbox(r.Envelopes[0].EnvelopeID); o.State != record.StateRelayed {
			t.Fatalf("not relayed: %+v", o)
		}
	}
}

// With TakeOverLeases (the daemon's pid lock: the holder is dead), the carrier
// takes back another holder's lease at start and sends at once; without it, the
// lease is waited out.
func TestTakeOverLeasesAtStart(t *testing.T) {
	for _, takeOver := range []bool{false, true} {
		h := newHarness(t, Options{TakeOverLeases: takeOver}, store.Options{})
		req := h.enqueue(relayA, 2, 24*time.Hour)
		until := h.clock.Now().Add(180 * time.Second).UnixMilli()
		for _, e := range req.Envelopes {
			o := h.outbox(e.EnvelopeID)
			o.Lease = &record.Lease{Holder: "carrier:1:dead", Until: until} // leased when due, as a carrier leases
			if err := h.s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(o) }); err != nil {
				t.Fatal(err)
			}
		}
		w, err := Waits(context.Background(), h.s, h.clock.Now())
		if err != nil || w[req.Envelopes[0].EnvelopeID].WaitingFor != WaitLease || w[req.Envelopes[0].EnvelopeID].LeaseUntil != until {
			t.Fatalf("wait of a leased envelope: %+v %v", w, err)
		}
		h.start()
		h.settle()
		if n := h.tr.count(); takeOver != (n == 2) || (!takeOver && n != 0) {
			t.Fatalf("take over %v: %d sends at start", takeOver, n)
		}
		h.stop()
	}
}

// Retry through Act of a message a dead carrier leased (TakeOverLeases) ends the
// lease and its wait marking at once: it is attempted, not left "in flight".
func TestRetryEndsADeadHoldersLease(t *testing.T) {
	h := newHarness(t, Options{TakeOverLeases: true, ProbeMin: time.Hour, ProbeEvery: time.Hour}, store.Options{})
	req := h.enqueue(relayA, 1, 24*time.Hour)
	o := h.outbox(req.Envelopes[0].EnvelopeID)
	until := h.clock.Now().Add(180 * time.Second).UnixMilli()
	o.Lease = &record.Lease{Holder: "carrier:1:dead", Until: until}
	o.UnreachableSince, o.NextAttemptAt = h.clock.Now().UnixMilli(), until
	if err := h.s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(o) }); err != nil {
		t.Fatal(err)
	}
	// Not running: Act alone, as a retry while the take-over has not happened yet.
	rs, err := h.c.Act(context.Background(), Selector{Target: relayA}, record.Action{Op: record.ActionRetry, By: "uid:1000", At: h.clock.Now().UnixMilli()})
	if err != nil || len(rs) != 1 || rs[0].Effect != EffectAttempting || rs[0].InFlight != 0 || rs[0].Changed != 1 {
		t.Fatalf("retry: %+v %v", rs, err)
	}
	if o := h.outbox(req.Envelopes[0].EnvelopeID); o.Lease != nil || o.UnreachableSince != 0 || o.NextAttemptAt > h.clock.Now().UnixMilli() {
		t.Fatalf("after the retry: %+v", o)
	}
	// Apply (no proof the holder is dead) leaves a live lease alone and says in flight.
	h2 := newHarness(t, Options{}, store.Options{})
	req = h2.enqueue(relayA, 1, 24*time.Hour)
	o = h2.outbox(req.Envelopes[0].EnvelopeID)
	o.Lease = &record.Lease{Holder: "carrier:1:other", Until: until}
	if err := h2.s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(o) }); err != nil {
		t.Fatal(err)
	}
	rs = h2.act(ids(req.MessageID), record.ActionRetry, "")
	if len(rs) != 1 || rs[0].Effect != EffectInFlight || rs[0].InFlight != 1 || !strings.Contains(rs[0].Message, "in flight") {
		t.Fatalf("retry of a message in flight: %+v", rs)
	}
	if o := h2.outbox(req.Envelopes[0].EnvelopeID); o.Lease == nil {
		t.Fatalf("a live lease was ended: %+v", o)
	}
}

// A store failure on one target ends with the first pass elsewhere that writes:
// the failed target is not left waiting on a failure that cleared.
func TestStoreRecoveryEndsStoreDelays(t *testing.T) {
	h := newHarness(t, Options{StoreRetryMin: time.Hour, StoreFailureDelay: time.Hour}, store.Options{})
	h.c.finish(passResult{target: relayA, err: errTest})
	if _, ok := h.c.blocked[relayA]; !ok || !h.c.storeBlocked[relayA] {
		t.Fatalf("not delayed: %v", h.c.blocked)
	}
	h.c.finish(passResult{target: relayB}) // nothing written: proves nothing
	if _, ok := h.c.blocked[relayA]; !ok {
		t.Fatal("a pass that wrote nothing ended the store delay")
	}
	h.c.finish(passResult{target: relayB, progress: true})
	if _, ok := h.c.blocked[relayA]; ok || len(h.c.storeBlocked) != 0 || h.c.storeFails != 0 {
		t.Fatalf("the store delay outlived a working write: %v", h.c.blocked)
	}
}

type testError struct{}

func (testError) Error() string { return "test store failure" }

var errTest error = testError{}

// Many operators retry the same few messages at once while the carrier runs:
// every retry answers, each message is sent (accepted) exactly once, and the
// expedite set is empty at the end.
func TestRetryManyAtOnce(t *testing.T) {
	h := newHarness(t, Options{ProbeMin: time.Hour, ProbeEvery: time.Hour}, store.Options{})
	h.tr.answer = unreachable
	var reqs []store.SendRequest
	for range 3 {
		reqs = append(reqs, h.enqueue(relayA, 1, 24*time.Hour))
	}
	h.start()
	h.settle()
	h.tr.answer = nil
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			<-start
			sel := ids(reqs[w%len(reqs)].MessageID)
			if w%5 == 0 {
				sel = Selector{Target: relayA}
			}
			rs, err := h.c.Act(context.Background(), sel, record.Action{Op: record.ActionRetry, By: "uid:1000", At: h.clock.Now().UnixMilli()})
			if err != nil || len(rs) == 0 {
				t.Errorf("retry: %+v %v", rs, err)
			}
		})
	}
	close(start)
	wg.Wait()
	h.kick()
	h.settle()
	seen := map[string]int{}
	for _, s := range h.tr.log()[1:] {
		seen[s.envelopeID]++
	}
	for _, r := range reqs {
		id := r.Envelopes[0].EnvelopeID
		if o := h.outbox(id); o.State != record.StateRelayed {
			t.Fatalf("not relayed: %+v", o)
		}
		if seen[id] > 1 {
			t.Fatalf("%s sent %d times after the retries", id, seen[id])
		}
	}
	if exp := h.c.expedited(); len(exp) != 0 {
		t.Fatalf("expedite set left: %v", exp)
	}
}
