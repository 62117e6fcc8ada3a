package store_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// testClock is a clock the test moves by hand.
type testClock struct{ ns atomic.Int64 }

func newTestClock(t time.Time) *testClock {
	c := &testClock{}
	c.ns.Store(t.UnixNano())
	return c
}
func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func maintain(t *testing.T, s *store.Store) store.MaintenanceReport {
	t.Helper()
	rep, err := s.Maintain(context.Background())
	if err != nil || len(rep.Errors) > 0 {
		t.Fatalf("Maintain: %v %v", err, rep.Errors)
	}
	return rep
}

func TestMaintenanceClosesPastDeadlineAndFinishesBatch(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now})
	req := sendRequest(t, 2)
	req.DeliveryDeadline = clock.Now().Add(time.Minute)
	if _, err := s.Enqueue(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if rep := maintain(t, s); rep.ClosedByDeadline != 0 || rep.BatchesFinished != 0 {
		t.Fatalf("nothing is due yet: %+v", rep)
	}
	clock.Advance(2 * time.Minute)
	rep := maintain(t, s)
	if rep.ClosedByDeadline != 2 || rep.BatchesFinished != 1 {
		t.Fatalf("report %+v, want 2 closed and 1 batch finished", rep)
	}
	m, err := s.Message(req.MessageID)
	if err != nil || m == nil || m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByDeadline ||
		m.LastError != errcode.OutboxDeadlineExpired.String() {
		t.Fatalf("message after deadline: %+v %v", m, err)
	}
	for _, k := range []record.Kind{record.KindOutbox, record.KindBatches} {
		if ids, _ := s.List(k); len(ids) != 0 {
			t.Fatalf("%s left after the batch finished: %v", k, ids)
		}
	}
}

// A held message closes by its deadline all the same: maintenance clears the holds
// of the envelopes and the message it closes (a closed record is never held).
func TestMaintenanceClosesHeldPastDeadline(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now})
	req := sendRequest(t, 2)
	req.DeliveryDeadline = clock.Now().Add(time.Minute)
	if _, err := s.Enqueue(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	hold := &record.Action{Op: record.ActionHold, By: "uid:1000", At: clock.Now().UnixMilli()}
	for _, e := range req.Envelopes {
		o, _ := store.GetAs[*record.Outbox](s, e.EnvelopeID)
		o.Held, o.Operator = hold, hold
		mustPut(t, s, o)
	}
	m, _ := s.Message(req.MessageID)
	m.Held, m.Operator = hold, hold
	mustPut(t, s, m)
	clock.Advance(2 * time.Minute)
	if rep := maintain(t, s); rep.ClosedByDeadline != 2 {
		t.Fatalf("report %+v, want the 2 held envelopes closed", rep)
	}
	m, err := s.Message(req.MessageID)
	if err != nil || m == nil || m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByDeadline || m.Held != nil {
		t.Fatalf("held message after its deadline: %+v %v", m, err)
	}
}

// A crash between the publications of a settlement can keep the relayed (or closed)
// envelope and lose its message's move. Maintenance brings the message forward before
// it removes the members — in an earlier transaction, so the removal never outlives
// the move — and the message is never reported absent.
func TestMaintenanceBringsMessageForwardBeforeFinishing(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now})
	relayed, _ := enqueue(t, s, 1)
	refused, _ := enqueue(t, s, 2)
	settle := func(id, state, lastError string) {
		o, _ := store.GetAs[*record.Outbox](s, id)
		o.State, o.LastError, o.Attempts = state, lastError, 3
		mustPut(t, s, o) // the envelope's publication only: the message's was lost
	}
	settle(relayed.Envelopes[0].EnvelopeID, record.StateRelayed, "")
	settle(refused.Envelopes[0].EnvelopeID, record.StateClosed, record.RefusedPrefix+"403 forbidden")
	settle(refused.Envelopes[1].EnvelopeID, record.StateRelayed, "")
	for pass := 1; pass <= 2; pass++ {
		maintain(t, s)
		m, err := s.Message(relayed.MessageID)
		if err != nil || m == nil || m.Status != record.StatusRelayed || m.Attempts != 3 {
			t.Fatalf("pass %d: the relayed message is %+v (%v), want relayed with 3 attempts", pass, m, err)
		}
		m, err = s.Message(refused.MessageID)
		if err != nil || m == nil || m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByRefused ||
			m.LastError != record.RefusedPrefix+"403 forbidden" {
			t.Fatalf("pass %d: the refused message is %+v (%v), want closed by refused", pass, m, err)
		}
	}
	if ids, _ := s.List(record.KindOutbox); len(ids) != 0 {
		t.Fatalf("the settled members were not removed by the second pass: %v", ids)
	}
}

