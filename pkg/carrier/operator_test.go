package carrier

import (
	"context"
	"reflect"
	"strings"
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
