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
