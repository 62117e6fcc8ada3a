package carrier

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// fillIdle enqueues n pending envelopes (messages of 64) that are not due for an hour.
func fillIdle(b *testing.B, n int) (*Carrier, time.Time) {
	clock := newFakeClock()
	later := clock.Now().Add(time.Hour)
	s := openStore(b, b.TempDir(), store.Options{Now: func() time.Time { return later }})
	for i := 0; n > 0; i++ {
		k := min(n, record.MaxBatchMembers)
		req := request(relayN(i%20), k, later.Add(24*time.Hour))
		if _, err := s.Enqueue(context.Background(), req); err != nil {
			b.Fatal(err)
		}
		n -= k
	}
	return New(s, &scripted{}, Options{Clock: clock, Watch: WatchOff}), clock.Now()
}

// BenchmarkScheduleIdle10k: one reconciliation (index read, grouping, due times) over
// 10,000 idle pending envelopes in 20 targets; the cost the carrier pays per event.
func BenchmarkScheduleIdle10k(b *testing.B) {
	c, now := fillIdle(b, 10_000)
	ctx := context.Background()
	if plans, err := c.plan(ctx, now, nil); err != nil || len(plans) != 20 || plans[0].due <= now.UnixMilli() {
		b.Fatalf("plan: %d targets, %v", len(plans), err)
	}
	for b.Loop() {
		if _, err := c.plan(ctx, now, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBuildPlan10k: the grouping alone, from summaries already in memory.
func BenchmarkBuildPlan10k(b *testing.B) {
	c, now := fillIdle(b, 10_000)
	sums, err := c.s.OutboxSummaries(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	batches, _ := c.s.List(record.KindBatches)
	messages, _ := c.s.List(record.KindMessages)
	for b.Loop() {
		buildPlan(sums, batches, messages, now.UnixMilli(), "h", nil)
	}
}

// relayStub accepts every envelope with a signed receipt, like the reference relay
// minus its store.
func relayStub(b *testing.B) *httptest.Server {
	relay := relayIdentity(b)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != relayproto.PathEnvelopes {
			w.WriteHeader(http.StatusNotFound) // a relay without the batch endpoint: the single path
			return
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, envelope.MaxSize+1))
		var e struct {
			Payload struct {
				EnvelopeID string `json:"envelopeId"`
			} `json:"payload"`
		}
		if json.Unmarshal(body, &e) != nil {
			w.WriteHeader(400)
			return
		}
		rc, err := envelope.SignRelayReceipt(relay, envelope.RelayReceipt{EnvelopeID: e.Payload.EnvelopeID,
			EnvelopeDigest: envelope.Digest(body), ReceivedAt: time.Now()})
		if err != nil {
			w.WriteHeader(500)
			return
		}
		w.Write(rc)
	}))
}

// wireRequest is a message of n real envelopes (so the stub's receipts match).
func wireRequest(b testing.TB, url string, n int) store.SendRequest {
	req := store.SendRequest{MessageID: uuid.NewString(), PeerOwnerDID: peer(), RelayURL: url, DeliveryDeadline: time.Now().Add(time.Hour)}
	for i := range n {
		e, data, err := envelope.NewMessage(owner(b), peer(), req.MessageID, bytes.Repeat([]byte("x"), 512), time.Now().Add(time.Hour), time.Now())
		if err != nil {
			b.Fatal(err)
		}
		kind := record.EnvelopeMessage
		if i > 0 {
			kind = record.EnvelopeDeliveryStatus
		}
		req.Envelopes = append(req.Envelopes, store.OutgoingEnvelope{EnvelopeID: e.ID(), Kind: kind, Envelope: data})
	}
	return req
}

