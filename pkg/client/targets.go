package client

import (
	"context"
	"net/http"
	"time"
)

// Target is one relay target's backlog in GET /v1/targets: its pending envelopes
// (held ones included), how many are held, their bytes, when the oldest one's message
// was created, how many are being sent, its state and the state's times, the sum of
// the pending envelopes' attempts and the last error. Ages counts the pending
// envelopes by age, one count per TargetList.AgeBuckets entry.
type Target struct {
	RelayURL        string    `json:"relayUrl"`
	State           string    `json:"state"` // ready, backing-off, unreachable or held
	Pending         int       `json:"pending"`
	Held            int       `json:"held"`
	Bytes           int64     `json:"bytes"`
	InFlight        int       `json:"inFlight"`
	OldestPendingAt time.Time `json:"oldestPendingAt,omitzero"`
	// BackoffUntil (backing-off) is when the first unheld envelope is due;
	// UnreachableSince and NextProbeAt (unreachable) when the target's wait began
	// and when its next probe is due.
	BackoffUntil     time.Time `json:"backoffUntil,omitzero"`
	UnreachableSince time.Time `json:"unreachableSince,omitzero"`
	NextProbeAt      time.Time `json:"nextProbeAt,omitzero"`
	Attempts         int       `json:"attempts"`
	LastError        string    `json:"lastError,omitempty"`
	Ages             []int     `json:"ages"`
	// Hint, when the target waits (unreachable or backing off), is what an
	// operator can do about it, e.g. "attempt now: sealbridge retry --target URL".
	Hint string `json:"hint,omitempty"`
}

// TargetList is the answer of GET /v1/targets: the targets with pending envelopes by
// relay URL, the time the view was taken, and the age buckets' labels ("5m" counts
// the envelopes under 5 minutes old, … "older" the rest).
type TargetList struct {
	Targets    []Target  `json:"targets"`
	At         time.Time `json:"at"`
	AgeBuckets []string  `json:"ageBuckets"`
	// Hint is the daemon's advice on the view, if any.
	Hint string `json:"hint,omitempty"`
}

// OperatorAction is an operator's action on a message as its records keep it: which
// (hold, release, cancel, retry), who asked, when, and why.
type OperatorAction struct {
	Op     string    `json:"op"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// Targets returns the backlog of every relay target with pending envelopes.
func (c *Client) Targets(ctx context.Context) (*TargetList, error) {
	var l TargetList
	if err := c.do(ctx, http.MethodGet, "/v1/targets", nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}
