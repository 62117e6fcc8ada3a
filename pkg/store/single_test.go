package store_test

import (
	"context"
	"errors"
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

// recordCreates returns the files an operation created in kind directories (record
// temps), by kind, from a Faulty log.
func recordCreates(log []fsx.Op) map[string]int {
	n := map[string]int{}
	for _, op := range log {
		if op.Kind != fsx.OpCreate {
			continue
		}
		if kind, _, ok := strings.Cut(op.Path, "/"); ok && record.Kind(kind).Valid() {
			n[kind]++
		}
	}
	return n
}

// A one-envelope message is two files: its member (a single) and its message record,
// which commits it; no batch marker. A message of two envelopes keeps its marker.
func TestOneEnvelopeEnqueueCreatesTwoFiles(t *testing.T) {
	ctx := context.Background()
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS { faulty = fsx.NewFaulty(inner); return faulty }})
	enqueue(t, s, 2) // the kind directories and .generation exist from here on
	faulty.Reset()
	req, m := enqueue(t, s, 1)
	got := recordCreates(faulty.Log())
	if want := map[string]int{"outbox": 1, "messages": 1}; len(got) != len(want) || got["outbox"] != 1 || got["messages"] != 1 {
		t.Fatalf("one-envelope enqueue created %v, want %v", got, want)
	}
	// The member is its own batch and is committed, dispatchable and reported.
	o, err := store.GetAs[*record.Outbox](s, req.Envelopes[0].EnvelopeID)
	if err != nil || o == nil || o.BatchID != o.EnvelopeID {
		t.Fatalf("member: %+v %v", o, err)
	}
	if mem, err := s.Committed(o.BatchID); err != nil || len(mem) != 1 || mem[0].EnvelopeID != o.EnvelopeID {
		t.Fatalf("Committed(%s): %v %v", o.BatchID, mem, err)
	}
	if p, err := s.Pending(ctx, m.MessageID); err != nil || len(p) != 1 {
		t.Fatalf("Pending: %v %v", p, err)
	}
	if got, err := s.AcceptedMessage(m.MessageID); err != nil || got == nil {
		t.Fatalf("AcceptedMessage: %v %v", got, err)
	}
	// Publication order: the member's directory is fsynced before the message record
	// is renamed.
	memberSynced := false
	for _, op := range faulty.Log() {
		switch {
		case op.Kind == fsx.OpSyncDir && op.Path == string(record.KindOutbox):
			memberSynced = true
		case op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, string(record.KindMessages)+"/") && !memberSynced:
			t.Fatalf("the message record was renamed before outbox/ was fsynced: %v", faulty.Log())
		}
	}
	faulty.Reset()
	enqueue(t, s, 2)
	if got := recordCreates(faulty.Log()); got["outbox"] != 2 || got["messages"] != 1 || got["batches"] != 1 {
		t.Fatalf("two-envelope enqueue created %v, want 2 members, the message and the marker", got)
	}
}

// The crash state between a single's two publications (the member durable, its
// message record not yet renamed) is an enqueue that never committed: the message is
// absent and not dispatchable, ResumeEnqueue finishes it from the stored envelope, and
// left alone maintenance removes the member as an orphan.
func TestSingleWithoutMessageRecord(t *testing.T) {
	ctx := context.Background()
	var failing atomic.Bool
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if failing.Load() && op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, string(record.KindMessages)+"/") {
				return syscall.EIO
			}
			return nil
		}
		return f
	}})
	req := sendRequest(t, 1)
	failing.Store(true)
	if _, err := s.Enqueue(ctx, req); !errors.Is(err, errcode.OutboxStoreUnwritable) {
		t.Fatalf("enqueue with a failing message rename: %v", err)
	}
	failing.Store(false)
	eid := req.Envelopes[0].EnvelopeID
	if o, err := store.GetAs[*record.Outbox](s, eid); err != nil || o == nil {
		t.Fatalf("the member was published first: %v %v", o, err)
	}
	if m, err := s.Message(req.MessageID); err != nil || m != nil {
		t.Fatalf("an uncommitted single's message is reported: %v %v", m, err)
	}
	if mem, err := s.Committed(eid); err != nil || mem != nil {
		t.Fatalf("an uncommitted single is committed: %v %v", mem, err)
	}
	if p, err := s.Pending(ctx, req.MessageID); err != nil || len(p) != 0 {
		t.Fatalf("an uncommitted single is dispatchable: %v %v", p, err)
	}
	m, ok, err := s.ResumeEnqueue(ctx, req.MessageID)
	if err != nil || !ok || m == nil || m.EnvelopeDigest != envelope.Digest(req.Envelopes[0].Envelope) {
		t.Fatalf("resume: %v %v %v", m, ok, err)
	}
	if p, err := s.Pending(ctx, req.MessageID); err != nil || len(p) != 1 {
		t.Fatalf("after resume: %v %v", p, err)
	}
	// Another uncommitted single, left alone: maintenance removes it.
	req2 := sendRequest(t, 1)
	failing.Store(true)
	if _, err := s.Enqueue(ctx, req2); err == nil {
		t.Fatal("enqueue with a failing message rename succeeded")
	}
	failing.Store(false)
	rep, err := s.Maintain(ctx)
	if err != nil || len(rep.Errors) > 0 || rep.OrphansRemoved != 1 {
		t.Fatalf("maintenance: %+v %v", rep, err)
	}
	if o, err := store.GetAs[*record.Outbox](s, req2.Envelopes[0].EnvelopeID); err != nil || o != nil {
		t.Fatalf("the uncommitted single was kept: %v %v", o, err)
	}
	if o, err := store.GetAs[*record.Outbox](s, eid); err != nil || o == nil {
		t.Fatalf("maintenance removed a committed single: %v %v", o, err)
	}
}

