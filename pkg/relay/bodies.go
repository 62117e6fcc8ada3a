package relay

// Large bodies (docs/RELAY.md "Bodies", relayproto's body.go). An envelope
// whose message body is a blob (envelope.BlobRef) is accepted in two steps:
//
//  1. POST /v1/envelopes: verified and admitted as any envelope (its quota and
//     byte rate count the envelope's bytes and the body's), then kept pending
//     — durable, but neither fetchable nor in its recipient's inbox — and
//     answered 202 BodyIncomplete.
//  2. PATCH /v1/bodies/{id}: the body, appended from the relay's durable
//     offset (fsynced at least every bodySyncEvery bytes and at the end of each
//     request) and hashed as it arrives. When the offset reaches the size the
//     SHA-256 is checked (a mismatch discards the body: 422), the body is
//     sealed and the envelope enters its inbox exactly as a small one does
//     (inbox file, then receipt record): from then on a POST of it answers 200
//     with its receipt, and its recipient can fetch it and its body.
//
// The relay layer here keeps the uploads' state (offset, the running hash, the
// one append at a time) for every storage; a bodyStore keeps the bytes and the
// pending envelopes. Lock order: an envelope's stripe, then upMu. An upload's
// busy flag (under upMu) gives one request at a time the right to append to,
// finish or expire it; a second one is answered 409 at once, never queued.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// DefaultMaxBody is the default bound on a blob body's sealed size
// (Limits.MaxBody, --max-body).
const DefaultMaxBody int64 = 4 << 30

const (
	// bodySyncEvery bounds the bytes an append writes between two fsyncs.
	bodySyncEvery = 4 << 20
	// bodyBuffer is the copy buffer of one append or download: a body never
	// passes through memory in larger pieces.
	bodyBuffer = 256 << 10
	// bodyIdle is how long a body upload or download may go without moving
	// bodyDeadlineEvery bytes before its connection's deadline cuts it: the
	// server's request and response timeouts do not bound a body's transfer
	// as a whole.
	bodyIdle          = 60 * time.Second
	bodyDeadlineEvery = 1 << 20
)

// bodyStore keeps the sealed bodies of blob envelopes and the pending
// envelopes waiting for them. Its errors are *relayproto.Error values (a 503
// for anything to retry). Only one call at a time touches one envelope's body
// (the upload's busy flag, or the inbox entry's ack/expiry for a sealed one).
type bodyStore interface {
	// pendingAtOpen lists the pending envelopes found when the storage
	// opened, each with its body's durable offset.
	pendingAtOpen() []pendingFound
	// hold keeps env (its wire bytes) pending, durably, before it returns.
	hold(ctx context.Context, env *envelope.Envelope, wire []byte) error
	// offset is the bytes of envelope id's body held durably (0: none): a
	// new pending envelope's upload starts there.
	offset(ctx context.Context, id string) (int64, error)
	// append writes r's bytes to envelope id's body at offset (its durable
	// offset), makes them durable, and returns the new durable offset —
	// after an error too (what it made durable before it). A failure that
	// leaves the body's state unknown (a failed fsync) discards it: 0.
	append(ctx context.Context, id string, offset int64, r io.Reader) (int64, error)
	// open reads envelope id's body from offset (pending or sealed).
	open(ctx context.Context, id string, offset int64) (io.ReadCloser, error)
	// seal makes the complete, verified body of size bytes the envelope's
	// body, durably: what an inbox entry's body is.
	seal(ctx context.Context, id string, size int64) error
	// unhold forgets the pending envelope id (it entered the inbox, or its
	// upload expired).
	unhold(ctx context.Context, id string) error
	// discard removes envelope id's body, partial or sealed.
	discard(ctx context.Context, id string) error
}

// pendingFound is a pending envelope a storage found at open.
type pendingFound struct {
	env    *envelope.Envelope
	wire   []byte
	offset int64 // the body's bytes held durably
	sealed bool  // the body is complete and verified
}

// upload is a pending envelope and its body's upload.
type upload struct {
	env      *envelope.Envelope
	wire     []byte
	digest   string // of the body
	size     int64  // of the body
	rdir     string
	deadline int64 // the envelope's delivery deadline, Unix ms
	cost     int64 // envelope and body bytes, for the recipient's quota

	// Guarded by Relay.upMu.
	offset int64 // durable
	busy   bool
	gone   bool // removed from Relay.uploads
	// Owned by the busy holder.
	h      hash.Hash
	hashed int64 // bytes of the body h has seen; -1: h must be rebuilt
	sealed bool
}

