package client

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Change-feed topics.
const (
	TopicMessages     = "messages"
	TopicOutbox       = "outbox"
	TopicReceipts     = "receipts"
	TopicObservations = "observations"
)

// Topics lists the change-feed topics.
var Topics = []string{TopicMessages, TopicOutbox, TopicReceipts, TopicObservations}

// Change is one entry of the daemon's change feed: record ID of Topic reached State
// ("removed" when the record went away) at At. Seq grows by one per change within
// one daemon instance.
type Change struct {
	Seq   uint64    `json:"seq"`
	Topic string    `json:"topic"`
	ID    string    `json:"id"`
	State string    `json:"state,omitempty"`
	At    time.Time `json:"at"`
}

// ChangePage is one answer of GET /v1/changes. Cursor is the `after` of the next
// request. Reset means the given cursor cannot be continued (Reason says why): no
// change is replayed; re-read a snapshot and continue from Cursor.
type ChangePage struct {
	Changes []Change `json:"changes"`
	Cursor  string   `json:"cursor"`
	Reset   bool     `json:"reset,omitempty"`
	Reason  string   `json:"reason,omitempty"`
}

// Changes reads the change feed after the cursor after ("" starts with a reset),
// restricted to topics (nil: all), waiting up to wait (the daemon caps it at 60 s)
// for a change when none is pending.
func (c *Client) Changes(ctx context.Context, after string, topics []string, wait time.Duration) (*ChangePage, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if len(topics) > 0 {
		q.Set("topics", strings.Join(topics, ","))
	}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	path := "/v1/changes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var p ChangePage
	if err := c.do(ctx, http.MethodGet, path, nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
