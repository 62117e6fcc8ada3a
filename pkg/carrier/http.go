package carrier

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// defaultSendTimeout bounds one attempt: connect, request, answer (DESIGN §11).
const defaultSendTimeout = 150 * time.Second

// maxResponseBytes bounds how much of a relay's answer is read: a receipt is far
// smaller (envelope.MaxReceiptSize), and an error body is only looked at for its size.
const maxResponseBytes = 16 << 10

// HTTPOptions configure an HTTPTransport. The zero value is usable.
type HTTPOptions struct {
	// SendTimeout bounds one attempt (default 150 s).
	SendTimeout time.Duration
	// MaxConnsPerHost bounds connections to one relay (default 4; the carrier sends
	// one attempt at a time per target).
	MaxConnsPerHost int
	// TLSConfig, if set, is used for https relays.
	TLSConfig *tls.Config
	// Client, if set, is used as is (tests); the options above then only set the
	// per-attempt timeout.
	Client *http.Client
}

// HTTPTransport posts envelopes to relays over HTTP/1.1 (DESIGN §12) with one shared
// client, so connections to a relay are reused across attempts.
type HTTPTransport struct {
	client  *http.Client
	timeout time.Duration

	mu      sync.Mutex
	noBatch map[string]time.Time // relay URL → until when it is sent single envelopes
}

// noBatchFor is how long a relay that answered a batch with 404 or 405 (or with an
// answer that is not a batch answer) is sent single envelopes before a batch is
// tried again: it may have been upgraded meanwhile.
const noBatchFor = time.Hour

// NewHTTPTransport returns a transport for relays at http(s) URLs.
func NewHTTPTransport(opts HTTPOptions) *HTTPTransport {
	t := &HTTPTransport{client: opts.Client, timeout: opts.SendTimeout, noBatch: map[string]time.Time{}}
	if t.timeout <= 0 {
		t.timeout = defaultSendTimeout
	}
	if t.client == nil {
		perHost := opts.MaxConnsPerHost
		if perHost <= 0 {
			perHost = 4
		}
		tr := &http.Transport{
			Proxy:                 nil, // relays are addressed directly
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:       opts.TLSConfig,
			TLSHandshakeTimeout:   30 * time.Second,
			MaxIdleConns:          2 * maxTargetsDefault * perHost,
			MaxIdleConnsPerHost:   perHost,
			MaxConnsPerHost:       perHost,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: t.timeout,
			ExpectContinueTimeout: time.Second,
			ForceAttemptHTTP2:     false,
		}
		t.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a relay does not redirect envelopes
		}}
	}
	return t
}

// CloseIdleConnections closes the transport's idle connections.
func (t *HTTPTransport) CloseIdleConnections() { t.client.CloseIdleConnections() }

// SenderHead fetches the highest store head relayURL witnessed from id
// (relayproto.Client.SenderHead: signed by id, verified to be id's head); nil,
// nil when it holds none. It is bounded by the send timeout.
func (t *HTTPTransport) SenderHead(ctx context.Context, relayURL string, id *identity.Identity) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	c := &relayproto.Client{BaseURL: relayURL, HTTP: t.client}
	return c.SenderHead(ctx, id)
}