func TestMaintenanceFinishesSettledBatchOnly(t *testing.T) {
	s := openStore(t, store.Options{})
	req, _ := enqueue(t, s, 2)
	relay := func(id string) {
		o, _ := store.GetAs[*record.Outbox](s, id)
		o.State = record.StateRelayed
		mustPut(t, s, o)
	}
	relay(req.Envelopes[0].EnvelopeID)
	if rep := maintain(t, s); rep.BatchesFinished != 0 {
		t.Fatal("a batch with a pending member was finished")
	}
	if p, _ := s.Pending(context.Background(), req.MessageID); len(p) != 1 {
		t.Fatalf("pending after partial relay: %d", len(p))
	}
	relay(req.Envelopes[1].EnvelopeID)
	if rep := maintain(t, s); rep.BatchesFinished != 1 {
		t.Fatalf("settled batch not finished: %+v", rep)
	}
	// the message record stays (until its retention) with its own status
	if ids, _ := s.List(record.KindMessages); len(ids) != 1 {
		t.Fatalf("messages: %v", ids)
	}
}

func TestMaintenanceRemovesOrphansExpiredAndOldTemps(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now})
	req, _ := enqueue(t, s, 1)
	// An outbox record that no marker lists (an interrupted enqueue).
	env := json.RawMessage(`{"orphan":true}`)
	now := clock.Now()
	orphan := &record.Outbox{EnvelopeID: uuid.NewString(), MessageID: uuid.NewString(), BatchID: uuid.NewString(),
		EnvelopeKind: record.EnvelopeMessage, State: record.StatePending, RelayURL: "http://127.0.0.1:9/",
		PeerOwnerDID: string(peerDID(t)), DeliveryDeadline: ms(now.Add(time.Hour)), NextAttemptAt: ms(now),
		Envelope: env, EnvelopeDigest: envelope.Digest(env), RetainUntil: ms(now.Add(2 * time.Hour))}
	mustPut(t, s, orphan)
	// A receipt whose retention ends in a minute.
	r := &record.Receipt{EnvelopeID: uuid.NewString(), SenderDID: string(peerDID(t)), EnvelopeDigest: envelope.Digest(env),
		State: record.ReceiptTerminal, ReceivedAt: ms(now), RetainUntil: ms(now.Add(time.Minute))}
	mustPut(t, s, r)
	// Two temps: one old, one fresh.
	dir := filepath.Join(s.Dir(), "outbox")
	oldTemp := filepath.Join(dir, "."+uuid.NewString()+".tmp")
	freshTemp := filepath.Join(dir, "."+uuid.NewString()+".tmp")
	for _, p := range []string{oldTemp, freshTemp} {
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := clock.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(oldTemp, old, old); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	rep := maintain(t, s)
	if rep.OrphansRemoved != 1 || rep.ExpiredRemoved != 1 || rep.TempsRemoved != 1 {
		t.Fatalf("report %+v, want 1 orphan, 1 expired, 1 temp", rep)
	}
	if o, _ := s.Get(record.KindOutbox, orphan.EnvelopeID); o != nil {
		t.Fatal("orphan kept")
	}
	if o, _ := s.Get(record.KindOutbox, req.Envelopes[0].EnvelopeID); o == nil {
		t.Fatal("a committed member was removed")
	}
	if _, err := os.Stat(oldTemp); !os.IsNotExist(err) {
		t.Fatal("old temp kept")
	}
	if _, err := os.Stat(freshTemp); err != nil {
		t.Fatal("a fresh temp (maybe a write in progress) was removed")
	}
}

func TestMaintenanceStopsOnCancel(t *testing.T) {
	s := openStore(t, store.Options{})
	enqueue(t, s, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Maintain(ctx); err != context.Canceled {
		t.Fatalf("Maintain with a cancelled context: %v", err)
	}
}

// TestMaintenanceRemovesInBoundedChunks: removing 150 expired records takes one
// directory fsync per chunk of at most 64 removals, not one per record, and no chunk
// (one lock hold) removes more than 64. One record a step made 150 fsyncs.
func TestMaintenanceRemovesInBoundedChunks(t *testing.T) {
	const n = 150
	clock := newTestClock(time.Now())
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{Now: clock.Now, WrapFS: func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		return faulty
	}})
	recs := make([]record.Record, n)
	for i := range recs {
		recs[i] = newMessage(t, clock.Now())
	}
	if err := s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.PutAll(recs...) }); err != nil {
		t.Fatal(err)
	}
	clock.Advance(3 * time.Hour) // past RetainUntil
	faulty.Reset()
	if rep := maintain(t, s); rep.ExpiredRemoved != n {
		t.Fatalf("ExpiredRemoved = %d, want %d", rep.ExpiredRemoved, n)
	}
	removed, syncs, sinceSync := 0, 0, 0
	for _, op := range faulty.Log() {
		switch {
		case op.Kind == fsx.OpRemove && strings.HasPrefix(op.Path, "messages/"):
			removed++
			if sinceSync++; sinceSync > 64 {
				t.Fatalf("more than 64 removals before a directory fsync (one lock hold)")
			}
		case op.Kind == fsx.OpSyncDir && op.Path == "messages":
			syncs++
			sinceSync = 0
		}
	}
	if removed != n || sinceSync != 0 {
		t.Fatalf("%d removals, %d after the last fsync; want %d, 0", removed, sinceSync, n)
	}
	if want := (n + 63) / 64; syncs != want {
		t.Fatalf("%d fsyncs of messages/ for %d removals, want %d (one per chunk)", syncs, n, want)
	}
	if ids, err := s.List(record.KindMessages); err != nil || len(ids) != 0 {
		t.Fatalf("left: %d %v", len(ids), err)
	}
}

// A maintenance step whose writes fail to become durable (the messages directory's
// fsync fails as it closes a message by its deadline) leaves the batch alone: removing
// the closed members after it could outlive the message's close in a crash, and the
// message would be reported absent.
func TestMaintenanceKeepsBatchWhenTheCloseFails(t *testing.T) {
	clock := newTestClock(time.Now())
	failing := new(atomic.Bool)
	s := openStore(t, store.Options{Now: clock.Now, WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if failing.Load() && op.Kind == fsx.OpSyncDir && op.Path == string(record.KindMessages) {
				return syscall.EIO
			}
			return nil
		}
		return f
	}})
	req := sendRequest(t, 1)
	req.DeliveryDeadline = clock.Now().Add(time.Minute)
	if _, err := s.Enqueue(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	failing.Store(true)
	rep, err := s.Maintain(context.Background())
	if err != nil || len(rep.Errors) == 0 {
		t.Fatalf("maintenance with the messages fsync failing: %v %v, want the step's error reported", err, rep.Errors)
	}
	if ids, _ := s.List(record.KindOutbox); len(ids) != 1 || rep.BatchesFinished != 0 {
		t.Fatalf("the closed single was removed (%v, %d finished) after a close that may not be durable", ids, rep.BatchesFinished)
	}
	failing.Store(false)
	maintain(t, s)
	if m, err := s.Message(req.MessageID); err != nil || m == nil || m.Status != record.StatusClosed {
		t.Fatalf("after a clean pass: %+v %v", m, err)
	}
	if ids, _ := s.List(record.KindOutbox); len(ids) != 0 {
		t.Fatalf("the single was not removed by the clean pass: %v", ids)
	}
}
