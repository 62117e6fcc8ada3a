package envelope

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// version is the wire format version, the envelope's "v".
const version = 1

// MaxSize is the largest wire envelope, in bytes (DESIGN §5: 128 KiB).
const MaxSize = 128 << 10

// MaxTime is the largest createdAt or deliveryDeadline, in Unix milliseconds:
// 2⁵³−1, the largest integer every JSON implementation reads exactly.
const MaxTime = 1<<53 - 1

// Kind is the kind of an envelope.
type Kind string

// Envelope kinds. They are also the values of the store's outbox "kind".
const (
	// KindMessage carries a body sealed to the recipient.
	KindMessage Kind = "message"
	// KindDeliveryStatus confirms, to a message's sender, that the
	// recipient received one message envelope.
	KindDeliveryStatus Kind = "delivery-status"
)

// StatusDelivered is the one status a version-1 delivery-status carries: the
// recipient verified the confirmed envelope and durably stored its opened body.
const StatusDelivered = "delivered"

// Sizes of the sealed body's parts.
const (
	// encSize is the length of the HPKE encapsulated key (DHKEM(X25519)).
	encSize = 32
	// tagSize is the ChaCha20-Poly1305 tag: a sealed body's ct is its
	// plaintext plus tagSize bytes.
	tagSize = 16
)

// b64 is the encoding of every binary field: base64url without padding,
// strict (non-zero trailing bits are refused). The decoder still skips '\r'
// and '\n', so every decoded field is also re-encoded and compared.
var b64 = base64.RawURLEncoding.Strict()

// wireJSON is the outer object, in its fixed key order.
type wireJSON struct {
	V       int             `json:"v"`
	Payload json.RawMessage `json:"payload"`
	Sig     string          `json:"sig"`
}

// payloadJSON is the signed payload, in its fixed key order. Exactly one of
// Body (kind message) and Confirms (kind delivery-status) is present.
type payloadJSON struct {
	EnvelopeID       string        `json:"envelopeId"`
	Kind             Kind          `json:"kind"`
	MessageID        string        `json:"messageId"`
	SenderDID        identity.DID  `json:"senderDid"`
	RecipientDID     identity.DID  `json:"recipientDid"`
	CreatedAt        int64         `json:"createdAt"`
	DeliveryDeadline int64         `json:"deliveryDeadline"`
	Body             *sealedJSON   `json:"body,omitempty"`
	Confirms         *confirmsJSON `json:"confirms,omitempty"`
}

// sealedJSON is the sealed body of a message: inline (Enc and Ct, HPKE) or a
// blob (Blob and Size, see NewBlobMessage), never both.
type sealedJSON struct {
	Enc  string `json:"enc,omitempty"`
	Ct   string `json:"ct,omitempty"`
	Blob string `json:"blob,omitempty"`
	Size int64  `json:"size,omitempty"`
}

// confirmsJSON is what a delivery-status confirms.
type confirmsJSON struct {
	MessageID      string `json:"messageId"`
	EnvelopeDigest string `json:"envelopeDigest"`
	Status         string `json:"status"`
}

// Confirmation is the content of a delivery-status envelope: the recipient of
// message MessageID confirms the message envelope whose digest (see Digest)
// is EnvelopeDigest with Status (StatusDelivered).
type Confirmation struct {
	MessageID      string
	EnvelopeDigest string
	Status         string
}

// ConfirmationOf returns the Confirmation that a recipient sends back for the
// message envelope msg (not nil): its messageId and digest, status delivered.
func ConfirmationOf(msg *Envelope) Confirmation {
	return Confirmation{MessageID: msg.p.MessageID, EnvelopeDigest: msg.digest, Status: StatusDelivered}
}

// Envelope is a verified wire envelope: every *Envelope this package returns
// came from Parse (the builders parse what they built), so its bytes are
// canonical, its fields are valid and its signature verifies under its
// sender's strictly valid key. It is immutable (accessors return copies) and
// safe for concurrent use.
type Envelope struct {
	data    []byte // the exact wire bytes
	payload []byte // the exact signed payload bytes (a subslice of data)
	digest  string
	p       payloadJSON
	sender  identity.PublicKey
	enc, ct []byte // kind message: the decoded sealed body
}

