package carrier

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Events reports every settled attempt with its reason and next attempt, and the
// store's successes per target and for the schedule.
func TestEventsReportAttempts(t *testing.T) {
	var mu sync.Mutex
	var evs []Event
	h := newHarness(t, Options{Events: func(e Event) {
		mu.Lock()
		evs = append(evs, e)
		mu.Unlock()
	}}, store.Options{})
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		if n == 1 { // the first send fails
			return failed(ctx, url, id, n)
		}
		return Result{Outcome: Accepted, Status: 200}
	}
	r := h.enqueue(relayA, 1, time.Hour)
	t0 := h.clock.Now()
	h.start()
	h.runUntil(t0.Add(time.Minute))
	mu.Lock()
	defer mu.Unlock()
	var attempts []Event
	storeOK := map[string]bool{}
	for _, e := range evs {
		switch e.Kind {
		case EventAttempt:
			attempts = append(attempts, e)
		case EventStoreOK:
			storeOK[e.Target] = true
		case EventStoreError:
			t.Fatalf("store error event: %+v", e)
		}
	}
	if len(attempts) != 2 {
		t.Fatalf("%d attempt events, want 2: %+v", len(attempts), attempts)
	}
	f, a := attempts[0], attempts[1]
	o := h.outbox(r.Envelopes[0].EnvelopeID)
	if f.Outcome != Failed || f.Target != relayA || f.EnvelopeID != o.EnvelopeID || f.Reason == "" ||
		!f.NextAttempt.Equal(t0.Add(defaultBackoffMin)) {
		t.Fatalf("failed attempt event: %+v (t0 %s)", f, t0)
	}
	if a.Outcome != Accepted || !a.NextAttempt.IsZero() || o.State != record.StateRelayed {
		t.Fatalf("accepted attempt event: %+v, envelope %+v", a, o)
	}
	if !storeOK[""] || !storeOK[relayA] {
		t.Fatalf("store successes reported for %v", storeOK)
	}
}
