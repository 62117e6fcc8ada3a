package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// relayAll settles every envelope of req as relayed and its message with it, as the
// carrier does.
func relayAll(t *testing.T, s *store.Store, req store.SendRequest) {
	t.Helper()
	err := s.PreparedTransaction(context.Background(), func(tx *store.Tx) error {
		for _, e := range req.Envelopes {
			o, err := store.TxGet[*record.Outbox](tx, e.EnvelopeID)
			if err != nil {
				return err
			}
			o.State, o.Attempts = record.StateRelayed, 1
			if err := tx.Put(o); err != nil {
				return err
			}
		}
		m, err := store.TxGet[*record.Message](tx, req.MessageID)
		if err != nil {
			return err
		}
		m.Status, m.Attempts = record.StatusRelayed, 1
		return tx.Put(m)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Enqueue of a message that already ended its journey (relayed, its settled envelopes
// removed by maintenance, its message record kept) changes nothing: it returns the
// message and writes no envelope.
func TestReenqueueOfAFinishedMessageChangesNothing(t *testing.T) {
	for _, n := range []int{1, 3} {
		s := openStore(t, store.Options{})
		req, _ := enqueue(t, s, n)
		relayAll(t, s, req)
		if rep := maintain(t, s); rep.BatchesFinished != 1 {
			t.Fatalf("%d envelopes: maintenance %+v, want the settled batch removed", n, rep)
		}
		m, err := s.Enqueue(context.Background(), req)
		if err != nil || m == nil || m.Status != record.StatusRelayed {
			t.Fatalf("%d envelopes: re-enqueue = %+v, %v; want the relayed message", n, m, err)
		}
		for _, k := range []record.Kind{record.KindOutbox, record.KindBatches} {
			if ids, err := s.List(k); err != nil || len(ids) != 0 {
				t.Fatalf("%d envelopes: re-enqueue of a finished message wrote %s %v (%v)", n, k, ids, err)
			}
		}
		if p, err := s.Pending(context.Background(), req.MessageID); err != nil || len(p) != 0 {
			t.Fatalf("%d envelopes: %d dispatchable envelopes after the re-enqueue (%v)", n, len(p), err)
		}
	}
}

// A record a prepared plan writes twice is published once, in its final version: an
// intermediate version is only a state a crash between two renames could keep.
func TestPlanPublishesARecordWrittenTwiceOnce(t *testing.T) {
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS { faulty = fsx.NewFaulty(inner); return faulty }})
	req, _ := enqueue(t, s, 1)
	faulty.Reset()
	err := s.PreparedTransaction(context.Background(), func(tx *store.Tx) error {
		m, err := store.TxGet[*record.Message](tx, req.MessageID)
		if err != nil {
			return err
		}
		m.Attempts = 1
		if err := tx.Put(m); err != nil {
			return err
		}
		m.Attempts = 2
		return tx.Put(m)
	})
	if err != nil {
		t.Fatal(err)
	}
	renames := 0
	for _, op := range faulty.Log() {
		if op.Kind == fsx.OpRename && op.Path2 == record.Path(record.KindMessages, req.MessageID) {
			renames++
		}
	}
	if renames != 1 {
		t.Fatalf("the message record was renamed %d times, want once", renames)
	}
	if m, _ := store.GetAs[*record.Message](s, req.MessageID); m == nil || m.Attempts != 2 {
		t.Fatalf("message after the plan: %+v, want its final version", m)
	}
}

// Maintenance ends a hold that outlived its message's last pending envelope: the
// message-kind envelope of a held two-envelope message was relayed, and maintenance
// closes the other by its deadline.
func TestMaintenanceEndsAHoldWithTheLastPendingEnvelope(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now})
	req := sendRequest(t, 2) // a message envelope and a delivery-status
	req.DeliveryDeadline = clock.Now().Add(time.Minute)
	if _, err := s.Enqueue(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	hold := &record.Action{Op: record.ActionHold, By: "uid:1000", At: clock.Now().UnixMilli()}
	err := s.PreparedTransaction(context.Background(), func(tx *store.Tx) error {
		first, err := store.TxGet[*record.Outbox](tx, req.Envelopes[0].EnvelopeID)
		if err != nil {
			return err
		}
		first.State, first.Attempts = record.StateRelayed, 1
		second, err := store.TxGet[*record.Outbox](tx, req.Envelopes[1].EnvelopeID)
		if err != nil {
			return err
		}
		second.Held = hold
		m, err := store.TxGet[*record.Message](tx, req.MessageID)
		if err != nil {
			return err
		}
		m.Status, m.Held, m.Attempts = record.StatusRelayed, hold, 1
		return tx.PutAll(first, second, m)
	})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	maintain(t, s)
	m, err := s.Message(req.MessageID)
	if err != nil || m == nil {
		t.Fatalf("message: %+v %v", m, err)
	}
	if m.Held != nil {
		t.Fatalf("message still held after its last pending envelope closed: %+v", m)
	}
}
