package envelope

import (
	"bytes"
	"fmt"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Relay receipts (DESIGN §12).
//
// A relay receipt is exactly these bytes — one compact JSON object, keys in
// this order, no whitespace, no trailing newline:
//
//	{"v":1,"payload":{"envelopeId":"E","envelopeDigest":"G","state":"persisted","relayDid":"R","receivedAt":T,"senderSeq":S},"sig":"SIG"}
//
// ",senderSeq":S is absent when S is 0 (0 ≤ S ≤ MaxTime: the highest store-head
// sequence number the relay had witnessed from the envelope's sender, StoreHead).
// E is the envelope's id (lower-case UUID), G its digest (64 lower-case hex
// digits, see Digest), R the relay's did:key, T the time the relay persisted
// the envelope in Unix milliseconds (0 < T ≤ MaxTime) and SIG the base64url
// (unpadded, canonical) Ed25519 signature by R's key over
//
//	"sealbridge/relay-receipt/v1" 0x00 PAYLOAD
//
// (identity.SignDomain with DomainRelayReceipt and one part, the payload
// bytes exactly as they stand in the receipt). As for envelopes, only the
// canonical bytes are a receipt.

// RelayReceipt is a relay's signed statement that it persisted an envelope.
type RelayReceipt struct {
	EnvelopeID     string       // lower-case UUID
	EnvelopeDigest string       // lower-case hex SHA-256 of the envelope's exact bytes
	State          string       // "persisted"
	RelayDID       identity.DID // the relay that signed the receipt
	ReceivedAt     time.Time    // millisecond precision
	// SenderSeq is the highest store-head sequence number (StoreHead.Seq) the relay
	// had witnessed from the envelope's sender when it signed; 0 when it had none
	// (and in receipts of relays that predate heads, which omit the field).
	SenderSeq int64
}

// ReceiptStatePersisted is the only receipt state of version 1: the relay
// stored the envelope durably before answering.
const ReceiptStatePersisted = "persisted"

// DomainRelayReceipt is the signature domain of relay receipts; it takes one
// part, the payload bytes.
const DomainRelayReceipt = "sealbridge/relay-receipt/v1"

// MaxReceiptSize bounds a relay receipt; a valid one is about 330 bytes.
const MaxReceiptSize = 4 << 10

// receiptPayloadJSON is the signed payload of a receipt, in its key order.
type receiptPayloadJSON struct {
	EnvelopeID     string       `json:"envelopeId"`
	EnvelopeDigest string       `json:"envelopeDigest"`
	State          string       `json:"state"`
	RelayDID       identity.DID `json:"relayDid"`
	ReceivedAt     int64        `json:"receivedAt"`
	SenderSeq      int64        `json:"senderSeq,omitempty"`
}

func (p *receiptPayloadJSON) validate() (identity.PublicKey, error) {
	switch {
	case !uuid.Valid(p.EnvelopeID):
		return nil, fmt.Errorf("%w: receipt envelopeId is not a lower-case UUID", ErrMalformed)
	case !IsHex(p.EnvelopeDigest, 64):
		return nil, fmt.Errorf("%w: receipt envelopeDigest is not 64 lower-case hex digits", ErrMalformed)
	case p.State != ReceiptStatePersisted:
		return nil, fmt.Errorf("%w: receipt state is not %q", ErrMalformed, ReceiptStatePersisted)
	case p.ReceivedAt <= 0 || p.ReceivedAt > MaxTime:
		return nil, fmt.Errorf("%w: receipt receivedAt out of range", ErrMalformed)
	case p.SenderSeq < 0 || p.SenderSeq > MaxTime:
		return nil, fmt.Errorf("%w: receipt senderSeq out of range", ErrMalformed)
	}
	pub, err := identity.ParseDID(string(p.RelayDID))
	if err != nil {
		return nil, fmt.Errorf("%w: receipt relayDid: %w", ErrMalformed, err)
	}
	return pub, nil
}

// SignRelayReceipt encodes r (State empty means ReceiptStatePersisted; the
// relay DID must be relay's) and signs it with relay's key. It returns the
// receipt's canonical bytes, which ParseRelayReceipt accepts.
func SignRelayReceipt(relay *identity.Identity, r RelayReceipt) ([]byte, error) {
	if relay == nil {
		return nil, fmt.Errorf("%w: nil relay identity", ErrMalformed)
	}
	if r.State == "" {
		r.State = ReceiptStatePersisted
	}
	if r.RelayDID == "" {
		r.RelayDID = relay.DID()
	}
	if r.RelayDID != relay.DID() {
		return nil, fmt.Errorf("%w: receipt relayDid %s is not the signer %s", ErrSender, r.RelayDID, relay.DID())
	}
	p := receiptPayloadJSON{
		EnvelopeID:     r.EnvelopeID,
		EnvelopeDigest: r.EnvelopeDigest,
		State:          r.State,
		RelayDID:       r.RelayDID,
		ReceivedAt:     r.ReceivedAt.UnixMilli(),
		SenderSeq:      r.SenderSeq,
	}
	if _, err := p.validate(); err != nil {
		return nil, err
	}
	payload, err := marshalCompact(&p)
	if err != nil {
		return nil, fmt.Errorf("envelope: encode receipt payload: %w", err)
	}
	sig, err := identity.SignDomain(relay.Signer(), DomainRelayReceipt, payload)
	if err != nil {
		return nil, fmt.Errorf("envelope: sign receipt for %s: %w", r.EnvelopeID, err)
	}
	data, err := marshalCompact(&wireJSON{V: version, Payload: payload, Sig: b64.EncodeToString(sig)})
	if err != nil {
		return nil, fmt.Errorf("envelope: encode receipt: %w", err)
	}
	if _, err := ParseRelayReceipt(data); err != nil {
		return nil, fmt.Errorf("envelope: built receipt does not parse back: %w", err)
	}
	return data, nil
}

// ParseRelayReceipt verifies data as one relay receipt and returns it. It
// refuses more than MaxReceiptSize bytes (ErrTooLarge); a byte outside
// printable ASCII, a space or a backslash, anything but one strict JSON
// object, a version other than 1 (ErrVersion), non-canonical bytes or a
// payload field that is invalid, including a relayDid identity.ParseDID
// refuses (ErrMalformed); and a signature that does not verify under the
// relayDid's key (ErrSignature). It never panics.
func ParseRelayReceipt(data []byte) (*RelayReceipt, error) {
	if len(data) > MaxReceiptSize {
		return nil, fmt.Errorf("%w: receipt is %d bytes, limit %d", ErrTooLarge, len(data), MaxReceiptSize)
	}
	for i, c := range data {
		if c <= ' ' || c > '~' || c == '\\' {
			return nil, fmt.Errorf("%w: receipt byte %d is not printable ASCII or is a space or backslash", ErrMalformed, i)
		}
	}
	var w wireJSON
	if err := decodeStrict("receipt", data, &w); err != nil {
		return nil, err
	}
	if w.V != version {
		return nil, fmt.Errorf("%w: receipt v=%d", ErrVersion, w.V)
	}
	if canon, err := marshalCompact(&w); err != nil || !bytes.Equal(canon, data) {
		return nil, fmt.Errorf("%w: receipt not in canonical form", ErrMalformed)
	}
	sig, err := decodeB64(w.Sig, "receipt sig")
	if err != nil {
		return nil, err
	}
	if len(sig) != identity.SignatureSize {
		return nil, fmt.Errorf("%w: receipt sig is %d bytes, want %d", ErrMalformed, len(sig), identity.SignatureSize)
	}
	var p receiptPayloadJSON
	if err := decodeStrict("receipt payload", w.Payload, &p); err != nil {
		return nil, err
	}
	if canon, err := marshalCompact(&p); err != nil || !bytes.Equal(canon, w.Payload) {
		return nil, fmt.Errorf("%w: receipt payload not in canonical form", ErrMalformed)
	}
	pub, err := p.validate()
	if err != nil {
		return nil, err
	}
	if !identity.VerifyDomain(pub, DomainRelayReceipt, sig, w.Payload) {
		return nil, fmt.Errorf("%w: receipt for %s from %s", ErrSignature, p.EnvelopeID, p.RelayDID)
	}
	return &RelayReceipt{
		EnvelopeID:     p.EnvelopeID,
		EnvelopeDigest: p.EnvelopeDigest,
		State:          p.State,
		RelayDID:       p.RelayDID,
		ReceivedAt:     time.UnixMilli(p.ReceivedAt),
		SenderSeq:      p.SenderSeq,
	}, nil
}

// Matches reports whether r is a persisted-receipt for exactly the envelope
// with this id and digest.
func (r *RelayReceipt) Matches(envelopeID, digest string) bool {
	return r != nil && r.State == ReceiptStatePersisted && r.EnvelopeID == envelopeID && r.EnvelopeDigest == digest
}
