package daemon

// The streamed send: POST /v1/messages with Content-Type application/octet-stream,
// the plaintext body as the request body and the metadata in headers
// (client.HeaderTo, HeaderRelay, HeaderDeadline, Idempotency-Key). A body of at most
// envelope.MaxBodySize takes the inline path of a JSON send, unchanged (acceptSend).
// A larger one is sealed as it arrives (envelope.NewBlobMessage) into a staged blob
// of the store (Store.CreateBlob), in constant memory, with the daemon's MaxBody
// enforced on the sealed bytes while they are written; the blob is committed
// (durable) before the envelope naming it is enqueued. docs/DAEMON.md states the
// protocol and its idempotency rule.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// streamIdle bounds the wait for the next bytes of a streamed request body, and for
// the client to take the next bytes of a body download: the server's 60 s
// ReadTimeout and WriteTimeout bound a whole small request, and are moved forward
// while a large body moves.
const streamIdle = 60 * time.Second

// streamCopyBuffer is the buffer a body is copied through: one sealed chunk's
// plaintext.
const streamCopyBuffer = envelope.BlobChunkSize

// streamed reports whether r is a streamed send (Content-Type
// application/octet-stream).
func streamed(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == client.ContentTypeStream
}

// streamRequest is what a streamed send's request digest is taken of (the
// Idempotency-Key's binding): its metadata, as sent, and "stream", so that no JSON
// request (which always has a body) has its digest. The body is not in it: its
// SHA-256, computed as it streams, is stored with the answer and compared with a
// retry's (serveSendStream).
type streamRequest struct {
	To         string `json:"to"`
	RelayURL   string `json:"relayUrl"`
	DeadlineMs int64  `json:"deadline,omitempty"`
	Body       string `json:"body"`
}

// streamedResponse is the stored answer of a streamed send: the response, and the
// SHA-256 of the body it sent (lower-case hex), which a retry's body must have.
type streamedResponse struct {
	Status     int             `json:"status"`
	Body       json.RawMessage `json:"body"`
	BodySHA256 string          `json:"bodySha256,omitempty"`
}

// errOverMaxBody ends a sealed stream that went over MaxBody.
var errOverMaxBody = errcode.New(errcode.BodyTooLarge, "streamed send", errors.New("the sealed body is over the daemon's --max-body"))

// errBodyRead is a streamed request body that could not be read to its end (the
// client went away or sent a bad length): nothing is enqueued.
type errBodyRead struct{ err error }

func (e *errBodyRead) Error() string { return "reading the request body: " + e.err.Error() }
func (e *errBodyRead) Unwrap() error { return e.err }