// blobOf returns the body reference of a blob envelope.
func blobOf(env *envelope.Envelope) (envelope.BlobRef, bool) { return env.Blob() }

// blobSize is the sealed size of env's body if it is a blob, else 0.
func blobSize(env *envelope.Envelope) int64 {
	if ref, ok := blobOf(env); ok {
		return ref.Size
	}
	return 0
}

func newUpload(env *envelope.Envelope, wire []byte, ref envelope.BlobRef, offset int64, sealed bool) *upload {
	return &upload{env: env, wire: wire, digest: ref.Digest, size: ref.Size, rdir: recipientDir(env.Recipient()),
		deadline: env.DeliveryDeadlineMillis(), cost: int64(len(wire)) + ref.Size, offset: offset, hashed: -1, sealed: sealed}
}

// loadUploads registers the pending envelopes the storage found: one whose
// envelope already has its receipt record (a crash after it entered the inbox)
// is forgotten.
func (r *Relay) loadUploads(ctx context.Context) error {
	if r.bodies == nil {
		return nil
	}
	for _, p := range r.bodies.pendingAtOpen() {
		ref, _ := blobOf(p.env)
		h, err := r.back.lookup(ctx, p.env.ID())
		if err != nil {
			return err
		}
		if h != nil {
			if err := r.bodies.unhold(ctx, p.env.ID()); err != nil {
				return err
			}
			continue
		}
		u := newUpload(p.env, p.wire, ref, p.offset, p.sealed)
		r.upMu.Lock()
		r.uploads[p.env.ID()] = u
		r.addPending(u, 1)
		r.upMu.Unlock()
	}
	return nil
}

// addPending adds (sign 1) or removes (-1) u's claim on its recipient's
// quota. r.upMu must be held.
func (r *Relay) addPending(u *upload, sign int) {
	p := r.pendUse[u.rdir]
	p.n += sign
	p.bytes += int64(sign) * u.cost
	if p.n <= 0 {
		delete(r.pendUse, u.rdir)
	} else {
		r.pendUse[u.rdir] = p
	}
}

func (r *Relay) pendingUsage(rdir string) usage {
	r.upMu.Lock()
	defer r.upMu.Unlock()
	return r.pendUse[rdir]
}

// forget removes u from the uploads. r.upMu must be held.
func (r *Relay) forgetLocked(u *upload) {
	if u.gone {
		return
	}
	u.gone = true
	delete(r.uploads, u.env.ID())
	r.addPending(u, -1)
}

func (r *Relay) incomplete(u *upload) error {
	r.upMu.Lock()
	off := u.offset
	r.upMu.Unlock()
	return &relayproto.BodyIncompleteError{Offset: off, Size: u.size, Upload: relayproto.PathBodies + u.env.ID()}
}

func bodyUnsupported() *relayproto.Error {
	return newError(http.StatusNotImplemented, relayproto.CodeBodyUnsupported,
		"this relay's storage does not keep blob bodies; send the body inline or use a relay with the file storage")
}

// acceptBlob is Accept for a blob envelope without a receipt record: the
// stripe of its id is held. It answers a *relayproto.BodyIncompleteError (the
// 202) or, for an envelope whose body is complete, its receipt.
func (r *Relay) acceptBlob(ctx context.Context, env *envelope.Envelope, data []byte, ref envelope.BlobRef) ([]byte, error) {
	if r.bodies == nil {
		return nil, bodyUnsupported()
	}
	r.upMu.Lock()
	u := r.uploads[env.ID()]
	r.upMu.Unlock()
	if u != nil {
		if u.env.Digest() != env.Digest() {
			r.count(func(s *Stats) { s.Conflicts++ })
			return nil, conflictError(env)
		}
		return r.resume(ctx, u)
	}
	now := r.now()
	if err := env.CheckDeadline(now); err != nil {
		return nil, envelopeError(err)
	}
	cost := int64(len(data)) + ref.Size
	if ref.Size > r.maxBody {
		return nil, newError(http.StatusRequestEntityTooLarge, relayproto.CodeBodyTooLarge,
			"the body is %d bytes, this relay keeps at most %d", ref.Size, r.maxBody)
	}
	if q := r.limits.QuotaBytes; q > 0 && cost > q {
		return nil, newError(http.StatusRequestEntityTooLarge, relayproto.CodeBodyTooLarge,
			"the envelope and its body are %d bytes, more than this relay keeps for one recipient (%d)", cost, q)
	}
	res, lerr := r.admit(ctx, env, cost)
	if lerr != nil {
		return nil, lerr
	}
	defer r.release(res) // after the pending claim below: never a gap in the quota
	off, err := r.bodies.offset(ctx, env.ID())
	if err != nil {
		return nil, err
	}
	if off > ref.Size { // not this body's bytes
		if err := r.bodies.discard(ctx, env.ID()); err != nil {
			return nil, err
		}
		off = 0
	}
	if err := r.bodies.hold(ctx, env, data); err != nil {
		return nil, err
	}
	u = newUpload(env, data, ref, off, false)
	if off == 0 {
		u.h, u.hashed = sha256.New(), 0
	}
	r.upMu.Lock()
	r.uploads[env.ID()] = u
	r.addPending(u, 1)
	r.upMu.Unlock()
	r.log.Info("relay: envelope pending its body", "envelopeId", env.ID(), "digest", env.Digest()[:16],
		"sender", string(env.Sender()), "recipient", string(env.Recipient()), "bodySize", ref.Size, "offset", off)
	return r.resume(ctx, u)
}

