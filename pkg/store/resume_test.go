package store_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// An enqueue interrupted after its members and message were published but before
// the batch marker is finished by ResumeEnqueue with the stored envelopes.
func TestResumeEnqueueFinishesAnInterruptedEnqueue(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, store.Options{})
	req := sendRequest(t, 2)
	if m, ok, err := s.ResumeEnqueue(ctx, req.MessageID); m != nil || ok || err != nil {
		t.Fatalf("nothing stored: %v %v %v", m, ok, err)
	}
	deadline := req.DeliveryDeadline.UnixMilli()
	now := time.Now().UnixMilli()
	err := s.Transaction(ctx, func(tx *store.Tx) error {
		for i, e := range req.Envelopes {
			if err := tx.Put(&record.Outbox{EnvelopeID: e.EnvelopeID, MessageID: req.MessageID, BatchID: "0b8f6a3e-1111-4222-8333-444455556666",
				EnvelopeKind: e.Kind, State: record.StatePending, Ordinal: i, RelayURL: req.RelayURL,
				PeerOwnerDID: string(req.PeerOwnerDID), DeliveryDeadline: deadline, NextAttemptAt: now,
				Envelope: e.Envelope, EnvelopeDigest: envelope.Digest(e.Envelope), RetainUntil: deadline + 1000}); err != nil {
				return err
			}
		}
		return tx.Put(&record.Message{MessageID: req.MessageID, Status: record.StatusQueued, PeerOwnerDID: string(req.PeerOwnerDID),
			RelayURL: req.RelayURL, EnvelopeDigest: envelope.Digest(req.Envelopes[0].Envelope), DeliveryDeadline: deadline,
			CreatedAt: now, UpdatedAt: now, RetainUntil: deadline + 1000})
	})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.Message(req.MessageID); m != nil || err != nil {
		t.Fatalf("an uncommitted message is reported: %v %v", m, err)
	}
	m, ok, err := s.ResumeEnqueue(ctx, req.MessageID)
	if err != nil || !ok || m == nil || m.MessageID != req.MessageID {
		t.Fatalf("resume: %v %v %v", m, ok, err)
	}
	pending, err := s.Pending(ctx, req.MessageID)
	if err != nil || len(pending) != 2 || pending[0].EnvelopeID != req.Envelopes[0].EnvelopeID {
		t.Fatalf("pending after resume: %d %v", len(pending), err)
	}
	// Resuming an accepted message returns it without writing.
	if m2, ok, err := s.ResumeEnqueue(ctx, req.MessageID); err != nil || !ok || m2.MessageID != m.MessageID {
		t.Fatalf("resume again: %v %v %v", m2, ok, err)
	}
}

func TestExpireOperationLeases(t *testing.T) {
	ctx := context.Background()
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	s := openStore(t, store.Options{Now: func() time.Time { return time.UnixMilli(clock.Load()) }})
	old, err := s.BeginOperation(ctx, "old", []byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	done, err := s.BeginOperation(ctx, "done", []byte(`{"a":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteOperation(ctx, done.Operation.OperationID, []byte(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	clock.Add(1000)
	cut := time.UnixMilli(clock.Load())
	if _, err := s.BeginOperation(ctx, "new", []byte(`{"a":3}`)); err != nil {
		t.Fatal(err)
	}
	clock.Add(1)
	_, err = s.BeginOperation(ctx, "old", []byte(`{"a":1}`))
	wantCode(t, err, errcode.IdempotencyInProgress)

	n, err := s.ExpireOperationLeases(ctx, cut)
	if err != nil || n != 1 {
		t.Fatalf("expired %d, %v; want 1", n, err)
	}
	if n, err := s.ExpireOperationLeases(ctx, cut); err != nil || n != 0 {
		t.Fatalf("second run expired %d, %v", n, err)
	}
	// The old one is taken over at once; the new one (created after cut) still runs;
	// the finished one still answers its response.
	if st, err := s.BeginOperation(ctx, "old", []byte(`{"a":1}`)); err != nil || st.Done || st.Operation.OperationID != old.Operation.OperationID {
		t.Fatalf("takeover: %+v %v", st, err)
	}
	_, err = s.BeginOperation(ctx, "new", []byte(`{"a":3}`))
	wantCode(t, err, errcode.IdempotencyInProgress)
	if st, err := s.BeginOperation(ctx, "done", []byte(`{"a":2}`)); err != nil || !st.Done {
		t.Fatalf("done: %+v %v", st, err)
	}
	// ReleaseOperation ends a running lease.
	st, _ := s.BeginOperation(ctx, "rel", []byte(`{"a":4}`))
	if err := s.ReleaseOperation(ctx, st.Operation.OperationID); err != nil {
		t.Fatal(err)
	}
	clock.Add(1)
	if again, err := s.BeginOperation(ctx, "rel", []byte(`{"a":4}`)); err != nil || again.Operation.OperationID != st.Operation.OperationID {
		t.Fatalf("after release: %+v %v", again, err)
	}
}

// An enqueue whose commit (the batch marker; for a one-envelope message, its message
// record) was renamed into place but whose directory fsync failed answers
// OUTBOX_STORE_UNWRITABLE although the message is visible: it may be accepted.
// ResumeEnqueue (what a retry with the same Idempotency-Key runs) fsyncs the
// directories again before it reports the message, and reports the fsync's failure as
// OUTBOX_STORE_UNWRITABLE instead of an accepted message.
func TestResumeEnqueueAfterFailedDirSync(t *testing.T) {
	for _, c := range []struct {
		envelopes int
		commit    record.Kind
	}{{2, record.KindBatches}, {1, record.KindMessages}} {
		t.Run(string(c.commit), func(t *testing.T) {
			ctx := context.Background()
			s, failing, faulty := dirSyncFailing(t, c.commit)
			req := sendRequest(t, c.envelopes)
			failing.Store(true)
			if _, err := s.Enqueue(ctx, req); !errors.Is(err, errcode.OutboxStoreUnwritable) {
				t.Fatalf("enqueue with a failing %s fsync: %v", c.commit, err)
			}
			if m, err := s.Message(req.MessageID); err != nil || m == nil {
				t.Fatalf("the commit was renamed: the message is visible: %v %v", m, err)
			}
			// Still failing: the retry cannot report the message as accepted.
			if m, ok, err := s.ResumeEnqueue(ctx, req.MessageID); !errors.Is(err, errcode.OutboxStoreUnwritable) || m != nil || ok {
				t.Fatalf("resume with the fsync still failing: %v %v %v", m, ok, err)
			}
			failing.Store(false)
			faulty.Reset()
			m, ok, err := s.ResumeEnqueue(ctx, req.MessageID)
			if err != nil || !ok || m == nil || m.MessageID != req.MessageID {
				t.Fatalf("resume: %v %v %v", m, ok, err)
			}
			synced := false
			for _, op := range faulty.Log() {
				synced = synced || (op.Kind == fsx.OpSyncDir && op.Path == string(c.commit) && op.Err == nil)
			}
			if !synced {
				t.Fatalf("the %s directory was not fsynced before the message was reported: %v", c.commit, faulty.Log())
			}
			if ids, err := s.List(record.KindMessages); err != nil || len(ids) != 1 {
				t.Fatalf("messages: %v %v", ids, err)
			}
		})
	}
}
