package envelope

import (
	"bytes"
	"crypto"
	"fmt"
	"time"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Store heads (DESIGN §5, "The head").
//
// A store head is an identity's signed statement about its own store: the newest
// format version that wrote it, a sequence number that only grows with its
// commits, and the time. The store keeps its latest head in .head; the carrier
// sends it with its deliveries, and a relay keeps the highest it has seen per
// sender and signs that sequence number into its receipts (RelayReceipt.SenderSeq).
// A store whose head is below one its owner signed earlier was rolled back.
//
// A head is exactly these bytes — one compact JSON object, keys in this order, no
// whitespace, no trailing newline:
//
//	{"v":1,"payload":{"owner":"D","format":F,"seq":N,"time":T},"sig":"SIG"}
//
// D is the owner's did:key, F the store format version (≥ 1), N the sequence
// number (≥ 1, at most MaxTime), T the time it was signed in Unix milliseconds
// (0 < T ≤ MaxTime) and SIG the base64url (unpadded, canonical) Ed25519 signature
// by D's key over
//
//	"sealbridge/store-head/v1" 0x00 PAYLOAD

// StoreHead is a parsed, verified store head.
type StoreHead struct {
	Owner  identity.DID
	Format int
	Seq    int64
	Time   time.Time // millisecond precision
}

// DomainStoreHead is the signature domain of store heads; it takes one part, the
// payload bytes.
const DomainStoreHead = "sealbridge/store-head/v1"

// MaxHeadSize bounds a store head; a valid one is about 250 bytes.
const MaxHeadSize = 1 << 10

// headPayloadJSON is the signed payload of a head, in its key order.
type headPayloadJSON struct {
	Owner  identity.DID `json:"owner"`
	Format int          `json:"format"`
	Seq    int64        `json:"seq"`
	Time   int64        `json:"time"`
}

func (p *headPayloadJSON) validate() (identity.PublicKey, error) {
	switch {
	case p.Format < 1 || p.Format > 1<<16:
		return nil, fmt.Errorf("%w: head format out of range", ErrMalformed)
	case p.Seq < 1 || p.Seq > MaxTime:
		return nil, fmt.Errorf("%w: head seq out of range", ErrMalformed)
	case p.Time <= 0 || p.Time > MaxTime:
		return nil, fmt.Errorf("%w: head time out of range", ErrMalformed)
	}
	pub, err := identity.ParseDID(string(p.Owner))
	if err != nil {
		return nil, fmt.Errorf("%w: head owner: %w", ErrMalformed, err)
	}
	return pub, nil
}

// SignStoreHead encodes h and signs it with signer, which must hold h.Owner's key
// (a head signed by another key does not parse back: ErrSignature). It returns the
// head's canonical bytes, which ParseStoreHead accepts.
func SignStoreHead(signer crypto.Signer, h StoreHead) ([]byte, error) {
	if signer == nil {
		return nil, fmt.Errorf("%w: nil signer", ErrMalformed)
	}
	p := headPayloadJSON{Owner: h.Owner, Format: h.Format, Seq: h.Seq, Time: h.Time.UnixMilli()}
	if _, err := p.validate(); err != nil {
		return nil, err
	}
	payload, err := marshalCompact(&p)
	if err != nil {
		return nil, fmt.Errorf("envelope: encode head payload: %w", err)
	}
	sig, err := identity.SignDomain(signer, DomainStoreHead, payload)
	if err != nil {
		return nil, fmt.Errorf("envelope: sign head: %w", err)
	}
	data, err := marshalCompact(&wireJSON{V: version, Payload: payload, Sig: b64.EncodeToString(sig)})
	if err != nil {
		return nil, fmt.Errorf("envelope: encode head: %w", err)
	}
	if _, err := ParseStoreHead(data); err != nil {
		return nil, fmt.Errorf("envelope: built head does not parse back: %w", err)
	}
	return data, nil
}

// ParseStoreHead verifies data as one store head and returns it. It refuses more
// than MaxHeadSize bytes (ErrTooLarge); a byte outside printable ASCII, a space or
// a backslash, anything but one strict JSON object, a version other than 1
// (ErrVersion), non-canonical bytes or an invalid payload field (ErrMalformed);
// and a signature that does not verify under the owner's key (ErrSignature). It
// never panics.
func ParseStoreHead(data []byte) (*StoreHead, error) {
	if len(data) > MaxHeadSize {
		return nil, fmt.Errorf("%w: head is %d bytes, limit %d", ErrTooLarge, len(data), MaxHeadSize)
	}
	for i, c := range data {
		if c <= ' ' || c > '~' || c == '\\' {
			return nil, fmt.Errorf("%w: head byte %d is not printable ASCII or is a space or backslash", ErrMalformed, i)
		}
	}
	var w wireJSON
	if err := decodeStrict("head", data, &w); err != nil {
		return nil, err
	}
	if w.V != version {
		return nil, fmt.Errorf("%w: head v=%d", ErrVersion, w.V)
	}
	if canon, err := marshalCompact(&w); err != nil || !bytes.Equal(canon, data) {
		return nil, fmt.Errorf("%w: head not in canonical form", ErrMalformed)
	}
	sig, err := decodeB64(w.Sig, "head sig")
	if err != nil {
		return nil, err
	}
	if len(sig) != identity.SignatureSize {
		return nil, fmt.Errorf("%w: head sig is %d bytes, want %d", ErrMalformed, len(sig), identity.SignatureSize)
	}
	var p headPayloadJSON
	if err := decodeStrict("head payload", w.Payload, &p); err != nil {
		return nil, err
	}
	if canon, err := marshalCompact(&p); err != nil || !bytes.Equal(canon, w.Payload) {
		return nil, fmt.Errorf("%w: head payload not in canonical form", ErrMalformed)
	}
	pub, err := p.validate()
	if err != nil {
		return nil, err
	}
	if !identity.VerifyDomain(pub, DomainStoreHead, sig, w.Payload) {
		return nil, fmt.Errorf("%w: head of %s", ErrSignature, p.Owner)
	}
	return &StoreHead{Owner: p.Owner, Format: p.Format, Seq: p.Seq, Time: time.UnixMilli(p.Time)}, nil
}
