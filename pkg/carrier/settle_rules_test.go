package carrier

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// gatedBatches is a transport that takes every run as one batch request: each batch
// is announced on started (its envelope ids) and answered, every envelope accepted,
// when the test sends on release (or its ctx ends: then nothing is accepted).
type gatedBatches struct {
	*scripted
	started chan []string
	release chan struct{}
}

func (g *gatedBatches) Batches(string) bool { return true }

func (g *gatedBatches) SendBatch(ctx context.Context, _ string, envs [][]byte) []Result {
	ids := make([]string, len(envs))
	for i, env := range envs {
		var e struct {
			EnvelopeID string `json:"envelopeId"`
		}
		_ = json.Unmarshal(env, &e)
		ids[i] = e.EnvelopeID
	}
	g.started <- ids
	res := make([]Result, len(envs))
	select {
	case <-g.release:
		for i := range res {
			res[i] = Result{Outcome: Accepted, Status: 200}
		}
	case <-ctx.Done():
		for i := range res {
			res[i] = Result{Outcome: Failed, Err: ctx.Err()}
		}
	}
	return res
}

// newGatedHarness is a harness whose store sits in a data root (so that fsck checks
// it) and whose carrier sends batches through a gatedBatches.
func newGatedHarness(t *testing.T) (*harness, *gatedBatches) {
	t.Helper()
	g := &gatedBatches{started: make(chan []string, 4), release: make(chan struct{})}
	h := newHarnessOn(t, Options{}, store.Options{Home: t.TempDir()}, func(s *scripted) Transport {
		g.scripted = s
		return g
	})
	return h, g
}

// checkClean fails the test if fsck finds a problem in h's store.
func checkClean(t *testing.T, h *harness) {
	t.Helper()
	rep, err := fsck.Check(context.Background(), h.s.Dir(), fsck.Options{Owner: owner(t).DID(), Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		if f.Severity == fsck.Problem {
			t.Errorf("fsck: %s %s: %s", f.Code, f.Path, f.Explanation)
		}
	}
}

// A hold placed while every envelope of a message of several is in flight ends with
// the settlement of the last of them: no envelope is left to hold, so the message is
// not held (a hold never outlives the last pending envelope of its message), and
// fsck agrees.
func TestHoldInFlightBatchEndsWithItsLastEnvelope(t *testing.T) {
	h, g := newGatedHarness(t)
	req := h.enqueue(relayA, 3, time.Hour)
	h.start()
	if ids := <-g.started; len(ids) != 3 {
		t.Fatalf("batch of %d envelopes, want the message's 3", len(ids))
	}
	if rs := h.act(ids(req.MessageID), record.ActionHold, "in flight"); rs[0].Changed != 3 {
		t.Fatalf("hold: %+v", rs)
	}
	g.release <- struct{}{}
	h.settle()
	for _, o := range h.members(req) {
		if o.State != record.StateRelayed || o.Held != nil {
			t.Fatalf("envelope %s: %s, held %v", o.EnvelopeID, o.State, o.Held)
		}
	}
	m := h.message(req.MessageID)
	if m.Status != record.StatusRelayed || m.Held != nil {
		t.Fatalf("message %s, held %v: relayed with nothing pending and still held", m.Status, m.Held)
	}
	if m.Operator == nil || m.Operator.Op != record.ActionHold {
		t.Fatalf("message operator %v: the settlement must keep the operator's last action", m.Operator)
	}
	checkClean(t, h)
}

// A hold and the settlement of the same message, at once, many times: whichever
// publishes first, the other is planned again on what it wrote. Either the hold
// comes first and the settlement ends it with the message's last envelope, or the
// settlement comes first and there is nothing left to hold; never a message held
// with nothing pending, nor a settled envelope held.
func TestHoldRacesSettlement(t *testing.T) {
	h, g := newGatedHarness(t)
	h.start()
	trials := 40
	if testing.Short() {
		trials = 10
	}
	holdsFirst := 0
	for trial := range trials {
		req := h.enqueue(relayA, 2, time.Hour)
		h.c.Kick()
		if got := <-g.started; len(got) != 2 {
			t.Fatalf("trial %d: batch of %d envelopes, want 2", trial, len(got))
		}
		gate := make(chan struct{})
		var wg sync.WaitGroup
		var rs []ActionResult
		var err error
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-gate
			rs, err = Apply(context.Background(), h.s, ids(req.MessageID),
				record.Action{Op: record.ActionHold, By: "uid:1000", At: h.clock.Now().UnixMilli()})
		}()
		go func() {
			defer wg.Done()
			<-gate
			g.release <- struct{}{}
		}()
		close(gate)
		wg.Wait()
		if err != nil || len(rs) != 1 || rs[0].Code != "" {
			t.Fatalf("trial %d: hold: %+v %v", trial, rs, err)
		}
		if rs[0].Changed > 0 {
			holdsFirst++
		}
		h.settle() // the pass is over: its settlement published (or failed)
		for _, o := range h.members(req) {
			if o.State != record.StateRelayed || o.Held != nil {
				t.Fatalf("trial %d: envelope %s, held %v", trial, o.State, o.Held)
			}
		}
		if m := h.message(req.MessageID); m.Status != record.StatusRelayed || m.Held != nil {
			t.Fatalf("trial %d (hold changed %d): message %s, held %v", trial, rs[0].Changed, m.Status, m.Held)
		}
	}
	t.Logf("%d trials, the hold published first in %d", trials, holdsFirst)
	checkClean(t, h)
}

