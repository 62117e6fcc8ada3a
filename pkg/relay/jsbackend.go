package relay

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// jsBackend is the JetStream storage (pkg/relay/jsstore): inbox messages,
// de-duplication records and the allow-list in JetStream, shared by every
// relay process on the same stream and buckets.
//
// Its cursors are "j" + the stream sequence, so they never parse as the file
// storage's decimal cursors and the other way round: each takes the other's
// as the start. Quotas read the inbox's usage with jsstore's Status, a scan of
// the waiting envelopes' headers (one per accept while a quota is set: its
// cost grows with the inbox, bounded by the quota itself).
type jsBackend struct {
	st        *jsstore.Store
	now       func() time.Time
	stopWatch func()
	bodies    *jsBodies // jsbodies.go
	log       *slog.Logger
	// statusRetention is how long an acknowledged delivery status is
	// retained (0: not at all).
	statusRetention time.Duration
}

// jsCursorPrefix marks a JetStream storage cursor.
const jsCursorPrefix = "j"

// jsCursor parses a JetStream storage cursor: jsstore's cursor and true, or
// false when s is not of that format, or a 400 when it is malformed.
func jsCursor(s string) (string, bool, error) {
	rest, ok := strings.CutPrefix(s, jsCursorPrefix)
	if !ok {
		return "", false, nil
	}
	if _, err := jsstore.ParseCursor(rest); err != nil || rest == "" {
		return "", false, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "after is not a cursor")
	}
	return rest, true, nil
}

// openJetStream opens the JetStream storage on nc and subscribes to the accept
// notifications of every relay process, which wake the held fetches.
func openJetStream(ctx context.Context, nc *nats.Conn, opts jsstore.Options, now func() time.Time, log *slog.Logger, wake func(string)) (*jsBackend, error) {
	st, err := jsstore.Open(ctx, nc, opts)
	if err != nil {
		return nil, err // jsstore's errors say what to change
	}
	b, err := st.Bodies(ctx, jsstore.BodiesOptions{Replicas: opts.Replicas, SyncAlways: opts.SyncAlways})
	if err != nil {
		return nil, err
	}
	stop, err := st.Watch(wake)
	if err != nil {
		return nil, err
	}
	return &jsBackend{st: st, now: now, stopWatch: stop, bodies: &jsBodies{b: b}, log: log}, nil
}

// jsError is the answer to a JetStream failure: 503, the sender retries.
func jsError(err error) *relayproto.Error {
	return unavailable(relayproto.CodeRelayStorageUnavailable, "the relay's JetStream storage is unavailable", err)
}

func (j *jsBackend) close() error {
	if j.stopWatch != nil {
		j.stopWatch()
		j.stopWatch = nil
	}
	return nil
}

func heldOfJS(h jsstore.Held) held {
	return held{envelopeID: h.EnvelopeID, digest: h.Digest, receivedAt: h.ReceivedAt.UnixMilli(),
		senderKey: h.SenderKey, senderSeq: h.SenderSeq}
}

func (j *jsBackend) lookup(ctx context.Context, id string) (*held, error) {
	h, ok, err := j.st.Lookup(ctx, id)
	if err != nil {
		return nil, jsError(err)
	}
	if !ok {
		return nil, nil
	}
	hh := heldOfJS(h)
	return &hh, nil
}

// put puts the envelopes one after the other, in order. A failure answers the
// whole batch "retry later"; the envelopes put before it are held, and the
// retry answers them as duplicates.
func (j *jsBackend) put(ctx context.Context, items []*newEnvelope) error {
	for _, it := range items {
		env := it.env
		h, dup, err := j.st.PutFrom(ctx, env.Recipient(), env.ID(), env.Digest(), it.wire, blobSize(env),
			it.receivedAt, time.UnixMilli(env.DeliveryDeadlineMillis()), env.Sender(), it.senderSeq)
		switch {
		case errors.Is(err, jsstore.ErrConflict):
			it.held, it.outcome = heldOfJS(h), putConflict
		case err != nil:
			return jsError(err)
		case dup: // another process (or an earlier attempt) holds it
			it.held, it.outcome = heldOfJS(h), putDuplicate
		default:
			it.held, it.outcome = heldOfJS(h), putNew
		}
	}
	return nil
}

// cursor turns a protocol cursor into jsstore's: "j<seq>" is ours; "" and
// anything else that parses as a file storage cursor (digits) is the start.
func (j *jsBackend) cursor(s string) (string, error) {
	if rest, ok, err := jsCursor(s); ok || err != nil {
		return rest, err
	}
	if _, err := parseFileCursor(s); err != nil {
		return "", err
	}
	return "", nil
}

func (j *jsBackend) fetch(ctx context.Context, recipient identity.DID, after string, limit int) (*relayproto.InboxPage, error) {
	c, err := j.cursor(after)
	if err != nil {
		return nil, err
	}
	p, err := j.st.Fetch(ctx, recipient, c, limit)
	if err != nil {
		return nil, jsError(err)
	}
	nowMs := j.now().UnixMilli()
	page := &relayproto.InboxPage{Envelopes: []relayproto.InboxEnvelope{}, Cursor: jsCursorPrefix + p.Cursor, More: p.More}
	for _, e := range p.Envelopes {
		if e.Deadline.UnixMilli() <= nowMs {
			continue // expired: never served, removed by expire
		}
		page.Envelopes = append(page.Envelopes, relayproto.InboxEnvelope{
			Cursor: jsCursorPrefix + e.Cursor, EnvelopeID: e.EnvelopeID, EnvelopeDigest: e.Digest,
			ReceivedAt: e.ReceivedAt.UnixMilli(), Envelope: e.Wire,
		})
	}
	return page, nil
}

