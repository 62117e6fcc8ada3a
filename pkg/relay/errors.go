package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// Error is a relay answer other than success: an HTTP status and a stable code,
// sent as {"code":…,"message":…}. A client's mistake is always a 4xx.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// RetryAfter, in seconds, is sent as Retry-After with 503s.
	RetryAfter int   `json:"-"`
	cause      error // for logs only
}

func (e *Error) Error() string { return fmt.Sprintf("relay: %d %s: %s", e.Status, e.Code, e.Message) }

func (e *Error) Unwrap() error { return e.cause }

// Error codes of the relay protocol (docs/RELAY.md).
const (
	CodeEnvelopeTooLarge  = "ENVELOPE_TOO_LARGE"
	CodeEnvelopeMalformed = "ENVELOPE_MALFORMED"
	CodeEnvelopeVersion   = "ENVELOPE_VERSION"
	CodeEnvelopeSignature = "ENVELOPE_SIGNATURE"
	CodeEnvelopeExpired   = "ENVELOPE_EXPIRED"
	CodeEnvelopeConflict  = "ENVELOPE_CONFLICT"
	CodeBadRequest        = "BAD_REQUEST"
	CodeBodyTooLarge      = "BODY_TOO_LARGE"
	CodeNotFound          = "NOT_FOUND"
	CodeMethodNotAllowed  = "METHOD_NOT_ALLOWED"
	CodeAuthMissing       = "AUTH_MISSING"
	CodeAuthMalformed     = "AUTH_MALFORMED"
	CodeAuthDID           = "AUTH_DID"
	CodeAuthTimestamp     = "AUTH_TIMESTAMP"
	CodeAuthNonceReplayed = "AUTH_NONCE_REPLAYED"
	CodeAuthSignature     = "AUTH_SIGNATURE"
	CodeRelayBusy         = "RELAY_BUSY"
	CodeRelayInternal     = "RELAY_INTERNAL"
)

func newError(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// envelopeError maps an envelope package error to a 4xx. The message is the
// package's, which names fields, offsets, ids and DIDs but no payload.
func envelopeError(err error) *Error {
	status, code := http.StatusBadRequest, CodeEnvelopeMalformed
	switch {
	case errors.Is(err, envelope.ErrTooLarge):
		status, code = http.StatusRequestEntityTooLarge, CodeEnvelopeTooLarge
	case errors.Is(err, envelope.ErrVersion):
		code = CodeEnvelopeVersion
	case errors.Is(err, envelope.ErrSignature):
		code = CodeEnvelopeSignature
	case errors.Is(err, envelope.ErrExpired):
		code = CodeEnvelopeExpired
	}
	return &Error{Status: status, Code: code, Message: err.Error(), cause: err}
}

func conflictError(env *envelope.Envelope) *Error {
	return newError(http.StatusConflict, CodeEnvelopeConflict,
		"envelope %s was already accepted with another digest", env.ID())
}

// storeError maps a store failure: busy or unwritable → 503 (the sender
// retries); anything else → 500.
func storeError(err error) *Error {
	code := errcode.Of(err)
	switch {
	case errors.Is(err, errcode.OutboxStoreBusy), errors.Is(err, errcode.OutboxStoreUnwritable),
		errors.Is(err, errcode.OutboxFull):
		return &Error{Status: http.StatusServiceUnavailable, Code: code, Message: "the relay's store is unavailable",
			RetryAfter: 5, cause: err}
	}
	if code == "" {
		code = CodeRelayInternal
	}
	return &Error{Status: http.StatusInternalServerError, Code: code, Message: "the relay's store failed", cause: err}
}

func unavailable(code, msg string, cause error) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: code, Message: msg, RetryAfter: 5, cause: cause}
}

func internalError(cause error) *Error {
	return &Error{Status: http.StatusInternalServerError, Code: CodeRelayInternal, Message: "internal error", cause: cause}
}

// writeError sends e as JSON.
func writeError(w http.ResponseWriter, e *Error) {
	body, _ := json.Marshal(e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", fmt.Sprint(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}

// asError turns any error into an *Error (500 if it is not one).
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return internalError(err)
}
