// Package relay is sealbridge's reference relay (DESIGN §12): an HTTP/1.1 +
// JSON service that accepts signed wire envelopes from carriers, answers each
// with its own signed receipt, de-duplicates them durably by envelopeId and
// digest, and holds them in per-recipient inboxes that the recipient fetches
// and acknowledges with requests signed by its key. docs/RELAY.md is the
// protocol; pkg/relayproto defines it for the relay and its clients alike.
//
// Persistence (the file storage, the default; Options.JetStream selects NATS
// JetStream instead, pkg/relay/jsstore, shared by several relay processes):
// the relay has an identity of its own and keeps its
// de-duplication records in a store of that identity (pkg/store, kind
// receipts, id record.ReceiptID(envelopeId)). The envelope bytes waiting in
// inboxes live in a relay-private directory next to the store, one file per
// envelope, written durably through internal/fsx (O_EXCL temp, fsync, a rename
// that never replaces, directory fsync) before the receipt record, and read
// without following a symlink or blocking on a FIFO; an envelope is acknowledged
// (200) only after both
// are durable. The signed receipt is not stored as bytes: Ed25519 signatures
// are deterministic, so signing the stored fields (envelopeId, digest,
// receivedAt, senderSeq) again with the same key reproduces the first receipt
// byte for byte. The relay also witnesses its senders' store heads and retains
// acknowledged delivery statuses (witness.go).
package relay

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// DefaultListen is the address both relay commands (sealbridge relay and
// sealbridge-relay) listen on unless --listen says otherwise.
const DefaultListen = "127.0.0.1:8470"

// Limits of this relay (the protocol's own are relayproto's).
const (
	// maxPageBytes bounds the envelope bytes of one inbox page (at least one
	// envelope is always returned when one is due).
	maxPageBytes = 4 << 20
	// dedupeRetention is how long after an envelope's delivery deadline its
	// receipt record (and so its de-duplication) is kept.
	dedupeRetention = 24 * time.Hour
	// maxNonces bounds the replay cache; past it inbox requests get 503.
	maxNonces = 1 << 20
)

// Options configure a Relay. Identity is required, and Home unless JetStream
// is set.
type Options struct {
	// Identity is the relay's own identity: it signs receipts and owns the store.
	Identity *identity.Identity
	// Home is the data root of the file storage: the store is
	// <Home>/delivery/<hex sha256(DID)> (store.Options.Home) and the inboxes
	// <Home>/relay/<hex sha256(DID)>. Unused with JetStream.
	Home string
	// JetStream, if set, selects the JetStream storage (pkg/relay/jsstore) on
	// this connection instead of the files: inboxes, de-duplication records
	// and the allow-list shared by every relay process of this identity on the
	// same stream and buckets. The connection stays the caller's (Close does
	// not close it). New refuses a stream that is neither replicated nor
	// declared synced on every write, before it creates anything
	// (jsstore.ErrNotDurable; the error carries JetStreamHint's hint).
	JetStream *nats.Conn
	// JetStreamOptions configure the JetStream storage (names, replicas, the
	// SyncAlways declaration, retention).
	JetStreamOptions jsstore.Options
	// Now is the clock (default time.Now). Only tests set it, to step a fake
	// clock across the signed-request window, dedupe retention, deadlines and
	// the sender rate.
	Now func() time.Time
	// Limits bound what the relay accepts and keeps (the zero value: nothing).
	Limits Limits
	// Logger receives one line per request outcome (default slog.Default()).
	// It never sees payloads or keys.
	Logger *slog.Logger
	// OnAccept, if set, is called after an envelope is durable and before the
	// receipt is written to the client — for a new envelope (duplicate false)
	// and for a de-duplicated one (duplicate true). Tests use it to observe
	// acceptance or to kill a sender between send and settle.
	OnAccept func(envelopeID, digest string, duplicate bool)
	// WrapFS, if set, wraps the file systems of both the store
	// (store.Options.WrapFS) and the inbox directory of the file storage:
	// fault injection and crash exploration in tests.
	WrapFS func(fsx.FS) fsx.FS
	// Version is the version of the binary, for the sealbridge_relay_build_info
	// series of GET /metrics.
	Version string
	// StatusRetention is how long the relay keeps a delivery-status envelope
	// after its recipient acknowledged it, for GET /v1/inbox/statuses
	// (default DefaultStatusRetention; negative: none is kept).
	StatusRetention time.Duration
	// MaxInboxWaiters bounds the inbox fetches held at once (GET /v1/inbox
	// with wait=); past it a waiting fetch gets 503 RELAY_BUSY. Default
	// DefaultMaxInboxWaiters.
	MaxInboxWaiters int
}

