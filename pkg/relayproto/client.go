package relayproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Bounds on what a Client reads of a relay's answers.
const (
	maxPageAnswer = 64 << 20
	maxAckAnswer  = 4 << 10
	// A batch answer is at most one receipt and a short refusal per envelope.
	maxBatchAnswer = MaxBatchEnvelopes*(envelope.MaxReceiptSize+1024) + 1024
)

// Client talks to one relay. The zero HTTP client means http.DefaultClient;
// Now defaults to time.Now.
type Client struct {
	BaseURL string // e.g. "http://127.0.0.1:8080"
	HTTP    *http.Client
	Now     func() time.Time
	// Head, if set, is called for every post (Post, PostBatch); the bytes it
	// returns, if any, are sent as HeaderHead: the sender's latest store head
	// (envelope.SignStoreHead), for the relay to witness. It must be safe to
	// call concurrently.
	Head func() []byte
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Client) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Post sends one wire envelope and returns the receipt bytes and the parsed,
// verified receipt, which must match the envelope. A relay's refusal is
// returned as an *Error. For an envelope with a blob body that the relay does
// not hold in full yet (a 202), the error is a *BodyIncompleteError: upload
// the body from its Offset (UploadBody), then Post again.
func (c *Client) Post(ctx context.Context, wire []byte) ([]byte, *envelope.RelayReceipt, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+PathEnvelopes, bytes.NewReader(wire))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	c.setHead(req)
	var incomplete *BodyIncompleteError
	body, err := c.doWith(req, envelope.MaxReceiptSize, func(status int, body []byte) error {
		if status != http.StatusAccepted {
			return nil
		}
		var bi BodyIncomplete
		if err := json.Unmarshal(body, &bi); err != nil || bi.Code != CodeBodyIncomplete || bi.Offset < 0 || bi.Size < bi.Offset {
			return errors.New("relay: a 202 that is not a BodyIncomplete answer")
		}
		incomplete = &BodyIncompleteError{Offset: bi.Offset, Size: bi.Size, Upload: bi.Upload}
		return incomplete
	})
	if err != nil {
		return nil, nil, err
	}
	rc, err := envelope.ParseRelayReceipt(body)
	if err != nil {
		return nil, nil, fmt.Errorf("relay: bad receipt: %w", err)
	}
	if !rc.Matches(envelopeIDOf(wire), envelope.Digest(wire)) {
		return nil, nil, errors.New("relay: receipt is for another envelope")
	}
	return body, rc, nil
}

// BatchAnswer is what PostBatch reports for one envelope.
type BatchAnswer struct {
	// Outcome is BatchAccepted, BatchDuplicate or BatchRefused.
	Outcome string
	// Receipt and Parsed are the receipt of an accepted or duplicate envelope,
	// verified to match it.
	Receipt []byte
	Parsed  *envelope.RelayReceipt
	// Refusal is the relay's refusal of this envelope (BatchRefused only).
	Refusal *Error
	// Err is set, and the other fields are not, when the relay's answer for
	// this envelope is unusable: an unknown outcome, a receipt that does not
	// verify or is for another envelope.
	Err error
}

// ErrNotBatchAnswer is what PostBatch returns (wrapped) for a 200 that is not a
// batch answer for the envelopes sent: what a relay without the endpoint may
// answer.
var ErrNotBatchAnswer = errors.New("relay: the answer is not a batch answer")

// PostBatch sends 1 to MaxBatchEnvelopes wire envelopes, which must fit
// MaxBatchBodySize (BatchBodySize), in one request, and returns one answer per
// envelope in their order. An error is about the whole request: a relay's
// refusal of it comes back as an *Error (404 or 405: the relay has no batch
// endpoint; send each envelope with Post), and a 200 without one result per
// envelope as ErrNotBatchAnswer.
func (c *Client) PostBatch(ctx context.Context, wires [][]byte) ([]BatchAnswer, error) {
	if len(wires) == 0 || len(wires) > MaxBatchEnvelopes {
		return nil, fmt.Errorf("relay: a batch holds 1 to %d envelopes, not %d", MaxBatchEnvelopes, len(wires))
	}
	sizes := make([]int, len(wires))
	for i, w := range wires {
		sizes[i] = len(w)
	}
	size := BatchBodySize(sizes...)
	if size > MaxBatchBodySize {
		return nil, fmt.Errorf("relay: batch body would be %d bytes, limit %d", size, MaxBatchBodySize)
	}
	// The envelopes are embedded byte for byte: they are canonical JSON
	// (envelope.Parse refuses anything else), and encoding/json would
	// re-encode a json.RawMessage only by compacting it.
	buf := make([]byte, 0, size)
	buf = append(buf, `{"envelopes":[`...)
	for i, w := range wires {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, w...)
	}
	buf = append(buf, "]}"...)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+PathEnvelopesBatch, bytes.NewReader(buf))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	c.setHead(req)
	body, err := c.do(req, maxBatchAnswer)
	if err != nil {
		return nil, err
	}
	var resp BatchResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotBatchAnswer, err)
	}
	if len(resp.Results) != len(wires) {
		return nil, fmt.Errorf("%w: %d results for %d envelopes", ErrNotBatchAnswer, len(resp.Results), len(wires))
	}
	out := make([]BatchAnswer, len(wires))
	for i, r := range resp.Results {
		out[i] = batchAnswer(wires[i], r)
	}
	return out, nil
}