// resume answers the POST of a pending envelope: the receipt if its body is
// complete (finish), else the 202 with its offset (also while another request
// holds the upload). The envelope's stripe is held.
func (r *Relay) resume(ctx context.Context, u *upload) ([]byte, error) {
	r.upMu.Lock()
	mine := u.offset == u.size && !u.busy
	if mine {
		u.busy = true
	}
	r.upMu.Unlock()
	if !mine {
		return nil, r.incomplete(u)
	}
	defer r.unbusy(u)
	return r.finish(ctx, u)
}

func (r *Relay) unbusy(u *upload) {
	r.upMu.Lock()
	u.busy = false
	if r.upIdle != nil {
		close(r.upIdle)
		r.upIdle = nil
	}
	r.upMu.Unlock()
}

// busyWait bounds how long a HEAD or a PATCH waits for another request's
// append to the same upload to end (what a sender killed mid-request leaves:
// its last bytes still arriving), so that it answers the offset that append
// made durable rather than the one before it.
const busyWait = 5 * time.Second

// waitIdle waits, at most busyWait and while ctx lasts, until u is not busy,
// and returns with r.upMu held either way.
func (r *Relay) waitIdle(ctx context.Context, u *upload) {
	deadline := time.NewTimer(busyWait)
	defer deadline.Stop()
	r.upMu.Lock()
	for u.busy && !u.gone {
		if r.upIdle == nil {
			r.upIdle = make(chan struct{})
		}
		idle := r.upIdle
		r.upMu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			r.upMu.Lock()
			return
		case <-deadline.C:
			r.upMu.Lock()
			return
		}
		r.upMu.Lock()
	}
}

// ensureHash makes u.h the hash of the body's durable bytes, re-reading them
// when it is not (after a restart, or an append whose bytes and hash parted).
// The caller holds u busy.
func (r *Relay) ensureHash(ctx context.Context, u *upload) error {
	r.upMu.Lock()
	off := u.offset
	r.upMu.Unlock()
	if u.h != nil && u.hashed == off {
		return nil
	}
	h := sha256.New()
	if off > 0 {
		rc, err := r.bodies.open(ctx, u.env.ID(), 0)
		if err != nil {
			return err
		}
		n, err := io.CopyBuffer(h, io.LimitReader(rc, off), make([]byte, bodyBuffer))
		rc.Close()
		if err == nil && n != off {
			err = fmt.Errorf("the body holds %d bytes, not %d", n, off)
		}
		if err != nil {
			return unavailable(relayproto.CodeInboxUnreadable, "the relay cannot read the body it holds", err)
		}
	}
	u.h, u.hashed = h, off
	return nil
}