// Stats counts what a Relay did since it started.
type Stats struct {
	Accepted   int64 // new envelopes stored
	Duplicates int64 // the same envelope again, answered with the stored receipt
	Conflicts  int64 // same envelopeId, other digest (409)
	Refused    int64 // other 4xx answers to POST /v1/envelopes
	Acked      int64 // envelopes removed from inboxes by acknowledgements
	// Limits (Options.Limits): refusals and removals.
	OverQuota   int64 // 429 RELAY_QUOTA
	RateLimited int64 // 429 RELAY_RATE_LIMITED
	NotAllowed  int64 // 403 RECIPIENT_NOT_ALLOWED
	Expired     int64 // envelopes removed from inboxes past their deadline
	// Bodies (blob envelopes).
	BodiesPending          int64 // pending envelopes now (not yet fetchable)
	BodiesCompleted        int64 // bodies complete and verified: their envelopes entered an inbox
	BodiesExpired          int64 // pending envelopes dropped past their deadline
	BodyDigestMismatches   int64 // complete bodies discarded for a wrong SHA-256 (422)
	UploadOffsetMismatches int64 // PATCHes answered 409
	BodyBytesIn            int64 // body bytes received by PATCHes (appended or not)
	BodyBytesOut           int64 // body bytes sent by downloads
	// Store heads (witness.go).
	HeadsWitnessed int64 // valid heads carried by posts
	HeadsBehind    int64 // of them, heads below the one the relay kept for their sender
	HeadsInvalid   int64 // posts refused 400 HEAD_INVALID
}

// Relay is the reference relay. Its Handler is safe for concurrent use; with
// the file storage one Relay (one process) owns its inbox directory at a time,
// with JetStream several share one stream.
type Relay struct {
	id       *identity.Identity
	back     storage
	now      func() time.Time
	log      *slog.Logger
	onAccept func(string, string, bool)
	started  time.Time

	stripes [64]sync.Mutex // serialize accepts of one envelopeId (in this process)
	// quotaStripes serialize, per recipient, reading an inbox's usage and
	// reserving a place in it against the release of another reservation.
	quotaStripes [64]sync.Mutex

	mu       sync.Mutex
	stats    Stats
	reserved map[string]usage // recipient dir name → quota held by accepts in flight

	limits    Limits
	rate      *senderRate
	stopMaint chan struct{}
	maintDone chan struct{}
	waits     waitState // held fetches (wait.go)

	nonces nonceCache

	// Witnessed store heads (witness.go).
	headStripes [64]sync.Mutex // serialize, per sender, the updates of heads
	heads       *headCache

	// Bodies (bodies.go): nil bodies when the storage keeps none.
	bodies   bodyStore
	maxBody  int64
	upMu     sync.Mutex
	upIdle   chan struct{}      // closed (and cleared) when an upload stops being busy; guarded by upMu
	uploads  map[string]*upload // pending envelope id → its upload
	pendUse  map[string]usage   // recipient dir → what its pending envelopes claim of its quota
	byteRate *senderRate        // Limits.SenderByteRate

	backendName string // "file" or "jetstream"
	codes       counts // refusals and error answers by code (ops.go), guarded by mu
	ops         ops    // /readyz's probe and /metrics's registry
}