// Send posts envelope to relayURL + "/v1/envelopes", with the store head ctx
// carries (WithHead) in relayproto.HeaderHead, and classifies the answer:
//
//	200 with a valid signed receipt for this envelope's id and digest → Accepted
//	200 with anything else                                            → Failed
//	408, 429, 5xx, any other status, a timeout, a broken connection    → Failed (Retry-After kept)
//	400 HEAD_INVALID (the relay refused the head, not the envelope)    → Failed
//	4xx other than 408 and 429                                        → Refused
//	connection refused, host or network unreachable, DNS, TLS          → Unreachable
func (t *HTTPTransport) Send(ctx context.Context, relayURL string, env []byte) Result {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	url := strings.TrimRight(relayURL, "/") + relayproto.PathEnvelopes
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(env))
	if err != nil {
		return Result{Outcome: Unreachable, Err: fmt.Errorf("relay URL: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if h := HeadOf(ctx); h != nil {
		req.Header.Set(relayproto.HeaderHead, string(h))
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return Result{Outcome: classifyError(ctx, err), Err: err}
	}
	defer resp.Body.Close()
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	res := Result{Status: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	code := resp.StatusCode
	switch {
	case code == http.StatusOK:
		switch {
		case rerr != nil:
			res.Outcome, res.Err = Failed, fmt.Errorf("reading the receipt: %w", rerr)
		case len(body) > maxResponseBytes:
			res.Outcome, res.Err = Failed, errors.New("HTTP 200 with an oversized receipt")
		default:
			res.Outcome, res.Err = Failed, nil
			rcpt, perr := envelope.ParseRelayReceipt(bytes.TrimRight(body, "\r\n"))
			id, digest := envelopeIdentity(env)
			switch {
			case perr != nil:
				res.Err = fmt.Errorf("HTTP 200 with an invalid receipt: %w", perr)
			case !rcpt.Matches(id, digest):
				res.Err = errors.New("HTTP 200 with a receipt for another envelope")
			default:
				res.Outcome, res.Receipt, res.ParsedReceipt = Accepted, bytes.TrimRight(body, "\r\n"), rcpt
			}
		}
	case code == http.StatusAccepted:
		// A blob envelope the relay keeps pending until it holds all of its body.
		var bi relayproto.BodyIncomplete
		res.Outcome = Failed
		if rerr == nil && len(body) <= maxResponseBytes && json.Unmarshal(body, &bi) == nil &&
			bi.Code == relayproto.CodeBodyIncomplete && bi.Offset >= 0 && bi.Size >= bi.Offset {
			res.Code, res.Body = bi.Code, &BodyState{Offset: bi.Offset, Size: bi.Size}
			res.Err = fmt.Errorf("HTTP 202 %s: the relay holds %d of the body's %d bytes", bi.Code, bi.Offset, bi.Size)
		} else {
			res.Err = errors.New("HTTP 202 that is not a BODY_INCOMPLETE answer")
		}
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		res.Outcome, res.Err = Failed, fmt.Errorf("HTTP %d%s", code, errorCode(body))
	case code == http.StatusBadRequest && errorCode(body) == " "+relayproto.CodeHeadInvalid:
		// The relay refused the head the post carried, not the envelope: retried.
		res.Outcome, res.Err = Failed, fmt.Errorf("HTTP %d%s", code, errorCode(body))
	case code >= 400 && code < 500:
		res.Outcome, res.Err = Refused, fmt.Errorf("HTTP %d%s", code, errorCode(body))
	default:
		res.Outcome, res.Err = Failed, fmt.Errorf("unexpected HTTP %d", code)
	}
	return res
}

// Batches reports whether relayURL is to be sent batches: true unless it showed it
// has no batch endpoint within the last hour.
func (t *HTTPTransport) Batches(relayURL string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.noBatch[relayURL]
	if ok && time.Now().After(until) {
		delete(t.noBatch, relayURL)
		return true
	}
	return !ok
}

// SendBatch posts envs to relayURL + "/v1/envelopes/batch" with relayproto.Client,
// with the store head ctx carries (WithHead), and classifies the answer of each envelope as Send classifies a single answer.
// Whole-request answers: 404, 405 or a 200 that is not a batch answer → nil (the
// relay lacks the endpoint; remembered for an hour); any other 4xx but 408 and 429 →
// nil (the request, not an envelope, was refused); otherwise every envelope gets the
// request's outcome (Failed for 408, 429, 5xx and broken exchanges, Unreachable as
// Send says).
func (t *HTTPTransport) SendBatch(ctx context.Context, relayURL string, envs [][]byte) []Result {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	head := HeadOf(ctx)
	c := &relayproto.Client{BaseURL: relayURL, HTTP: t.client, Head: func() []byte { return head }}
	answers, err := c.PostBatch(ctx, envs)
	all := func(r Result) []Result {
		out := make([]Result, len(envs))
		for i := range out {
			out[i] = r
		}
		return out
	}
	var re *relayproto.Error
	switch {
	case errors.As(err, &re):
		code := re.Status
		res := Result{Status: code, RetryAfter: time.Duration(re.RetryAfter) * time.Second}
		switch {
		case code == http.StatusNotFound || code == http.StatusMethodNotAllowed:
			t.remember(relayURL)
			return nil
		case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
			res.Outcome, res.Err = Failed, fmt.Errorf("HTTP %d%s (batch)", code, spaced(safeCode(re.Code)))
			return all(res)
		case code >= 400 && code < 500:
			return nil
		}
		res.Outcome, res.Err = Failed, fmt.Errorf("unexpected HTTP %d (batch)", code)
		return all(res)
	case errors.Is(err, relayproto.ErrNotBatchAnswer):
		t.remember(relayURL)
		return nil
	case err != nil:
		return all(Result{Outcome: classifyError(ctx, err), Err: err})
	}
	out := make([]Result, len(envs))
	for i, a := range answers {
		r := Result{Status: http.StatusOK}
		switch {
		case a.Err != nil:
			r.Outcome, r.Err = Failed, fmt.Errorf("HTTP 200 (batch): %w", a.Err)
		case a.Refusal != nil:
			r.Status = a.Refusal.Status
			r.RetryAfter = time.Duration(a.Refusal.RetryAfter) * time.Second
			if code := a.Refusal.Status; code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500 {
				r.Outcome = Failed
			} else {
				r.Outcome = Refused
			}
			r.Err = fmt.Errorf("HTTP %d%s (batch)", a.Refusal.Status, spaced(safeCode(a.Refusal.Code)))
		default:
			r.Outcome, r.Receipt, r.ParsedReceipt = Accepted, a.Receipt, a.Parsed
		}
		out[i] = r
	}
	return out
}

func spaced(s string) string {
	if s == "" {
		return ""
	}
	return " " + s
}

func (t *HTTPTransport) remember(relayURL string) {
	t.mu.Lock()
	t.noBatch[relayURL] = time.Now().Add(noBatchFor)
	t.mu.Unlock()
}

// safeCode is a relay's error code for lastError, if it is a short token.
func safeCode(c string) string {
	if c == "" || len(c) > 64 || strings.ContainsFunc(c, func(r rune) bool {
		return !(r == '_' || r == '-' || r == '.' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
	}) {
		return ""
	}
	return c
}

// envelopeIdentity returns the id and digest the relay's receipt must name.
func envelopeIdentity(env []byte) (id, digest string) {
	digest = envelope.Digest(env)
	if e, err := envelope.Parse(env); err == nil {
		return e.ID(), digest
	}
	// Not a valid envelope (the relay will refuse it); read the id leniently.
	var w struct {
		Payload struct {
			EnvelopeID string `json:"envelopeId"`
		} `json:"payload"`
	}
	_ = json.Unmarshal(env, &w)
	return w.Payload.EnvelopeID, digest
}

// errorCode extracts a relay's JSON error code ({"code":"…"}) for lastError: a short
// token, never the body itself.
func errorCode(body []byte) string {
	var e struct {
		Code  string `json:"code"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	c := e.Code
	if c == "" {
		c = e.Error.Code
	}
	if c = safeCode(c); c == "" {
		return ""
	}
	return " " + c
}

// classifyError tells an unreachable relay (nobody answered the connection) from a
// failed attempt (it answered, or might have, but the exchange broke or timed out).
func classifyError(ctx context.Context, err error) Outcome {
	var dnsErr *net.DNSError
	var recErr tls.RecordHeaderError
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalidErr x509.CertificateInvalidError
	var alertErr tls.AlertError
	switch {
	case ctx.Err() != nil:
		return Failed // our timeout (or shutdown): the relay may have been working on it
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTDOWN),
		errors.As(err, &dnsErr), errors.As(err, &recErr), errors.As(err, &certErr),
		errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &invalidErr),
		errors.As(err, &alertErr):
		return Unreachable
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		if op.Timeout() {
			return Failed
		}
		return Unreachable
	}
	return Failed
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP-date. It
// returns 0 when absent or unparsable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > int64(365*24*time.Hour/time.Second) {
			n = int64(365 * 24 * time.Hour / time.Second)
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// UploadBody appends n bytes of r at offset to the body of the pending envelope
// envelopeID (PATCH relayURL/v1/bodies/<id>, relayproto.Client.UploadBody, which
// streams r) and classifies the answer:
//
//	204 with the relay's new Upload-Offset                       → Accepted, Body set
//	409 UPLOAD_OFFSET_MISMATCH (Body: the relay's offset)         → Failed
//	404 UPLOAD_UNKNOWN, 422 BODY_DIGEST_MISMATCH (body discarded) → Failed, Code says which
//	408, 429, 5xx, a timeout, a broken exchange                   → Failed (Retry-After kept)
//	any other 4xx (413: bytes beyond the body's size)              → Refused
//	connection refused, host or network unreachable, DNS, TLS      → Unreachable
//
// Unlike Send it puts no bound of its own on the whole request (a large one takes
// what the link needs: the carrier cuts one that stops moving); the relay's answer
// after the last byte is bounded by the client's response header timeout.
func (t *HTTPTransport) UploadBody(ctx context.Context, relayURL, envelopeID string, offset int64, r io.Reader, n int64) Result {
	c := &relayproto.Client{BaseURL: relayURL, HTTP: t.client}
	next, err := c.UploadBody(ctx, envelopeID, offset, r, n)
	if err == nil {
		return Result{Outcome: Accepted, Status: http.StatusNoContent, Body: &BodyState{Offset: next}}
	}
	res := t.bodyFailure(ctx, err)
	var re *relayproto.Error
	if !errors.As(err, &re) && ctx.Err() == nil {
		// The exchange broke (a relay killed or restarted): the idle connections
		// to it are likely dead too, and a body upload is never retried on one
		// by net/http, so each would cost a request that moves nothing.
		t.client.CloseIdleConnections()
	}
	if res.Code == relayproto.CodeUploadOffsetMismatch && next != offset {
		res.Body = &BodyState{Offset: next}
	} else if res.Code == relayproto.CodeUploadOffsetMismatch {
		// The relay's answer named no offset (or ours): ask for it.
		res.Body = nil
	}
	return res
}

// BodyOffset asks the relay how much of envelopeID's body it holds durably (HEAD
// relayURL/v1/bodies/<id>): Accepted with Body, or a failure classified as
// UploadBody's (404 UPLOAD_UNKNOWN: no upload of that id is pending).
func (t *HTTPTransport) BodyOffset(ctx context.Context, relayURL, envelopeID string) Result {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	c := &relayproto.Client{BaseURL: relayURL, HTTP: t.client}
	off, size, err := c.BodyOffset(ctx, envelopeID)
	if err == nil {
		return Result{Outcome: Accepted, Status: http.StatusOK, Body: &BodyState{Offset: off, Size: size}}
	}
	return t.bodyFailure(ctx, err)
}

// bodyFailure classifies a failed body request as UploadBody says.
func (t *HTTPTransport) bodyFailure(ctx context.Context, err error) Result {
	var re *relayproto.Error
	if !errors.As(err, &re) {
		return Result{Outcome: classifyError(ctx, err), Err: err}
	}
	code := re.Status
	res := Result{Status: code, Code: safeCode(re.Code), RetryAfter: time.Duration(re.RetryAfter) * time.Second,
		Err: fmt.Errorf("HTTP %d%s", code, spaced(safeCode(re.Code)))}
	switch {
	case code == http.StatusConflict && re.Code == relayproto.CodeUploadOffsetMismatch,
		code == http.StatusNotFound && re.Code == relayproto.CodeUploadUnknown,
		code == http.StatusUnprocessableEntity && re.Code == relayproto.CodeBodyDigestMismatch,
		code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		res.Outcome = Failed
	case code >= 400 && code < 500:
		res.Outcome = Refused
	default:
		res.Outcome = Failed
	}
	return res
}
