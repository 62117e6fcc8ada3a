package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// OutgoingEnvelope is one signed wire envelope of a message to send.
type OutgoingEnvelope struct {
	EnvelopeID string          // lower-case UUID
	Kind       string          // EnvelopeMessage or EnvelopeDeliveryStatus
	Envelope   json.RawMessage // the signed envelope, compact JSON, exact bytes
}

// SendRequest is a message accepted for delivery: its 1..N envelopes go to one peer
// through one relay before one deadline.
type SendRequest struct {
	MessageID        string
	PeerOwnerDID     identity.DID
	RelayURL         string
	DeliveryDeadline time.Time
	Envelopes        []OutgoingEnvelope
}

// Enqueue accepts a message. An envelope whose body is a sealed blob is accepted only
// if that blob is in the store (BlobWriter.Commit) with the size the envelope names,
// checked under the lock when the plan is published (BODY_MISSING otherwise, nothing
// written). It is a prepared transaction: the plan checks that the
// message and its envelopes are new; the outbox members, the message record and the
// batch marker are signed and fsynced outside the lock; then, under the lock and with
// capacity checked there (DESIGN §5 limits, OUTBOX_FULL with nothing written), the members
// and the message are renamed into place and their directories fsynced, and only then
// the marker that makes the members dispatchable. A one-envelope message has no marker:
// its member (a single, DESIGN §7) is renamed and fsynced first, then the message
// record that commits it. When Enqueue returns nil the message
// is accepted: it will be delivered or explicitly expired. Enqueueing the same message
// again (same id and first envelope) returns the stored message without writing.
// A rolled-back Store refuses it (STORE_ROLLED_BACK).
func (s *Store) Enqueue(ctx context.Context, req SendRequest) (*record.Message, error) {
	if err := s.checkWritable(); err != nil {
		return nil, err
	}
	if err := s.checkSendRequest(req); err != nil {
		return nil, err
	}
	blobs, err := sendBlobs(req)
	if err != nil {
		return nil, err
	}
	// Bring the outbox index up to date outside the lock, so the capacity check under
	// the lock usually finds it current. Losing this race only costs that check a
	// reconciliation; a cancelled ctx stops here.
	if err := s.Prepare(ctx); err != nil && ctx.Err() != nil {
		return nil, errcode.Ensure(err, errcode.OutboxStoreBusy, s.dir)
	}
	var out *record.Message
	err = s.preparedTx(ctx, func(tx *Tx) error {
		m, err := s.planEnqueue(tx, req)
		out = m
		return err
	}, func(pub *Tx) error {
		// Under the lock, in the hold that publishes the plan: maintenance removes
		// blobs under the lock too, so a blob found here is there when the records
		// that refer to it are published (DESIGN §10).
		if err := s.checkBlobs(blobs); err != nil {
			return err
		}
		return s.checkCapacity(pub, req)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Store) checkSendRequest(req SendRequest) error {
	bad := func(format string, args ...any) error {
		return errcode.New(errcode.OutboxStoreInvalid, "message "+req.MessageID, fmt.Errorf(format, args...))
	}
	switch {
	case !uuid.Valid(req.MessageID):
		return bad("message id is not a lower-case UUID")
	case len(req.Envelopes) == 0 || len(req.Envelopes) > record.MaxBatchMembers:
		return bad("a message has 1..%d envelopes", record.MaxBatchMembers)
	case req.DeliveryDeadline.UnixMilli() <= s.nowMs():
		return errcode.New(errcode.OutboxDeadlineExpired, "message "+req.MessageID, nil)
	}
	for _, e := range req.Envelopes {
		if int64(len(e.Envelope)) > s.limits.WireBytes {
			return errcode.New(errcode.OutboxFull, "envelope "+e.EnvelopeID, errors.New("envelope exceeds the wire size limit"))
		}
	}
	return nil
}

// planEnqueue plans the records of req. If the message is already accepted (its
// batch committed) it plans nothing and returns it. If an earlier enqueue of the same
// message was interrupted after some of its records were published but before the
// marker, the plan finishes it: it keeps the members already there (same envelopes)
// and their batch id, and writes what is missing, the marker last. A one-envelope
// message gets the batch id of its envelope and no marker (a single, DESIGN §7): the
// member first, the message record last. One whose member is already stored keeps
// that member's batch id, so an interrupted enqueue of the marker protocol is finished
// with its marker.
func (s *Store) planEnqueue(tx *Tx, req SendRequest) (*record.Message, error) {
	now := s.nowMs()
	deadline := req.DeliveryDeadline.UnixMilli()
	retain := deadline + s.retain.Milliseconds()
	msg := &record.Message{MessageID: req.MessageID, Status: record.StatusQueued, PeerOwnerDID: string(req.PeerOwnerDID),
		RelayURL: req.RelayURL, EnvelopeDigest: envelope.Digest(req.Envelopes[0].Envelope), DeliveryDeadline: deadline,
		CreatedAt: now, UpdatedAt: now, RetainUntil: retain}
	prev, err := TxGet[*record.Message](tx, req.MessageID)
	if err != nil {
		return nil, err
	}
	if prev != nil && prev.EnvelopeDigest != msg.EnvelopeDigest {
		return nil, conflict(msg, "message id already used for another message")
	}
	if prev != nil && prev.Status != record.StatusQueued {
		// Relayed, delivered or closed: it was accepted, and its envelopes were sent
		// or ended (maintenance may have removed them since). Nothing to write: a
		// fresh member would be committed by this message record and sent again.
		return prev, nil
	}
	// Members already present (an interrupted enqueue) fix the batch id.
	batchID := ""
	existing := make([]*record.Outbox, len(req.Envelopes))
	for i, e := range req.Envelopes {
		r, err := tx.get(record.KindOutbox, e.EnvelopeID)
		if err != nil {
			return nil, err
		}
		o, _ := r.(*record.Outbox)
		if o == nil {
			continue
		}
		if o.MessageID != req.MessageID || o.EnvelopeDigest != envelope.Digest(e.Envelope) || o.Ordinal != i ||
			(batchID != "" && o.BatchID != batchID) {
			return nil, conflict(o, "envelope id already in the outbox for another message")
		}
		batchID, existing[i] = o.BatchID, o
	}
	if prev != nil && batchID != "" {
		if members, err := tx.Committed(batchID); err == nil && len(members) == len(req.Envelopes) {
			return prev, nil // already accepted
		}
	}
	if prev != nil {
		msg = prev // keep the first attempt's times
		deadline, retain = prev.DeliveryDeadline, prev.RetainUntil
	}
	if batchID == "" && len(req.Envelopes) == 1 {
		// A single, unless a marker already has that id (envelope ids are the caller's).
		b, err := TxGet[*record.Batch](tx, req.Envelopes[0].EnvelopeID)
		if err != nil {
			return nil, err
		}
		if b == nil {
			batchID = req.Envelopes[0].EnvelopeID
		}
	}
	if batchID == "" {
		batchID = uuid.NewString()
	}
	single := len(req.Envelopes) == 1 && record.IsSingle(batchID, req.Envelopes[0].EnvelopeID, 0)
	var writes []record.Record
	for i, e := range req.Envelopes {
		if existing[i] != nil {
			continue
		}
		writes = append(writes, &record.Outbox{EnvelopeID: e.EnvelopeID, MessageID: req.MessageID, BatchID: batchID,
			EnvelopeKind: e.Kind, State: record.StatePending, Ordinal: i, RelayURL: req.RelayURL,
			PeerOwnerDID: string(req.PeerOwnerDID), DeliveryDeadline: deadline, NextAttemptAt: now,
			Envelope: e.Envelope, EnvelopeDigest: envelope.Digest(e.Envelope), RetainUntil: retain})
	}
	if single {
		// The member first, then the message record that commits it.
		if err := tx.PutAll(writes...); err != nil {
			return nil, err
		}
		if prev == nil {
			if err := tx.putLast(msg); err != nil {
				return nil, err
			}
		}
		return record.Clone(msg).(*record.Message), nil
	}
	if prev == nil {
		writes = append(writes, msg)
	}
	batch := &record.Batch{BatchID: batchID, MessageID: req.MessageID, PeerOwnerDID: string(req.PeerOwnerDID),
		RelayURL: req.RelayURL, DeliveryDeadline: deadline, CreatedAt: now, RetainUntil: retain}
	for _, e := range req.Envelopes {
		batch.EnvelopeIDs = append(batch.EnvelopeIDs, e.EnvelopeID)
	}
	// Members and message first, then the marker once they are durable.
	if err := tx.PutAll(writes...); err != nil {
		return nil, err
	}
	if err := tx.putLast(batch); err != nil {
		return nil, err
	}
	return record.Clone(msg).(*record.Message), nil
}

// checkCapacity checks, under the lock, that req's new message fits the DESIGN §5 limits,
// from the outbox and messages indexes: kept current by this process's publications,
// and reconciled only if another process published to their kind since. The message
// records that earlier plans of the same group commit publish last are counted too.
func (s *Store) checkCapacity(pub *Tx, req SendRequest) error {
	gen := pub.heldGeneration()
	outbox, err := s.prepareIndexHeld(pub.ctx, record.KindOutbox, gen)
	if err != nil {
		return err
	}
	msgs, err := s.prepareIndexHeld(pub.ctx, record.KindMessages, gen)
	if err != nil {
		return err
	}
	var newBytes int64
	for _, e := range req.Envelopes {
		newBytes += int64(len(e.Envelope))
	}
	s.mu.Lock()
	ob := s.answer(record.KindOutbox, outbox)
	pending, total := ob.pending, newBytes+ob.bytes
	messages := len(s.answer(record.KindMessages, msgs).messages) + pub.unpublishedCreates(record.KindMessages)
	s.mu.Unlock()
	switch {
	case pending+len(req.Envelopes) > s.limits.PendingEnvelopes:
		return errcode.New(errcode.OutboxFull, "outbox", fmt.Errorf("%d pending envelopes", pending))
	case total > s.limits.EnvelopeBytes:
		return errcode.New(errcode.OutboxFull, "outbox", errors.New("envelope bytes limit reached"))
	case messages >= s.limits.Messages:
		return errcode.New(errcode.OutboxFull, "messages", fmt.Errorf("%d messages", messages))
	}
	return nil
}

// Committed returns the members of batch id if its marker exists and every member it
// lists is present and consistent (same message, peer, relay and deadline, ordinals
// 0..n-1 in order); (nil, nil) if the marker is absent; OUTBOX_STORE_INVALID if the
// batch is broken. Without a marker, a single whose envelope id is id (DESIGN §7) is
// its batch's one member if its message record commits it; (nil, nil) if not.
func (tx *Tx) Committed(batchID string) ([]*record.Outbox, error) {
	return committed(batchID, tx.get)
}

// Committed is Tx.Committed outside a transaction. It stays exported for the crash
// explorer (internal/crashtest), which checks after every crash state, without taking
// the lock, that each marker's members are present and consistent.
func (s *Store) Committed(batchID string) ([]*record.Outbox, error) {
	return committed(batchID, s.read)
}

func committed(batchID string, get func(record.Kind, string) (record.Record, error)) ([]*record.Outbox, error) {
	r, err := get(record.KindBatches, batchID)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return committedSingle(batchID, get)
	}
	b := r.(*record.Batch)
	members := make([]*record.Outbox, 0, len(b.EnvelopeIDs))
	for i, id := range b.EnvelopeIDs {
		r, err := get(record.KindOutbox, id)
		if err != nil {
			return nil, err
		}
		o, _ := r.(*record.Outbox)
		if !record.MemberOf(b, i, o) {
			return nil, invalidAt("batches/"+batchID, fmt.Errorf("member %d is missing or inconsistent", i))
		}
		members = append(members, record.Clone(o).(*record.Outbox))
	}
	return members, nil
}

// committedSingle returns outbox record id as its batch's one member if it is a single
// that its message record commits, or nil.
func committedSingle(id string, get func(record.Kind, string) (record.Record, error)) ([]*record.Outbox, error) {
	r, err := get(record.KindOutbox, id)
	if err != nil || r == nil {
		return nil, err
	}
	o := r.(*record.Outbox)
	if !record.IsSingle(o.BatchID, o.EnvelopeID, o.Ordinal) {
		return nil, nil
	}
	mr, err := get(record.KindMessages, o.MessageID)
	if err != nil {
		return nil, err
	}
	if m, _ := mr.(*record.Message); !record.CommitsSingle(m, o) {
		return nil, nil // an enqueue that never committed
	}
	return []*record.Outbox{record.Clone(o).(*record.Outbox)}, nil
}

// Message returns the status of a sent message, or nil if there is none. A queued
// message whose batch is not committed (its marker missing; for a single, the member
// missing) was never accepted and is reported as absent.
func (s *Store) Message(id string) (*record.Message, error) {
	m, err := GetAs[*record.Message](s, id)
	if err != nil || m == nil {
		return nil, err
	}
	if m.Status == record.StatusQueued {
		ok, err := s.messageCommitted(context.Background(), id)
		if err != nil || !ok {
			return nil, err
		}
	}
	return m, nil
}

func (s *Store) messageCommitted(ctx context.Context, id string) (bool, error) {
	batch, err := s.batchOf(ctx, id)
	if err != nil || batch == "" {
		return false, err
	}
	mem, err := s.Committed(batch)
	return len(mem) > 0, err
}

// batchOf returns the batch id of message id's outbox members, or "".
func (s *Store) batchOf(ctx context.Context, messageID string) (string, error) {
	ix, err := s.prepareIndex(ctx, record.KindOutbox)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range ix.outbox {
		if e.MessageID == messageID {
			return e.BatchID, nil
		}
	}
	return "", nil
}

// Pending returns the dispatchable envelopes of a message: pending members of a
// committed batch, in ordinal order.
func (s *Store) Pending(ctx context.Context, messageID string) ([]*record.Outbox, error) {
	batch, err := s.batchOf(ctx, messageID)
	if err != nil || batch == "" {
		return nil, err
	}
	members, err := s.Committed(batch)
	if err != nil {
		return nil, err
	}
	var out []*record.Outbox
	for _, m := range members {
		if m.State == record.StatePending {
			out = append(out, m)
		}
	}
	return out, nil
}

// AcceptedMessage returns message id if it is accepted (its batch committed), or
// nil. It first fsyncs the directories of the message's records (outbox, messages and,
// if a marker commits it, batches): the publication
// that made the message visible may have been followed by a failed directory fsync
// (its Enqueue answered OUTBOX_STORE_UNWRITABLE although the marker was renamed into
// place), and whoever reports the message as accepted must rest on durable records.
// A failed fsync is OUTBOX_STORE_UNWRITABLE: the message may be accepted, unknown.
func (s *Store) AcceptedMessage(id string) (*record.Message, error) {
	m, err := s.Message(id)
	if err != nil || m == nil {
		return nil, err
	}
	dirs := map[string]bool{string(record.KindOutbox): true, string(record.KindMessages): true}
	batch, err := s.batchOf(context.Background(), id)
	if err != nil {
		return nil, err
	}
	if batch != "" {
		b, err := GetAs[*record.Batch](s, batch)
		if err != nil {
			return nil, err
		}
		if b != nil { // a marker commits it; a single needs no batches directory
			dirs[string(record.KindBatches)] = true
		}
	}
	if err := s.syncDirs(dirs); err != nil {
		return nil, err
	}
	return m, nil
}

// ResumeEnqueue finishes an enqueue of message messageID that was interrupted (by a
// crash) after its outbox members were published but before its batch marker: it
// rebuilds the SendRequest from the stored members (their envelope bytes, kinds and
// routing) and calls Enqueue, which keeps what is there and writes the rest, the
// marker last. It returns (message, true, nil) when the message is accepted — already
// or now — and (nil, false, nil) when no member of it is stored (nothing to resume).
// An already accepted message is returned by AcceptedMessage (its directories
// fsynced again), so resuming also finishes an enqueue whose last directory fsync
// failed. Members that do not form ordinals 0..n-1 of one batch answer
// OUTBOX_STORE_INVALID. Before it finishes the enqueue it fsyncs the directories of
// the records already there (outbox, and messages if the record is there): the
// interrupted attempt may have renamed them and then failed its directory fsync, and
// the commit written now must rest on durable records.
func (s *Store) ResumeEnqueue(ctx context.Context, messageID string) (*record.Message, bool, error) {
	if m, err := s.AcceptedMessage(messageID); err != nil || m != nil {
		return m, m != nil, err
	}
	sums, err := s.OutboxSummaries(ctx)
	if err != nil {
		return nil, false, err
	}
	var members []*record.Outbox
	for _, e := range sums { // sorted by (message, ordinal)
		if e.MessageID != messageID {
			continue
		}
		o, err := GetAs[*record.Outbox](s, e.EnvelopeID)
		if err != nil {
			return nil, false, err
		}
		if o == nil {
			continue
		}
		members = append(members, o)
	}
	if len(members) == 0 {
		return nil, false, nil
	}
	first := members[0]
	req := SendRequest{MessageID: messageID, PeerOwnerDID: identity.DID(first.PeerOwnerDID), RelayURL: first.RelayURL,
		DeliveryDeadline: time.UnixMilli(first.DeliveryDeadline)}
	for i, o := range members {
		if o.Ordinal != i || o.BatchID != first.BatchID || o.RelayURL != first.RelayURL ||
			o.PeerOwnerDID != first.PeerOwnerDID || o.DeliveryDeadline != first.DeliveryDeadline {
			return nil, false, invalidAt("outbox/"+o.EnvelopeID, fmt.Errorf("interrupted enqueue of message %s cannot be resumed", messageID))
		}
		req.Envelopes = append(req.Envelopes, OutgoingEnvelope{EnvelopeID: o.EnvelopeID, Kind: o.EnvelopeKind, Envelope: o.Envelope})
	}
	dirs := map[string]bool{string(record.KindOutbox): true}
	if m, err := GetAs[*record.Message](s, messageID); err != nil {
		return nil, false, err
	} else if m != nil {
		dirs[string(record.KindMessages)] = true
	}
	if err := s.syncDirs(dirs); err != nil {
		return nil, false, err
	}
	m, err := s.Enqueue(ctx, req)
	if err != nil {
		return nil, false, err
	}
	return m, true, nil
}

// blobMention is how the payload of an envelope with a blob body names it. Every
// string of an envelope is an id, a DID, base64url, a digest or a fixed word, none of
// which holds a quote, so only the body's key can match: an envelope without it has
// no blob and is not parsed (a signature check per enqueue saved).
var blobMention = []byte(`"blob":`)

// envelopeBlob returns the blob reference of the signed envelope raw, or false if its
// body is not a blob. An envelope that names a blob but does not parse is
// OUTBOX_STORE_INVALID: what it refers to cannot be told.
func envelopeBlob(raw []byte) (envelope.BlobRef, bool, error) {
	if !bytes.Contains(raw, blobMention) {
		return envelope.BlobRef{}, false, nil
	}
	env, err := envelope.Parse(raw)
	if err != nil {
		return envelope.BlobRef{}, false, err
	}
	ref, ok := env.Blob()
	return ref, ok, nil
}

// sendBlobs returns the blob references of req's envelopes.
func sendBlobs(req SendRequest) ([]envelope.BlobRef, error) {
	var refs []envelope.BlobRef
	for _, e := range req.Envelopes {
		ref, ok, err := envelopeBlob(e.Envelope)
		if err != nil {
			return nil, invalidAt("envelope "+e.EnvelopeID, fmt.Errorf("it names a blob but does not parse: %w", err))
		}
		if ok {
			refs = append(refs, ref)
		}
	}
	return refs, nil
}

// checkObservedBlobs checks, under the lock in the hold that publishes plan,
// that the blob of every observation plan writes with a Blob is in blobs/ with
// its size (checkBlobs): maintenance removes blobs only under the lock, so an
// observation is never published naming a blob that a collection removed
// between its download and its transaction (a blob committed longer than the
// grace time before, by a receiver that crashed before its records).
func (s *Store) checkObservedBlobs(plan *Tx) error {
	var refs []envelope.BlobRef
	for _, w := range plan.writes {
		if o, ok := w.rec.(*record.Observation); ok && o.Blob != nil {
			refs = append(refs, envelope.BlobRef{EnvelopeID: o.Blob.EnvelopeID, Digest: o.Blob.Digest, Size: o.Blob.Size})
		}
	}
	return s.checkBlobs(refs)
}

// checkBlobs checks that every blob of refs is in blobs/ — a private regular file
// with one link — with its size: BODY_MISSING otherwise (absent, or another size),
// OUTBOX_STORE_INVALID for a file that breaks the blob rules.
func (s *Store) checkBlobs(refs []envelope.BlobRef) error {
	for _, ref := range refs {
		name := blobPath(ref.Digest)
		info, err := s.fs.Lstat(name)
		switch {
		case fsx.IsNotExist(err):
			return errcode.New(errcode.BodyMissing, "envelope "+ref.EnvelopeID, fmt.Errorf("its blob %s is not in the store", ref.Digest))
		case err != nil:
			return invalidAt(name, err)
		}
		if err := fsx.CheckPrivateFile(name, info); err != nil {
			return invalidAt(name, err)
		}
		if info.Size != ref.Size {
			return errcode.New(errcode.BodyMissing, "envelope "+ref.EnvelopeID,
				fmt.Errorf("its blob %s holds %d bytes, the envelope says %d", ref.Digest, info.Size, ref.Size))
		}
	}
	return nil
}
