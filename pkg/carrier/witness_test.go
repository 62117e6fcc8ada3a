package carrier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// headRelay is a scripted relay that witnesses heads: it records the head each
// post carries and answers SenderHead with head.
type headRelay struct {
	*scripted
	mu      sync.Mutex
	head    []byte   // what SenderHead answers (nil: none)
	headErr error    // what SenderHead fails with
	carried [][]byte // the head each post carried
	asks    int      // SenderHead calls
}

func (r *headRelay) Send(ctx context.Context, url string, env []byte) Result {
	r.mu.Lock()
	r.carried = append(r.carried, HeadOf(ctx))
	r.mu.Unlock()
	return r.scripted.Send(ctx, url, env)
}

func (r *headRelay) SenderHead(ctx context.Context, url string, id *identity.Identity) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asks++
	return r.head, r.headErr
}

func (r *headRelay) asked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.asks
}

// signedHead is a head of the test owner's with seq.
func signedHead(t testing.TB, seq int64) []byte {
	t.Helper()
	id := owner(t)
	b, err := envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: store.FormatVersion, Seq: seq, Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// acceptedWithSeq answers every send Accepted with a receipt naming senderSeq.
func acceptedWithSeq(senderSeq func() int64) func(context.Context, string, string, int) Result {
	return func(_ context.Context, _, id string, _ int) Result {
		return Result{Outcome: Accepted, Status: 200, ParsedReceipt: &envelope.RelayReceipt{EnvelopeID: id, SenderSeq: senderSeq()}}
	}
}

// witnessHarness is a harness whose carrier knows the owner and sends through a
// headRelay, on a store with a head (seq 1, written by WriteHead).
func witnessHarness(t *testing.T, opts Options) (*harness, *headRelay, *[]Event, *sync.Mutex) {
	t.Helper()
	var relay *headRelay
	var mu sync.Mutex
	var events []Event
	opts.Identity = owner(t)
	opts.Events = func(e Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	h := newHarnessOn(t, opts, store.Options{}, func(s *scripted) Transport {
		relay = &headRelay{scripted: s}
		return relay
	})
	if _, _, err := h.s.WriteHead(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	return h, relay, &events, &mu
}

func (h *harness) headSeq() int64 {
	hd, _ := h.s.Head()
	if hd == nil {
		h.t.Fatal("the store has no head")
	}
	return hd.Seq
}

// waitStopped waits for Run to return and returns its error.
func (h *harness) waitStopped() error {
	h.t.Helper()
	select {
	case err := <-h.done:
		h.cancel()
		h.cancel = nil
		return err
	case <-time.After(60 * time.Second):
		h.t.Fatal("the carrier did not stop")
		return nil
	}
}

// snapshot is what must not change of an outbox record when a rolled-back store
// stops the carrier.
type snapshot struct {
	state       string
	attempts    int
	next        int64
	lastError   string
	unreachable int64
}

func snap(o *record.Outbox) snapshot {
	return snapshot{o.State, o.Attempts, o.NextAttemptAt, o.LastError, o.UnreachableSince}
}

func rolledBackEvents(mu *sync.Mutex, events *[]Event) []Event {
	mu.Lock()
	defer mu.Unlock()
	var out []Event
	for _, e := range *events {
		if e.Kind == EventRolledBack {
			out = append(out, e)
		}
	}
	return out
}

// A receipt naming a head above the store's makes the carrier fetch the relay's
// signed head; the store becomes rolled back and the carrier stops: nothing is
// settled, every envelope stays pending with its record as it was, the event says
// so and Run returns STORE_ROLLED_BACK. A second Run stops at once, sending
// nothing.
func TestReceiptAboveHeadStopsCarrier(t *testing.T) {
	h, relay, events, mu := witnessHarness(t, Options{})
	seq := h.headSeq()
	relay.head = signedHead(t, seq+5)
	h.tr.answer = acceptedWithSeq(func() int64 { return seq + 5 })
	var reqs []store.SendRequest
	for range 3 {
		reqs = append(reqs, h.enqueue("https://relay.example", 1, time.Hour))
	}
	before := map[string]snapshot{}
	for _, r := range reqs {
		before[r.Envelopes[0].EnvelopeID] = snap(h.outbox(r.Envelopes[0].EnvelopeID))
	}
	_, headBytes := h.s.Head()
	h.start()
	err := h.waitStopped()
	if !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("Run returned %v, want STORE_ROLLED_BACK", err)
	}
	if relay.asked() != 1 {
		t.Fatalf("SenderHead asked %d times, want 1", relay.asked())
	}
	if n := h.tr.count(); n != 1 {
		t.Fatalf("%d sends, want 1 (the one whose receipt showed the rollback)", n)
	}
	if !bytes.Equal(relay.carried[0], headBytes) {
		t.Fatalf("the post carried head %q, want the store's %q", relay.carried[0], headBytes)
	}
	if h.s.RolledBack() == nil {
		t.Fatal("the store is not rolled back")
	}
	for _, r := range reqs {
		id := r.Envelopes[0].EnvelopeID
		if got := snap(h.outbox(id)); got != before[id] {
			t.Fatalf("envelope %s changed: %+v, was %+v", id, got, before[id])
		}
		if m := h.message(r.MessageID); m.Status != record.StatusQueued {
			t.Fatalf("message %s is %s, want queued", r.MessageID, m.Status)
		}
	}
	evs := rolledBackEvents(mu, events)
	if len(evs) != 1 || evs[0].Target != "https://relay.example" || !errors.Is(evs[0].Err, errcode.StoreRolledBack) {
		t.Fatalf("rolled-back events: %+v, want one for the relay", evs)
	}
	if h.c.Stats().HeadChecks != 1 {
		t.Fatalf("HeadChecks = %d, want 1", h.c.Stats().HeadChecks)
	}

	// Run again: the store says it is rolled back; nothing is sent.
	h.start()
	if err := h.waitStopped(); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("second Run returned %v", err)
	}
	if n := h.tr.count(); n != 1 {
		t.Fatalf("%d sends after the second Run, want still 1", n)
	}
}

// A receipt naming the store's head seq, or a lower one, is the normal case: no
// head is fetched and every envelope is relayed.
func TestReceiptAtOrBelowHeadDoesNothing(t *testing.T) {
	for _, delta := range []int64{0, -1} {
		t.Run(fmt.Sprint(delta), func(t *testing.T) {
			h, relay, events, mu := witnessHarness(t, Options{})
			if delta < 0 {
				if _, _, err := h.s.WriteHead(context.Background(), true); err != nil { // seq 2: a lower one exists
					t.Fatal(err)
				}
			}
			seq := h.headSeq() + delta
			relay.head = signedHead(t, seq+5) // never asked for
			h.tr.answer = acceptedWithSeq(func() int64 { return seq })
			var reqs []store.SendRequest
			for range 3 {
				reqs = append(reqs, h.enqueue("https://relay.example", 1, time.Hour))
			}
			h.start()
			h.settle()
			for _, r := range reqs {
				if o := h.outbox(r.Envelopes[0].EnvelopeID); o.State != record.StateRelayed {
					t.Fatalf("envelope is %s, want relayed", o.State)
				}
			}
			if relay.asked() != 0 || h.s.RolledBack() != nil || len(rolledBackEvents(mu, events)) != 0 {
				t.Fatalf("asked %d, rolled back %v", relay.asked(), h.s.RolledBack())
			}
		})
	}
}

// A relay head that does not prove a rollback — the relay holds none, or it
// cannot be fetched — leaves the carrier delivering (the next receipt above the
// head asks again).
func TestReceiptAboveHeadWithoutProof(t *testing.T) {
	for name, set := range map[string]func(*headRelay){
		"none":   func(r *headRelay) { r.head = nil },
		"failed": func(r *headRelay) { r.headErr = errors.New("connection reset") },
	} {
		t.Run(name, func(t *testing.T) {
			h, relay, _, _ := witnessHarness(t, Options{})
			seq := h.headSeq()
			set(relay)
			h.tr.answer = acceptedWithSeq(func() int64 { return seq + 1 })
			a := h.enqueue("https://relay.example", 1, time.Hour)
			b := h.enqueue("https://relay.example", 1, time.Hour)
			h.start()
			h.settle()
			for _, r := range []store.SendRequest{a, b} {
				if o := h.outbox(r.Envelopes[0].EnvelopeID); o.State != record.StateRelayed {
					t.Fatalf("envelope is %s, want relayed", o.State)
				}
			}
			if relay.asked() != 2 || h.s.RolledBack() != nil {
				t.Fatalf("asked %d times (want 2), rolled back %v", relay.asked(), h.s.RolledBack())
			}
		})
	}
}

// Several targets in flight at once all learn of the rollback: each pass's
// witness check races the others' (Store.Witness is safe concurrently); the
// carrier stops once, reports it once, and no envelope is settled.
func TestConcurrentPassesDetectRollback(t *testing.T) {
	const targets = 8
	h, relay, events, mu := witnessHarness(t, Options{})
	seq := h.headSeq()
	relay.head = signedHead(t, seq+3)
	var started sync.WaitGroup
	started.Add(targets)
	gate := make(chan struct{})
	go func() { started.Wait(); close(gate) }()
	var once sync.Map
	h.tr.answer = func(ctx context.Context, url, id string, _ int) Result {
		if _, dup := once.LoadOrStore(url, true); !dup {
			started.Done()
		}
		select {
		case <-gate: // every target has a send in flight
		case <-ctx.Done():
			return Result{Outcome: Failed, Err: ctx.Err()}
		}
		return Result{Outcome: Accepted, Status: 200, ParsedReceipt: &envelope.RelayReceipt{EnvelopeID: id, SenderSeq: seq + 3}}
	}
	var reqs []store.SendRequest
	for i := range targets {
		reqs = append(reqs, h.enqueue(fmt.Sprintf("https://relay%d.example", i), 1, time.Hour))
	}
	h.start()
	if err := h.waitStopped(); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("Run returned %v", err)
	}
	for _, r := range reqs {
		if o := h.outbox(r.Envelopes[0].EnvelopeID); o.State != record.StatePending || o.Attempts != 0 {
			t.Fatalf("envelope %s: %s after %d attempts, want pending, untouched", o.EnvelopeID, o.State, o.Attempts)
		}
	}
	if n := len(rolledBackEvents(mu, events)); n != 1 {
		t.Fatalf("%d rolled-back events, want 1", n)
	}
	if relay.asked() < 1 || relay.asked() > targets {
		t.Fatalf("SenderHead asked %d times", relay.asked())
	}
	if h.c.Stats().InFlight != 0 {
		t.Fatal("passes still in flight after Run returned")
	}
}