func (j *jsBackend) ack(ctx context.Context, recipient identity.DID, ids []string) (int, error) {
	var retain func([]byte) time.Time
	if j.statusRetention > 0 {
		retain = func(wire []byte) time.Time {
			if !isStatusWire(wire) {
				return time.Time{}
			}
			return j.now().Add(j.statusRetention)
		}
	}
	n, err := j.st.AckRetaining(ctx, recipient, ids, retain, func(id string, wire []byte) {
		if isBlobWire(wire) {
			j.dropBody(ctx, id)
		}
	})
	if err != nil {
		return n, jsError(err)
	}
	return n, nil
}

func (j *jsBackend) status(ctx context.Context, recipient identity.DID) (relayproto.InboxStatus, error) {
	st, err := j.st.StatusAt(ctx, recipient, j.now())
	if err != nil {
		return relayproto.InboxStatus{}, jsError(err)
	}
	out := relayproto.InboxStatus{Count: st.Count, Bytes: st.Bytes}
	if st.Count > 0 {
		out.OldestReceivedAt, out.NewestReceivedAt = st.Oldest.UnixMilli(), st.Newest.UnixMilli()
	}
	return out, nil
}

func (j *jsBackend) usage(ctx context.Context, recipient identity.DID) (usage, error) {
	st, err := j.st.StatusAt(ctx, recipient, j.now()) // an expired envelope takes no room
	if err != nil {
		return usage{}, jsError(err)
	}
	return usage{st.Count, st.Bytes}, nil
}

// expire removes the envelopes with a deadline at or before now (jsstore's
// Expire removes those before its argument). Every relay process runs it; a
// message removed by another meanwhile is skipped.
func (j *jsBackend) expire(ctx context.Context, now time.Time) (int, error) {
	// The body of every envelope removed: the scan reads headers only, and
	// removing a body that is not there costs a lookup.
	n, err := j.st.ExpireEach(ctx, now.Add(time.Millisecond), func(id string) { j.dropBody(ctx, id) })
	if err != nil {
		return n, jsError(err)
	}
	return n, nil
}

func (j *jsBackend) registered(ctx context.Context, did identity.DID) (bool, error) {
	ok, err := j.st.Registered(ctx, did)
	if err != nil {
		return false, jsError(err)
	}
	return ok, nil
}

func (j *jsBackend) register(ctx context.Context, did identity.DID) error {
	if err := j.st.Register(ctx, did); err != nil {
		return jsError(err)
	}
	return nil
}

func (j *jsBackend) unregister(ctx context.Context, did identity.DID) error {
	if err := j.st.Unregister(ctx, did); err != nil {
		return jsError(err)
	}
	return nil
}

func (j *jsBackend) senderHead(ctx context.Context, sender identity.DID) ([]byte, error) {
	data, err := j.st.Head(ctx, sender)
	if err != nil {
		return nil, jsError(err)
	}
	return data, nil
}

func (j *jsBackend) raiseHead(ctx context.Context, data []byte, _ *envelope.StoreHead) (int64, error) {
	seq, err := j.st.RaiseHead(ctx, data)
	if err != nil {
		return 0, jsError(err)
	}
	return seq, nil
}

func (j *jsBackend) sent(ctx context.Context, id string) (*held, bool, error) {
	h, waiting, ok, err := j.st.Sent(ctx, id, j.now().UnixMilli())
	if err != nil {
		return nil, false, jsError(err)
	}
	if !ok {
		return nil, false, nil
	}
	hh := heldOfJS(h)
	return &hh, waiting, nil
}

func (j *jsBackend) statusesPage(ctx context.Context, recipient identity.DID, since int64, after string, limit int) (*relayproto.InboxPage, error) {
	c, err := j.cursor(after)
	if err != nil {
		return nil, err
	}
	p, err := j.st.PageStatuses(ctx, recipient, time.UnixMilli(since), j.now(), c, limit)
	if err != nil {
		return nil, jsError(err)
	}
	page := &relayproto.InboxPage{Envelopes: []relayproto.InboxEnvelope{}, Cursor: jsCursorPrefix + p.Cursor, More: p.More}
	for _, e := range p.Envelopes {
		page.Envelopes = append(page.Envelopes, relayproto.InboxEnvelope{
			Cursor: jsCursorPrefix + e.Cursor, EnvelopeID: e.EnvelopeID, EnvelopeDigest: e.Digest,
			ReceivedAt: e.ReceivedAt.UnixMilli(), Envelope: e.Wire,
		})
	}
	return page, nil
}

// statusMarker is in every delivery-status envelope's bytes (its payload is
// canonical JSON within them): envelopes without it are not parsed again.
var statusMarker = []byte(`"kind":"delivery-status"`)

// isStatusWire reports whether wire is a delivery-status envelope (the
// relay verified it when it accepted it).
func isStatusWire(wire []byte) bool {
	if !bytes.Contains(wire, statusMarker) {
		return false
	}
	env, err := envelope.Parse(wire)
	return err == nil && env.Kind() == envelope.KindDeliveryStatus
}