// Digest returns the envelope digest of wire bytes: the lower-case hex
// SHA-256 of exactly those bytes. It does not parse them.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Parse verifies data as one wire envelope and returns it. In order, it
// refuses: more than MaxSize bytes, before looking at them (ErrTooLarge); a
// byte that is not printable ASCII, a space or a backslash, none of which a
// valid envelope contains (ErrMalformed); anything but one strict JSON
// object (ErrMalformed); a version other than 1 (ErrVersion); any byte
// sequence other than the canonical encoding of what it decodes to
// (ErrMalformed); a payload that is not a strict, canonical, valid payload,
// including a sender or recipient DID that identity.ParseDID refuses
// (ErrMalformed, also wrapping the identity error); and a signature that does
// not verify under the sender's key (ErrSignature). It does not check the
// deadline (CheckDeadline) or who the recipient is (Open, CheckRecipient).
// Parse never panics and keeps a copy of data.
func Parse(data []byte) (*Envelope, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), MaxSize)
	}
	// Every valid envelope is printable ASCII without space or backslash:
	// all its strings are ids, DIDs, base64url, digests and fixed words,
	// which JSON writes without escapes. Refusing anything else first is
	// cheap and rules out whitespace and escapes before any decoding; the
	// canonical-form check in parse would refuse them too.
	for i, c := range data {
		if c <= ' ' || c > '~' || c == '\\' {
			return nil, fmt.Errorf("%w: byte %d is not printable ASCII or is a space or backslash", ErrMalformed, i)
		}
	}
	return parse(bytes.Clone(data))
}

// parse is Parse after the size and character checks; it owns data.
func parse(data []byte) (*Envelope, error) {
	var w wireJSON
	if err := decodeStrict("envelope", data, &w); err != nil {
		return nil, err
	}
	if w.V != version {
		return nil, fmt.Errorf("%w: v=%d", ErrVersion, w.V)
	}
	// Only the canonical bytes are an envelope: no whitespace, reordered
	// keys or escapes that would decode to the same values. This also makes
	// the payload compact, as the re-encoding compacts it.
	if canon, err := marshalCompact(&w); err != nil || !bytes.Equal(canon, data) {
		return nil, fmt.Errorf("%w: not in canonical form", ErrMalformed)
	}
	sig, err := decodeB64(w.Sig, "sig")
	if err != nil {
		return nil, err
	}
	if len(sig) != identity.SignatureSize {
		return nil, fmt.Errorf("%w: sig is %d bytes, want %d", ErrMalformed, len(sig), identity.SignatureSize)
	}
	env := &Envelope{data: data, payload: w.Payload, digest: Digest(data)}
	if err := decodeStrict("payload", w.Payload, &env.p); err != nil {
		return nil, err
	}
	if canon, err := marshalCompact(&env.p); err != nil || !bytes.Equal(canon, w.Payload) {
		return nil, fmt.Errorf("%w: payload not in canonical form", ErrMalformed)
	}
	if env.sender, env.enc, env.ct, err = env.p.validate(); err != nil {
		return nil, err
	}
	if !identity.VerifyDomain(env.sender, identity.DomainEnvelope, sig, w.Payload) {
		return nil, fmt.Errorf("%w: envelope %s from %s", ErrSignature, env.p.EnvelopeID, env.p.SenderDID)
	}
	return env, nil
}

// decodeB64 decodes a binary field, accepting only its canonical encoding.
func decodeB64(s, field string) ([]byte, error) {
	b, err := b64.DecodeString(s)
	if err != nil || b64.EncodeToString(b) != s {
		return nil, fmt.Errorf("%w: %s is not canonical unpadded base64url", ErrMalformed, field)
	}
	return b, nil
}

