package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// API limits.
const (
	// maxRequestBytes bounds a request body: a MaxBodySize body in base64 plus the
	// other fields.
	maxRequestBytes = envelope.MaxBodySize*4/3 + 8<<10
	// maxIdempotencyKey bounds the Idempotency-Key header.
	maxIdempotencyKey = 255
	// defaultDeadline is the delivery deadline of a request that gives none.
	defaultDeadline = 24 * time.Hour
	// defaultPageSize and maxPageSize bound GET /v1/messages.
	defaultPageSize = 100
	maxPageSize     = 1000
)

// Error codes of the API besides the store's (errcode).
const (
	codeBadRequest  = "BAD_REQUEST"
	codeNotFound    = "NOT_FOUND"
	codeTooLarge    = "REQUEST_TOO_LARGE"
	codeNotReady    = "NOT_READY"
	codeInternal    = "INTERNAL"
	codeUnsupported = "UNSUPPORTED_MEDIA_TYPE"
)

// codeBodyTooLarge (413): a send's message body is over envelope.MaxBodySize, or its
// request is too large to hold a body within it.
const codeBodyTooLarge = "BODY_TOO_LARGE"

func (d *Daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", d.route("send", d.serveSend))
	mux.HandleFunc("GET /v1/messages/{id}", d.route("message", d.serveMessage))
	mux.HandleFunc("GET /v1/messages", d.route("messages", d.serveMessages))
	mux.HandleFunc("GET /v1/inbox", d.route("inbox", d.serveInbox))
	mux.HandleFunc("GET /v1/inbox/refused", d.route("inbox-refused", d.serveInboxRefused))
	mux.HandleFunc("GET /v1/inbox/{messageId}/body", d.route("inbox-body", d.serveInboxBody))
	mux.HandleFunc("GET /v1/changes", d.route("changes", d.serveChanges))
	mux.HandleFunc("GET /v1/targets", d.route("targets", d.serveTargets))
	for _, op := range []string{record.ActionHold, record.ActionRelease, record.ActionCancel, record.ActionRetry} {
		mux.HandleFunc("POST /v1/queue/"+op, d.route("queue-"+op, d.serveAction(op)))
	}
	mux.HandleFunc("GET /livez", d.route("livez", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
	mux.HandleFunc("GET /readyz", d.route("readyz", d.serveReady))
	mux.Handle("GET /metrics", d.m.handler())
	mux.HandleFunc("/", d.route("other", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, codeNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	}))
	return mux
}

// statusWriter records the status for the request metric.
type statusWriter struct {
	http.ResponseWriter
	status int
}

// Unwrap gives http.ResponseController the connection's writer (a held long
// poll moves its deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (d *Daemon) route(name string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		h(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		d.m.requests.WithLabelValues(name, strconv.Itoa(sw.status)).Inc()
		d.log.Debug("api", "route", name, "method", r.Method, "status", sw.status, "duration", time.Since(start))
	}
}

func (d *Daemon) serveMessage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !uuid.Valid(id) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "message id must be a lower-case UUID")
		return
	}
	m, err := d.st.Message(id)
	if err != nil {
		d.writeStoreError(w, err)
		return
	}
	if m == nil {
		writeError(w, http.StatusNotFound, codeNotFound, "no message "+id)
		return
	}
	cm := toClient(m)
	if m.Status == record.StatusQueued {
		envs, err := d.st.Pending(r.Context(), id)
		if err != nil {
			d.writeStoreError(w, err)
			return
		}
		waits, err := carrier.Waits(r.Context(), d.st, d.now())
		if err != nil {
			d.writeStoreError(w, err)
			return
		}
		withDelivery(&cm, envs, waits)
	}
	writeJSON(w, http.StatusOK, cm)
}

