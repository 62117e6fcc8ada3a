package store_test

import (
	"context"
	"testing"

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