// validate checks every field rule of the payload and returns the sender's
// key and, for a message, the decoded sealed body.
func (p *payloadJSON) validate() (sender identity.PublicKey, enc, ct []byte, err error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	switch {
	case !uuid.Valid(p.EnvelopeID):
		return nil, nil, nil, bad("envelopeId is not a lower-case UUID")
	case !uuid.Valid(p.MessageID):
		return nil, nil, nil, bad("messageId is not a lower-case UUID")
	case p.CreatedAt <= 0 || p.CreatedAt > MaxTime:
		return nil, nil, nil, bad("createdAt is not a positive millisecond time up to 2^53-1")
	case p.DeliveryDeadline <= 0 || p.DeliveryDeadline > MaxTime:
		return nil, nil, nil, bad("deliveryDeadline is not a positive millisecond time up to 2^53-1")
	case p.DeliveryDeadline <= p.CreatedAt:
		return nil, nil, nil, bad("deliveryDeadline is not after createdAt")
	}
	switch p.Kind {
	case KindMessage:
		if p.Body == nil || p.Confirms != nil {
			return nil, nil, nil, bad("a message carries a body and no confirms")
		}
		if p.Body.Blob != "" || p.Body.Size != 0 {
			switch b := p.Body; {
			case b.Enc != "" || b.Ct != "":
				return nil, nil, nil, bad("a body is inline (enc, ct) or a blob (blob, size), not both")
			case !IsHex(b.Blob, 2*sha256.Size):
				return nil, nil, nil, bad("body.blob is not 64 lower-case hex digits")
			case b.Size < 1 || b.Size > MaxBlobSize:
				return nil, nil, nil, bad("body.size is not 1 to %d", MaxBlobSize)
			}
			break
		}
		if enc, err = decodeB64(p.Body.Enc, "body.enc"); err != nil {
			return nil, nil, nil, err
		}
		if len(enc) != encSize {
			return nil, nil, nil, bad("body.enc is %d bytes, want %d", len(enc), encSize)
		}
		if ct, err = decodeB64(p.Body.Ct, "body.ct"); err != nil {
			return nil, nil, nil, err
		}
		if len(ct) < tagSize {
			return nil, nil, nil, bad("body.ct is shorter than its %d-byte tag", tagSize)
		}
	case KindDeliveryStatus:
		if p.Confirms == nil || p.Body != nil {
			return nil, nil, nil, bad("a delivery-status carries confirms and no body")
		}
		c := p.Confirms
		switch {
		case !uuid.Valid(c.MessageID):
			return nil, nil, nil, bad("confirms.messageId is not a lower-case UUID")
		case c.MessageID != p.MessageID:
			return nil, nil, nil, bad("confirms.messageId is not the envelope's messageId")
		case !IsHex(c.EnvelopeDigest, 2*sha256.Size):
			return nil, nil, nil, bad("confirms.envelopeDigest is not 64 lower-case hex digits")
		case c.Status != StatusDelivered:
			return nil, nil, nil, bad("confirms.status is not %q", StatusDelivered)
		}
	default:
		return nil, nil, nil, bad("kind is not %q or %q", KindMessage, KindDeliveryStatus)
	}
	if _, err := identity.ParseDID(string(p.RecipientDID)); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: recipientDid: %w", ErrMalformed, err)
	}
	sender, err = identity.ParseDID(string(p.SenderDID))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: senderDid: %w", ErrMalformed, err)
	}
	return sender, enc, ct, nil
}

func isLowerHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

// IsHex reports whether s is exactly n lower-case hex digits (digests).
func IsHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < n; i++ {
		if !isLowerHex(s[i]) {
			return false
		}
	}
	return true
}

// ID returns the envelopeId.
func (e *Envelope) ID() string { return e.p.EnvelopeID }

// Kind returns the envelope's kind.
func (e *Envelope) Kind() Kind { return e.p.Kind }

// MessageID returns the messageId: the message the envelope carries, or for
// a delivery-status the message it confirms.
func (e *Envelope) MessageID() string { return e.p.MessageID }

// Sender returns the senderDid, whose key signed the envelope.
func (e *Envelope) Sender() identity.DID { return e.p.SenderDID }

// SenderKey returns a copy of the sender's (strictly valid) public key.
func (e *Envelope) SenderKey() identity.PublicKey { return bytes.Clone(e.sender) }

// Recipient returns the recipientDid.
func (e *Envelope) Recipient() identity.DID { return e.p.RecipientDID }

// CreatedAt returns createdAt.
func (e *Envelope) CreatedAt() time.Time { return time.UnixMilli(e.p.CreatedAt) }

