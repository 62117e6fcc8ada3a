package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func TestEnqueueAndRead(t *testing.T) {
	s := openStore(t, store.Options{})
	req, m := enqueue(t, s, 2)
	if m.Status != record.StatusQueued {
		t.Fatalf("status %q", m.Status)
	}
	got, err := s.Message(req.MessageID)
	if err != nil || got == nil || got.MessageID != req.MessageID {
		t.Fatalf("Message: %v %v", got, err)
	}
	pend, err := s.Pending(context.Background(), req.MessageID)
	if err != nil || len(pend) != 2 || pend[0].Ordinal != 0 || pend[1].Ordinal != 1 {
		t.Fatalf("Pending: %v %v", pend, err)
	}
	// a second store instance (cold cache) sees the same
	s2 := openStore(t, store.Options{Dir: s.Dir(), CacheEntries: -1})
	got2, err := s2.Message(req.MessageID)
	if err != nil || got2 == nil {
		t.Fatalf("cold Message: %v %v", got2, err)
	}
}

func TestLockStatsCountAcquisitions(t *testing.T) {
	s := openStore(t, store.Options{})
	if n, _ := s.LockStats(); n != 0 {
		t.Fatalf("a fresh store took the lock %d times", n)
	}
	for range 3 {
		if err := s.Transaction(context.Background(), func(tx *store.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if n, waited := s.LockStats(); n != 3 || waited <= 0 {
		t.Fatalf("LockStats = %d, %v; want 3 acquisitions and some time", n, waited)
	}
}

func TestLockHoldObserverSeesEveryHold(t *testing.T) {
	var mu sync.Mutex
	var holds []time.Duration
	s := openStore(t, store.Options{LockHoldObserver: func(d time.Duration) {
		mu.Lock()
		holds = append(holds, d)
		mu.Unlock()
	}})
	var inside time.Duration
	err := s.Transaction(context.Background(), func(tx *store.Tx) error {
		t0 := time.Now()
		err := tx.Put(&record.Message{MessageID: uuid.NewString(), Status: record.StatusQueued, PeerOwnerDID: string(peerDID(t)),
			RelayURL: "http://127.0.0.1:9/relay", EnvelopeDigest: envelope.Digest([]byte("x")), DeliveryDeadline: time.Now().Add(time.Hour).UnixMilli(),
			CreatedAt: 1, UpdatedAt: 1, RetainUntil: time.Now().Add(time.Hour).UnixMilli()})
		inside = time.Since(t0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(holds) != 1 || holds[0] < inside {
		t.Fatalf("holds %v after one Transaction whose fn ran %v under the lock", holds, inside)
	}
	mu.Unlock()
	enqueue(t, s, 2) // a prepared transaction: a hold to plan, one to publish
	n, _ := s.LockStats()
	mu.Lock()
	defer mu.Unlock()
	if int64(len(holds)) != n || n < 3 {
		t.Fatalf("%d holds observed, %d acquisitions", len(holds), n)
	}
}