// serveSendStream serves a streamed send (see the top of this file). The headers are
// checked before any of the body is read, so a client that sent Expect:
// 100-continue sends none of it when they are refused.
func (d *Daemon) serveSendStream(w http.ResponseWriter, r *http.Request, key string) {
	req, ok := streamHeaders(w, r)
	if !ok {
		return
	}
	now := time.Now()
	deadline := now.Add(defaultDeadline)
	if req.DeadlineMs != 0 {
		deadline = time.UnixMilli(req.DeadlineMs)
	}
	if code, msg, hint := validate(req, deadline, now); code != "" {
		writeErrorHint(w, http.StatusBadRequest, code, msg, hint)
		return
	}
	if r.ContentLength > d.maxBody() {
		d.writeOverMaxBody(w, fmt.Sprintf("the message body is %d bytes (Content-Length), over this daemon's limit of %d bytes",
			r.ContentLength, d.maxBody()))
		return
	}
	body := &idleReader{r: r.Body, rc: http.NewResponseController(w)}
	var rest io.Reader = body
	if r.ContentLength < 0 || r.ContentLength <= envelope.MaxBodySize {
		// Whether the body is small is known once up to one byte over the inline
		// limit is read. (With a Content-Length over it, it is known from the
		// headers, and the operation is decided before any of the body is read.)
		prefix := make([]byte, envelope.MaxBodySize+1)
		n, err := io.ReadFull(body, prefix)
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			// Small: the inline path of a JSON send with this body.
			req.Body = prefix[:n]
			d.acceptSend(w, r, key, req)
			return
		case err != nil:
			writeError(w, http.StatusBadRequest, codeBadRequest, "reading the request: "+err.Error())
			return
		}
		rest = io.MultiReader(bytes.NewReader(prefix), body)
	}
	canonical, _ := json.Marshal(streamRequest{To: req.To[0], RelayURL: req.RelayURL, DeadlineMs: req.DeadlineMs, Body: "stream"})
	req.RelayURL, _ = relayproto.CanonicalRelayURL(req.RelayURL)
	if key == "" {
		msgID := uuid.NewString()
		m, _, err := d.sendBlob(r.Context(), msgID, req, deadline, rest, false)
		if err != nil {
			d.writeStreamError(w, err, msgID, false)
			return
		}
		d.answer(w, http.StatusCreated, sendAnswer([]*record.Message{m}))
		return
	}
	// As for a JSON send; a message already accepted is the answer without its
	// body compared (its first request is still running, or died after the
	// message was accepted and before its answer was stored).
	start, ok := d.beginSend(w, r, key, canonical, req.To)
	if !ok {
		return
	}
	if start.Done {
		d.replayStream(w, start.Operation, rest)
		return
	}
	opID := start.Operation.OperationID
	stopRenew := d.renewLease(r.Context(), start.Operation)
	m, sum, err := d.sendBlob(r.Context(), opID, req, deadline, rest, true)
	stopRenew()
	if err != nil {
		if rerr := d.st.ReleaseOperation(context.WithoutCancel(r.Context()), opID); rerr != nil {
			d.storeWarn("api: releasing an operation", rerr, "operation", opID)
		}
		d.writeStreamError(w, err, opID, true)
		return
	}
	answer := sendAnswer([]*record.Message{m})
	stored, _ := json.Marshal(streamedResponse{Status: http.StatusCreated, Body: answer, BodySHA256: sum})
	if err := d.st.CompleteOperation(context.WithoutCancel(r.Context()), opID, stored); err != nil {
		d.m.storeError(err)
		d.storeWarn("api: completing an operation", err, "operation", opID)
		if rerr := d.st.ReleaseOperation(context.WithoutCancel(r.Context()), opID); rerr != nil {
			d.storeWarn("api: releasing an operation", rerr, "operation", opID)
		}
	}
	d.answer(w, http.StatusCreated, answer)
}

// streamHeaders reads a streamed send's metadata into a SendRequest without a body,
// or answers 400 and returns false.
func streamHeaders(w http.ResponseWriter, r *http.Request) (client.SendRequest, bool) {
	bad := func(msg, hint string) (client.SendRequest, bool) {
		writeErrorHint(w, http.StatusBadRequest, codeBadRequest, msg, hint)
		return client.SendRequest{}, false
	}
	tos := r.Header.Values(client.HeaderTo)
	switch {
	case len(tos) == 0 || tos[0] == "":
		return bad("a streamed send needs the recipient's did:key in "+client.HeaderTo, "")
	case len(tos) > 1 || strings.Contains(tos[0], ","):
		return bad("a streamed send goes to one recipient ("+client.HeaderTo+" names several)",
			"send the body once per recipient, each with its own Idempotency-Key")
	}
	relays := r.Header.Values(client.HeaderRelay)
	if len(relays) != 1 {
		return bad("a streamed send needs one relay URL in "+client.HeaderRelay, "")
	}
	req := client.SendRequest{To: client.Recipients{tos[0]}, RelayURL: relays[0]}
	if ds := r.Header.Values(client.HeaderDeadline); len(ds) > 0 {
		ms, err := strconv.ParseInt(ds[0], 10, 64)
		if len(ds) > 1 || err != nil || ms <= 0 {
			return bad(client.HeaderDeadline+" must be one deadline in Unix milliseconds", "")
		}
		req.DeadlineMs = ms
	}
	return req, true
}