// BenchmarkDelivery: envelopes/s delivered by the carrier to one local relay stub
// (lease, send, settle, each envelope durable twice) against the stub's raw accept
// rate for the same envelopes posted back to back over one connection.
func BenchmarkDelivery(b *testing.B) {
	const n = 512
	srv := relayStub(b)
	defer srv.Close()
	var reqs []store.SendRequest
	for range n / 64 {
		reqs = append(reqs, wireRequest(b, srv.URL, 64))
	}
	// Raw accept rate.
	tr := NewHTTPTransport(HTTPOptions{})
	start := time.Now()
	for _, r := range reqs {
		for _, e := range r.Envelopes {
			if res := tr.Send(context.Background(), srv.URL, e.Envelope); res.Outcome != Accepted {
				b.Fatalf("raw: %v %v", res.Outcome, res.Err)
			}
		}
	}
	raw := float64(n) / time.Since(start).Seconds()
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		s := openStore(b, b.TempDir(), store.Options{})
		for _, r := range reqs {
			if _, err := s.Enqueue(context.Background(), r); err != nil {
				b.Fatal(err)
			}
		}
		c := New(s, tr, Options{Watch: WatchOff})
		ctx, cancel := context.WithCancel(context.Background())
		b.StartTimer()
		t0 := time.Now()
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		waitFor(b, "every envelope accepted", func() bool { return c.Stats().Attempts["accepted"] == n })
		total += time.Since(t0)
		b.StopTimer()
		cancel()
		<-done
	}
	carrier := float64(n*b.N) / total.Seconds()
	b.ReportMetric(raw, "raw-env/s")
	b.ReportMetric(carrier, "carrier-env/s")
	b.ReportMetric(carrier/raw, "ratio")
}

// singleOnly hides a transport's batches: the carrier sends one envelope at a time,
// as before batched delivery.
type singleOnly struct{ t Transport }

func (s singleOnly) Send(ctx context.Context, url string, env []byte) Result {
	return s.t.Send(ctx, url, env)
}

// deliverOneRelay measures, in one run, n envelopes delivered by the carrier through
// tr to a fresh reference relay (send → relayed in the store) against the same
// relay's raw accept rate: n other envelopes posted back to back to
// /v1/envelopes over one connection, on a fresh relay of its own.
func deliverOneRelay(b *testing.B, n int, wrap func(*HTTPTransport) Transport) {
	tr := NewHTTPTransport(HTTPOptions{})
	rawRelay := newLocalRelay(b, 0)
	var raw float64
	{
		var wires [][]byte
		for range n / 64 {
			for _, e := range wireRequest(b, rawRelay.srv.URL, 64).Envelopes {
				wires = append(wires, e.Envelope)
			}
		}
		start := time.Now()
		for _, w := range wires {
			if res := tr.Send(context.Background(), rawRelay.srv.URL, w); res.Outcome != Accepted {
				b.Fatalf("raw: %v %v", res.Outcome, res.Err)
			}
		}
		raw = float64(len(wires)) / time.Since(start).Seconds()
	}
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		lr := newLocalRelay(b, 0)
		s := openStore(b, b.TempDir(), store.Options{})
		var ids []string
		for range n / 64 {
			req := wireRequest(b, lr.srv.URL, 64)
			if _, err := s.Enqueue(context.Background(), req); err != nil {
				b.Fatal(err)
			}
			for _, e := range req.Envelopes {
				ids = append(ids, e.EnvelopeID)
			}
		}
		c := New(s, wrap(tr), Options{Watch: WatchOff})
		ctx, cancel := context.WithCancel(context.Background())
		b.StartTimer()
		t0 := time.Now()
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		waitFor(b, "every envelope relayed", func() bool {
			if c.Stats().Attempts["accepted"] < uint64(len(ids)) {
				return false
			}
			o, err := store.GetAs[*record.Outbox](s, ids[len(ids)-1])
			return err == nil && o != nil && o.State == record.StateRelayed
		})
		total += time.Since(t0)
		b.StopTimer()
		cancel()
		<-done
		if st := lr.relay.Stats(); st.Accepted != int64(len(ids)) {
			b.Fatalf("relay stats %+v", st)
		}
	}
	carrier := float64(n*b.N) / total.Seconds()
	b.ReportMetric(raw, "raw-env/s")
	b.ReportMetric(carrier, "carrier-env/s")
	b.ReportMetric(carrier/raw, "ratio")
}

// BenchmarkDeliverOneRelayBatched: 512 envelopes delivered by the carrier to one
// local reference relay in batches (lease, send and settle a run of up to 64 at a
// time), against the relay's raw single-envelope accept rate in the same run.
func BenchmarkDeliverOneRelayBatched(b *testing.B) {
	deliverOneRelay(b, 512, func(t *HTTPTransport) Transport { return t })
}

// BenchmarkDeliverOneRelaySingle: the same, one envelope at a time (two prepared
// transactions and one request per envelope): the delivery path before batches.
func BenchmarkDeliverOneRelaySingle(b *testing.B) {
	deliverOneRelay(b, 512, func(t *HTTPTransport) Transport { return singleOnly{t} })
}
