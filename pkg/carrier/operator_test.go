package carrier

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

const relayB = "http://relay-b.test"

func (h *harness) act(sel Selector, op, reason string) []ActionResult {
	h.t.Helper()
	rs, err := Apply(context.Background(), h.s, sel, record.Action{Op: op, By: "uid:1000", At: h.clock.Now().UnixMilli(), Reason: reason})
	if err != nil {
		h.t.Fatalf("%s: %v", op, err)
	}
	return rs
}

func ids(ms ...string) Selector { return Selector{MessageIDs: ms} }

func (h *harness) members(req store.SendRequest) []*record.Outbox {
	h.t.Helper()
	var out []*record.Outbox
	for _, e := range req.Envelopes {
		out = append(out, h.outbox(e.EnvelopeID))
	}
	return out
}

func TestApplyHoldRelease(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	req := h.enqueue(relayA, 3, time.Hour)
	other := h.enqueue(relayA, 1, time.Hour)
	rs := h.act(ids(req.MessageID), record.ActionHold, "peer asked")
	if len(rs) != 1 || rs[0].Changed != 3 || rs[0].Code != "" || rs[0].MessageID != req.MessageID {
		t.Fatalf("hold: %+v", rs)
	}
	for _, o := range h.members(req) {
		if o.Held == nil || o.Held.Op != record.ActionHold || o.Held.Reason != "peer asked" || o.Operator == nil || o.Operator.By != "uid:1000" {
			t.Fatalf("held member %+v", o)
		}
	}
	m := h.message(req.MessageID)
	if m.Held == nil || m.Operator == nil || m.Operator.Op != record.ActionHold {
		t.Fatalf("held message %+v", m)
	}
	if o := h.outbox(other.Envelopes[0].EnvelopeID); o.Held != nil || o.Operator != nil {
		t.Fatalf("another message was held: %+v", o)
	}
	before := h.members(req)
	h.clock.set(h.clock.Now().Add(time.Minute))
	if rs := h.act(ids(req.MessageID), record.ActionHold, "again"); rs[0].Changed != 0 || rs[0].Code != "" {
		t.Fatalf("second hold: %+v", rs)
	}
	if after := h.members(req); !reflect.DeepEqual(before, after) {
		t.Fatal("a repeated hold rewrote the records")
	}
	if !reflect.DeepEqual(m, h.message(req.MessageID)) {
		t.Fatal("a repeated hold rewrote the message")
	}
	rs = h.act(ids(req.MessageID), record.ActionRelease, "")
	if rs[0].Changed != 3 || rs[0].Code != "" {
		t.Fatalf("release: %+v", rs)
	}
	for i, o := range h.members(req) {
		if o.Held != nil || o.Operator == nil || o.Operator.Op != record.ActionRelease || o.NextAttemptAt != before[i].NextAttemptAt {
			t.Fatalf("released member %+v", o)
		}
	}
	if m := h.message(req.MessageID); m.Held != nil || m.Operator.Op != record.ActionRelease {
		t.Fatalf("released message %+v", m)
	}
	if rs := h.act(ids(req.MessageID), record.ActionRelease, ""); rs[0].Changed != 0 || rs[0].Code != "" {
		t.Fatalf("second release: %+v", rs)
	}
}