// CreatedAtMillis returns createdAt in Unix milliseconds, as on the wire.
func (e *Envelope) CreatedAtMillis() int64 { return e.p.CreatedAt }

// DeliveryDeadline returns deliveryDeadline.
func (e *Envelope) DeliveryDeadline() time.Time { return time.UnixMilli(e.p.DeliveryDeadline) }

// DeliveryDeadlineMillis returns deliveryDeadline in Unix milliseconds, as on
// the wire (and as the store's records keep it).
func (e *Envelope) DeliveryDeadlineMillis() int64 { return e.p.DeliveryDeadline }

// Confirmation returns what a delivery-status confirms; ok is false for a
// message.
func (e *Envelope) Confirmation() (c Confirmation, ok bool) {
	if e.p.Confirms == nil {
		return Confirmation{}, false
	}
	return Confirmation{MessageID: e.p.Confirms.MessageID, EnvelopeDigest: e.p.Confirms.EnvelopeDigest,
		Status: e.p.Confirms.Status}, true
}

// Bytes returns a copy of the exact wire bytes.
func (e *Envelope) Bytes() []byte { return bytes.Clone(e.data) }

// Payload returns a copy of the exact signed payload bytes.
func (e *Envelope) Payload() []byte { return bytes.Clone(e.payload) }

// Size returns the length of the wire bytes.
func (e *Envelope) Size() int { return len(e.data) }

// Digest returns the envelope digest, Digest(e.Bytes()).
func (e *Envelope) Digest() string { return e.digest }

// String names the envelope without its body: id, kind, sender → recipient.
func (e *Envelope) String() string {
	return fmt.Sprintf("envelope %s (%s) %s → %s", e.p.EnvelopeID, e.p.Kind, e.p.SenderDID, e.p.RecipientDID)
}

// CheckDeadline returns an error wrapping ErrExpired if now is at or past the
// envelope's delivery deadline.
func (e *Envelope) CheckDeadline(now time.Time) error {
	if now.UnixMilli() >= e.p.DeliveryDeadline {
		return fmt.Errorf("%w: envelope %s, deadline %s", ErrExpired, e.p.EnvelopeID,
			e.DeliveryDeadline().UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// CheckRecipient returns an error wrapping ErrRecipient unless the envelope
// is addressed to did.
func (e *Envelope) CheckRecipient(did identity.DID) error {
	if e.p.RecipientDID != did {
		return fmt.Errorf("%w: envelope %s is for %s, not %s", ErrRecipient, e.p.EnvelopeID, e.p.RecipientDID, did)
	}
	return nil
}

// ConfirmsDelivery returns nil if e is a delivery-status from peer (the
// recipient of the confirmed message) to owner (its sender) that confirms the
// message envelope with messageID and envelopeDigest. Otherwise the error
// wraps ErrKind, ErrSender, ErrRecipient or ErrConfirmation. A status signed
// by anyone but the message's recipient never confirms it.
func (e *Envelope) ConfirmsDelivery(owner, peer identity.DID, messageID, envelopeDigest string) error {
	switch {
	case e.p.Kind != KindDeliveryStatus || e.p.Confirms == nil:
		return fmt.Errorf("%w: envelope %s is a %s, not a %s", ErrKind, e.p.EnvelopeID, e.p.Kind, KindDeliveryStatus)
	case e.p.SenderDID != peer:
		return fmt.Errorf("%w: delivery status %s is from %s, not the message's recipient %s", ErrSender,
			e.p.EnvelopeID, e.p.SenderDID, peer)
	case e.p.RecipientDID != owner:
		return fmt.Errorf("%w: delivery status %s is for %s, not %s", ErrRecipient, e.p.EnvelopeID, e.p.RecipientDID, owner)
	case e.p.Confirms.MessageID != messageID || e.p.Confirms.EnvelopeDigest != envelopeDigest:
		return fmt.Errorf("%w: delivery status %s confirms message %s envelope digest %s", ErrConfirmation,
			e.p.EnvelopeID, e.p.Confirms.MessageID, e.p.Confirms.EnvelopeDigest)
	case e.p.Confirms.Status != StatusDelivered:
		return fmt.Errorf("%w: status %q", ErrConfirmation, e.p.Confirms.Status)
	}
	return nil
}