// finish ends the upload of a complete body: the digest checked (a mismatch
// discards the body, 422), the body sealed, the envelope put into its inbox as
// a new one, the pending envelope forgotten; it answers the receipt. The
// caller holds the envelope's stripe and u busy.
func (r *Relay) finish(ctx context.Context, u *upload) ([]byte, error) {
	id := u.env.ID()
	if err := u.env.CheckDeadline(r.now()); err != nil {
		r.dropUpload(ctx, u)
		return nil, envelopeError(err)
	}
	if !u.sealed {
		if err := r.ensureHash(ctx, u); err != nil {
			return nil, err
		}
		if got := hex.EncodeToString(u.h.Sum(nil)); got != u.digest {
			r.count(func(s *Stats) { s.BodyDigestMismatches++ })
			off, err := r.resetBody(ctx, u)
			r.log.Warn("relay: body digest mismatch; body discarded", "envelopeId", id, "digest", got[:16],
				"want", u.digest[:min(16, len(u.digest))])
			if err != nil {
				return nil, err
			}
			e := newError(http.StatusUnprocessableEntity, relayproto.CodeBodyDigestMismatch,
				"the body's SHA-256 is not the digest the envelope names; the relay discarded it: upload it again from %d", off)
			return nil, e
		}
		if err := r.bodies.seal(ctx, id, u.size); err != nil {
			return nil, err
		}
		u.sealed = true
	}
	it := &newEnvelope{env: u.env, wire: u.wire, receivedAt: r.now()}
	if err := r.stamp(ctx, []*newEnvelope{it}, 0); err != nil {
		return nil, err
	}
	if err := r.back.put(ctx, []*newEnvelope{it}); err != nil {
		return nil, err
	}
	receipt, err := r.answer(it, 0)
	if err != nil {
		return nil, err
	}
	r.upMu.Lock()
	r.forgetLocked(u)
	r.upMu.Unlock()
	r.count(func(s *Stats) { s.BodiesCompleted++ })
	if err := r.bodies.unhold(ctx, id); err != nil {
		// The envelope is in its inbox with its receipt record; the pending
		// file left behind is forgotten at the next start.
		r.log.Warn("relay: pending envelope not removed", "envelopeId", id, "err", err)
	}
	return receipt, nil
}

// resetBody discards u's body: its upload starts again at 0.
func (r *Relay) resetBody(ctx context.Context, u *upload) (int64, error) {
	err := r.bodies.discard(ctx, u.env.ID())
	r.upMu.Lock()
	u.offset = 0
	r.upMu.Unlock()
	u.h, u.hashed, u.sealed = sha256.New(), 0, false
	return 0, err
}

// forgetHeld forgets a pending upload of envelope id, which has its receipt
// record: on JetStream another relay process completed it. Its body is the
// inbox entry's now. The envelope's stripe is held.
func (r *Relay) forgetHeld(id string) {
	r.upMu.Lock()
	defer r.upMu.Unlock()
	if u := r.uploads[id]; u != nil && !u.busy {
		r.forgetLocked(u)
	}
}

// dropUpload forgets u and removes its body and pending envelope (expiry).
// The caller holds u busy.
func (r *Relay) dropUpload(ctx context.Context, u *upload) {
	id := u.env.ID()
	if h, err := r.back.lookup(ctx, id); err != nil || h != nil {
		if h != nil { // completed elsewhere: the body is its inbox entry's
			_ = r.bodies.unhold(ctx, id)
			r.upMu.Lock()
			r.forgetLocked(u)
			r.upMu.Unlock()
		}
		return
	}
	if err := r.bodies.discard(ctx, id); err != nil {
		r.log.Warn("relay: expired body not removed", "envelopeId", id, "err", err)
		return // kept: the next pass tries again
	}
	if err := r.bodies.unhold(ctx, id); err != nil {
		r.log.Warn("relay: expired pending envelope not removed", "envelopeId", id, "err", err)
		return
	}
	r.upMu.Lock()
	r.forgetLocked(u)
	r.upMu.Unlock()
	r.count(func(s *Stats) { s.BodiesExpired++ })
}

// expireUploads drops the pending envelopes whose deadline is at or before
// now: an upload its sender abandoned is kept no longer than its envelope
// could be delivered. An upload busy now is left to the next pass.
func (r *Relay) expireUploads(ctx context.Context, now time.Time) int {
	if r.bodies == nil {
		return 0
	}
	var due []*upload
	r.upMu.Lock()
	for _, u := range r.uploads {
		if u.deadline <= now.UnixMilli() && !u.busy {
			u.busy = true
			due = append(due, u)
		}
	}
	r.upMu.Unlock()
	for _, u := range due {
		r.dropUpload(ctx, u)
		r.unbusy(u)
	}
	if len(due) > 0 {
		r.log.Info("relay: expired pending bodies removed", "count", len(due))
	}
	return len(due)
}

// bodyPath returns the envelope id of a body path (prefix + id), or a 404.
func bodyPath(p, prefix string) (string, *relayproto.Error) {
	id := strings.TrimPrefix(p, prefix)
	if !uuid.Valid(id) {
		return "", newError(http.StatusNotFound, relayproto.CodeNotFound, "no such endpoint")
	}
	return id, nil
}