func TestApplyRefusals(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	req := h.enqueue(relayA, 2, time.Hour)
	missing := uuid.NewString()
	rs := h.act(ids(missing, req.MessageID, missing), record.ActionHold, "")
	if len(rs) != 2 || rs[0].Code != errcode.MessageNotFound.String() || rs[1].Code != "" || rs[1].Changed != 2 {
		t.Fatalf("hold of a missing and a present message: %+v", rs)
	}
	// Cancel: the pending members close, the message closes as cancelled.
	rs = h.act(ids(req.MessageID), record.ActionCancel, "wrong peer")
	if rs[0].Changed != 2 || rs[0].Code != "" {
		t.Fatalf("cancel: %+v", rs)
	}
	for _, o := range h.members(req) {
		if o.State != record.StateClosed || o.Held != nil || o.Lease != nil || o.LastError != "cancelled by operator: wrong peer" || o.Operator.Op != record.ActionCancel {
			t.Fatalf("cancelled member %+v", o)
		}
	}
	m := h.message(req.MessageID)
	if m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByCancelled || m.Held != nil || m.Operator.Op != record.ActionCancel ||
		!strings.Contains(m.LastError, "wrong peer") {
		t.Fatalf("cancelled message %+v", m)
	}
	if rs := h.act(ids(req.MessageID), record.ActionCancel, ""); rs[0].Changed != 0 || rs[0].Code != "" {
		t.Fatalf("second cancel: %+v", rs)
	}
	for _, op := range []string{record.ActionHold, record.ActionRelease, record.ActionRetry} {
		if rs := h.act(ids(req.MessageID), op, ""); rs[0].Code != errcode.MessageClosed.String() || rs[0].Changed != 0 {
			t.Fatalf("%s of a cancelled message: %+v", op, rs)
		}
	}
	if !reflect.DeepEqual(m, h.message(req.MessageID)) {
		t.Fatal("a refused action rewrote the message")
	}
	for _, bad := range []struct {
		sel Selector
		a   record.Action
	}{
		{Selector{}, record.Action{Op: record.ActionHold, By: "x", At: 1}},
		{Selector{MessageIDs: []string{req.MessageID}, Target: relayA}, record.Action{Op: record.ActionHold, By: "x", At: 1}},
		{ids(req.MessageID), record.Action{Op: "delete", By: "x", At: 1}},
		{ids(req.MessageID), record.Action{Op: record.ActionHold, At: 1}},
	} {
		if _, err := Apply(context.Background(), h.s, bad.sel, bad.a); err == nil {
			t.Errorf("Apply(%+v, %+v) accepted", bad.sel, bad.a)
		}
	}
}

// Cancel does not recall a relayed envelope, and says so.
func TestApplyCancelKeepsRelayed(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	req := h.enqueue(relayA, 2, time.Hour)
	o := h.outbox(req.Envelopes[0].EnvelopeID)
	if err := h.s.Transaction(context.Background(), func(tx *store.Tx) error {
		o.State, o.Attempts = record.StateRelayed, 1
		return tx.Put(o)
	}); err != nil {
		t.Fatal(err)
	}
	rs := h.act(ids(req.MessageID), record.ActionCancel, "")
	if rs[0].Changed != 1 || !strings.Contains(rs[0].Message, "1 envelope already relayed is not recalled") {
		t.Fatalf("cancel: %+v", rs)
	}
	if got := h.outbox(req.Envelopes[0].EnvelopeID); got.State != record.StateRelayed || got.Operator != nil {
		t.Fatalf("the relayed envelope was changed: %+v", got)
	}
	// The cancelled message is kept for the closed retention, from the cancel.
	if m := h.message(req.MessageID); m.RetainUntil != h.clock.Now().UnixMilli()+h.s.ClosedRetention().Milliseconds() {
		t.Fatalf("cancelled message retained until %d, want now + the closed retention", m.RetainUntil)
	}
	// A relayed message with nothing pending has nothing to cancel: refused, unchanged.
	req2 := h.enqueue(relayA, 1, time.Hour)
	if err := h.s.Transaction(context.Background(), func(tx *store.Tx) error {
		o := h.outbox(req2.Envelopes[0].EnvelopeID)
		o.State = record.StateRelayed
		m := h.message(req2.MessageID)
		m.Status = record.StatusRelayed
		return tx.PutAll(o, m)
	}); err != nil {
		t.Fatal(err)
	}
	before := h.message(req2.MessageID)
	rs = h.act(ids(req2.MessageID), record.ActionCancel, "")
	if rs[0].Code != errcode.MessageClosed.String() || rs[0].Changed != 0 || !strings.Contains(rs[0].Message, "not recalled") {
		t.Fatalf("cancel of a relayed message: %+v", rs)
	}
	if !reflect.DeepEqual(before, h.message(req2.MessageID)) {
		t.Fatal("a refused cancel rewrote the relayed message")
	}
}

