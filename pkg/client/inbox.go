package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// InboxMessage is one received message of GET /v1/inbox: its id, sender, when it
// was received, its opened body (base64 in JSON) and the body's length. A large body
// (over envelope.MaxBodySize, kept as a sealed blob) is not in the list: Blob is
// true, Body is empty, and Client.Body (GET /v1/inbox/{messageId}/body) streams it;
// Client.Body streams a small one too.
type InboxMessage struct {
	MessageID  string    `json:"messageId"`
	From       string    `json:"from"`
	ReceivedAt time.Time `json:"receivedAt"`
	Body       []byte    `json:"body"`
	BodySize   int64     `json:"bodySize"`
	Blob       bool      `json:"blob,omitempty"`
}

// InboxList is one page of GET /v1/inbox, oldest first; Next, if set, is the
// `after` of the next page.
type InboxList struct {
	Messages []InboxMessage `json:"messages"`
	Next     string         `json:"next,omitempty"`
}

// Inbox lists received messages, limit per page (0: the daemon's default), after
// the given message id (empty: from the start).
func (c *Client) Inbox(ctx context.Context, limit int, after string) (*InboxList, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if after != "" {
		q.Set("after", after)
	}
	path := "/v1/inbox"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var l InboxList
	if err := c.do(ctx, http.MethodGet, path, nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// RefusedEnvelope is one inbound envelope the daemon refused (GET /v1/inbox/refused):
// evidence only, never delivered. EnvelopeID and From are what the envelope claims
// (empty when they do not parse); Envelope is its bytes when the daemon kept them.
type RefusedEnvelope struct {
	RefusalID      string          `json:"refusalId"`
	Reason         string          `json:"reason"`
	EnvelopeID     string          `json:"envelopeId,omitempty"`
	From           string          `json:"from,omitempty"`
	EnvelopeDigest string          `json:"envelopeDigest"`
	Size           int64           `json:"size"`
	ReceivedAt     time.Time       `json:"receivedAt"`
	RetainUntil    time.Time       `json:"retainUntil"`
	Envelope       json.RawMessage `json:"envelope,omitempty"`
}

// RefusedList is GET /v1/inbox/refused: every kept refusal, oldest first.
type RefusedList struct {
	Refused []RefusedEnvelope `json:"refused"`
}

// InboxRefused lists the inbound envelopes the daemon refused.
func (c *Client) InboxRefused(ctx context.Context) (*RefusedList, error) {
	var l RefusedList
	if err := c.do(ctx, http.MethodGet, "/v1/inbox/refused", nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}