// serveUpload answers HEAD and PATCH /v1/bodies/{id} (tus 1.0 core).
func (r *Relay) serveUpload(w http.ResponseWriter, req *http.Request) (int, error) {
	id, e := bodyPath(req.URL.Path, relayproto.PathBodies)
	if e != nil {
		return 0, e
	}
	h := w.Header()
	h.Set(relayproto.HeaderTusResumable, relayproto.TusVersion)
	h.Set("Cache-Control", "no-store")
	if req.Method != http.MethodHead && req.Method != http.MethodPatch {
		h.Set("Allow", "HEAD, PATCH")
		return 0, newError(http.StatusMethodNotAllowed, relayproto.CodeMethodNotAllowed, "use HEAD or PATCH")
	}
	if v := req.Header.Get(relayproto.HeaderTusResumable); v != "" && v != relayproto.TusVersion {
		h.Set("Tus-Version", relayproto.TusVersion)
		return 0, newError(http.StatusPreconditionFailed, relayproto.CodeBadRequest, "this relay speaks tus %s", relayproto.TusVersion)
	}
	if r.bodies == nil {
		return 0, bodyUnsupported()
	}
	r.upMu.Lock()
	u := r.uploads[id]
	r.upMu.Unlock()
	var off int64
	if u != nil && req.Method == http.MethodHead {
		r.waitIdle(req.Context(), u)
		off = u.offset
		r.upMu.Unlock()
	}
	if u == nil {
		return 0, newError(http.StatusNotFound, relayproto.CodeUploadUnknown,
			"no envelope %s is pending at this relay (post it: it may be complete already)", id)
	}
	if req.Method == http.MethodHead {
		h.Set(relayproto.HeaderUploadOffset, strconv.FormatInt(off, 10))
		h.Set(relayproto.HeaderUploadLength, strconv.FormatInt(u.size, 10))
		w.WriteHeader(http.StatusOK)
		return http.StatusOK, nil
	}
	return r.patch(w, req, u)
}

