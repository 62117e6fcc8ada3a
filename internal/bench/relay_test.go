package bench

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// The relay's accept rate: the file-backed reference relay (pkg/relay) storing new
// envelopes, one at a time and in batches of relayproto.MaxBatchEnvelopes, in process
// (Relay.Accept, Relay.AcceptBatch) and over HTTP through relayproto.Client. Every
// accept of a new envelope makes two files durable: its inbox file and its receipt
// record in the relay's store. Each run starts a fresh relay (a fresh data root), so
// the same pre-signed envelopes are new to it.

// relayBatch is the batch size of the batch rows: the protocol's largest batch.
const relayBatch = relayproto.MaxBatchEnvelopes

// acceptPool holds signed wire envelopes (from the store owner to the peer, the
// delivery backlog's shape: a 512-byte body), built on first use and grown as a run
// needs more; shared by every run, since each run's relay is fresh.
var (
	acceptMu   sync.Mutex
	acceptEnvs [][]byte
)

// acceptEnvelopes returns n distinct signed wire envelopes.
func acceptEnvelopes(b *testing.B, n int) [][]byte {
	acceptMu.Lock()
	defer acceptMu.Unlock()
	if have := len(acceptEnvs); have < n {
		o, _, peer := owner()
		now := time.Now()
		deadline := now.Add(24 * time.Hour)
		body := bytes.Repeat([]byte("x"), 512)
		more := make([][]byte, n-have)
		err := onAllCores(len(more), func(i int) (err error) {
			_, more[i], err = envelope.NewMessage(o, identity.DID(peer), uuid.NewString(), body, deadline, now)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		acceptEnvs = append(acceptEnvs, more...)
	}
	return acceptEnvs[:n]
}

// BenchmarkRelayAccept1 is the relay accepting new envelopes one at a time, in
// process (Relay.Accept: parse and verify, inbox file created durably, receipt record
// written in a prepared transaction, receipt signed): env/s.
func BenchmarkRelayAccept1(b *testing.B) {
	envs := acceptEnvelopes(b, b.N)
	r, stop := startRelay(b)
	defer stop()
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if _, err := r.Accept(ctx, envs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "env/s")
	if got := r.Stats().Accepted; got != int64(b.N) {
		b.Fatalf("the relay accepted %d envelopes, want %d", got, b.N)
	}
}

// BenchmarkRelayAcceptBatch64 is the relay accepting new envelopes in batches of 64,
// in process (Relay.AcceptBatch: inbox files staged in parallel and published, each
// recipient directory fsynced once, the receipt records in one prepared
// transaction): env/s.
func BenchmarkRelayAcceptBatch64(b *testing.B) {
	envs := acceptEnvelopes(b, b.N*relayBatch)
	r, stop := startRelay(b)
	defer stop()
	b.ResetTimer()
	for i := range b.N {
		acceptBatch(b, r, envs[i*relayBatch:(i+1)*relayBatch])
	}
	b.StopTimer()
	reportRate(b, float64(b.N*relayBatch), "env/s")
}

// relayClient is a relayproto.Client of the relay at relayURL on its own keep-alive
// connection.
func relayClient() (*relayproto.Client, func()) {
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	return &relayproto.Client{BaseURL: relayURL(), HTTP: &http.Client{Transport: tr}}, tr.CloseIdleConnections
}

// BenchmarkRelayAcceptHTTP1 is BenchmarkRelayAccept1 over HTTP on 127.0.0.1
// (relayproto.Client.Post, which also verifies each receipt): env/s.
func BenchmarkRelayAcceptHTTP1(b *testing.B) {
	envs := acceptEnvelopes(b, b.N)
	_, stop := startRelay(b)
	defer stop()
	c, closeIdle := relayClient()
	defer closeIdle()
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if _, _, err := c.Post(ctx, envs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "env/s")
}

// BenchmarkRelayAcceptHTTPBatch64 is BenchmarkRelayAcceptBatch64 over HTTP
// (relayproto.Client.PostBatch, which verifies every receipt): env/s.
func BenchmarkRelayAcceptHTTPBatch64(b *testing.B) {
	envs := acceptEnvelopes(b, b.N*relayBatch)
	_, stop := startRelay(b)
	defer stop()
	c, closeIdle := relayClient()
	defer closeIdle()
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		res, err := c.PostBatch(ctx, envs[i*relayBatch:(i+1)*relayBatch])
		if err != nil {
			b.Fatal(err)
		}
		for _, x := range res {
			if x.Err != nil || x.Outcome != relayproto.BatchAccepted {
				b.Fatalf("batch answer %q, %v; want accepted", x.Outcome, x.Err)
			}
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*relayBatch), "env/s")
}

// acceptBatch has r accept envs in one batch, every one of them new.
func acceptBatch(b *testing.B, r *relay.Relay, envs [][]byte) {
	res, err := r.AcceptBatch(context.Background(), envs)
	if err != nil {
		b.Fatal(err)
	}
	for _, x := range res {
		if x.Outcome != relayproto.BatchAccepted {
			b.Fatalf("batch result %q (%s), want accepted", x.Outcome, x.Code)
		}
	}
}