// withDelivery adds what a queued message's pending envelopes (in ordinal order)
// say about its delivery, as the carrier plans it (waits, carrier.Waits): when its
// next attempt is due — the target's next probe if the target waits, the end of a
// lease — what it waits for, and the last error (the target's, when the message
// has none of its own and waits on its target). An envelope the plan does not
// know (not dispatchable yet) counts with its own record.
func withDelivery(cm *client.Message, envs []*record.Outbox, waits map[string]carrier.EnvelopeWait) {
	var next, lease int64
	waiting, allHeld := "", len(envs) > 0
	for _, o := range envs {
		w, ok := waits[o.EnvelopeID]
		if !ok {
			w = carrier.EnvelopeWait{DueAt: o.NextAttemptAt, LastError: o.LastError}
		}
		if cm.LastError == "" {
			cm.LastError = w.LastError
		}
		held := w.WaitingFor == carrier.WaitHeld
		if allHeld && !held {
			allHeld, next, waiting, lease = false, 0, "", 0 // an unheld envelope decides
		}
		if held && !allHeld {
			continue
		}
		if w.DueAt > 0 && (next == 0 || w.DueAt < next) {
			next, waiting, lease = w.DueAt, w.WaitingFor, w.LeaseUntil
		}
	}
	if allHeld {
		waiting = carrier.WaitHeld
	}
	cm.NextAttemptAt, cm.WaitingFor, cm.LeaseUntil = msTime(next), waiting, msTime(lease)
}

// serveMessages lists messages from the messages index. A queued message is read
// from its record (it may be an interrupted enqueue, which is not listed) with its
// pending envelopes; every other message is listed from its summary, which carries
// its last error, hold and operator action. A record that cannot be read is listed as an entry carrying
// only its id and the error, and the daemon reports itself not ready; if the index
// itself cannot be made, each record is read instead. Only a listing that fails (a
// name that is no record's in the directory) fails the request.
func (d *Daemon) serveMessages(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	status, after := q.Get("status"), q.Get("after")
	limit := defaultPageSize
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, codeBadRequest, "limit must be a positive integer")
			return
		}
		limit = min(n, maxPageSize)
	}
	switch status {
	case "", record.StatusQueued, record.StatusRelayed, record.StatusDelivered, record.StatusClosed:
	default:
		writeError(w, http.StatusBadRequest, codeBadRequest, "unknown status "+strconv.Quote(status))
		return
	}
	ctx := r.Context()
	sums, err := d.st.MessageSummaries(ctx)
	degraded := err != nil
	if degraded {
		if !unreadable(err) {
			d.writeStoreError(w, err)
			return
		}
		d.apiProblem(err)
		ids, lerr := d.st.List(record.KindMessages)
		if lerr != nil {
			d.writeStoreError(w, lerr)
			return
		}
		sums = make([]store.MessageSummary, len(ids))
		for i, id := range ids {
			sums[i] = store.MessageSummary{MessageID: id}
		}
	}
	// The pending envelopes of queued messages and what they wait for, read once
	// for the page.
	var waits map[string]carrier.EnvelopeWait
	var pending map[string][]store.OutboxSummary
	pendingOf := func(id string) ([]*record.Outbox, error) {
		if pending == nil {
			all, err := d.st.OutboxSummaries(ctx)
			if err != nil {
				return nil, err
			}
			if waits, err = carrier.Waits(ctx, d.st, d.now()); err != nil {
				return nil, err
			}
			pending = map[string][]store.OutboxSummary{}
			for _, e := range all {
				if e.State == record.StatePending {
					pending[e.MessageID] = append(pending[e.MessageID], e)
				}
			}
		}
		var out []*record.Outbox
		for _, e := range pending[id] {
			o, err := store.GetAs[*record.Outbox](d.st, e.EnvelopeID)
			if err != nil {
				return nil, err
			}
			if o != nil && o.State == record.StatePending {
				out = append(out, o)
			}
		}
		return out, nil
	}
	out := client.MessageList{Messages: []client.Message{}}
	for _, s := range sums { // sorted by id
		if s.MessageID <= after || (!degraded && status != "" && s.Status != status) {
			continue
		}
		if len(out.Messages) == limit {
			out.Next = out.Messages[len(out.Messages)-1].MessageID
			break
		}
		cm := client.Message{MessageID: s.MessageID, Kind: messageKind(s.MessageID), Status: s.Status, ClosedBy: s.ClosedBy, To: s.PeerOwnerDID,
			RelayURL: s.RelayURL, Attempts: s.Attempts, CreatedAt: msTime(s.CreatedAt), UpdatedAt: msTime(s.UpdatedAt),
			Deadline: msTime(s.DeliveryDeadline), LastError: s.LastError, Held: actionOf(s.Held), Operator: actionOf(s.Operator)}
		if degraded || s.Status == record.StatusQueued {
			m, err := d.st.Message(s.MessageID)
			var envs []*record.Outbox
			if err == nil && m != nil && m.Status == record.StatusQueued {
				envs, err = pendingOf(m.MessageID)
			}
			if err != nil {
				if !unreadable(err) {
					d.writeStoreError(w, err)
					return
				}
				d.apiProblem(err)
				out.Messages = append(out.Messages, client.Message{MessageID: s.MessageID,
					Error: &client.Error{Code: errcode.Of(err), Message: err.Error()}})
				continue
			}
			if m == nil || (status != "" && m.Status != status) {
				continue
			}
			cm = toClient(m)
			withDelivery(&cm, envs, waits)
		}
		out.Messages = append(out.Messages, cm)
	}
	writeJSON(w, http.StatusOK, out)
}