func TestApplyRetry(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	req := h.enqueue(relayA, 2, time.Hour)
	later := h.clock.Now().Add(10 * time.Minute).UnixMilli()
	if err := h.s.Transaction(context.Background(), func(tx *store.Tx) error {
		for i, o := range h.members(req) {
			o.NextAttemptAt, o.Attempts = later, 3
			if i == 1 {
				o.UnreachableSince = later - 1000
			}
			if err := tx.Put(o); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	now := h.clock.Now().UnixMilli()
	rs := h.act(ids(req.MessageID), record.ActionRetry, "relay is back")
	if rs[0].Changed != 2 || rs[0].Code != "" {
		t.Fatalf("retry: %+v", rs)
	}
	for _, o := range h.members(req) {
		if o.NextAttemptAt != now || o.UnreachableSince != 0 || o.Attempts != 3 || o.Operator.Op != record.ActionRetry {
			t.Fatalf("retried member %+v", o)
		}
	}
	if rs := h.act(ids(req.MessageID), record.ActionRetry, ""); rs[0].Changed != 0 {
		t.Fatalf("second retry: %+v", rs)
	}
	// A held envelope is not retried.
	h.act(ids(req.MessageID), record.ActionHold, "")
	h.clock.set(h.clock.Now().Add(time.Minute))
	if err := h.s.Transaction(context.Background(), func(tx *store.Tx) error {
		o := h.outbox(req.Envelopes[0].EnvelopeID)
		o.NextAttemptAt = later + 60_000
		return tx.Put(o)
	}); err != nil {
		t.Fatal(err)
	}
	rs = h.act(ids(req.MessageID), record.ActionRetry, "")
	if rs[0].Changed != 0 || !strings.Contains(rs[0].Message, "2 held envelopes are not retried") {
		t.Fatalf("retry of a held message: %+v", rs)
	}
	if o := h.outbox(req.Envelopes[0].EnvelopeID); o.NextAttemptAt != later+60_000 {
		t.Fatalf("a held envelope was retried: %+v", o)
	}
}

// A target's action reaches every message with pending envelopes to it, and no
// other, in transactions of at most actionChunk envelopes.
func TestApplyTarget(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	var reqs []store.SendRequest
	for range 5 {
		reqs = append(reqs, h.enqueue(relayA, 30, time.Hour))
	}
	other := h.enqueue(relayB, 2, time.Hour)
	if _, err := h.s.OutboxSummaries(context.Background()); err != nil {
		t.Fatal(err)
	}
	acq0, _ := h.s.LockStats()
	rs := h.act(Selector{Target: relayA}, record.ActionHold, "")
	acq1, _ := h.s.LockStats()
	if len(rs) != 5 {
		t.Fatalf("hold --target: %+v", rs)
	}
	for _, r := range rs {
		if r.Changed != 30 || r.Code != "" {
			t.Fatalf("hold --target: %+v", rs)
		}
	}
	// 150 envelopes in whole messages of 30, at most 64 a transaction: 3 transactions.
	if n := acq1 - acq0; n < 3 {
		t.Errorf("hold of 150 envelopes took %d lock holds, want at least 3 (chunks of <= %d)", n, actionChunk)
	}
	for _, req := range reqs {
		for _, o := range h.members(req) {
			if o.Held == nil {
				t.Fatalf("not held: %+v", o)
			}
		}
	}
	for _, o := range h.members(other) {
		if o.Held != nil {
			t.Fatalf("another target's envelope was held: %+v", o)
		}
	}
	if rs := h.act(Selector{Target: relayA}, record.ActionHold, ""); len(rs) != 5 || rs[0].Changed != 0 {
		t.Fatalf("second hold --target: %+v", rs)
	}
	if rs := h.act(Selector{Target: "http://nobody.test"}, record.ActionHold, ""); len(rs) != 0 {
		t.Fatalf("hold of an unknown target: %+v", rs)
	}
}

// A held message is never sent while held, and the timer does not fire for it before
// its deadline; released, it is sent at once.
func TestHeldNotSentUntilReleased(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	req := h.enqueue(relayA, 2, 24*time.Hour)
	h.act(ids(req.MessageID), record.ActionHold, "")
	t0 := h.clock.Now()
	h.start()
	h.runUntil(t0.Add(time.Hour))
	if n := h.tr.count(); n != 0 {
		t.Fatalf("%d sends of a held message", n)
	}
	if at := h.armed(); !at.IsZero() && at.Before(t0.Add(5*time.Minute)) {
		t.Fatalf("the timer is armed for %v, before the sweep, for a held message", at.Sub(t0))
	}
	h.act(ids(req.MessageID), record.ActionRelease, "")
	h.kick()
	if n := h.tr.count(); n != 2 {
		t.Fatalf("%d sends after release, want 2", n)
	}
	for _, o := range h.members(req) {
		if o.State != record.StateRelayed || o.Held != nil {
			t.Fatalf("released member %+v", o)
		}
	}
	if m := h.message(req.MessageID); m.Status != record.StatusRelayed || m.Held != nil {
		t.Fatalf("message %+v", m)
	}
}

// The lease step re-reads the hold: an envelope held after the plan was made is not
// sent.
func TestLeaseSkipsHeld(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	req := h.enqueue(relayA, 1, time.Hour)
	plans, err := h.c.plan(context.Background(), h.clock.Now(), nil)
	if err != nil || len(plans) != 1 {
		t.Fatalf("plan: %v %v", plans, err)
	}
	h.act(ids(req.MessageID), record.ActionHold, "")
	h.c.pass(context.Background(), plans[0])
	if n := h.tr.count(); n != 0 {
		t.Fatalf("%d sends of an envelope held after the plan", n)
	}
	if o := h.outbox(req.Envelopes[0].EnvelopeID); o.Lease != nil || o.Held == nil {
		t.Fatalf("outbox %+v", o)
	}
}

// A held message past its deadline closes by deadline, and the hold ends.
func TestHeldClosesByDeadline(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	req := h.enqueue(relayA, 2, 20*time.Minute)
	h.act(ids(req.MessageID), record.ActionHold, "")
	t0 := h.clock.Now()
	h.start()
	h.runUntil(t0.Add(time.Hour))
	if n := h.tr.count(); n != 0 {
		t.Fatalf("%d sends of a held message", n)
	}
	for _, o := range h.members(req) {
		if o.State != record.StateClosed || o.Held != nil || !strings.Contains(o.LastError, errcode.OutboxDeadlineExpired.String()) {
			t.Fatalf("member %+v", o)
		}
	}
	m := h.message(req.MessageID)
	if m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByDeadline || m.Held != nil || m.Operator.Op != record.ActionHold {
		t.Fatalf("message %+v", m)
	}
	if at := m.UpdatedAt; at != t0.Add(20*time.Minute).UnixMilli() {
		t.Fatalf("closed at %v, want at the deadline", time.UnixMilli(at).Sub(t0))
	}
}

// A cancelled message is never sent afterwards.
func TestCancelledNeverSent(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = failed
	req := h.enqueue(relayA, 1, 24*time.Hour)
	t0 := h.clock.Now()
	h.start()
	h.settle()
	if n := h.tr.count(); n != 1 {
		t.Fatalf("%d sends before the cancel", n)
	}
	h.act(ids(req.MessageID), record.ActionCancel, "")
	h.runUntil(t0.Add(2 * time.Hour))
	if n := h.tr.count(); n != 1 {
		t.Fatalf("%d sends, a cancelled message was sent again", n)
	}
	if m := h.message(req.MessageID); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByCancelled {
		t.Fatalf("message %+v", m)
	}
}

// A cancel interrupted after its message's close (a crash lost its members' writes)
// leaves members pending of a cancelled message: the carrier never sends them but
// closes them as the cancel would have, and the same cancel repeated completes it.
func TestInterruptedCancel(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	interrupt := func(req store.SendRequest) {
		m := h.message(req.MessageID)
		cancel := &record.Action{Op: record.ActionCancel, By: "uid:1000", At: h.clock.Now().UnixMilli()}
		m.Status, m.ClosedBy, m.LastError, m.Operator = record.StatusClosed, record.ClosedByCancelled, "cancelled by operator", cancel
		if err := h.s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(m) }); err != nil {
			t.Fatal(err)
		}
	}
	repeated := h.enqueue(relayA, 2, 24*time.Hour)
	interrupt(repeated)
	if rs := h.act(ids(repeated.MessageID), record.ActionCancel, ""); rs[0].Changed != 2 || rs[0].Code != "" {
		t.Fatalf("the repeated cancel: %+v, want both pending members closed", rs)
	}
	sent := h.enqueue(relayA, 2, 24*time.Hour)
	interrupt(sent)
	h.start()
	h.settle()
	if n := h.tr.count(); n != 0 {
		t.Fatalf("%d sends of a cancelled message's members", n)
	}
	for _, req := range []store.SendRequest{repeated, sent} {
		for _, o := range h.members(req) {
			if o.State != record.StateClosed || o.Operator == nil || o.Operator.Op != record.ActionCancel {
				t.Fatalf("member of an interrupted cancel: %+v", o)
			}
		}
	}
}

// Retry makes an attempt at once instead of after the backoff.
func TestRetryAttemptsAtOnce(t *testing.T) {
	h := newHarness(t, Options{BackoffMin: 10 * time.Minute, BackoffMax: time.Hour}, store.Options{})
	h.tr.answer = failed
	req := h.enqueue(relayA, 1, 24*time.Hour)
	h.start()
	h.settle()
	if n := h.tr.count(); n != 1 {
		t.Fatalf("%d sends", n)
	}
	h.clock.set(h.clock.Now().Add(time.Second))
	h.tr.answer = nil
	h.act(ids(req.MessageID), record.ActionRetry, "")
	at := h.clock.Now()
	h.kick()
	sends := h.tr.log()
	if len(sends) != 2 || !sends[1].at.Equal(at) {
		t.Fatalf("sends %v, want a second at %v", sends, at)
	}
	if o := h.outbox(req.Envelopes[0].EnvelopeID); o.State != record.StateRelayed || o.Attempts != 2 {
		t.Fatalf("outbox %+v", o)
	}
}

// Retry of a target clears its unreachable wait: its envelopes go at once, not at the
// next probe.
func TestRetryTargetClearsWait(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = unreachable
	var reqs []store.SendRequest
	for range 3 {
		reqs = append(reqs, h.enqueue(relayA, 1, 24*time.Hour))
	}
	h.start()
	h.settle()
	if n := h.tr.count(); n != 1 {
		t.Fatalf("%d sends before the wait", n)
	}
	for _, r := range reqs {
		if o := h.outbox(r.Envelopes[0].EnvelopeID); o.UnreachableSince == 0 {
			t.Fatalf("not waiting: %+v", o)
		}
	}
	h.clock.set(h.clock.Now().Add(time.Minute))
	h.tr.answer = nil
	rs := h.act(Selector{Target: relayA}, record.ActionRetry, "relay is back")
	if len(rs) != 3 {
		t.Fatalf("retry --target: %+v", rs)
	}
	at := h.clock.Now()
	h.kick()
	sends := h.tr.log()
	if len(sends) != 4 {
		t.Fatalf("sends %v, want 3 more at once", sends)
	}
	for _, s := range sends[1:] {
		if !s.at.Equal(at) {
			t.Fatalf("sent at %v, want %v", s.at, at)
		}
	}
}

// A held envelope leaves its target's wait: when the unreachable relay's wait
// expires, the held message is not closed with the rest, and released after the
// expiry it is probed instead of closed.
func TestHeldLeavesTheWait(t *testing.T) {
	h := newHarness(t, Options{OfflineLimit: time.Hour, ProbeEvery: time.Minute}, store.Options{})
	h.tr.answer = unreachable
	held, other := h.enqueue(relayA, 1, 24*time.Hour), h.enqueue(relayA, 1, 24*time.Hour)
	t0 := h.clock.Now()
	h.start()
	h.settle()
	if o := h.outbox(held.Envelopes[0].EnvelopeID); o.UnreachableSince == 0 {
		t.Fatalf("not in the wait: %+v", o)
	}
	h.act(ids(held.MessageID), record.ActionHold, "")
	if o := h.outbox(held.Envelopes[0].EnvelopeID); o.UnreachableSince != 0 {
		t.Fatalf("a held envelope still in the wait: %+v", o)
	}
	h.runUntil(t0.Add(2 * time.Hour))
	if o := h.outbox(other.Envelopes[0].EnvelopeID); o.State != record.StateClosed {
		t.Fatalf("the unheld envelope after the wait's expiry: %+v", o)
	}
	if o := h.outbox(held.Envelopes[0].EnvelopeID); o.State != record.StatePending {
		t.Fatalf("the held envelope was closed by the wait's expiry: %+v", o)
	}
	sends := h.tr.count()
	h.act(ids(held.MessageID), record.ActionRelease, "")
	h.runUntil(t0.Add(3 * time.Hour))
	if o := h.outbox(held.Envelopes[0].EnvelopeID); o.State != record.StatePending || h.tr.count() == sends {
		t.Fatalf("released after the expiry: %+v, %d sends then %d; want probed, not closed", o, sends, h.tr.count())
	}
}

// blockingSend blocks each send until release is closed, announcing it on started.
func blockingSend(h *harness) (started chan sendRec, release chan struct{}) {
	started, release = make(chan sendRec, 16), make(chan struct{})
	h.tr.started = started
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return Result{Outcome: Accepted, Status: 200}
	}
	return started, release
}

