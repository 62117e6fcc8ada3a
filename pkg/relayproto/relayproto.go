// Package relayproto is the relay protocol (docs/RELAY.md), defined once for
// both of its sides: the paths, limits and wire types, the error answer, the
// signed inbox request (SignInboxRequest for a client, VerifyInboxRequest for
// the relay), and a Client for the three endpoints (POST /v1/envelopes, GET
// /v1/inbox, POST /v1/inbox/ack). pkg/relay serves it; the daemon's inbox
// follower speaks it.
package relayproto

import (
	"encoding/json"
	"time"
)

// Paths of the protocol.
const (
	PathEnvelopes = "/v1/envelopes"
	PathInbox     = "/v1/inbox"
	PathInboxAck  = "/v1/inbox/ack"
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
)

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