// response is what an idempotent operation stores: the status and body answered.
type response struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

func (d *Daemon) serveSend(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if len(key) > maxIdempotencyKey || strings.ContainsFunc(key, func(c rune) bool { return c < 0x20 || c > 0x7e }) {
		writeError(w, http.StatusBadRequest, codeBadRequest, fmt.Sprintf("Idempotency-Key must be 1..%d printable ASCII characters", maxIdempotencyKey))
		return
	}
	if streamed(r) {
		d.serveSendStream(w, r, key) // stream_send.go
		return
	}
	var req client.SendRequest
	if !readBodyOr(w, r, maxRequestBytes, &req, "{to, relayUrl, body, deadline}", func(w http.ResponseWriter) {
		writeBodyTooLarge(w, fmt.Sprintf("the request is over %d bytes, more than a send with a message body of at most %d bytes takes",
			maxRequestBytes, envelope.MaxBodySize))
	}) {
		return
	}
	if len(req.Body) > envelope.MaxBodySize {
		writeBodyTooLarge(w, fmt.Sprintf("the message body is %d bytes, over the limit of %d bytes", len(req.Body), envelope.MaxBodySize))
		return
	}
	d.acceptSend(w, r, key, req)
}

// acceptSend performs a send whose body is inline (at most envelope.MaxBodySize):
// a JSON request, or a streamed one whose body turned out small. Its request
// digest, for the Idempotency-Key, is that of req as JSON, so both forms of one
// send are one request.
func (d *Daemon) acceptSend(w http.ResponseWriter, r *http.Request, key string, req client.SendRequest) {
	canonical, _ := json.Marshal(req)
	now := time.Now()
	deadline := now.Add(defaultDeadline)
	if req.DeadlineMs != 0 {
		deadline = time.UnixMilli(req.DeadlineMs)
	}
	if code, msg, hint := validate(req, deadline, now); code != "" {
		writeErrorHint(w, http.StatusBadRequest, code, msg, hint)
		return
	}
	// Validated: the relay URL is kept in its one canonical form (the request's
	// digest, taken above, is of the request as sent).
	req.RelayURL, _ = relayproto.CanonicalRelayURL(req.RelayURL)
	if key == "" {
		if len(req.To) > 1 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"code": codeBadRequest,
				"message": "a send to several recipients needs an Idempotency-Key",
				"hint":    "each recipient's message is accepted on its own: send with an Idempotency-Key, so that a retry with it finishes a send that failed part-way"})
			return
		}
		msgID := uuid.NewString()
		status, body, _, err := d.send(r.Context(), msgID, req, deadline, false)
		if err != nil {
			d.writeSendError(w, err, msgID, false)
			return
		}
		writeJSONBytes(w, status, body)
		return
	}
	start, ok := d.beginSend(w, r, key, canonical, req.To)
	if !ok {
		return
	}
	if start.Done {
		var resp response
		if err := json.Unmarshal(start.Operation.Response, &resp); err != nil || resp.Status == 0 {
			writeError(w, http.StatusInternalServerError, codeInternal, "stored response is unreadable")
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSONBytes(w, resp.Status, resp.Body)
		return
	}
	// The (first) message id is the operation id: re-executing the operation after a
	// crash finds each message (or its interrupted enqueue) instead of making another.
	opID := start.Operation.OperationID
	status, body, failedID, err := d.send(r.Context(), opID, req, deadline, true)
	if err != nil {
		// Not a stored answer: let a retry take the operation over at once.
		if rerr := d.st.ReleaseOperation(context.WithoutCancel(r.Context()), opID); rerr != nil {
			d.storeWarn("api: releasing an operation", rerr, "operation", opID)
		}
		d.writeSendError(w, err, failedID, true)
		return
	}
	stored, _ := json.Marshal(response{Status: status, Body: body})
	if err := d.st.CompleteOperation(context.WithoutCancel(r.Context()), opID, stored); err != nil {
		// The message is accepted; a retry re-executes and finds it. End the lease so
		// that the retry need not wait for it.
		d.m.storeError(err)
		d.storeWarn("api: completing an operation", err, "operation", opID)
		if rerr := d.st.ReleaseOperation(context.WithoutCancel(r.Context()), opID); rerr != nil {
			d.storeWarn("api: releasing an operation", rerr, "operation", opID)
		}
	}
	writeJSONBytes(w, status, body)
}

