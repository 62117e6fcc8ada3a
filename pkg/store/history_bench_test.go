package store_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// historyLimits lift the capacity limits so a store can hold the benchmarks' history.
var historyLimits = store.Limits{PendingEnvelopes: 1 << 30, EnvelopeBytes: 1 << 40, Messages: 1 << 30}

// writeHistory makes dir a store directory holding n settled messages: for each, a
// relayed message record and its relayed outbox envelope, signed by the test owner and
// written with plain os.WriteFile (no fsync, no store: only the benchmark and tests
// read them).
func writeHistory(t testing.TB, dir string, n int) {
	t.Helper()
	owner := ownerIdentity(t)
	signer, did, peer := owner.Signer(), owner.DID(), string(peerDID(t))
	for _, k := range []record.Kind{record.KindMessages, record.KindOutbox} {
		if err := os.MkdirAll(filepath.Join(dir, string(k)), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UnixMilli()
	recs := make([]record.Record, 0, 2*n)
	for i := 0; i < n; i++ {
		m := benchMessage(peer, uuid.NewString())
		m.Status, m.UpdatedAt = record.StatusRelayed, now
		env, _ := json.Marshal(map[string]any{"envelopeId": uuid.NewString(), "body": "history " + strconv.Itoa(i)})
		o := &record.Outbox{EnvelopeID: uuid.NewString(), MessageID: m.MessageID, BatchID: uuid.NewString(),
			EnvelopeKind: record.EnvelopeMessage, State: record.StateRelayed, RelayURL: m.RelayURL,
			PeerOwnerDID: peer, DeliveryDeadline: m.DeliveryDeadline, NextAttemptAt: now, Envelope: env,
			EnvelopeDigest: envelope.Digest(env), RetainUntil: m.RetainUntil}
		recs = append(recs, m, o)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for part := range 2 {
		wg.Go(func() {
			for i := part; i < len(recs); i += 2 {
				data, err := record.Encode(signer, did, recs[i])
				if err == nil {
					err = os.WriteFile(filepath.Join(dir, record.Path(recs[i].Kind(), recs[i].RecordID())), data, 0o600)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// BenchmarkEnqueueWithHistory: eight concurrent senders each enqueueing one-envelope
// messages on a store that already holds n settled messages (a message record and an
// outbox envelope each), its indexes prepared once before timing as a daemon does at
// start-up. The cost of a send must not depend on n: compare the sub-benchmarks'
// ns/op within one run.
func BenchmarkEnqueueWithHistory(b *testing.B) {
	for _, n := range []int{0, 10_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "store")
			writeHistory(b, dir, n)
			s := openStore(b, store.Options{Dir: dir, Limits: historyLimits})
			ctx := context.Background()
			enqueue(b, s, 1) // create every directory
			if err := s.Prepare(ctx); err != nil {
				b.Fatal(err)
			}
			reqs := make(chan store.SendRequest, 1024)
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for {
					select {
					case reqs <- sendRequest(b, 1):
					case <-stop:
						return
					}
				}
			}()
			b.SetParallelism(4) // 8 senders on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.Enqueue(ctx, <-reqs); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkListVsReadDir10k: a cached List of 10,000 ids ("cached": a stamp check,
// no copy) against a fresh read of the same directory ("readDir": os.ReadDir), the
// work an uncached listing starts with.
func BenchmarkListVsReadDir10k(b *testing.B) {
	const n = 10_000
	dir := filepath.Join(b.TempDir(), "store")
	benchBuildMessages(b, dir, n)
	s := openStore(b, store.Options{Dir: dir, Now: benchLater})
	b.Run("cached", func(b *testing.B) {
		for range b.N {
			if ids, err := s.List(record.KindMessages); err != nil || len(ids) != n {
				b.Fatalf("List: %d ids, %v", len(ids), err)
			}
		}
	})
	b.Run("readDir", func(b *testing.B) {
		for range b.N {
			if ents, err := os.ReadDir(filepath.Join(dir, string(record.KindMessages))); err != nil || len(ents) != n {
				b.Fatalf("ReadDir: %d, %v", len(ents), err)
			}
		}
	})
}
