package carrier

import (
	"context"
	"io"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Outcome classifies one delivery attempt (DESIGN §11).
type Outcome int

const (
	// Failed: the relay answered 5xx, 408 or 429, the attempt timed out, or the answer
	// was unusable (a 200 without a valid receipt for this envelope). Retried with
	// backoff.
	Failed Outcome = iota
	// Accepted: the relay answered 200 with a signed receipt for exactly this envelope.
	Accepted
	// Refused: the relay refused the envelope permanently (4xx other than 408 and 429).
	Refused
	// Unreachable: no answer at all — connection refused, DNS or TLS failure. The
	// target gets a persisted wait and is probed sparingly.
	Unreachable
)

var outcomeNames = [...]string{Failed: "failed", Accepted: "accepted", Refused: "refused", Unreachable: "unreachable"}

// String returns the outcome's metric label.
func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// Result is what one Send reports. Its texts never contain envelope or payload bytes.
type Result struct {
	Outcome Outcome
	// Receipt is the relay's receipt, raw and parsed, when Outcome is Accepted (a
	// scripted transport may leave them empty).
	Receipt       []byte
	ParsedReceipt *envelope.RelayReceipt
	// RetryAfter is the relay's Retry-After, 0 if none.
	RetryAfter time.Duration
	// Status is the HTTP status, 0 if there was no answer.
	Status int
	// Err describes a failure for logs and lastError.
	Err error
	// Code is the relay's error code when it gave one (a short token such as
	// UPLOAD_OFFSET_MISMATCH); the body upload decides by it. A transport may leave
	// it empty for Send.
	Code string
	// Body is what the relay said it holds durably of a blob envelope's body: set by
	// Send when the relay keeps the envelope pending for its body (202
	// BODY_INCOMPLETE, Outcome Failed: upload from Body.Offset, then send again), and
	// by BodyTransport's UploadBody and BodyOffset whenever the answer named the
	// relay's offset.
	Body *BodyState
	// local: the carrier's own verdict, no relay's (a missing blob): a Refused
	// closes the envelope as refused by the carrier.
	local bool
}

// BodyState is how much of a blob body a relay holds durably.
type BodyState struct {
	Offset, Size int64
}

// Transport delivers one signed envelope to one relay. Send must honour ctx (the
// carrier bounds each attempt with Options.SendTimeout) and be safe for concurrent use.
type Transport interface {
	Send(ctx context.Context, relayURL string, envelope []byte) Result
}

// BatchTransport is a Transport that can also deliver a run of envelopes for one relay
// in one request (relayproto.PathEnvelopesBatch). The carrier uses it when the
// transport has it and Batches says so, and sends one envelope at a time otherwise.
type BatchTransport interface {
	Transport
	// Batches reports whether runs for relayURL are to be sent as batches: false for
	// a relay known to lack the batch endpoint.
	Batches(relayURL string) bool
	// SendBatch delivers envs (1 to relayproto.MaxBatchEnvelopes of them, whose
	// batch body fits relayproto.MaxBatchBodySize) in one request and returns one
	// Result per envelope, in their order. It returns nil when the relay cannot take
	// this batch (no batch endpoint, or it refused the request as a whole): nothing
	// was accepted as a batch, and the carrier sends the envelopes one at a time.
	// Like Send it must honour ctx and be safe for concurrent use.
	SendBatch(ctx context.Context, relayURL string, envs [][]byte) []Result
}

// BodyTransport is a Transport that can also upload the blob body of an envelope
// (relayproto's tus-style upload, docs/RELAY.md "Bodies"). The carrier uploads a
// blob envelope's body through it when Send reports the body incomplete; with a plain
// Transport such an envelope is retried as failed until its deadline.
type BodyTransport interface {
	Transport
	// UploadBody appends the n bytes of r, which are the body's bytes from offset, to
	// the body of the pending envelope envelopeID at relayURL. Accepted: the relay
	// holds them durably and Body.Offset is its new offset. Otherwise the outcome is
	// classified as Send classifies an answer, with Code the relay's error code: a
	// 409 UPLOAD_OFFSET_MISMATCH (offset is not the relay's) is Failed with Body
	// set to the relay's offset, 404 UPLOAD_UNKNOWN says the relay holds no pending
	// envelope of that id (post it again), 422 BODY_DIGEST_MISMATCH that the relay
	// discarded a complete body whose digest was wrong. It must stream r (constant
	// memory), honour ctx (the carrier's bound: it ends ctx when r is not read for
	// the send timeout) and be safe for concurrent use.
	UploadBody(ctx context.Context, relayURL, envelopeID string, offset int64, r io.Reader, n int64) Result
	// BodyOffset asks the relay how much of envelopeID's body it holds durably:
	// Accepted with Body set, or a failure classified as UploadBody's.
	BodyOffset(ctx context.Context, relayURL, envelopeID string) Result
}

// HeadTransport is a Transport that can also fetch the highest store head a relay
// has witnessed from a sender (relayproto.PathSenderHead, signed by id). The
// carrier asks for it when a receipt says the relay witnessed a head newer than
// the store's (Result.ParsedReceipt's SenderSeq): a bare sequence number is the
// relay's word, the head is the owner's signature, and only that makes the store
// rolled back (store.Store.Witness). SenderHead returns nil, nil when the relay
// holds no head of id. It must honour ctx and be safe for concurrent use.
type HeadTransport interface {
	Transport
	SenderHead(ctx context.Context, relayURL string, id *identity.Identity) ([]byte, error)
}

// headKey is the context key of the store head a post carries.
type headKey struct{}

// WithHead returns ctx carrying head, the bytes of the store's current signed head
// (envelope.SignStoreHead): a transport puts them on every post it makes under ctx
// (relayproto.HeaderHead), so the relay witnesses the sender's head. The carrier
// sets it on the context of each send; nil or empty means no head.
func WithHead(ctx context.Context, head []byte) context.Context {
	if len(head) == 0 {
		return ctx
	}
	return context.WithValue(ctx, headKey{}, head)
}

// HeadOf returns the store head ctx carries (WithHead), nil if none.
func HeadOf(ctx context.Context) []byte {
	h, _ := ctx.Value(headKey{}).([]byte)
	return h
}