// decodeBody decodes a request body strictly: one JSON object with no duplicate,
// case-variant or unknown key and nothing after it (envelope.DecodeStrict).
func decodeBody(data []byte, v any) error { return envelope.DecodeStrict(data, v) }

// acceptedOperation finds the operation bound to key for the request canonical and
// returns its id and, if every recipient's message is accepted (made durable again by
// store.AcceptedMessage), their messages in the order of to; ("", nil, nil) when there
// is no such operation, and (id, nil, nil) while a message is still missing.
func (d *Daemon) acceptedOperation(key string, canonical []byte, to client.Recipients) (string, []*record.Message, error) {
	b, err := store.GetAs[*record.Binding](d.st, record.IdempotencyID(key))
	if err != nil || b == nil || b.RequestDigest != envelope.Digest(canonical) {
		return "", nil, nil // BeginOperation's answer stands
	}
	ms := make([]*record.Message, 0, len(to))
	for _, id := range recipientMessageIDs(b.OperationID, to) {
		m, err := d.st.AcceptedMessage(id)
		if err != nil || m == nil {
			return b.OperationID, nil, err
		}
		ms = append(ms, m)
	}
	return b.OperationID, ms, nil
}

// recipientMessageIDs names the messages of a send to the recipients to: the first
// is first (the operation's id, or a fresh one), each other one the name-based id of
// its recipient in first's namespace, so that a retry re-executing the operation
// finds each message (or its interrupted enqueue) instead of making another.
func recipientMessageIDs(first string, to client.Recipients) []string {
	ids := make([]string, len(to))
	for i, did := range to {
		if i == 0 {
			ids[i] = first
		} else {
			ids[i] = uuid.FromName(first, did)
		}
	}
	return ids
}

// sendAnswer is a send's answer body: the message for one recipient, or a
// client.SendResult for several.
func sendAnswer(ms []*record.Message) []byte {
	if len(ms) == 1 {
		body, _ := json.Marshal(toClient(ms[0]))
		return body
	}
	res := client.SendResult{Messages: make([]client.Message, len(ms))}
	for i, m := range ms {
		res.Messages[i] = toClient(m)
	}
	body, _ := json.Marshal(res)
	return body
}

// writeBodyTooLarge answers a JSON send whose message body is over the inline limit
// (envelope.MaxBodySize): 413 BODY_TOO_LARGE with the limit and a hint pointing at
// the streamed send (stream_send.go), which takes larger bodies.
func writeBodyTooLarge(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{"code": codeBodyTooLarge, "message": msg,
		"limit": envelope.MaxBodySize,
		"hint": fmt.Sprintf("a message body in a JSON request is at most %d bytes (%d KiB): send a larger one as a streamed upload "+
			"(Content-Type: application/octet-stream; sealbridge send does), up to the daemon's --max-body",
			envelope.MaxBodySize, envelope.MaxBodySize>>10)})
}

