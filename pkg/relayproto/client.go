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
)

// Client talks to one relay. The zero HTTP client means http.DefaultClient;
// Now defaults to time.Now.
type Client struct {
	BaseURL string // e.g. "http://127.0.0.1:8080"
	HTTP    *http.Client
	Now     func() time.Time
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
// returned as an *Error.
func (c *Client) Post(ctx context.Context, wire []byte) ([]byte, *envelope.RelayReceipt, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+PathEnvelopes, bytes.NewReader(wire))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	body, err := c.do(req, envelope.MaxReceiptSize)
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

func envelopeIDOf(wire []byte) string {
	if env, err := envelope.Parse(wire); err == nil {
		return env.ID()
	}
	return ""
}

// Fetch returns a page of id's inbox after cursor (empty: from the start), at
// most limit envelopes (0: the relay's default).
func (c *Client) Fetch(ctx context.Context, id *identity.Identity, after string, limit int) (*InboxPage, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	u := strings.TrimRight(c.BaseURL, "/") + PathInbox
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
		return nil, fmt.Errorf("relay: bad inbox page: %w", err)
	}
	return &page, nil
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
