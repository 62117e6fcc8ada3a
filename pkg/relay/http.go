package relay

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Handler returns the relay's HTTP handler.
func (r *Relay) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		var status int
		var err error
		switch req.URL.Path {
		case relayproto.PathEnvelopes:
			status, err = r.only(w, req, http.MethodPost, r.serveEnvelope)
		case relayproto.PathEnvelopesBatch:
			status, err = r.only(w, req, http.MethodPost, r.serveBatch)
		case relayproto.PathInbox:
			status, err = r.only(w, req, http.MethodGet, r.serveInbox)
		case relayproto.PathInboxAck:
			status, err = r.only(w, req, http.MethodPost, r.serveAck)
		case relayproto.PathRecipientsRegister, relayproto.PathRecipientsUnregister:
			status, err = r.only(w, req, http.MethodPost, r.serveRegister)
		case relayproto.PathInboxStatus:
			status, err = r.only(w, req, http.MethodGet, r.serveStatus)
		case relayproto.PathSenderHead:
			status, err = r.only(w, req, http.MethodGet, r.serveSenderHead)
		case relayproto.PathSenderReceipts:
			status, err = r.only(w, req, http.MethodPost, r.serveSenderReceipts)
		case relayproto.PathInboxStatuses:
			status, err = r.only(w, req, http.MethodGet, r.serveStatuses)
		case PathLivez:
			status, err = r.only(w, req, http.MethodGet, r.serveLive)
		case PathReadyz:
			status, err = r.only(w, req, http.MethodGet, r.serveReady)
		case PathMetrics:
			status, err = r.only(w, req, http.MethodGet, r.serveMetrics)
		default:
			switch {
			case strings.HasPrefix(req.URL.Path, relayproto.PathBodies):
				status, err = r.serveUpload(w, req)
			case strings.HasPrefix(req.URL.Path, relayproto.PathInboxBodies):
				status, err = r.serveBody(w, req)
			default:
				err = newError(http.StatusNotFound, relayproto.CodeNotFound, "no such endpoint")
			}
		}
		if errors.Is(err, errClientGone) {
			r.log.Debug("relay: client went away", "method", req.Method, "path", req.URL.Path,
				"ms", time.Since(start).Milliseconds())
			return
		}
		if err != nil {
			e := asError(err)
			status = e.Status
			writeError(w, e)
			r.countRequestError(e.Code)
			level := r.log.Info
			if e.Status >= 500 {
				level = r.log.Error
			}
			args := []any{"method", req.Method, "path", req.URL.Path, "status", e.Status, "code", e.Code,
				"remote", req.RemoteAddr, "ms", time.Since(start).Milliseconds()}
			if e.Cause != nil && e.Status >= 500 {
				args = append(args, "cause", e.Cause.Error())
			}
			level("relay: request refused", args...)
			return
		}
		r.log.Debug("relay: request", "method", req.Method, "path", req.URL.Path, "status", status,
			"ms", time.Since(start).Milliseconds())
	})
}

// errClientGone: the client went away while its request was held; there is
// nobody to answer.
var errClientGone = errors.New("relay: client went away")

func (r *Relay) only(w http.ResponseWriter, req *http.Request, method string,
	fn func(http.ResponseWriter, *http.Request) (int, error)) (int, error) {
	if req.Method != method {
		w.Header().Set("Allow", method)
		return 0, newError(http.StatusMethodNotAllowed, relayproto.CodeMethodNotAllowed, "use %s", method)
	}
	return fn(w, req)
}

// readBody reads at most max bytes of the body; more is a 413 with code.
func readBody(w http.ResponseWriter, req *http.Request, max int64, code string) ([]byte, *relayproto.Error) {
	if req.ContentLength > max {
		return nil, newError(http.StatusRequestEntityTooLarge, code, "body is %d bytes, limit %d", req.ContentLength, max)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, max))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, newError(http.StatusRequestEntityTooLarge, code, "body is larger than %d bytes", max)
		}
		return nil, &relayproto.Error{Status: http.StatusBadRequest, Code: relayproto.CodeBadRequest, Message: "could not read the body", Cause: err}
	}
	return body, nil
}

func (r *Relay) serveEnvelope(w http.ResponseWriter, req *http.Request) (int, error) {
	body, e := readBody(w, req, envelope.MaxSize, relayproto.CodeEnvelopeTooLarge)
	if e != nil {
		r.count(func(s *Stats) { s.Refused++ })
		r.countRefusals(e.Code, 1)
		return 0, e
	}
	head, e := r.headOf(req)
	if e != nil {
		r.count(func(s *Stats) { s.Refused++ })
		r.countRefusals(e.Code, 1)
		return 0, e
	}
	receipt, err := r.AcceptHead(req.Context(), body, head)
	var bi *relayproto.BodyIncompleteError
	if errors.As(err, &bi) {
		data, _ := json.Marshal(relayproto.BodyIncomplete{Code: relayproto.CodeBodyIncomplete, Upload: bi.Upload,
			Offset: bi.Offset, Size: bi.Size})
		w.Header().Set("Location", bi.Upload)
		writeJSONBytes(w, http.StatusAccepted, data)
		return http.StatusAccepted, nil
	}
	if err != nil {
		if req.Context().Err() == nil {
			r.countRefusals(asError(err).Code, 1)
		}
		if e := asError(err); e.Status < 500 && e.Status != http.StatusConflict {
			r.count(func(s *Stats) { s.Refused++ })
		}
		return 0, err
	}
	writeJSONBytes(w, http.StatusOK, receipt)
	return http.StatusOK, nil
}

