package store_test

import (
	"context"
	"testing"

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
// message and writes no envelope. On the old code it wrote fresh pending members that
// the kept message record committed, so the message was sent again.
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