// confirmation enqueues a one-envelope message whose envelope is a delivery-status,
// as the inbox follower enqueues a confirmation.
func (h *harness) confirmation(relayURL string, deadline time.Duration) store.SendRequest {
	h.t.Helper()
	req := request(relayURL, 1, h.clock.Now().Add(deadline))
	req.Envelopes[0].Kind = record.EnvelopeDeliveryStatus
	if _, err := h.s.Enqueue(context.Background(), req); err != nil {
		h.t.Fatal(err)
	}
	return req
}

// A confirmation (a message whose one envelope is a delivery-status) speaks for
// itself: relayed, its message is relayed with the attempt counted; refused, its
// message is closed by refused with the relay's answer.
func TestConfirmationSpeaksForItself(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = func(_ context.Context, url, _ string, _ int) Result {
		if url == relayB {
			return Result{Outcome: Refused, Status: 403}
		}
		return Result{Outcome: Accepted, Status: 200}
	}
	ok := h.confirmation(relayA, time.Hour)
	refused := h.confirmation(relayB, time.Hour)
	h.start()
	h.settle()
	if o := h.outbox(ok.Envelopes[0].EnvelopeID); o.State != record.StateRelayed {
		t.Fatalf("confirmation envelope %s", o.State)
	}
	if m := h.message(ok.MessageID); m.Status != record.StatusRelayed || m.Attempts != 1 {
		t.Fatalf("relayed confirmation's message: %s, %d attempts; want relayed, 1", m.Status, m.Attempts)
	}
	if m := h.message(refused.MessageID); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByRefused || m.Attempts != 1 {
		t.Fatalf("refused confirmation's message: %+v", m)
	}
	// A member of kind delivery-status beside one of kind message still does not
	// speak for its message.
	m := h.enqueue(relayB, 2, time.Hour)
	h.kick()
	if got := h.message(m.MessageID); got.Status != record.StatusClosed {
		t.Fatalf("message of two, both refused: %s", got.Status)
	}
	if o := h.members(m); o[0].State != record.StateClosed || o[1].State != record.StateClosed {
		t.Fatalf("members %s %s", o[0].State, o[1].State)
	}
}

// The carrier's settlement and maintenance apply the one rule to confirmations at
// once: many confirmations, the carrier relaying them while maintenance runs again
// and again. Every confirmation ends relayed and stays visible (a queued message
// whose single maintenance removed would be reported absent), and fsck finds
// nothing.
func TestConfirmationsSettledWhileMaintaining(t *testing.T) {
	h, g := newGatedHarness(t)
	const n = 16
	var reqs []store.SendRequest
	for range n {
		reqs = append(reqs, h.confirmation(relayA, time.Hour))
	}
	h.start()
	if got := <-g.started; len(got) != n {
		t.Fatalf("batch of %d, want %d", len(got), n)
	}
	gate, stop := make(chan struct{}), make(chan struct{})
	var maintainer, releaser sync.WaitGroup
	var maintErr error
	passes := 0
	maintainer.Add(1)
	go func() {
		defer maintainer.Done()
		<-gate
		for {
			if _, err := h.s.Maintain(context.Background()); err != nil {
				maintErr = err
				return
			}
			passes++
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	releaser.Add(1)
	go func() {
		defer releaser.Done()
		<-gate
		g.release <- struct{}{}
	}()
	close(gate)
	releaser.Wait()
	h.settle() // the pass is over: its settlement published
	close(stop)
	maintainer.Wait()
	if maintErr != nil {
		t.Fatal(maintErr)
	}
	if _, err := h.s.Maintain(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		m, err := h.s.Message(r.MessageID)
		if err != nil || m == nil || m.Status != record.StatusRelayed || m.Attempts != 1 {
			t.Fatalf("confirmation %s after maintenance: %+v %v; want relayed, 1 attempt", r.MessageID, m, err)
		}
		if o, err := store.GetAs[*record.Outbox](h.s, r.Envelopes[0].EnvelopeID); err != nil || o != nil {
			t.Fatalf("confirmation envelope after maintenance: %+v %v; want removed", o, err)
		}
	}
	t.Logf("%d maintenance passes during the settlement", passes)
	checkClean(t, h)
}