// patch appends one request's bytes to u's body.
func (r *Relay) patch(w http.ResponseWriter, req *http.Request, u *upload) (int, error) {
	if ct := req.Header.Get("Content-Type"); ct != relayproto.ContentTypeOffsetOctetStream {
		return 0, newError(http.StatusUnsupportedMediaType, relayproto.CodeBadRequest,
			"Content-Type must be %s", relayproto.ContentTypeOffsetOctetStream)
	}
	at, ok := relayproto.ParseUploadOffset(req.Header.Get(relayproto.HeaderUploadOffset))
	if !ok {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "Upload-Offset must be a number of bytes")
	}
	n := req.ContentLength
	if n < 0 {
		return 0, newError(http.StatusLengthRequired, relayproto.CodeBadRequest, "a PATCH needs a Content-Length")
	}
	r.waitIdle(req.Context(), u)
	switch {
	case u.gone:
		r.upMu.Unlock()
		return 0, newError(http.StatusNotFound, relayproto.CodeUploadUnknown,
			"no envelope %s is pending at this relay (post it: it may be complete already)", u.env.ID())
	case u.busy || u.offset != at:
		off := u.offset
		r.upMu.Unlock()
		w.Header().Set(relayproto.HeaderUploadOffset, strconv.FormatInt(off, 10))
		r.count(func(s *Stats) { s.UploadOffsetMismatches++ })
		return 0, newError(http.StatusConflict, relayproto.CodeUploadOffsetMismatch,
			"the relay holds %d bytes of this body (or another upload of it is running); upload from there", off)
	case n > u.size-at:
		r.upMu.Unlock()
		return 0, newError(http.StatusRequestEntityTooLarge, relayproto.CodeBodyTooLarge,
			"%d bytes at %d run past the body's %d", n, at, u.size)
	}
	u.busy = true
	r.upMu.Unlock()
	defer r.unbusy(u)

	ctx := req.Context()
	if err := r.ensureHash(ctx, u); err != nil {
		return 0, err
	}
	in := &bodyReader{r: io.LimitReader(req.Body, n), h: u.h, rc: http.NewResponseController(w)}
	newOff, err := r.bodies.append(ctx, u.env.ID(), at, in)
	r.upMu.Lock()
	u.offset = newOff
	r.upMu.Unlock()
	if in.n == newOff-at && newOff >= at {
		u.hashed = newOff
	} else {
		u.hashed = -1
	}
	r.count(func(s *Stats) { s.BodyBytesIn += in.n })
	w.Header().Set(relayproto.HeaderUploadOffset, strconv.FormatInt(newOff, 10))
	if err != nil {
		if in.err != nil {
			// The client's bytes stopped coming (it went away, or sent fewer
			// than its Content-Length): what arrived is durable, and its next
			// PATCH goes on from there.
			return 0, &relayproto.Error{Status: http.StatusBadRequest, Code: relayproto.CodeBadRequest,
				Message: "the body ended before its Content-Length", Cause: in.err}
		}
		return 0, err
	}
	if newOff != at+n {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "the body ended before its Content-Length")
	}
	if newOff == u.size {
		mu := &r.stripes[stripe(u.env.ID())]
		mu.Lock()
		_, err := r.finish(ctx, u)
		mu.Unlock()
		if err != nil {
			if e := asError(err); e.Code == relayproto.CodeBodyDigestMismatch {
				w.Header().Set(relayproto.HeaderUploadOffset, "0")
			}
			return 0, err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent, nil
}

// bodyReader reads a request's body into an append: it hashes and counts
// what it passes on, remembers a read error (the client's, not the storage's),
// and moves the connection's read deadline on as bytes arrive.
type bodyReader struct {
	r     io.Reader
	h     hash.Hash
	rc    *http.ResponseController
	n     int64
	since int64
	err   error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.n == 0 || b.since >= bodyDeadlineEvery {
		_ = b.rc.SetReadDeadline(time.Now().Add(bodyIdle))
		b.since = 0
	}
	n, err := b.r.Read(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	b.since += int64(n)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// serveBody answers GET /v1/inbox/bodies/{id}: the body of an envelope
// fetchable in the signer's inbox, whole (200) or from a Range (206).
func (r *Relay) serveBody(w http.ResponseWriter, req *http.Request) (int, error) {
	id, e := bodyPath(req.URL.Path, relayproto.PathInboxBodies)
	if e != nil {
		return 0, e
	}
	if req.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		return 0, newError(http.StatusMethodNotAllowed, relayproto.CodeMethodNotAllowed, "use GET")
	}
	_, did, e := r.signedRequest(w, req)
	if e != nil {
		return 0, e
	}
	if req.URL.RawQuery != "" {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "a body download has no query")
	}
	if r.bodies == nil {
		return 0, bodyUnsupported()
	}
	size, ok, err := r.back.fetchable(req.Context(), did, id)
	if err != nil {
		return 0, err
	}
	if !ok || size == 0 {
		return 0, newError(http.StatusNotFound, relayproto.CodeBodyMissing,
			"no envelope %s with a body is waiting in the inbox of %s", id, did)
	}
	var from int64
	status := http.StatusOK
	h := w.Header()
	h.Set("Accept-Ranges", "bytes")
	if rg := req.Header.Get("Range"); rg != "" {
		o, ok := relayproto.RangeFrom(rg)
		if !ok {
			return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, `Range must be "bytes=OFFSET-"`)
		}
		if o >= size {
			h.Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
			return 0, newError(http.StatusRequestedRangeNotSatisfiable, relayproto.CodeBadRequest,
				"the body has %d bytes", size)
		}
		from, status = o, http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", o, size-1, size))
	}
	rc, err := r.bodies.open(req.Context(), id, from)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.FormatInt(size-from, 10))
	w.WriteHeader(status)
	out := &bodyWriter{w: w, rc: http.NewResponseController(w)}
	n, err := io.CopyBuffer(out, io.LimitReader(rc, size-from), make([]byte, bodyBuffer))
	r.count(func(s *Stats) { s.BodyBytesOut += n })
	if err != nil || n != size-from {
		// The status is sent: the client sees a short body (and resumes).
		r.log.Info("relay: body download cut", "envelopeId", id, "sent", n, "of", size-from, "err", fmt.Sprint(err))
	}
	return status, nil
}

// bodyWriter moves the connection's write deadline on as bytes leave.
type bodyWriter struct {
	w     io.Writer
	rc    *http.ResponseController
	since int64
	first bool
}

func (b *bodyWriter) Write(p []byte) (int, error) {
	if !b.first || b.since >= bodyDeadlineEvery {
		_ = b.rc.SetWriteDeadline(time.Now().Add(bodyIdle))
		b.first, b.since = true, 0
	}
	n, err := b.w.Write(p)
	b.since += int64(n)
	return n, err
}