func batchAnswer(wire []byte, r BatchResult) BatchAnswer {
	switch r.Outcome {
	case BatchAccepted, BatchDuplicate:
		rc, err := envelope.ParseRelayReceipt(r.Receipt)
		if err != nil {
			return BatchAnswer{Err: fmt.Errorf("relay: bad receipt: %w", err)}
		}
		if !rc.Matches(envelopeIDOf(wire), envelope.Digest(wire)) {
			return BatchAnswer{Err: errors.New("relay: receipt is for another envelope")}
		}
		return BatchAnswer{Outcome: r.Outcome, Receipt: []byte(r.Receipt), Parsed: rc}
	case BatchRefused:
		if r.Status < 400 || r.Status > 599 || r.Code == "" {
			return BatchAnswer{Err: fmt.Errorf("relay: refusal without an error status and code (%d)", r.Status)}
		}
		return BatchAnswer{Outcome: r.Outcome, Refusal: &Error{Status: r.Status, Code: r.Code, Message: r.Message,
			RetryAfter: max(r.RetryAfter, 0)}}
	}
	return BatchAnswer{Err: errors.New("relay: unknown batch outcome")}
}

func envelopeIDOf(wire []byte) string {
	if env, err := envelope.Parse(wire); err == nil {
		return env.ID()
	}
	return ""
}

// Fetch returns a page of id's inbox after cursor (empty: from the start),
// at most limit envelopes (0: the relay's default).
func (c *Client) Fetch(ctx context.Context, id *identity.Identity, after string, limit int) (*InboxPage, error) {
	return c.FetchWait(ctx, id, after, limit, 0)
}

// FetchWait is Fetch with a long poll: when nothing is waiting after the
// cursor, the relay holds the request until an envelope for id arrives or wait
// (at most MaxInboxWait; 0: none) ends, then answers the page (empty if the
// wait ended). The HTTP client's timeout must exceed wait. A relay that does
// not know wait= refuses it with a 400 BAD_REQUEST, or answers at once.
func (c *Client) FetchWait(ctx context.Context, id *identity.Identity, after string, limit int, wait time.Duration) (*InboxPage, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if wait > 0 {
		q.Set("wait", min(wait, MaxInboxWait).String())
	}
	return c.getPage(ctx, id, PathInbox, q, "inbox page")
}

// getPage is a GET of path with query q, signed by id (SignInboxRequest), whose
// answer is one InboxPage; what names the page in a decoding error.
func (c *Client) getPage(ctx context.Context, id *identity.Identity, path string, q url.Values, what string) (*InboxPage, error) {
	u := strings.TrimRight(c.BaseURL, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if err := SignInboxRequest(req, id, c.now()); err != nil {
		return nil, err
	}
	body, err := c.do(req, maxPageAnswer)
	if err != nil {
		return nil, err
	}
	var page InboxPage
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, fmt.Errorf("relay: bad %s: %w", what, err)
	}
	return &page, nil
}

// Status returns what is waiting in id's inbox. A relay without the endpoint
// answers 404 (an *Error).
func (c *Client) Status(ctx context.Context, id *identity.Identity) (*InboxStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.BaseURL, "/")+PathInboxStatus, nil)
	if err != nil {
		return nil, err
	}
	if err := SignInboxRequest(req, id, c.now()); err != nil {
		return nil, err
	}
	body, err := c.do(req, maxAckAnswer)
	if err != nil {
		return nil, err
	}
	var st InboxStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("relay: bad inbox status: %w", err)
	}
	return &st, nil
}

// Ack removes envelopes from id's inbox and returns how many were removed.
func (c *Client) Ack(ctx context.Context, id *identity.Identity, envelopeIDs []string) (int, error) {
	data, err := json.Marshal(AckRequest{EnvelopeIDs: envelopeIDs})
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+PathInboxAck, bytes.NewReader(data))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if err := SignInboxRequest(req, id, c.now()); err != nil {
		return 0, err
	}
	body, err := c.do(req, maxAckAnswer)
	if err != nil {
		return 0, err
	}
	var resp AckResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return 0, fmt.Errorf("relay: bad ack response: %w", err)
	}
	return resp.Acknowledged, nil
}

// Register adds id to the relay's allow-list of recipients (a relay without
// one accepts envelopes for every recipient anyway); Unregister removes it.
// Both are signed as the inbox requests are, and idempotent.
func (c *Client) Register(ctx context.Context, id *identity.Identity) error {
	return c.register(ctx, id, PathRecipientsRegister, true)
}

// Unregister removes id from the relay's allow-list: the relay then refuses
// new envelopes for it (403 RECIPIENT_NOT_ALLOWED) when its allow-list is on.
// Envelopes already in its inbox stay there to be fetched.
func (c *Client) Unregister(ctx context.Context, id *identity.Identity) error {
	return c.register(ctx, id, PathRecipientsUnregister, false)
}

func (c *Client) register(ctx context.Context, id *identity.Identity, p string, want bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+p, nil)
	if err != nil {
		return err
	}
	if err := SignInboxRequest(req, id, c.now()); err != nil {
		return err
	}
	body, err := c.do(req, maxAckAnswer)
	if err != nil {
		return err
	}
	var resp RegisterResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("relay: bad registration answer: %w", err)
	}
	if resp.Registered != want {
		return fmt.Errorf("relay: registration answer says registered=%v", resp.Registered)
	}
	return nil
}
