package carrier

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// holdAll puts an operator's hold on the pending envelopes of req (as the operator
// actions do), directly in the store.
func holdAll(t *testing.T, s *store.Store, req store.SendRequest, at int64) {
	t.Helper()
	err := s.Transaction(context.Background(), func(tx *store.Tx) error {
		for _, e := range req.Envelopes {
			o, err := store.TxGet[*record.Outbox](tx, e.EnvelopeID)
			if err != nil {
				return err
			}
			a := &record.Action{Op: record.ActionHold, By: "uid:1", At: at, Reason: "test"}
			o.Held, o.Operator = a, a
			if err := tx.Put(o); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func viewOf(t *testing.T, views []TargetView, url string) TargetView {
	t.Helper()
	for _, v := range views {
		if v.RelayURL == url {
			return v
		}
	}
	t.Fatalf("no view of %s in %+v", url, views)
	return TargetView{}
}

// The queue view of a real store after a scripted run, on the fake clock: a failing
// relay backs off until the envelope's next attempt, a relay that does not answer is
// unreachable since the first attempt with its next probe, a relay never tried is
// ready, a held one held; counts, bytes, attempts, ages and the last error follow.
func TestTargetsStates(t *testing.T) {
	const (
		failing = "http://failing.test"
		down    = "http://down.test"
		fresh   = "http://fresh.test"
		heldURL = "http://held.test"
	)
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		switch url {
		case failing:
			return failed(ctx, url, id, n)
		case down:
			return unreachable(ctx, url, id, n)
		}
		return Result{Outcome: Accepted, Status: 200}
	}
	t0 := h.clock.Now()
	h.enqueue(failing, 1, 24*time.Hour)
	h.enqueue(down, 2, 24*time.Hour)
	h.start()
	h.runUntil(t0.Add(5 * time.Second)) // failing: attempts at t0, t0+2 s; next at t0+6 s
	h.stop()
	t1 := h.clock.Now()
	h.clock.set(t0.Add(7 * time.Minute)) // the fresh and held messages are younger
	f1 := h.enqueue(fresh, 1, 24*time.Hour)
	f2 := h.enqueue(fresh, 3, 24*time.Hour)
	hr := h.enqueue(heldURL, 1, 24*time.Hour)
	holdAll(t, h.s, hr, h.clock.Now().UnixMilli())

	now := t0.Add(11 * time.Minute)
	views, err := Targets(context.Background(), h.s, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 4 || views[0].RelayURL != down || views[3].RelayURL != heldURL {
		t.Fatalf("views not one per target in URL order: %+v", views)
	}
	// Evaluated at t1 (just after the run) the failing target backs off.
	early, err := Targets(context.Background(), h.s, t1)
	if err != nil {
		t.Fatal(err)
	}
	if v := viewOf(t, early, failing); v.State != TargetBackingOff || v.BackoffUntil != t0.Add(6*time.Second).UnixMilli() ||
		v.Attempts != 2 || !strings.Contains(v.LastError, "503") || v.Pending != 1 || v.InFlight != 0 {
		t.Fatalf("failing target at %v: %+v", t1, v)
	}
	// At now its next attempt is past: ready again, with the history kept.
	if v := viewOf(t, views, failing); v.State != TargetReady || v.Attempts != 2 || !strings.Contains(v.LastError, "503") ||
		v.Ages != [7]int{0, 0, 1, 0, 0, 0, 0} || v.OldestPendingAt != t0.UnixMilli() {
		t.Fatalf("failing target at now: %+v", v)
	}
	v := viewOf(t, views, down)
	// down: probes at t0, t0+1.5 s, t0+3.75 s; the next at t0+9.375 s.
	if v.State != TargetUnreachable || v.UnreachableSince != t0.UnixMilli() || v.NextProbeAt != t0.Add(9375*time.Millisecond).UnixMilli() ||
		v.Pending != 2 || v.Attempts != 3 || v.LastError == "" {
		t.Fatalf("unreachable target: %+v", v)
	}
	v = viewOf(t, views, fresh)
	var bytes int64
	for _, r := range []store.SendRequest{f1, f2} {
		for _, e := range r.Envelopes {
			bytes += int64(len(e.Envelope))
		}
	}
	if v.State != TargetReady || v.Pending != 4 || v.Held != 0 || v.Bytes != bytes || v.Attempts != 0 || v.LastError != "" ||
		v.Ages != [7]int{4, 0, 0, 0, 0, 0, 0} || v.OldestPendingAt != t0.Add(7*time.Minute).UnixMilli() {
		t.Fatalf("fresh target: %+v (bytes want %d)", v, bytes)
	}
	if v := viewOf(t, views, heldURL); v.State != TargetHeld || v.Pending != 1 || v.Held != 1 {
		t.Fatalf("held target: %+v", v)
	}
	// Three hours later everything is in the last bucket.
	late, err := Targets(context.Background(), h.s, t0.Add(3*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if v := viewOf(t, late, fresh); v.Ages != [7]int{0, 0, 0, 0, 0, 0, 4} {
		t.Fatalf("ages after 3 h: %v", v.Ages)
	}
}

// The view counts what the plan would dispatch — not an uncommitted single nor a
// member whose marker is missing, nor a relayed or closed envelope — and its state
// looks only at the unheld envelopes: one held envelope among due ones leaves the
// target ready, held ones among backed-off ones do not make it due; a live lease is
// in flight (ready), an expired one is not.
func TestTargetViewsRules(t *testing.T) {
	const url = "http://127.0.0.1:9/"
	const now = int64(10_000_000)
	sum := func(env, msg, batch string, next int64) store.OutboxSummary {
		return store.OutboxSummary{EnvelopeID: env, MessageID: msg, BatchID: batch, State: record.StatePending,
			RelayURL: url, DeliveryDeadline: 1 << 40, NextAttemptAt: next, Bytes: 10}
	}
	msgs := []store.MessageSummary{{MessageID: "m-1", CreatedAt: now - 1000}}
	build := func(sums ...store.OutboxSummary) TargetView {
		t.Helper()
		views := targetViews(sums, msgs, []string{"b-1"}, []string{"m-1", "m-2"}, now)
		if len(views) != 1 {
			t.Fatalf("views %+v", views)
		}
		return views[0]
	}
	relayed := sum("e-relayed", "m-1", "b-1", 0)
	relayed.State = record.StateRelayed
	v := build(sum("e-1", "m-1", "b-1", now+5000), sum("e-half", "m-3", "e-half", 0), sum("e-nomarker", "m-2", "b-9", 0), relayed)
	if v.Pending != 1 || v.Bytes != 10 || v.State != TargetBackingOff || v.BackoffUntil != now+5000 || v.OldestPendingAt != now-1000 {
		t.Fatalf("only the committed pending envelope counts: %+v", v)
	}

	heldDue := sum("e-2", "m-1", "b-1", 0)
	heldDue.Held = true
	if v := build(sum("e-1", "m-1", "b-1", now+5000), heldDue); v.State != TargetBackingOff || v.BackoffUntil != now+5000 || v.Held != 1 || v.Pending != 2 {
		t.Fatalf("a held due envelope made the target due: %+v", v)
	}
	heldLater := sum("e-2", "m-1", "b-1", now+9000)
	heldLater.Held = true
	if v := build(sum("e-1", "m-1", "b-1", 0), heldLater); v.State != TargetReady || v.Held != 1 {
		t.Fatalf("a held envelope hid a due one: %+v", v)
	}

	leased := sum("e-1", "m-1", "b-1", 0)
	leased.Lease = &record.Lease{Holder: "other", Until: now + 60_000}
	if v := build(leased, sum("e-2", "m-1", "b-1", now+5000)); v.InFlight != 1 || v.State != TargetReady {
		t.Fatalf("a live lease: %+v", v)
	}
	leased.Lease.Until = now - 1
	if v := build(leased); v.InFlight != 0 || v.State != TargetReady {
		t.Fatalf("an expired lease: %+v", v)
	}

	// The last error is the most tried envelope's.
	a, b := sum("e-1", "m-1", "b-1", now+100), sum("e-2", "m-1", "b-1", now+200)
	a.Attempts, a.LastError = 5, "relay unreachable"
	b.Attempts, b.LastError = 1, "HTTP 503"
	if v := build(a, b); v.LastError != "relay unreachable" || v.Attempts != 6 {
		t.Fatalf("last error: %+v", v)
	}
}