// sendBlob makes sure message msgID to req's one recipient exists with the body read
// from body (more than envelope.MaxBodySize bytes): with resume, an accepted message
// of that id (an operation re-executed after its holder died) is the answer, without
// reading the body; otherwise the body is sealed into a staged blob as it is read
// (its sealed size bounded by MaxBody), the blob committed, then its envelope
// enqueued. It returns the message and the SHA-256 of the body (lower-case hex; ""
// for a resumed message). On an error the staged blob is removed and nothing is
// enqueued; a blob committed before a failed enqueue is left to maintenance, which
// removes it once its grace time passed (no record refers to it).
func (d *Daemon) sendBlob(ctx context.Context, msgID string, req client.SendRequest, deadline time.Time, body io.Reader, resume bool) (*record.Message, string, error) {
	if resume {
		m, resumed, err := d.st.ResumeEnqueue(ctx, msgID)
		if err != nil {
			return nil, "", err
		}
		if resumed {
			d.recordChange(client.TopicMessages, m.MessageID, m.Status)
			return m, "", nil
		}
	}
	to := identity.DID(req.To[0])
	bw, err := d.st.CreateBlob()
	if err != nil {
		return nil, "", err
	}
	committed := false
	defer func() {
		if !committed {
			if aerr := bw.Abort(); aerr != nil {
				d.storeWarn("api: removing a staged blob", aerr, "message", msgID)
			}
		}
	}()
	limited := &limitWriter{w: bw, max: d.maxBody()}
	sealer, err := envelope.NewBlobMessage(d.id, to, msgID, deadline, time.Now(), limited)
	if err != nil {
		if limited.err != nil {
			return nil, "", limited.err
		}
		return nil, "", &badRequest{err.Error()}
	}
	sum := sha256.New()
	err = copyBody(io.MultiWriter(sealer, sum), body)
	d.m.bodyBytes.WithLabelValues("sent").Add(float64(sealer.PlainSize()))
	if err != nil {
		return nil, "", err
	}
	env, wire, err := sealer.Finish()
	if err != nil {
		if limited.err != nil {
			return nil, "", limited.err
		}
		return nil, "", err
	}
	digest, size, err := bw.Commit()
	if err != nil {
		return nil, "", err
	}
	committed = true
	if ref, ok := env.Blob(); !ok || ref.Digest != digest || ref.Size != size {
		return nil, "", fmt.Errorf("daemon: the blob committed (%s, %d bytes) is not the one envelope %s names", digest, size, env.ID())
	}
	t0 := time.Now()
	m, err := d.st.Enqueue(ctx, store.SendRequest{MessageID: msgID, PeerOwnerDID: to, RelayURL: req.RelayURL,
		DeliveryDeadline: deadline, Envelopes: []store.OutgoingEnvelope{
			{EnvelopeID: env.ID(), Kind: record.EnvelopeMessage, Envelope: wire}}})
	d.m.enqueue.Observe(time.Since(t0).Seconds())
	if err != nil {
		return nil, "", err
	}
	d.recordChange(client.TopicMessages, m.MessageID, m.Status)
	d.car.Kick()
	return m, hex.EncodeToString(sum.Sum(nil)), nil
}

// copyBody copies body into w through one chunk's buffer, telling a read error
// (errBodyRead) from a write error (the sealer's or the blob's).
func copyBody(w io.Writer, body io.Reader) error {
	buf := make([]byte, streamCopyBuffer)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
		}
		switch {
		case rerr == io.EOF:
			return nil
		case rerr != nil:
			return &errBodyRead{rerr}
		}
	}
}

// replayStream answers a retry of a streamed send whose operation is done: it reads
// the retry's body (bounded by MaxBody, hashing it, storing nothing) and answers the
// stored response if the body has the SHA-256 the first request's had, else 422
// IDEMPOTENCY_KEY_REUSED. A stored answer without a digest (the operation was
// finished by a retry that found the message accepted) is answered as is.
func (d *Daemon) replayStream(w http.ResponseWriter, op *record.Operation, body io.Reader) {
	var resp streamedResponse
	if err := json.Unmarshal(op.Response, &resp); err != nil || resp.Status == 0 {
		d.log.Error("api: unreadable stored response", "operation", op.OperationID)
		writeError(w, http.StatusInternalServerError, codeInternal, "stored response unreadable")
		return
	}
	if resp.BodySHA256 != "" {
		sum := sha256.New()
		n, err := hashBody(sum, body, d.maxBody())
		moveWriteDeadline(w)
		switch {
		case errors.Is(err, errOverMaxBody):
			d.writeOverMaxBody(w, fmt.Sprintf("the message body is over this daemon's limit of %d bytes", d.maxBody()))
			return
		case err != nil:
			writeError(w, http.StatusBadRequest, codeBadRequest, "reading the request: "+err.Error())
			return
		case hex.EncodeToString(sum.Sum(nil)) != resp.BodySHA256:
			d.log.Debug("api: a retry's body differs", "operation", op.OperationID, "bytes", n)
			writeErrorHint(w, http.StatusUnprocessableEntity, errcode.IdempotencyKeyReused.String(),
				"this Idempotency-Key is bound to a streamed send of another body (its SHA-256 differs)",
				idempotencyHint(errcode.IdempotencyKeyReused.String()))
			return
		}
	}
	w.Header().Set("Idempotent-Replayed", "true")
	d.answer(w, resp.Status, resp.Body)
}

