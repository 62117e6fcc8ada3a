// Package relayproto is the relay protocol (docs/RELAY.md), defined once for
// both of its sides: the paths, limits and wire types, the error answer, the
// signed inbox request (SignInboxRequest for a client, VerifyInboxRequest for
// the relay), and a Client for its endpoints (POST /v1/envelopes, POST
// /v1/envelopes/batch, GET /v1/inbox, GET /v1/inbox/status, POST /v1/inbox/ack,
// POST /v1/recipients/register and /v1/recipients/unregister, for large
// bodies HEAD and PATCH /v1/bodies/{id} and GET /v1/inbox/bodies/{id}
// (body.go), and for the witness of store heads the Sealbridge-Head header of
// the posts, GET /v1/senders/head, POST /v1/senders/receipts and GET
// /v1/inbox/statuses (witness.go)).
// pkg/relay serves
// it; the daemon's inbox follower speaks it.
package relayproto

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"
)

// Paths of the protocol.
const (
	PathEnvelopes = "/v1/envelopes"
	// PathEnvelopesBatch accepts up to MaxBatchEnvelopes envelopes in one
	// request; a relay without it answers 404 or 405, and a sender falls back
	// to PathEnvelopes.
	PathEnvelopesBatch = "/v1/envelopes/batch"
	PathInbox          = "/v1/inbox"
	PathInboxAck       = "/v1/inbox/ack"
	// PathRecipientsRegister and PathRecipientsUnregister add the signing
	// recipient to, and remove it from, a relay's allow-list (signed as the
	// inbox requests are, with an empty body).
	PathRecipientsRegister   = "/v1/recipients/register"
	PathRecipientsUnregister = "/v1/recipients/unregister"
	// PathInboxStatus answers the caller's InboxStatus (a signed GET); a relay
	// without it answers 404.
	PathInboxStatus = "/v1/inbox/status"
)

// Limits of the protocol.
const (
	// MaxClockSkew is how far a signed inbox request's timestamp may be from
	// the relay's clock, either way.
	MaxClockSkew = 5 * time.Minute
	// DefaultFetchLimit and MaxFetchLimit bound the envelopes of one inbox page.
	DefaultFetchLimit = 64
	MaxFetchLimit     = 256
	// MaxAckIDs bounds the envelope ids of one acknowledgement.
	MaxAckIDs = 1024
	// MaxAckBodySize bounds an acknowledgement's body (and any signed request's).
	MaxAckBodySize = 64 << 10
	// MaxBatchEnvelopes bounds the envelopes of one batch accept.
	MaxBatchEnvelopes = 64
	// MaxBatchBodySize bounds a batch accept's body. It holds any single
	// envelope (at most envelope.MaxSize) with room to spare; a sender packs
	// as many as fit (BatchBodySize).
	MaxBatchBodySize = 4 << 20
	// MaxInboxWait bounds the wait= of GET /v1/inbox: how long the relay holds
	// a fetch that finds nothing after its cursor (a longer wait is cut to it).
	MaxInboxWait = 60 * time.Second
)

// ParseInboxWait parses the wait= of GET /v1/inbox: a Go duration such as
// "30s" or "500ms", or whole seconds ("30"); "" is 0 (answer at once). A
// negative or malformed wait is an error; one past MaxInboxWait is cut to it.
func ParseInboxWait(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		n, nerr := strconv.Atoi(s)
		d, err = time.Duration(n)*time.Second, nerr
	}
	if err != nil || d < 0 {
		return 0, errors.New("wait must be a duration such as 30s (at most 60s)")
	}
	return min(d, MaxInboxWait), nil
}

// InboxStatus is the answer to GET /v1/inbox/status: the envelopes waiting in
// the caller's inbox (those a fetch from the start would page through), their
// bytes, and the receivedAt (Unix ms) of the oldest and newest (0 when empty).
type InboxStatus struct {
	Count            int   `json:"count"`
	Bytes            int64 `json:"bytes"`
	OldestReceivedAt int64 `json:"oldestReceivedAt"`
	NewestReceivedAt int64 `json:"newestReceivedAt"`
}

// InboxEnvelope is one envelope of an inbox page.
type InboxEnvelope struct {
	// Cursor is this envelope's position; passing it as after= returns the
	// envelopes after it.
	Cursor         string `json:"cursor"`
	EnvelopeID     string `json:"envelopeId"`
	EnvelopeDigest string `json:"envelopeDigest"`
	ReceivedAt     int64  `json:"receivedAt"`
	// Envelope is the wire envelope, byte for byte.
	Envelope json.RawMessage `json:"envelope"`
}

// InboxPage is the answer to GET /v1/inbox.
type InboxPage struct {
	Envelopes []InboxEnvelope `json:"envelopes"`
	// Cursor is the cursor to pass next: the last envelope's, or the one
	// asked for when the page is empty.
	Cursor string `json:"cursor"`
	// More is true when more envelopes are waiting after Cursor.
	More bool `json:"more"`
}

// AckRequest is the body of POST /v1/inbox/ack.
type AckRequest struct {
	EnvelopeIDs []string `json:"envelopeIds"`
}

// AckResponse is its answer: how many of the ids were removed.
type AckResponse struct {
	Acknowledged int `json:"acknowledged"`
}

// BatchRequest is the body of POST /v1/envelopes/batch: 1 to MaxBatchEnvelopes
// wire envelopes, each byte for byte as POST /v1/envelopes would carry it.
type BatchRequest struct {
	Envelopes []json.RawMessage `json:"envelopes"`
}

// BatchBodySize is the size of the BatchRequest body holding envelopes of
// these sizes, as Client.PostBatch encodes it.
func BatchBodySize(sizes ...int) int {
	n := len(`{"envelopes":[]}`)
	for i, s := range sizes {
		if i > 0 {
			n++ // the comma
		}
		n += s
	}
	return n
}

// Outcomes of one envelope of a batch accept.
const (
	// BatchAccepted: a new envelope, now durable; Receipt is its receipt.
	BatchAccepted = "accepted"
	// BatchDuplicate: an envelope the relay already holds (same id and
	// digest); Receipt is the same receipt bytes as the first time.
	BatchDuplicate = "duplicate"
	// BatchRefused: refused as POST /v1/envelopes would refuse it alone;
	// Status, Code and Message say how.
	BatchRefused = "refused"
)

// BatchResult is the answer for one envelope of a batch accept.
type BatchResult struct {
	Outcome string `json:"outcome"`
	// Receipt is the signed relay receipt (accepted and duplicate only).
	Receipt json.RawMessage `json:"receipt,omitempty"`
	// Status, Code and Message are the refusal (refused only): the HTTP status
	// and error body POST /v1/envelopes would have answered for the envelope.
	Status  int    `json:"status,omitempty"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	// RetryAfter is the Retry-After, in seconds, the single endpoint would
	// have sent with the refusal (429 and 503 refusals), else 0.
	RetryAfter int `json:"retryAfter,omitempty"`
}

// RegisterResponse is the answer to POST /v1/recipients/register and
// /v1/recipients/unregister: whether the recipient is now registered.
type RegisterResponse struct {
	Registered bool `json:"registered"`
}

// BatchResponse is the answer to POST /v1/envelopes/batch: one result per
// envelope, in the request's order. The accepted envelopes of one batch get
// inbox positions in the request's order.
type BatchResponse struct {
	Results []BatchResult `json:"results"`
}
