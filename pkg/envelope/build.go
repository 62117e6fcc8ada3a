package envelope

import (
	"errors"
	"fmt"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// MaxBodySize is the largest body NewMessage always accepts: the sealed body
// (plaintext + tagSize, in base64url) and the rest of the envelope then fit
// in MaxSize whatever the times are. A slightly larger body may fit too;
// NewMessage refuses one that does not with ErrTooLarge.
const MaxBodySize = 97_280 // 95 KiB

// NewMessage builds, seals and signs a message envelope from sender to
// recipient: a fresh random envelopeId, messageID (a lower-case UUID), the
// body sealed to recipient's key (see Open), createdAt now and
// deliveryDeadline deadline, both in Unix milliseconds. It returns the parsed
// envelope and its wire bytes (the caller's copy). It refuses a deadline not
// after now (ErrExpired), an envelope over MaxSize (ErrTooLarge), and invalid
// arguments (ErrMalformed; an invalid recipient DID also wraps the identity
// error).
func NewMessage(sender *identity.Identity, recipient identity.DID, messageID string, body []byte,
	deadline, now time.Time) (*Envelope, []byte, error) {
	if len(body) > MaxSize {
		return nil, nil, fmt.Errorf("%w: body of %d bytes", ErrTooLarge, len(body))
	}
	p, err := newPayload(sender, KindMessage, recipient, messageID, deadline, now)
	if err != nil {
		return nil, nil, err
	}
	enc, ct, err := seal(p, body)
	if err != nil {
		return nil, nil, err
	}
	p.Body = &sealedJSON{Enc: b64.EncodeToString(enc), Ct: b64.EncodeToString(ct)}
	return sign(sender, p)
}

// NewDeliveryStatus builds and signs a delivery-status envelope from sender
// to recipient confirming c (usually ConfirmationOf the message envelope
// sender received from recipient; c.Status empty means StatusDelivered). Its
// messageId is c.MessageID; its envelopeId is fresh and random. The errors
// are those of NewMessage.
func NewDeliveryStatus(sender *identity.Identity, recipient identity.DID, c Confirmation,
	deadline, now time.Time) (*Envelope, []byte, error) {
	if c.Status == "" {
		c.Status = StatusDelivered
	}
	p, err := newPayload(sender, KindDeliveryStatus, recipient, c.MessageID, deadline, now)
	if err != nil {
		return nil, nil, err
	}
	p.Confirms = &confirmsJSON{MessageID: c.MessageID, EnvelopeDigest: c.EnvelopeDigest, Status: c.Status}
	return sign(sender, p)
}

// newPayload fills the fields every kind has and checks the arguments the
// payload validation would only report less clearly.
func newPayload(sender *identity.Identity, kind Kind, recipient identity.DID, messageID string,
	deadline, now time.Time) (*payloadJSON, error) {
	if sender == nil {
		return nil, fmt.Errorf("%w: nil sender", ErrMalformed)
	}
	if _, err := identity.ParseDID(string(recipient)); err != nil {
		return nil, fmt.Errorf("%w: recipient: %w", ErrMalformed, err)
	}
	if !uuid.Valid(messageID) {
		return nil, fmt.Errorf("%w: messageId is not a lower-case UUID", ErrMalformed)
	}
	created, dl := now.UnixMilli(), deadline.UnixMilli()
	if created <= 0 || created > MaxTime || dl > MaxTime {
		return nil, fmt.Errorf("%w: time out of range (1 ms after the epoch to 2^53-1 ms)", ErrMalformed)
	}
	if dl <= created {
		return nil, fmt.Errorf("%w: deadline %s is not after now %s", ErrExpired,
			deadline.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
	}
	return &payloadJSON{EnvelopeID: uuid.NewString(), Kind: kind, MessageID: messageID, SenderDID: sender.DID(),
		RecipientDID: recipient, CreatedAt: created, DeliveryDeadline: dl}, nil
}

// sign validates p, encodes it, signs it as sender and returns the parsed
// envelope and a copy of its bytes. What it returns has gone through Parse,
// so an envelope built here is one every peer accepts.
func sign(sender *identity.Identity, p *payloadJSON) (*Envelope, []byte, error) {
	if _, _, _, err := p.validate(); err != nil {
		return nil, nil, err
	}
	payload, err := marshalCompact(p)
	if err != nil {
		return nil, nil, fmt.Errorf("envelope: encode payload: %w", err)
	}
	sig, err := identity.SignDomain(sender.Signer(), identity.DomainEnvelope, payload)
	if err != nil {
		return nil, nil, fmt.Errorf("envelope: sign %s: %w", p.EnvelopeID, err)
	}
	data, err := marshalCompact(&wireJSON{V: version, Payload: payload, Sig: b64.EncodeToString(sig)})
	if err != nil {
		return nil, nil, fmt.Errorf("envelope: encode: %w", err)
	}
	if len(data) > MaxSize {
		return nil, nil, fmt.Errorf("%w: envelope would be %d bytes, limit %d", ErrTooLarge, len(data), MaxSize)
	}
	env, err := Parse(data)
	if err != nil {
		if errors.Is(err, ErrSignature) {
			return nil, nil, err // the sender's key does not match its DID: cannot happen with an Identity
		}
		return nil, nil, fmt.Errorf("envelope: built envelope does not parse back: %w", err)
	}
	return env, data, nil
}
