package carrier

import (
	"context"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
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