// New opens the relay's storage — the files under Options.Home (openFiles),
// or JetStream when Options.JetStream is set — and starts the expiry pass.
func New(opts Options) (*Relay, error) {
	if opts.Identity == nil {
		return nil, errors.New("relay: Options.Identity is required")
	}
	if err := opts.Limits.Check(); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	r := &Relay{
		id: opts.Identity, now: opts.Now, log: opts.Logger, onAccept: opts.OnAccept,
		reserved: map[string]usage{}, limits: opts.Limits, rate: newSenderRate(opts.Limits),
		byteRate: newByteRate(opts.Limits), maxBody: cmp.Or(opts.Limits.MaxBody, DefaultMaxBody),
		uploads: map[string]*upload{}, pendUse: map[string]usage{}, heads: newHeadCache(),
	}
	switch {
	case opts.StatusRetention == 0:
		opts.StatusRetention = DefaultStatusRetention
	case opts.StatusRetention < 0:
		opts.StatusRetention = 0
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.started = r.now()
	r.waits.max = cmp.Or(opts.MaxInboxWaiters, DefaultMaxInboxWaiters)
	r.waits.maxPerAddr = cmp.Or(opts.Limits.HeldPollsPerAddress, DefaultHeldPollsPerAddress)
	r.nonces.entries = map[string]int64{}
	var err error
	r.backendName = "file"
	if opts.JetStream != nil {
		r.backendName = "jetstream"
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		var j *jsBackend
		j, err = openJetStream(ctx, opts.JetStream, opts.JetStreamOptions, r.now, r.log, r.wake)
		cancel()
		if err == nil {
			j.statusRetention = opts.StatusRetention
			r.back, r.bodies = j, j.bodies
		}
		if h := JetStreamHint(err); h != "" {
			err = errcode.WithHint(err, h)
		}
		if err == nil {
			r.log.Info("relay: JetStream storage opened", "relayDid", string(r.id.DID()))
		}
	} else {
		var f *fileStore
		f, err = openFiles(opts, r.now, r.log, r.wake)
		if err == nil {
			r.back, r.bodies = f, f.bodies
		}
	}
	if err != nil {
		return nil, err
	}
	if err := r.loadUploads(context.Background()); err != nil {
		r.back.close()
		return nil, err
	}
	r.newOps(opts.Version)
	if opts.Limits.ExpireEvery > 0 {
		r.stopMaint, r.maintDone = make(chan struct{}), make(chan struct{})
		go r.maintain(opts.Limits.ExpireEvery, r.stopMaint, r.maintDone)
	}
	return r, nil
}

// openTimeout bounds opening the JetStream storage.
const openTimeout = 30 * time.Second

// Stats returns the counters.
func (r *Relay) Stats() Stats {
	r.upMu.Lock()
	pending := int64(len(r.uploads))
	r.upMu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats
	st.BodiesPending = pending
	return st
}

// Close stops the maintenance pass and releases the storage (the inbox
// directory's lock; JetStream's notification subscription). Stop serving the
// Handler first.
func (r *Relay) Close() error {
	if r.stopMaint != nil {
		close(r.stopMaint)
		<-r.maintDone
		r.stopMaint = nil
	}
	if r.back == nil {
		return nil
	}
	err := r.back.close()
	r.back = nil
	return err
}

// recipientDir names a recipient's inbox: hex SHA-256 of the DID, so no
// sender-chosen string becomes a path or a subject (jsstore.RecipientKey is
// the same).
func recipientDir(did identity.DID) string {
	sum := sha256.Sum256([]byte(did))
	return hex.EncodeToString(sum[:])
}

// signReceipt signs the relay receipt of a held envelope. Ed25519 is
// deterministic, so the bytes are the same every time, in every process with
// the relay's key.
func (r *Relay) signReceipt(h *held) ([]byte, error) {
	return envelope.SignRelayReceipt(r.id, envelope.RelayReceipt{
		EnvelopeID: h.envelopeID, EnvelopeDigest: h.digest, State: envelope.ReceiptStatePersisted,
		RelayDID: r.id.DID(), ReceivedAt: time.UnixMilli(h.receivedAt), SenderSeq: h.senderSeq,
	})
}

func (r *Relay) count(f func(s *Stats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// Accept verifies and stores one wire envelope and returns the relay's
// receipt: the same bytes for the same envelope again. Its errors are
// *relayproto.Error values with an HTTP status and a code, but for a blob
// envelope whose body the relay does not hold in full yet: then it is a
// *relayproto.BodyIncompleteError (the 202; bodies.go).
// Exported for the package's external tests, which call it without an HTTP server.
func (r *Relay) Accept(ctx context.Context, data []byte) ([]byte, error) {
	return r.AcceptHead(ctx, data, nil)
}

// AcceptHead is Accept of an envelope posted with the store head head (nil:
// none; witness.go): it must be the head of the envelope's sender (else a 400
// HEAD_INVALID, nothing accepted), and is kept durably before the envelope is.
func (r *Relay) AcceptHead(ctx context.Context, data, head []byte) ([]byte, error) {
	env, err := envelope.Parse(data)
	if err != nil {
		return nil, envelopeError(err)
	}
	floor, err := r.witness(ctx, string(head), []identity.DID{env.Sender()})
	if err != nil {
		return nil, err
	}
	mu := &r.stripes[stripe(env.ID())]
	mu.Lock()
	defer mu.Unlock()

	h, err := r.back.lookup(ctx, env.ID())
	if err != nil {
		return nil, err
	}
	if h != nil {
		r.forgetHeld(env.ID())
		return r.existing(env, h)
	}
	if ref, ok := blobOf(env); ok {
		return r.acceptBlob(ctx, env, data, ref)
	}
	now := r.now()
	if err := env.CheckDeadline(now); err != nil {
		return nil, envelopeError(err)
	}
	res, lerr := r.admit(ctx, env, int64(len(data)))
	if lerr != nil {
		return nil, lerr
	}
	defer r.release(res)
	it := &newEnvelope{env: env, wire: data, receivedAt: now}
	if err := r.stamp(ctx, []*newEnvelope{it}, floor); err != nil {
		return nil, err
	}
	if err := r.back.put(ctx, []*newEnvelope{it}); err != nil {
		return nil, err
	}
	return r.answer(it, 0)
}

// answer is the receipt (or the refusal) of an envelope storage.put handled;
// batch is the size of its batch (0: a single accept).
func (r *Relay) answer(it *newEnvelope, batch int) ([]byte, error) {
	env := it.env
	switch it.outcome {
	case putDuplicate:
		return r.existing(env, &it.held)
	case putConflict:
		r.count(func(s *Stats) { s.Conflicts++ })
		return nil, conflictError(env)
	}
	r.count(func(s *Stats) { s.Accepted++ })
	receipt, err := r.signReceipt(&it.held)
	if err != nil {
		return nil, internalError(err)
	}
	args := []any{"envelopeId", env.ID(), "digest", env.Digest()[:16],
		"sender", string(env.Sender()), "recipient", string(env.Recipient()), "size", len(it.wire)}
	if batch > 0 {
		args = append(args, "batch", batch)
	}
	r.log.Info("relay: envelope accepted", args...)
	if r.onAccept != nil {
		r.onAccept(env.ID(), env.Digest(), false)
	}
	return receipt, nil
}

// existing answers an envelope whose id is held.
func (r *Relay) existing(env *envelope.Envelope, h *held) ([]byte, error) {
	if h.digest != env.Digest() {
		r.count(func(s *Stats) { s.Conflicts++ })
		r.log.Warn("relay: envelope id conflict", "envelopeId", env.ID(), "digest", env.Digest()[:16],
			"storedDigest", h.digest[:min(16, len(h.digest))], "sender", string(env.Sender()))
		return nil, conflictError(env)
	}
	receipt, err := r.signReceipt(h)
	if err != nil {
		return nil, internalError(err)
	}
	r.count(func(s *Stats) { s.Duplicates++ })
	r.log.Info("relay: duplicate envelope", "envelopeId", env.ID(), "digest", env.Digest()[:16])
	if r.onAccept != nil {
		r.onAccept(env.ID(), env.Digest(), true)
	}
	return receipt, nil
}

func stripe(id string) int {
	var h uint32 = 2166136261
	for i := 0; i < len(id); i++ {
		h = (h ^ uint32(id[i])) * 16777619
	}
	return int(h % 64)
}

// Fetch returns recipient's envelopes after cursor after ("": from the start;
// a cursor of the other storage's format is taken as the start), at most limit
// and maxPageBytes of them.
// Exported for the FIFO test, which checks the error chain HTTP would flatten.
func (r *Relay) Fetch(ctx context.Context, recipient identity.DID, after string, limit int) (*relayproto.InboxPage, error) {
	if limit <= 0 {
		limit = relayproto.DefaultFetchLimit
	}
	limit = min(limit, relayproto.MaxFetchLimit)
	return r.back.fetch(ctx, recipient, after, limit)
}

// Ack removes the listed envelopes from recipient's inbox (ids not waiting
// there are ignored) and, on the file storage, raises their receipt records to
// terminal. It returns how many it removed.
// Exported for the test that passes an already cancelled context, which HTTP cannot.
func (r *Relay) Ack(ctx context.Context, recipient identity.DID, ids []string) (int, error) {
	n, err := r.back.ack(ctx, recipient, ids)
	if n > 0 {
		r.count(func(s *Stats) { s.Acked += int64(n) })
	}
	return n, err
}
