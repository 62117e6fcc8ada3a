package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// The relay's answers other than success are *relayproto.Error, built here.

func newError(status int, code, format string, args ...any) *relayproto.Error {
	return &relayproto.Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// envelopeError maps an envelope package error to a 4xx. The message is the
// package's, which names fields, offsets, ids and DIDs but no payload.
func envelopeError(err error) *relayproto.Error {
	status, code := http.StatusBadRequest, relayproto.CodeEnvelopeMalformed
	switch {
	case errors.Is(err, envelope.ErrTooLarge):
		status, code = http.StatusRequestEntityTooLarge, relayproto.CodeEnvelopeTooLarge
	case errors.Is(err, envelope.ErrVersion):
		code = relayproto.CodeEnvelopeVersion
	case errors.Is(err, envelope.ErrSignature):
		code = relayproto.CodeEnvelopeSignature
	case errors.Is(err, envelope.ErrExpired):
		code = relayproto.CodeEnvelopeExpired
	}
	return &relayproto.Error{Status: status, Code: code, Message: err.Error(), Cause: err}
}

func conflictError(env *envelope.Envelope) *relayproto.Error {
	return newError(http.StatusConflict, relayproto.CodeEnvelopeConflict,
		"envelope %s was already accepted with another digest", env.ID())
}

// storeError maps a store failure: busy or unwritable → 503 (the sender
// retries); anything else → 500.
func storeError(err error) *relayproto.Error {
	code := errcode.Of(err)
	switch {
	case errors.Is(err, errcode.OutboxStoreBusy), errors.Is(err, errcode.OutboxStoreUnwritable),
		errors.Is(err, errcode.OutboxFull):
		return &relayproto.Error{Status: http.StatusServiceUnavailable, Code: code, Message: "the relay's store is unavailable",
			RetryAfter: 5, Cause: err}
	}
	if code == "" {
		code = relayproto.CodeRelayInternal
	}
	return &relayproto.Error{Status: http.StatusInternalServerError, Code: code, Message: "the relay's store failed", Cause: err}
}

func unavailable(code, msg string, cause error) *relayproto.Error {
	return &relayproto.Error{Status: http.StatusServiceUnavailable, Code: code, Message: msg, RetryAfter: 5, Cause: cause}
}

func internalError(cause error) *relayproto.Error {
	return &relayproto.Error{Status: http.StatusInternalServerError, Code: relayproto.CodeRelayInternal, Message: "internal error", Cause: cause}
}

// writeError sends e as JSON.
func writeError(w http.ResponseWriter, e *relayproto.Error) {
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

// asError turns any error into a *relayproto.Error (500 if it is not one).
func asError(err error) *relayproto.Error {
	var e *relayproto.Error
	if errors.As(err, &e) {
		return e
	}
	return internalError(err)
}
