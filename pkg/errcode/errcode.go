// Package errcode is the catalogue of sealbridge's stable error codes (DESIGN §15).
//
// It is a leaf package: the store, the daemon and the daemon's Go client all use the
// same sentinels, so a caller can write errors.Is(err, errcode.OutboxFull) without
// linking the store.
//
// Every sentinel is a *Code. An error returned by sealbridge carries one of them, some
// human context (an id or a path, never key material or payload contents), and
// optionally a cause that stays reachable through errors.Unwrap for logs:
//
//	err := errcode.New(errcode.OutboxStoreInvalid, "outbox/1b4e…json", cause)
//	errors.Is(err, errcode.OutboxStoreInvalid) // true
//	errcode.Of(err)                            // "OUTBOX_STORE_INVALID"
package errcode

import (
	"errors"
	"fmt"
)

// Code is one stable error code. Codes are compared by identity; use errors.Is.
type Code struct {
	name string
	desc string
}

// String returns the stable code string, e.g. "OUTBOX_FULL".
func (c *Code) String() string { return c.name }

// Error returns the stable code string followed by its meaning.
func (c *Code) Error() string { return c.name + ": " + c.desc }

// The codes of DESIGN §15. Each is returned when the condition in its comment holds.
var (
	// OutboxFull: a capacity limit (records, bytes, pending envelopes, messages,
	// receipts) would be exceeded; nothing was written.
	OutboxFull = &Code{"OUTBOX_FULL", "outbox capacity limit reached"}
	// OutboxStoreBusy: the store lock could not be taken within its bound, or a
	// prepared transaction's plan was invalidated more times than allowed, or the
	// caller's context ended before a transaction published (its error is the cause).
	OutboxStoreBusy = &Code{"OUTBOX_STORE_BUSY", "outbox store is busy"}
	// OutboxStoreInvalid: a record or directory failed validation (tampered,
	// truncated, planted, wrong owner or mode, symlink, unknown file).
	OutboxStoreInvalid = &Code{"OUTBOX_STORE_INVALID", "outbox store record is invalid"}
	// OutboxStoreUnwritable: the file system refused a write, fsync, rename or
	// removal (ENOSPC, EIO, EACCES, …); the operation was not acknowledged.
	OutboxStoreUnwritable = &Code{"OUTBOX_STORE_UNWRITABLE", "outbox store is not writable"}
	// OutboxDeadlineExpired: the delivery deadline passed before the envelope was relayed.
	OutboxDeadlineExpired = &Code{"OUTBOX_DEADLINE_EXPIRED", "delivery deadline expired"}
	// DeliveryRecordConflict: a write would change an immutable field (an outbox
	// envelope or digest, a receipt's envelope identity, an observation's fixed fields).
	DeliveryRecordConflict = &Code{"DELIVERY_RECORD_CONFLICT", "delivery record conflicts with the stored one"}
	// InvalidDeliveryStatus: a status value is unknown or the transition goes backwards.
	InvalidDeliveryStatus = &Code{"INVALID_DELIVERY_STATUS", "invalid delivery status"}
	// DeliveryStatusConflict: a status update disagrees with a terminal status already stored.
	DeliveryStatusConflict = &Code{"DELIVERY_STATUS_CONFLICT", "delivery status conflicts with the stored one"}
	// IdempotencyStoreFull: the operations capacity or cached-result bytes are exhausted.
	IdempotencyStoreFull = &Code{"IDEMPOTENCY_STORE_FULL", "idempotency store is full"}
	// IdempotencyStoreBusy: the idempotency indexes are stale and must be prepared
	// outside the lock before the operation can be decided.
	IdempotencyStoreBusy = &Code{"IDEMPOTENCY_STORE_BUSY", "idempotency store is busy"}
	// IdempotencyKeyReused: the key is bound to a different request.
	IdempotencyKeyReused = &Code{"IDEMPOTENCY_KEY_REUSED", "idempotency key reused with another request"}
	// IdempotencyInProgress: the first request with this key is still in flight.
	IdempotencyInProgress = &Code{"IDEMPOTENCY_IN_PROGRESS", "request with this idempotency key is in progress"}
	// MessageNotFound: an operator action names a message the store has no
	// committed record of.
	MessageNotFound = &Code{"MESSAGE_NOT_FOUND", "no such message"}
	// MessageClosed: an operator action would change a message that is already
	// delivered or closed, or cancel a relayed one with nothing pending.
	MessageClosed = &Code{"MESSAGE_CLOSED", "the message is already delivered or closed"}
	// BodyTooLarge: a message body is larger than the limit in force (the inline
	// limit of the JSON API, or the streamed limit, sealbridged --max-body);
	// nothing was written.
	BodyTooLarge = &Code{"BODY_TOO_LARGE", "message body is larger than the limit"}
	// BodyMissing: a record names a sealed blob the store does not hold.
	BodyMissing = &Code{"BODY_MISSING", "the sealed body is missing"}
	// BodySizeMismatch: a sealed blob's length differs from the size its
	// envelope names.
	BodySizeMismatch = &Code{"BODY_SIZE_MISMATCH", "the sealed body has the wrong size"}
	// BodyDigestMismatch: a sealed blob's SHA-256 differs from the digest its
	// envelope names.
	BodyDigestMismatch = &Code{"BODY_DIGEST_MISMATCH", "the sealed body has the wrong digest"}
	// BodyChunkInvalid: a chunk of a sealed blob does not verify (altered,
	// reordered, duplicated, truncated), or its header does not open.
	BodyChunkInvalid = &Code{"BODY_CHUNK_INVALID", "a chunk of the sealed body does not verify"}
	// StoreRolledBack: the store's head is below a head its owner signed earlier
	// (kept outside the store or witnessed by a relay): it was restored from an
	// older copy. Nothing may be sent or changed until sealbridge-fsck --reconcile.
	StoreRolledBack = &Code{"STORE_ROLLED_BACK", "the store is older than its last witnessed head"}
	// StoreFormatNewer: the store was written by a newer format version than this
	// binary reads; it is refused unchanged.
	StoreFormatNewer = &Code{"STORE_FORMAT_NEWER", "the store was written by a newer format version"}
)

