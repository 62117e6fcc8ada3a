package carrier

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// countingRelay is one relay shared by two carriers (0 and 1). It counts the sends
// of each envelope in flight at once, and holds every send until the other carrier
// has been through the lease step of the same envelope: the other carrier, whose
// plan was read before any lease was taken, tries the envelope exactly while this
// send is in flight.
type countingRelay struct {
	mu       sync.Mutex
	inflight map[string]int // envelope id → sends in flight now
	leases   map[string]int // envelope id → lease steps that took the lease
	peak     map[string]int // envelope id → most sends in flight at once
	sends    map[string]int
	checks   [2]map[string]int
	checked  [2]map[string]chan struct{}
	planned  [2]chan struct{}
	plannedF [2]bool
}

func newCountingRelay() *countingRelay {
	return &countingRelay{inflight: map[string]int{}, leases: map[string]int{}, peak: map[string]int{}, sends: map[string]int{}}
}

// round prepares the relay for a round whose envelopes are ids.
func (r *countingRelay) round(ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range 2 {
		r.checks[w] = map[string]int{}
		r.checked[w] = map[string]chan struct{}{}
		for _, id := range ids {
			r.checked[w][id] = make(chan struct{})
		}
		r.planned[w], r.plannedF[w] = make(chan struct{}), false
	}
}

// pass is carrier w's onPass hook: a pass starts only after both carriers have
// read their plans (a carrier starts its passes once its plan is complete).
func (r *countingRelay) pass(w int) {
	r.mu.Lock()
	if !r.plannedF[w] {
		r.plannedF[w] = true
		close(r.planned[w])
	}
	other := r.planned[1-w]
	r.mu.Unlock()
	select {
	case <-other:
	case <-time.After(20 * time.Second): // a failsafe: the checks below then fail
	}
}

// lease is carrier w's onLease hook.
func (r *countingRelay) lease(w int, id string, leased bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks[w][id]++
	if leased {
		r.leases[id]++
	}
	if r.checks[w][id] == 1 {
		close(r.checked[w][id])
	}
}

func (r *countingRelay) violated() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.peak {
		if n > 1 {
			return true
		}
	}
	return false
}

// via is the transport of carrier w.
type via struct {
	r *countingRelay
	w int
}

func (v via) Send(ctx context.Context, _ string, env []byte) Result {
	var e struct {
		EnvelopeID string `json:"envelopeId"`
	}
	_ = json.Unmarshal(env, &e)
	r := v.r
	r.mu.Lock()
	r.sends[e.EnvelopeID]++
	r.inflight[e.EnvelopeID]++
	r.peak[e.EnvelopeID] = max(r.peak[e.EnvelopeID], r.inflight[e.EnvelopeID])
	other := r.checked[1-v.w][e.EnvelopeID]
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inflight[e.EnvelopeID]--
		r.mu.Unlock()
	}()
	select {
	case <-other:
	case <-ctx.Done():
		return Result{Outcome: Failed, Err: ctx.Err()}
	}
	return Result{Outcome: Accepted, Status: 200}
}

// Two carriers with different holder ids, on two handles of one store directory,
// deliver through one relay: no envelope is ever in flight twice at once. Every
// envelope is forced into the race the lease rule guards: both carriers plan
// before either leases, and each send is held until the other carrier has been
// through the lease step of the same envelope. So for every envelope the carrier
// that did not take the lease ran its lease step after the other took it (had it
// come first, it would have taken the lease: the envelope was pending, due and
// free) and before that send returned; it must skip the envelope, because the
// sender's lease is live, though its plan says the envelope is due.
func TestTwoCarriersNeverSendAnEnvelopeTwiceAtOnce(t *testing.T) {
	const rounds, targets, perTarget = 4, 3, 5
	clock := newFakeClock()
	dir := t.TempDir()
	stores := [2]*store.Store{openStore(t, dir, store.Options{Now: clock.Now}), openStore(t, dir, store.Options{Now: clock.Now})}
	relay := newCountingRelay()
	var all []string
	for round := range rounds {
		var ids []string
		for i := range targets {
			req := request(fmt.Sprintf("https://relay%d.test", i), perTarget, clock.Now().Add(time.Hour))
			if _, err := stores[0].Enqueue(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			for _, e := range req.Envelopes {
				ids = append(ids, e.EnvelopeID)
			}
		}
		all = append(all, ids...)
		relay.round(ids)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := range 2 {
			c := New(stores[w], via{relay, w}, Options{Clock: clock, Watch: WatchOff, HolderID: fmt.Sprintf("carrier-%d", w),
				Jitter: func() float64 { return 0.5 }})
			c.onPass = func(string) { relay.pass(w) }
			c.onLease = func(id string, leased bool) { relay.lease(w, id, leased) }
			wg.Go(func() { _ = c.Run(ctx) })
		}
		waitFor(t, fmt.Sprintf("round %d relayed", round), func() bool {
			if relay.violated() {
				return true
			}
			for _, id := range ids {
				o, err := store.GetAs[*record.Outbox](stores[1], id)
				if err != nil {
					t.Fatal(err)
				}
				if o == nil || o.State != record.StateRelayed {
					return false
				}
			}
			return true
		})
		cancel()
		wg.Wait()
		if relay.violated() {
			break
		}
		for _, id := range ids {
			if a, b := relay.checks[0][id], relay.checks[1][id]; a != 1 || b != 1 {
				t.Fatalf("round %d: envelope %s went through the lease step %d and %d times, want once per carrier", round, id, a, b)
			}
		}
	}
	for _, id := range all {
		if n := relay.peak[id]; n > 1 {
			t.Errorf("envelope %s was in flight %d times at once", id, n)
		}
	}
	if t.Failed() {
		return
	}
	for _, id := range all {
		if n := relay.sends[id]; n != 1 {
			t.Errorf("envelope %s sent %d times, want once", id, n)
		}
	}
	for _, id := range all {
		if n := relay.leases[id]; n != 1 {
			t.Errorf("envelope %s leased %d times, want once", id, n)
		}
	}
}
