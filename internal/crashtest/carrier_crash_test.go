package crashtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// acceptAll is a batch transport to a relay that accepts every envelope.
type acceptAll struct{}

func (acceptAll) Send(context.Context, string, []byte) carrier.Result {
	return carrier.Result{Outcome: carrier.Accepted, Status: 200}
}

func (acceptAll) Batches(string) bool { return true }

func (acceptAll) SendBatch(_ context.Context, _ string, envs [][]byte) []carrier.Result {
	out := make([]carrier.Result, len(envs))
	for i := range out {
		out[i] = carrier.Result{Outcome: carrier.Accepted, Status: 200}
	}
	return out
}

// batchedDeliveryWorkload: a carrier delivers a target's backlog of two messages (4
// envelopes) as one run: one lease transaction, one batch send, one settlement
// transaction. Acknowledged: every outbox record relayed and both messages relayed.
func batchedDeliveryWorkload() workload {
	var reqs []store.SendRequest
	return workload{name: "carrier-batched-lease-settle", setup: func(t *testing.T, s *store.Store, c *clock) {
		reqs = []store.SendRequest{sendRequest(c.Now(), 3), sendRequest(c.Now(), 1)}
		for _, r := range reqs {
			if _, err := s.Enqueue(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
	}, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
		settled := make(chan struct{}, 64) // one per settled attempt (a wake-up, not a count)
		cr := carrier.New(s, acceptAll{}, carrier.Options{Clock: wall{c}, Watch: carrier.WatchOff, Events: func(e carrier.Event) {
			if e.Kind == carrier.EventAttempt {
				select {
				case settled <- struct{}{}:
				default:
				}
			}
		}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { cr.Run(ctx); close(done) }()
		deadline := time.After(60 * time.Second)
		for cr.Stats().Attempts["accepted"] < 4 || !allRelayed(t, s, reqs) {
			select {
			case <-settled: // look again after each settled attempt
			case <-deadline:
				t.Fatal("the carrier did not deliver")
			}
		}
		cancel()
		<-done
		for _, r := range reqs {
			m, _ := store.GetAs[*record.Message](s, r.MessageID)
			ack(m)
			for _, e := range r.Envelopes {
				o, _ := store.GetAs[*record.Outbox](s, e.EnvelopeID)
				ack(o)
			}
		}
	}}
}

func allRelayed(t *testing.T, s *store.Store, reqs []store.SendRequest) bool {
	for _, r := range reqs {
		for _, e := range r.Envelopes {
			o, err := store.GetAs[*record.Outbox](s, e.EnvelopeID)
			if err != nil {
				t.Fatal(err)
			}
			if o == nil || o.State != record.StateRelayed {
				return false
			}
		}
	}
	return true
}

// wall is the workload clock as a carrier clock.
type wall struct{ c *clock }

func (w wall) Now() time.Time { return w.c.Now() }

func (w wall) NewTimer(d time.Duration) carrier.Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }
