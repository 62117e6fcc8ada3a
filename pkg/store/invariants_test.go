package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// put writes recs in one transaction.
func put(t *testing.T, s *store.Store, recs ...record.Record) error {
	t.Helper()
	return s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.PutAll(recs...) })
}

func mustPut(t *testing.T, s *store.Store, recs ...record.Record) {
	t.Helper()
	if err := put(t, s, recs...); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, err error, code *errcode.Code) {
	t.Helper()
	if !errors.Is(err, code) {
		t.Fatalf("got %v, want %s", err, code)
	}
}

func ms(tm time.Time) int64 { return tm.UnixMilli() }

func TestOutboxEnvelopeAndDigestNeverChange(t *testing.T) {
	s := openStore(t, store.Options{})
	req, _ := enqueue(t, s, 1)
	o, err := store.GetAs[*record.Outbox](s, req.Envelopes[0].EnvelopeID)
	if err != nil || o == nil {
		t.Fatal(o, err)
	}
	changed := *o
	changed.Envelope = json.RawMessage(`{"other":true}`)
	changed.EnvelopeDigest = envelope.Digest(changed.Envelope)
	wantCode(t, put(t, s, &changed), errcode.DeliveryRecordConflict)

	rerouted := *o
	rerouted.RelayURL = "http://127.0.0.1:10/elsewhere"
	wantCode(t, put(t, s, &rerouted), errcode.DeliveryRecordConflict)

	// A state change with the same envelope is allowed, and a settled state is final.
	relayed := *o
	relayed.State = record.StateRelayed
	mustPut(t, s, &relayed)
	back := relayed
	back.State = record.StatePending
	wantCode(t, put(t, s, &back), errcode.InvalidDeliveryStatus)

	stored, _ := store.GetAs[*record.Outbox](s, o.EnvelopeID)
	if stored.State != record.StateRelayed || string(stored.Envelope) != string(o.Envelope) {
		t.Fatalf("refused writes changed the record: %+v", stored)
	}
}

func TestBatchMarkerNeedsConsistentMembers(t *testing.T) {
	s := openStore(t, store.Options{})
	req, _ := enqueue(t, s, 2)
	first, _ := store.GetAs[*record.Outbox](s, req.Envelopes[0].EnvelopeID)
	now := time.Now()
	base := record.Batch{BatchID: uuid.NewString(), MessageID: first.MessageID, PeerOwnerDID: first.PeerOwnerDID,
		RelayURL: first.RelayURL, DeliveryDeadline: first.DeliveryDeadline, CreatedAt: ms(now), RetainUntil: ms(now.Add(time.Hour))}

	// A marker listing a member that does not exist.
	missing := base
	missing.EnvelopeIDs = []string{uuid.NewString()}
	wantCode(t, put(t, s, &missing), errcode.DeliveryRecordConflict)

	// A marker listing members of another batch.
	foreign := base
	foreign.EnvelopeIDs = []string{req.Envelopes[0].EnvelopeID, req.Envelopes[1].EnvelopeID}
	wantCode(t, put(t, s, &foreign), errcode.DeliveryRecordConflict)

	// Members with a different deadline, or ordinals out of order.
	mk := func(batch string, ordinal int, deadline int64) *record.Outbox {
		env := json.RawMessage(`{"n":` + string(rune('0'+ordinal)) + `}`)
		return &record.Outbox{EnvelopeID: uuid.NewString(), MessageID: first.MessageID, BatchID: batch,
			EnvelopeKind: record.EnvelopeMessage, State: record.StatePending, Ordinal: ordinal, RelayURL: first.RelayURL,
			PeerOwnerDID: first.PeerOwnerDID, DeliveryDeadline: deadline, NextAttemptAt: ms(now), Envelope: env,
			EnvelopeDigest: envelope.Digest(env), RetainUntil: ms(now.Add(time.Hour))}
	}
	a, b := mk(base.BatchID, 0, first.DeliveryDeadline), mk(base.BatchID, 1, first.DeliveryDeadline+1)
	mustPut(t, s, a, b)
	skewed := base
	skewed.EnvelopeIDs = []string{a.EnvelopeID, b.EnvelopeID}
	wantCode(t, put(t, s, &skewed), errcode.DeliveryRecordConflict)

	c := mk(base.BatchID, 1, first.DeliveryDeadline)
	mustPut(t, s, c)
	swapped := base
	swapped.EnvelopeIDs = []string{c.EnvelopeID, a.EnvelopeID}
	wantCode(t, put(t, s, &swapped), errcode.DeliveryRecordConflict)

	ok := base
	ok.EnvelopeIDs = []string{a.EnvelopeID, c.EnvelopeID}
	mustPut(t, s, &ok)
	// and a marker never changes once written
	changed := ok
	changed.EnvelopeIDs = []string{a.EnvelopeID}
	wantCode(t, put(t, s, &changed), errcode.DeliveryRecordConflict)
	if got, _ := store.GetAs[*record.Batch](s, base.BatchID); got == nil || len(got.EnvelopeIDs) != 2 {
		t.Fatalf("marker changed: %+v", got)
	}
}

func TestMessageStatusOnlyMovesForward(t *testing.T) {
	s := openStore(t, store.Options{})
	req, m := enqueue(t, s, 1)
	_ = req
	step := func(status, closedBy string) error {
		next := *m
		next.Status, next.ClosedBy = status, closedBy
		err := put(t, s, &next)
		if err == nil {
			m = &next
		}
		return err
	}
	if err := step(record.StatusRelayed, ""); err != nil {
		t.Fatal(err)
	}
	wantCode(t, step(record.StatusQueued, ""), errcode.InvalidDeliveryStatus)
	if err := step(record.StatusDelivered, ""); err != nil {
		t.Fatal(err)
	}
	wantCode(t, step(record.StatusRelayed, ""), errcode.InvalidDeliveryStatus)
	wantCode(t, step(record.StatusClosed, record.ClosedByRefused), errcode.DeliveryStatusConflict)

	// closed is terminal too, and its closer never changes
	_, m2 := enqueue(t, s, 1)
	m = m2
	if err := step(record.StatusClosed, record.ClosedByDeadline); err != nil {
		t.Fatal(err)
	}
	wantCode(t, step(record.StatusClosed, record.ClosedByRefused), errcode.DeliveryStatusConflict)
	wantCode(t, step(record.StatusDelivered, ""), errcode.DeliveryStatusConflict)
	wantCode(t, step("lost", ""), errcode.OutboxStoreInvalid)

	got, _ := s.Message(m2.MessageID)
	if got.Status != record.StatusClosed || got.ClosedBy != record.ClosedByDeadline {
		t.Fatalf("refused writes changed the message: %+v", got)
	}
}

func TestReceiptStateOnlyRisesAndIdentityIsFixed(t *testing.T) {
	s := openStore(t, store.Options{})
	now := time.Now()
	r := &record.Receipt{EnvelopeID: uuid.NewString(), SenderDID: string(peerDID(t)), EnvelopeDigest: envelope.Digest([]byte("e")),
		State: record.ReceiptProcessed, ReceivedAt: ms(now), RetainUntil: ms(now.Add(time.Hour))}
	mustPut(t, s, r)
	lower := *r
	lower.State = record.ReceiptPersisted
	wantCode(t, put(t, s, &lower), errcode.InvalidDeliveryStatus)
	other := *r
	other.EnvelopeDigest = envelope.Digest([]byte("f"))
	wantCode(t, put(t, s, &other), errcode.DeliveryRecordConflict)
	sender := *r
	sender.SenderDID = string(ownerIdentity(t).DID())
	wantCode(t, put(t, s, &sender), errcode.DeliveryRecordConflict)
	up := *r
	up.State = record.ReceiptTerminal
	mustPut(t, s, &up)
	got, err := store.GetAs[*record.Receipt](s, record.ReceiptID(r.EnvelopeID))
	if err != nil || got.State != record.ReceiptTerminal {
		t.Fatal(got, err)
	}
}

func TestObservationFixedFieldsAndGrowOnlyLists(t *testing.T) {
	s := openStore(t, store.Options{})
	now := time.Now()
	o := &record.Observation{MessageID: uuid.NewString(), SenderDID: string(peerDID(t)), EnvelopeDigest: envelope.Digest([]byte("e")),
		CreatedAt: ms(now), DeliveryDeadline: ms(now.Add(time.Hour)), RetainUntil: ms(now.Add(2 * time.Hour)),
		Facts: []json.RawMessage{json.RawMessage(`{"a":1}`)}, Published: []string{uuid.NewString()}}
	mustPut(t, s, o)

	grown := *o
	grown.Facts = append([]json.RawMessage{o.Facts[0]}, json.RawMessage(`{"b":2}`))
	grown.Published = append([]string{o.Published[0]}, uuid.NewString())
	mustPut(t, s, &grown)

	shrunk := grown
	shrunk.Facts = grown.Facts[:1]
	wantCode(t, put(t, s, &shrunk), errcode.DeliveryRecordConflict)
	rewritten := grown
	rewritten.Facts = []json.RawMessage{json.RawMessage(`{"a":2}`), grown.Facts[1]}
	wantCode(t, put(t, s, &rewritten), errcode.DeliveryRecordConflict)
	reordered := grown
	reordered.Published = []string{grown.Published[1], grown.Published[0]}
	wantCode(t, put(t, s, &reordered), errcode.DeliveryRecordConflict)
	moved := grown
	moved.CreatedAt++
	wantCode(t, put(t, s, &moved), errcode.DeliveryRecordConflict)
}

func TestEnqueueCapacityWritesNothing(t *testing.T) {
	s := openStore(t, store.Options{Limits: store.Limits{PendingEnvelopes: 3}})
	enqueue(t, s, 2)
	before, _ := s.List(record.KindOutbox)
	_, err := s.Enqueue(context.Background(), sendRequest(t, 2))
	wantCode(t, err, errcode.OutboxFull)
	after, _ := s.List(record.KindOutbox)
	msgs, _ := s.List(record.KindMessages)
	if len(after) != len(before) || len(msgs) != 1 {
		t.Fatalf("a refused enqueue wrote records: outbox %d→%d, messages %d", len(before), len(after), len(msgs))
	}
	// one more single-envelope message still fits
	enqueue(t, s, 1)

	small := openStore(t, store.Options{Limits: store.Limits{WireBytes: 16}})
	_, err = small.Enqueue(context.Background(), sendRequest(t, 1))
	wantCode(t, err, errcode.OutboxFull)
}

func TestEnqueueIsIdempotentPerMessage(t *testing.T) {
	s := openStore(t, store.Options{})
	req, _ := enqueue(t, s, 2)
	if _, err := s.Enqueue(context.Background(), req); err != nil {
		t.Fatalf("re-enqueue of the same message: %v", err)
	}
	ids, _ := s.List(record.KindOutbox)
	if len(ids) != 2 {
		t.Fatalf("re-enqueue wrote again: %d outbox records", len(ids))
	}
	other := sendRequest(t, 1)
	other.MessageID = req.MessageID
	_, err := s.Enqueue(context.Background(), other)
	wantCode(t, err, errcode.DeliveryRecordConflict)
}

func TestEnqueuePastDeadlineIsRefused(t *testing.T) {
	s := openStore(t, store.Options{})
	req := sendRequest(t, 1)
	req.DeliveryDeadline = time.Now().Add(-time.Second)
	_, err := s.Enqueue(context.Background(), req)
	wantCode(t, err, errcode.OutboxDeadlineExpired)
}