// readBody reads r's body, at most limit bytes of application/json, into v with the
// strict decoder; on failure it answers the request (415, 413 or 400, saying the
// expected shape) and returns false.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, v any, shape string) bool {
	return readBodyOr(w, r, limit, v, shape, func(w http.ResponseWriter) {
		writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body over %d bytes", limit))
	})
}

// readBodyOr is readBody answering a body over limit with tooLarge.
func readBodyOr(w http.ResponseWriter, r *http.Request, limit int64, v any, shape string, tooLarge func(http.ResponseWriter)) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		writeError(w, http.StatusUnsupportedMediaType, codeUnsupported, "send application/json")
		return false
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooLarge(w)
			return false
		}
		writeError(w, http.StatusBadRequest, codeBadRequest, "reading the request: "+err.Error())
		return false
	}
	if err := decodeBody(data, v); err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, "request must be one JSON object "+shape+": "+err.Error())
		return false
	}
	return true
}

// send makes sure the message of each recipient of req exists (firstID names the
// first, recipientMessageIDs the others): already stored, an interrupted enqueue
// finished, or built and enqueued now, one recipient after another. It returns the
// answer's status and body; on an error, the id of the message it was making (those
// before it are accepted: a retry with the same key finishes the rest).
func (d *Daemon) send(ctx context.Context, firstID string, req client.SendRequest, deadline time.Time, resume bool) (int, []byte, string, error) {
	ids := recipientMessageIDs(firstID, req.To)
	ms := make([]*record.Message, len(ids))
	for i, msgID := range ids {
		m, err := d.sendOne(ctx, msgID, identity.DID(req.To[i]), req, deadline, resume)
		if err != nil {
			return 0, nil, msgID, err
		}
		ms[i] = m
	}
	d.car.Kick()
	return http.StatusCreated, sendAnswer(ms), "", nil
}

// sendOne makes sure message msgID to one recipient exists.
func (d *Daemon) sendOne(ctx context.Context, msgID string, to identity.DID, req client.SendRequest, deadline time.Time, resume bool) (*record.Message, error) {
	var m *record.Message
	resumed := false
	if resume {
		var err error
		if m, resumed, err = d.st.ResumeEnqueue(ctx, msgID); err != nil {
			return nil, err
		}
	}
	if !resumed {
		env, wire, err := envelope.NewMessage(d.id, to, msgID, req.Body, deadline, time.Now())
		if err != nil {
			return nil, &badRequest{err.Error()}
		}
		t0 := time.Now()
		m, err = d.st.Enqueue(ctx, store.SendRequest{MessageID: msgID, PeerOwnerDID: to, RelayURL: req.RelayURL,
			DeliveryDeadline: deadline, Envelopes: []store.OutgoingEnvelope{
				{EnvelopeID: env.ID(), Kind: record.EnvelopeMessage, Envelope: wire}}})
		d.m.enqueue.Observe(time.Since(t0).Seconds())
		if err != nil {
			return nil, err
		}
	}
	d.recordChange(client.TopicMessages, m.MessageID, m.Status)
	return m, nil
}

func validate(req client.SendRequest, deadline, now time.Time) (code, msg, hint string) {
	if len(req.To) == 0 || len(req.To) > client.MaxRecipients {
		return codeBadRequest, fmt.Sprintf("to must be a did:key or a list of 1 to %d of them", client.MaxRecipients), ""
	}
	seen := make(map[string]bool, len(req.To))
	for i, to := range req.To {
		if _, err := identity.ParseDID(to); err != nil {
			if len(req.To) == 1 {
				return codeBadRequest, "to must be a did:key of an Ed25519 key", ""
			}
			return codeBadRequest, fmt.Sprintf("to[%d] must be a did:key of an Ed25519 key", i), ""
		}
		if seen[to] {
			return codeBadRequest, fmt.Sprintf("to[%d] names a recipient twice", i), ""
		}
		seen[to] = true
	}
	if _, err := relayproto.CanonicalRelayURL(req.RelayURL); err != nil {
		return relayproto.CodeRelayURLInvalid, "relayUrl: " + err.Error(), relayproto.RelayURLFix(err)
	}
	if !deadline.After(now) {
		return errcode.OutboxDeadlineExpired.String(), "deadline is not in the future", ""
	}
	return "", "", ""
}