// hashBody reads body into h, at most max bytes (errOverMaxBody beyond), and returns
// how many it read.
func hashBody(h hash.Hash, body io.Reader, max int64) (int64, error) {
	n, err := io.Copy(h, io.LimitReader(body, max+1))
	if err == nil && n > max {
		err = errOverMaxBody
	}
	return n, err
}

// writeStreamError answers a streamed send that failed: over MaxBody (413), a body
// that could not be read (400: the client is probably gone), or as a send's error.
func (d *Daemon) writeStreamError(w http.ResponseWriter, err error, msgID string, keyed bool) {
	moveWriteDeadline(w)
	var re *errBodyRead
	switch {
	case errors.Is(err, errOverMaxBody):
		d.writeOverMaxBody(w, fmt.Sprintf("the sealed message body went over this daemon's limit of %d bytes while it streamed; nothing was stored",
			d.maxBody()))
	case errors.As(err, &re):
		d.log.Debug("api: a streamed send's body broke off", "message", msgID, "err", err)
		writeError(w, http.StatusBadRequest, codeBadRequest, "the request body broke off; nothing was stored")
	default:
		d.writeSendError(w, err, msgID, keyed)
	}
}

// answer writes a streamed send's answer, moving the write deadline first.
func (d *Daemon) answer(w http.ResponseWriter, status int, body []byte) {
	moveWriteDeadline(w)
	writeJSONBytes(w, status, body)
}

// moveWriteDeadline gives the answer to a streamed request streamIdle to be written:
// the request may have outlasted the server's WriteTimeout.
func moveWriteDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(streamIdle))
}

// limitWriter passes writes to w until more than max bytes went through: that write
// and every later one fail with errOverMaxBody (kept in err).
type limitWriter struct {
	w   io.Writer
	max int64
	n   int64
	err error
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if l.n+int64(len(p)) > l.max {
		l.err = errOverMaxBody
		return 0, l.err
	}
	n, err := l.w.Write(p)
	l.n += int64(n)
	return n, err
}

// idleReader reads a streamed request body, moving the connection's read deadline
// to streamIdle ahead at most once a second while bytes arrive: a body may take
// longer than the server's ReadTimeout, but never stalls longer than streamIdle.
type idleReader struct {
	r     io.Reader
	rc    *http.ResponseController
	moved time.Time
}

func (b *idleReader) Read(p []byte) (int, error) {
	if now := time.Now(); now.Sub(b.moved) >= time.Second {
		b.moved = now
		_ = b.rc.SetReadDeadline(now.Add(streamIdle))
	}
	return b.r.Read(p)
}

// renewLease keeps the lease of op, an in-flight operation this request holds,
// while a streamed body arrives (it may take longer than the lease): every third of
// the lease it moves the lease's end a lease ahead, as long as the lease has not
// run out (a lease that ran out may have been taken over). The returned function
// stops it and waits for it.
func (d *Daemon) renewLease(ctx context.Context, op *record.Operation) (stop func()) {
	lease := time.Duration(op.LeaseUntil-d.storeNow().UnixMilli()) * time.Millisecond
	if lease < 300*time.Millisecond {
		return func() {} // a lease this short (or ended) is not kept alive
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			until := d.storeNow().Add(lease).UnixMilli()
			err := d.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
				cur, err := store.TxGet[*record.Operation](tx, op.OperationID)
				if err != nil || cur == nil || cur.State != record.OperationInFlight || cur.LeaseUntil <= d.storeNow().UnixMilli() {
					return err
				}
				cur.LeaseUntil = until
				return tx.Put(cur)
			})
			if err != nil && ctx.Err() == nil {
				d.storeWarn("api: renewing an operation's lease", err, "operation", op.OperationID)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// storeNow is the store's clock (Options.Store.Now, by default the wall clock).
func (d *Daemon) storeNow() time.Time {
	if d.opts.Store.Now != nil {
		return d.opts.Store.Now()
	}
	return time.Now()
}
