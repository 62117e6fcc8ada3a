package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// endMessage ends message id as a writer does, in one transaction.
func endMessage(t *testing.T, s *store.Store, id, status, closedBy string, now time.Time) {
	t.Helper()
	err := s.Transaction(context.Background(), func(tx *store.Tx) error {
		m, err := store.TxGet[*record.Message](tx, id)
		if err != nil {
			return err
		}
		tx.EndMessage(m, status, closedBy, "why", now.UnixMilli())
		return tx.Put(m)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// messageKept runs maintenance and reports whether message id is still stored.
func messageKept(t *testing.T, s *store.Store, id string) bool {
	t.Helper()
	maintain(t, s)
	m, err := s.Message(id)
	if err != nil {
		t.Fatal(err)
	}
	return m != nil
}

// A delivered message is kept DeliveredRetention after its delivery, however far its
// deadline is; a closed one ClosedRetention after it closed, however near its
// deadline was.
func TestMessageRetentionByHowItEnded(t *testing.T) {
	clock := newTestClock(time.Now())
	// A short store retention: the old rule (deadline + Retention) would drop the
	// closed message within the hour and keep the delivered one for 30 days.
	s := openStore(t, store.Options{Now: clock.Now, Retention: time.Hour})
	delivered := sendRequest(t, 1)
	delivered.DeliveryDeadline = clock.Now().Add(30 * 24 * time.Hour)
	closed := sendRequest(t, 1)
	closed.DeliveryDeadline = clock.Now().Add(time.Minute)
	for _, req := range []store.SendRequest{delivered, closed} {
		if _, err := s.Enqueue(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	start := clock.Now()
	endMessage(t, s, delivered.MessageID, record.StatusDelivered, "", start)
	clock.Advance(2 * time.Minute) // past the closed one's deadline: maintenance closes it
	if !messageKept(t, s, closed.MessageID) {
		t.Fatal("the message closed by deadline was removed at once")
	}
	m, _ := s.Message(closed.MessageID)
	if m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByDeadline ||
		m.RetainUntil != clock.Now().UnixMilli()+store.DefaultClosedRetention.Milliseconds() {
		t.Fatalf("closed message %+v, want closed by deadline, kept 7 days from now", m)
	}
	closedAt := clock.Now()
	clock.Advance(start.Add(store.DefaultDeliveredRetention).Sub(clock.Now()) - time.Millisecond)
	if !messageKept(t, s, delivered.MessageID) {
		t.Fatal("the delivered message was removed before its delivered retention")
	}
	clock.Advance(time.Millisecond)
	if messageKept(t, s, delivered.MessageID) {
		t.Fatal("the delivered message outlived its delivered retention")
	}
	clock.Advance(closedAt.Add(store.DefaultClosedRetention).Sub(clock.Now()) - time.Millisecond)
	if !messageKept(t, s, closed.MessageID) {
		t.Fatal("the closed message was removed before its failure retention")
	}
	clock.Advance(time.Millisecond)
	if messageKept(t, s, closed.MessageID) {
		t.Fatal("the closed message outlived its failure retention")
	}
}

func TestMessageRetentionOptions(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now, DeliveredRetention: time.Minute, ClosedRetention: time.Hour})
	a, _ := enqueue(t, s, 1)
	b, _ := enqueue(t, s, 1)
	early, _ := enqueue(t, s, 1)
	created := clock.Now().UnixMilli()
	// Ended right away: kept as long as the send's Idempotency-Key can be retried
	// (24 h after its creation), or a retry would enqueue the message again.
	endMessage(t, s, early.MessageID, record.StatusClosed, record.ClosedByCancelled, clock.Now())
	if m, _ := s.Message(early.MessageID); m.RetainUntil != created+store.DefaultOperationRetention.Milliseconds() {
		t.Fatalf("a message ended at once: retainUntil %d, want its creation + 24 h (%d)", m.RetainUntil,
			created+store.DefaultOperationRetention.Milliseconds())
	}
	clock.Advance(48 * time.Hour)
	endMessage(t, s, a.MessageID, record.StatusDelivered, "", clock.Now())
	endMessage(t, s, b.MessageID, record.StatusClosed, record.ClosedByRefused, clock.Now())
	for _, c := range []struct {
		id   string
		keep time.Duration
	}{{a.MessageID, time.Minute}, {b.MessageID, time.Hour}} {
		m, _ := s.Message(c.id)
		if want := clock.Now().UnixMilli() + c.keep.Milliseconds(); m.RetainUntil != want || m.Held != nil {
			t.Fatalf("message %s: retainUntil %d, want %d", m.Status, m.RetainUntil, want)
		}
	}
	if s.ClosedRetention() != time.Hour {
		t.Fatalf("ClosedRetention %v", s.ClosedRetention())
	}
}