func toClient(m *record.Message) client.Message {
	return client.Message{MessageID: m.MessageID, Kind: messageKind(m.MessageID), Status: m.Status, ClosedBy: m.ClosedBy, LastError: m.LastError,
		To: m.PeerOwnerDID, RelayURL: m.RelayURL, Attempts: m.Attempts, CreatedAt: msTime(m.CreatedAt),
		UpdatedAt: msTime(m.UpdatedAt), Deadline: msTime(m.DeliveryDeadline), Held: actionOf(m.Held),
		Operator: actionOf(m.Operator)}
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// statusOf maps a store error code to an HTTP status.
func statusOf(c *errcode.Code) int {
	switch c {
	case errcode.IdempotencyKeyReused:
		return http.StatusUnprocessableEntity
	case errcode.IdempotencyInProgress, errcode.DeliveryRecordConflict, errcode.DeliveryStatusConflict,
		errcode.StoreRolledBack:
		return http.StatusConflict
	case errcode.OutboxFull, errcode.IdempotencyStoreFull:
		return http.StatusInsufficientStorage
	case errcode.OutboxStoreBusy, errcode.IdempotencyStoreBusy, errcode.OutboxStoreUnwritable:
		return http.StatusServiceUnavailable
	case errcode.OutboxDeadlineExpired, errcode.InvalidDeliveryStatus:
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// badRequest is a request refused by the envelope builder.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func (d *Daemon) writeStoreError(w http.ResponseWriter, err error) {
	status, code, msg := d.classify(w, err)
	if writeFailure(err) {
		_, hint := describeWriteFailure(d.st.Dir(), err)
		writeJSON(w, status, map[string]string{"code": code, "message": msg, "hint": hint})
		return
	}
	if hint := idempotencyHint(code); hint != "" {
		writeJSON(w, status, map[string]string{"code": code, "message": msg, "hint": hint})
		return
	}
	if hint := errcode.HintOf(err); hint != "" && code == errcode.StoreRolledBack.String() {
		writeJSON(w, status, map[string]string{"code": code, "message": msg, "hint": hint})
		return
	}
	writeError(w, status, code, msg)
}

// idempotencyHint is the advice of an answer to a send whose Idempotency-Key cannot
// be used now, or "".
func idempotencyHint(code string) string {
	switch code {
	case errcode.IdempotencyInProgress.String():
		return "the first request with this Idempotency-Key is still being processed: retry the same request with the same key after Retry-After; it answers with that request's message, and never sends a second one"
	case errcode.IdempotencyKeyReused.String():
		return "this Idempotency-Key is bound to another request: send a new request with a new key (the key's first request keeps its answer)"
	}
	return ""
}

// sendError is the error answer of a send that failed in the daemon (5xx). Outcome
// "unknown" and MessageID say that the message may have been accepted nonetheless
// (its commit was published but not confirmed durable): it may be delivered.
type sendError struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Outcome   string `json:"outcome,omitempty"`
	MessageID string `json:"messageId,omitempty"`
	Hint      string `json:"hint,omitempty"`
}

// writeSendError answers a failed send of message msgID (keyed: the request has an
// Idempotency-Key). A 5xx tells the client whether the message may have been
// accepted and how to retry without sending it twice.
func (d *Daemon) writeSendError(w http.ResponseWriter, err error, msgID string, keyed bool) {
	status, code, msg := d.classify(w, err)
	if status < 500 {
		writeError(w, status, code, msg)
		return
	}
	e := sendError{Code: code, Message: msg}
	visible := false
	if m, merr := d.st.Message(msgID); merr == nil && m != nil {
		visible = true
		e.Outcome, e.MessageID = "unknown", msgID
	}
	switch {
	case keyed && visible:
		e.Hint = "the message may have been accepted and may be delivered: retry with the same Idempotency-Key and the same request to learn the outcome; never with another key"
	case keyed:
		e.Hint = "retry with the same Idempotency-Key and the same request"
	case visible:
		e.Hint = "the message may have been accepted and may be delivered: check GET /v1/messages/" + msgID + " before sending it again; send with an Idempotency-Key to make retries safe"
	default:
		e.Hint = "the message was not accepted; send with an Idempotency-Key to make retries safe"
	}
	if writeFailure(err) {
		_, hint := describeWriteFailure(d.st.Dir(), err)
		if visible {
			e.Hint += "; and " + hint
		} else {
			e.Hint = hint + " (the message was not accepted)"
		}
	}
	writeJSON(w, status, e)
}

// classify maps err to the answer's status, code and message, logging what the
// daemon must see and setting Retry-After where a retry helps.
func (d *Daemon) classify(w http.ResponseWriter, err error) (int, string, string) {
	var br *badRequest
	if errors.As(err, &br) {
		return http.StatusBadRequest, codeBadRequest, br.msg
	}
	var c *errcode.Code
	for _, k := range errcode.All {
		if errors.Is(err, k) {
			c = k
			break
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return http.StatusServiceUnavailable, codeNotReady, "request cancelled"
	}
	if c == nil {
		d.m.storeError(err)
		d.log.Error("api: internal error", "err", err)
		return http.StatusInternalServerError, codeInternal, "internal error (see the daemon log)"
	}
	status := statusOf(c)
	switch {
	case unreadable(err):
		d.apiProblem(err) // logged as a condition
	case writeFailure(err):
		// One condition for every writer, logged at most once a minute; the answer
		// says it in plain words, without Retry-After: a retry in a second fails too.
		d.m.storeError(err)
		msg, _ := d.writeFailed(err)
		return status, c.String(), msg
	case status >= 500:
		d.m.storeError(err)
		d.log.Warn("api: store error", "code", c.String(), "err", err)
	}
	if status == http.StatusServiceUnavailable || c == errcode.IdempotencyInProgress {
		w.Header().Set("Retry-After", "1")
	}
	// The code is the answer's "code"; its message is what the error says after it.
	return status, c.String(), strings.TrimPrefix(err.Error(), c.String()+": ")
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

// writeErrorHint is writeError with the daemon's advice (client.Error.Hint), if any.
func writeErrorHint(w http.ResponseWriter, status int, code, msg, hint string) {
	if hint == "" {
		writeError(w, status, code, msg)
		return
	}
	writeJSON(w, status, map[string]string{"code": code, "message": msg, "hint": hint})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"code":"INTERNAL","message":"encoding the response"}`)
	}
	writeJSONBytes(w, status, data)
}

func writeJSONBytes(w http.ResponseWriter, status int, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// beginSend binds a send's Idempotency-Key to its operation (BeginOperation), for
// the JSON and the streamed send alike. It waits first until the operations a dead
// predecessor left in flight are expired (bounded by the request). A key whose
// operation is in flight and whose message was accepted already (its answer never
// stored) is answered with that message, rather than making the client wait for
// the lease. ok is false when it answered the request itself.
func (d *Daemon) beginSend(w http.ResponseWriter, r *http.Request, key string, canonical []byte, to client.Recipients) (store.OperationStart, bool) {
	select {
	case <-d.leasesOK:
	case <-r.Context().Done():
		writeError(w, http.StatusServiceUnavailable, errcode.IdempotencyStoreBusy.String(), "starting up")
		return store.OperationStart{}, false
	}
	start, err := d.st.BeginOperation(r.Context(), key, canonical)
	if errors.Is(err, errcode.IdempotencyInProgress) {
		if opID, ms, aerr := d.acceptedOperation(key, canonical, to); aerr != nil {
			d.writeSendError(w, aerr, opID, true)
			return store.OperationStart{}, false
		} else if ms != nil {
			w.Header().Set("Idempotent-Replayed", "true")
			moveWriteDeadline(w) // a streamed send may have outlasted WriteTimeout
			writeJSONBytes(w, http.StatusCreated, sendAnswer(ms))
			return store.OperationStart{}, false
		}
	}
	if err != nil {
		d.writeStoreError(w, err)
		return store.OperationStart{}, false
	}
	return start, true
}
