package envelope

import "errors"

// Errors of this package. Each is returned wrapped with context (a field name,
// a byte offset, a size, an envelope id or a DID — never body plaintext, never
// key material, no quoted input but a DID); test with errors.Is. They are exported
// for any implementation that uses this package as the wire specification, even
// those the rest of this module never names.
var (
	// ErrTooLarge: the envelope is larger than MaxSize. Parse says so before
	// decoding anything; NewMessage says so when the body would not fit.
	ErrTooLarge = errors.New("envelope: too large")
	// ErrMalformed: the bytes are not exactly the canonical encoding of a
	// well-formed envelope — bad JSON, duplicate, unknown or case-variant
	// keys, whitespace, reordered keys, escapes, non-canonical base64url, a
	// field that fails validation, or a DID refused by identity.ParseDID (the
	// identity error is wrapped too, so errors.Is(err, identity.ErrKeySmallOrder)
	// works). The builders return it for arguments that would make such an
	// envelope.
	ErrMalformed = errors.New("envelope: malformed")
	// ErrVersion: the envelope's "v" is not a version this package knows.
	ErrVersion = errors.New("envelope: unknown version")
	// ErrSignature: the signature does not verify under the senderDid's key
	// over "sealbridge/envelope/v1" 0x00 payload-bytes.
	ErrSignature = errors.New("envelope: signature does not verify")
	// ErrRecipient: the envelope is not addressed to the identity at hand.
	ErrRecipient = errors.New("envelope: not addressed to this recipient")
	// ErrSender: the envelope is not from the expected sender.
	ErrSender = errors.New("envelope: not from the expected sender")
	// ErrExpired: the delivery deadline has passed (or, for the builders, is
	// not after now).
	ErrExpired = errors.New("envelope: delivery deadline has passed")
	// ErrKind: the operation does not apply to the envelope's kind (Open on a
	// delivery-status, ConfirmsDelivery on a message).
	ErrKind = errors.New("envelope: wrong envelope kind for this operation")
	// ErrOpen: the sealed body does not open — another recipient's key, a
	// body sealed for another envelope, or damaged ciphertext.
	ErrOpen = errors.New("envelope: sealed body does not open")
	// ErrConfirmation: a delivery-status confirms another message or another
	// envelope digest than the one asked about.
	ErrConfirmation = errors.New("envelope: delivery status does not confirm this message")
)