// A store written by the marker protocol keeps working: a one-envelope message with
// a random batch id and a marker is committed by the marker, an interrupted one (the
// member and message, no marker) is finished with its marker, and maintenance
// finishes such batches as before.
func TestOneEnvelopeMessageWithMarkerStillValid(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, store.Options{})
	legacy := func(withMarker bool) store.SendRequest {
		req := sendRequest(t, 1)
		e := req.Envelopes[0]
		now := req.DeliveryDeadline.Add(-30 * time.Minute).UnixMilli()
		dl, retain := req.DeliveryDeadline.UnixMilli(), req.DeliveryDeadline.UnixMilli()+1
		o := &record.Outbox{EnvelopeID: e.EnvelopeID, MessageID: req.MessageID, BatchID: uuid.NewString(), EnvelopeKind: e.Kind,
			State: record.StatePending, RelayURL: req.RelayURL, PeerOwnerDID: string(req.PeerOwnerDID), DeliveryDeadline: dl,
			NextAttemptAt: now, Envelope: e.Envelope, EnvelopeDigest: envelope.Digest(e.Envelope), RetainUntil: retain}
		m := &record.Message{MessageID: req.MessageID, Status: record.StatusQueued, PeerOwnerDID: o.PeerOwnerDID, RelayURL: o.RelayURL,
			EnvelopeDigest: o.EnvelopeDigest, DeliveryDeadline: dl, CreatedAt: now, UpdatedAt: now, RetainUntil: retain}
		b := &record.Batch{BatchID: o.BatchID, MessageID: m.MessageID, EnvelopeIDs: []string{o.EnvelopeID}, PeerOwnerDID: o.PeerOwnerDID,
			RelayURL: o.RelayURL, DeliveryDeadline: dl, CreatedAt: now, RetainUntil: retain}
		if err := s.Transaction(ctx, func(tx *store.Tx) error {
			if err := tx.PutAll(o, m); err != nil || !withMarker {
				return err
			}
			return tx.Put(b)
		}); err != nil {
			t.Fatal(err)
		}
		return req
	}
	old := legacy(true)
	if m, err := s.AcceptedMessage(old.MessageID); err != nil || m == nil {
		t.Fatalf("a marker-committed one-envelope message: %v %v", m, err)
	}
	if p, err := s.Pending(ctx, old.MessageID); err != nil || len(p) != 1 {
		t.Fatalf("Pending: %v %v", p, err)
	}
	half := legacy(false)
	if m, err := s.Message(half.MessageID); err != nil || m != nil {
		t.Fatalf("an interrupted marker-protocol enqueue is reported: %v %v", m, err)
	}
	if m, ok, err := s.ResumeEnqueue(ctx, half.MessageID); err != nil || !ok || m == nil {
		t.Fatalf("resume: %v %v %v", m, ok, err)
	}
	o, _ := store.GetAs[*record.Outbox](s, half.Envelopes[0].EnvelopeID)
	if b, err := store.GetAs[*record.Batch](s, o.BatchID); err != nil || b == nil {
		t.Fatalf("the resumed enqueue kept its batch id but wrote no marker: %v %v", b, err)
	}
	rep, err := s.Maintain(ctx)
	if err != nil || len(rep.Errors) > 0 || rep.OrphansRemoved != 0 {
		t.Fatalf("maintenance on the marker-protocol messages: %+v %v", rep, err)
	}
	for _, id := range []string{old.MessageID, half.MessageID} {
		if p, err := s.Pending(ctx, id); err != nil || len(p) != 1 {
			t.Fatalf("after maintenance, %s: %v %v", id, p, err)
		}
	}
}

// An enqueue whose member was renamed but whose outbox fsync failed is resumed by a
// retry: ResumeEnqueue fsyncs outbox/ again before it renames the message record that
// commits the member, so the commit never rests on a member that may not be durable.
func TestResumeSingleAfterFailedMemberSync(t *testing.T) {
	ctx := context.Background()
	s, failing, faulty := dirSyncFailing(t, record.KindOutbox)
	req := sendRequest(t, 1)
	failing.Store(true)
	if _, err := s.Enqueue(ctx, req); !errors.Is(err, errcode.OutboxStoreUnwritable) {
		t.Fatalf("enqueue with a failing outbox fsync: %v", err)
	}
	if ids, err := s.List(record.KindMessages); err != nil || len(ids) != 0 {
		t.Fatalf("the message record was renamed after the member's fsync failed: %v %v", ids, err)
	}
	failing.Store(false)
	faulty.Reset()
	if m, ok, err := s.ResumeEnqueue(ctx, req.MessageID); err != nil || !ok || m == nil {
		t.Fatalf("resume: %v %v %v", m, ok, err)
	}
	synced := false
	for _, op := range faulty.Log() {
		switch {
		case op.Kind == fsx.OpSyncDir && op.Path == string(record.KindOutbox) && op.Err == nil:
			synced = true
		case op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, string(record.KindMessages)+"/") && !synced:
			t.Fatalf("the message record was renamed before outbox/ was fsynced again: %v", faulty.Log())
		}
	}
	if !synced {
		t.Fatalf("outbox/ was not fsynced: %v", faulty.Log())
	}
}