// All lists every code, in catalogue order.
var All = []*Code{
	OutboxFull, OutboxStoreBusy, OutboxStoreInvalid, OutboxStoreUnwritable,
	OutboxDeadlineExpired, DeliveryRecordConflict, InvalidDeliveryStatus,
	DeliveryStatusConflict, IdempotencyStoreFull, IdempotencyStoreBusy,
	IdempotencyKeyReused, IdempotencyInProgress, MessageNotFound, MessageClosed,
	BodyTooLarge, BodyMissing, BodySizeMismatch, BodyDigestMismatch, BodyChunkInvalid,
	StoreRolledBack, StoreFormatNewer,
}

// Lookup returns the code with the given string, or nil.
func Lookup(name string) *Code {
	for _, c := range All {
		if c.name == name {
			return c
		}
	}
	return nil
}

// Error is a coded error: a code, human context and an optional cause.
type Error struct {
	Code    *Code
	Context string // an id or path; never secrets or payload bytes
	Cause   error
}

// New returns an error with code c, context (an id or a path) and an optional cause.
func New(c *Code, context string, cause error) error {
	return &Error{Code: c, Context: context, Cause: cause}
}

// Errorf returns an error with code c and a formatted context.
func Errorf(c *Code, format string, args ...any) error {
	return &Error{Code: c, Context: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string {
	s := e.Code.name
	if e.Context != "" {
		s += ": " + e.Context
	}
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Is reports whether target is this error's code.
func (e *Error) Is(target error) bool {
	c, ok := target.(*Code)
	return ok && c == e.Code
}

// Unwrap returns the cause, for logs.
func (e *Error) Unwrap() error { return e.Cause }

// Of returns the code string of the first coded error in err's chain, or "".
func Of(err error) string {
	if c := CodeOf(err); c != nil {
		return c.name
	}
	return ""
}

// CodeOf returns the code of the first coded error in err's chain, or nil.
func CodeOf(err error) *Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var c *Code
	if errors.As(err, &c) {
		return c
	}
	return nil
}

// Ensure returns err unchanged if it already carries a code, and otherwise wraps it
// in code c with the given context. A nil err stays nil.
func Ensure(err error, c *Code, context string) error {
	if err == nil || CodeOf(err) != nil {
		return err
	}
	return New(c, context, err)
}

// hinted is an error that carries a hint: one line telling the user what to do.
// The commands print it as "PROG: hint: …" after the error.
type hinted struct {
	Err  error
	Hint string
}

// WithHint returns err carrying hint (nil if err is nil).
func WithHint(err error, hint string) error {
	if err == nil {
		return nil
	}
	return &hinted{Err: err, Hint: hint}
}

func (e *hinted) Error() string { return e.Err.Error() }
func (e *hinted) Unwrap() error { return e.Err }

// HintOf returns the outermost hint in err's chain, or "".
func HintOf(err error) string {
	var h *hinted
	if errors.As(err, &h) {
		return h.Hint
	}
	return ""
}