// A store that refuses a write as rolled back (shown by someone else: the
// daemon's start, another pass) stops the carrier: the lease step's refusal
// ends the pass, and the carrier stops without a send and without the
// store-failure backoff (no EventStoreError, no retry).
func TestStoreRefusalRolledBackStopsCarrier(t *testing.T) {
	h, relay, events, mu := witnessHarness(t, Options{})
	r := h.enqueue("https://relay.example", 1, time.Hour)
	before := snap(h.outbox(r.Envelopes[0].EnvelopeID))
	var once sync.Once
	h.c.onPass = func(string) {
		once.Do(func() {
			if err := h.s.Witness(signedHead(t, h.headSeq()+1), "test"); !errors.Is(err, errcode.StoreRolledBack) {
				t.Errorf("Witness: %v", err)
			}
		})
	}
	h.start()
	if err := h.waitStopped(); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("Run returned %v", err)
	}
	if h.tr.count() != 0 || relay.asked() != 0 {
		t.Fatalf("%d sends, %d head asks; want none", h.tr.count(), relay.asked())
	}
	if got := snap(h.outbox(r.Envelopes[0].EnvelopeID)); got != before {
		t.Fatalf("envelope changed: %+v, was %+v", got, before)
	}
	mu.Lock()
	for _, e := range *events {
		if e.Kind == EventStoreError {
			t.Errorf("a store error event for the refusal: %+v", e)
		}
	}
	mu.Unlock()
	if evs := rolledBackEvents(mu, events); len(evs) != 1 || evs[0].Target != "https://relay.example" {
		t.Fatalf("events %+v", evs)
	}
}

// A store already rolled back when Run starts: Run returns at once.
func TestRunOnRolledBackStore(t *testing.T) {
	h, _, events, mu := witnessHarness(t, Options{})
	h.enqueue("https://relay.example", 1, time.Hour)
	if err := h.s.Witness(signedHead(t, h.headSeq()+1), "test"); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("Witness: %v", err)
	}
	h.start()
	if err := h.waitStopped(); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("Run returned %v", err)
	}
	if h.tr.count() != 0 {
		t.Fatalf("%d sends", h.tr.count())
	}
	if evs := rolledBackEvents(mu, events); len(evs) != 1 || evs[0].Target != "" {
		t.Fatalf("events %+v", evs)
	}
}