func (r *Relay) serveInbox(w http.ResponseWriter, req *http.Request) (int, error) {
	_, did, e := r.signedRequest(w, req)
	if e != nil {
		return 0, e
	}
	q := req.URL.Query()
	for k := range q {
		if k != "after" && k != "limit" && k != "wait" {
			return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "unknown query parameter %q", k)
		}
	}
	after := q.Get("after") // the storage parses it
	limit := relayproto.DefaultFetchLimit
	if s := q.Get("limit"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > relayproto.MaxFetchLimit {
			return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "limit must be 1..%d", relayproto.MaxFetchLimit)
		}
		limit = v
	}
	wait, err := relayproto.ParseInboxWait(q.Get("wait"))
	if err != nil {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "%s", err)
	}
	if wait > 0 {
		// The server's read and write timeouts count from the request's
		// arrival and may be shorter than the wait; a read deadline that
		// passes cancels the request. Make room for this one.
		rc := http.NewResponseController(w)
		end := time.Now().Add(wait + inboxWaitSlack)
		_ = rc.SetReadDeadline(end)
		_ = rc.SetWriteDeadline(end)
	}
	page, err := r.fetchWait(req.Context(), addressKey(req.RemoteAddr), did, after, limit, wait)
	if err != nil {
		if req.Context().Err() != nil && errors.Is(err, req.Context().Err()) {
			return 0, errClientGone
		}
		return 0, err
	}
	data, err := json.Marshal(page)
	if err != nil {
		return 0, internalError(err)
	}
	writeJSONBytes(w, http.StatusOK, data)
	return http.StatusOK, nil
}

func (r *Relay) serveStatus(w http.ResponseWriter, req *http.Request) (int, error) {
	_, did, e := r.signedRequest(w, req)
	if e != nil {
		return 0, e
	}
	for k := range req.URL.Query() {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "unknown query parameter %q", k)
	}
	st, err := r.Status(req.Context(), did)
	if err != nil {
		return 0, err
	}
	data, err := json.Marshal(st)
	if err != nil {
		return 0, internalError(err)
	}
	writeJSONBytes(w, http.StatusOK, data)
	return http.StatusOK, nil
}

// decodeEnvelopeIDs decodes body strictly into v, a request of one field
// {"envelopeIds":[…]} whose list is *ids, and checks the list: 1..MaxAckIDs
// lower-case UUIDs. A refusal is a 400 BAD_REQUEST naming what is wrong.
func decodeEnvelopeIDs(body []byte, v any, ids *[]string) error {
	if err := envelope.DecodeStrict(body, v); err != nil {
		return newError(http.StatusBadRequest, relayproto.CodeBadRequest, `body must be one JSON object {"envelopeIds":[…]}: %s`, err)
	}
	if len(*ids) == 0 || len(*ids) > relayproto.MaxAckIDs {
		return newError(http.StatusBadRequest, relayproto.CodeBadRequest, "envelopeIds must list 1..%d ids", relayproto.MaxAckIDs)
	}
	for i, id := range *ids {
		if !uuid.Valid(id) {
			return newError(http.StatusBadRequest, relayproto.CodeBadRequest, "envelopeIds[%d] is not a lower-case UUID", i)
		}
	}
	return nil
}

func (r *Relay) serveAck(w http.ResponseWriter, req *http.Request) (int, error) {
	body, did, e := r.signedRequest(w, req)
	if e != nil {
		return 0, e
	}
	var ack relayproto.AckRequest
	if e := decodeEnvelopeIDs(body, &ack, &ack.EnvelopeIDs); e != nil {
		return 0, e
	}
	n, err := r.Ack(req.Context(), did, ack.EnvelopeIDs)
	if err != nil {
		return 0, err
	}
	data, _ := json.Marshal(relayproto.AckResponse{Acknowledged: n})
	writeJSONBytes(w, http.StatusOK, data)
	return http.StatusOK, nil
}

// serveRegister adds the signing recipient to the allow-list, or removes it.
func (r *Relay) serveRegister(w http.ResponseWriter, req *http.Request) (int, error) {
	body, did, e := r.signedRequest(w, req)
	if e != nil {
		return 0, e
	}
	if len(body) != 0 || req.URL.RawQuery != "" {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "a registration has no body and no query")
	}
	register := req.URL.Path == relayproto.PathRecipientsRegister
	var err error
	if register {
		err = r.Register(req.Context(), did)
	} else {
		err = r.Unregister(req.Context(), did)
	}
	if err != nil {
		return 0, err
	}
	data, _ := json.Marshal(relayproto.RegisterResponse{Registered: register})
	writeJSONBytes(w, http.StatusOK, data)
	return http.StatusOK, nil
}

func writeJSONBytes(w http.ResponseWriter, status int, data []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// signedRequest reads req's body (at most relayproto.MaxAckBodySize) and
// verifies its signature (docs/RELAY.md "Signed inbox requests"): the body and
// the recipient who signed it.
func (r *Relay) signedRequest(w http.ResponseWriter, req *http.Request) ([]byte, identity.DID, *relayproto.Error) {
	body, e := readBody(w, req, relayproto.MaxAckBodySize, relayproto.CodeBodyTooLarge)
	if e != nil {
		return nil, "", e
	}
	did, e := r.authenticate(req, body)
	if e != nil {
		return nil, "", e
	}
	return body, did, nil
}