// A cancel while the envelope is in flight stands: the settlement leaves the closed
// record as it is and does not fail.
func TestCancelInFlight(t *testing.T) {
	var mu sync.Mutex
	var events []Event
	h := newHarness(t, Options{Events: func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }}, store.Options{})
	started, release := blockingSend(h)
	req := h.enqueue(relayA, 1, time.Hour)
	h.start()
	<-started
	rs := h.act(ids(req.MessageID), record.ActionCancel, "")
	if rs[0].Changed != 1 {
		t.Fatalf("cancel: %+v", rs)
	}
	before := h.outbox(req.Envelopes[0].EnvelopeID)
	close(release)
	h.settle()
	if after := h.outbox(req.Envelopes[0].EnvelopeID); !reflect.DeepEqual(before, after) {
		t.Fatalf("the settlement rewrote a cancelled envelope: %+v", after)
	}
	if m := h.message(req.MessageID); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByCancelled {
		t.Fatalf("message %+v", m)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range events {
		if e.Kind == EventStoreError {
			t.Fatalf("the settlement failed: %+v", e)
		}
	}
}

// A hold that comes while the envelope is in flight ends with its relay.
func TestHoldInFlightThenRelayed(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	started, release := blockingSend(h)
	req := h.enqueue(relayA, 1, time.Hour)
	h.start()
	<-started
	h.act(ids(req.MessageID), record.ActionHold, "")
	close(release)
	h.settle()
	if o := h.outbox(req.Envelopes[0].EnvelopeID); o.State != record.StateRelayed || o.Held != nil || o.Operator.Op != record.ActionHold {
		t.Fatalf("outbox %+v", o)
	} // Its one envelope relayed, the message has nothing left to hold.
	if m := h.message(req.MessageID); m.Status != record.StatusRelayed || m.Held != nil {
		t.Fatalf("message %+v: relayed and still held", m)
	}
}
