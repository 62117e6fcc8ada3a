package identity

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"sync"

	"filippo.io/edwards25519"
)

// PublicKey is an Ed25519 public key as its 32-byte encoding. A PublicKey
// obtained from ParseDID or an Identity has been validated; one built by
// conversion from bytes has not, and every function here that relies on it
// validates it again.
type PublicKey ed25519.PublicKey

// ValidatePublicKey reports whether pub is a strictly valid Ed25519 public
// key: 32 bytes (ErrKeyLength) decoding to a point of edwards25519
// (ErrKeyNotOnCurve), canonically encoded (ErrKeyNonCanonical), and not of
// small order (ErrKeySmallOrder). Exported as the one public-key check the
// package's tests and FuzzValidatePublicKey exercise directly.
func ValidatePublicKey(pub []byte) error {
	if len(pub) == ed25519.PublicKeySize && validKeys.has([32]byte(pub)) {
		return nil
	}
	_, err := decodePoint(pub)
	if err == nil {
		validKeys.add([32]byte(pub))
	}
	return err
}

// validKeys remembers keys that passed validation: every record verification checks
// its key, and decoding a point costs about as much as a sixth of a verification.
// Validation is a pure function of the 32 bytes, so remembering is exact.
var validKeys = &keyMemo{keys: map[[32]byte]struct{}{}}

// maxValidKeys bounds the memo; past it the memo starts over.
const maxValidKeys = 4096

type keyMemo struct {
	mu   sync.RWMutex
	keys map[[32]byte]struct{}
}

func (m *keyMemo) has(k [32]byte) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.keys[k]
	return ok
}

func (m *keyMemo) add(k [32]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.keys) >= maxValidKeys {
		clear(m.keys)
	}
	m.keys[k] = struct{}{}
}

// decodePoint validates pub as ValidatePublicKey does and returns its point.
func decodePoint(pub []byte) (*edwards25519.Point, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w (got %d bytes)", ErrKeyLength, len(pub))
	}
	p, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return nil, ErrKeyNotOnCurve
	}
	// SetBytes accepts y ≥ 2²⁵⁵−19 and x = 0 with the sign bit set; Bytes
	// always produces the canonical encoding.
	if !bytes.Equal(p.Bytes(), pub) {
		return nil, ErrKeyNonCanonical
	}
	// [8]P is the identity exactly for the eight points of small order.
	if new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return nil, ErrKeySmallOrder
	}
	return p, nil
}

// Equal reports whether pub and other are the same bytes.
func (pub PublicKey) Equal(other PublicKey) bool { return bytes.Equal(pub, other) }

// DID returns the did:key name of pub, or "" if pub is not 32 bytes. It does
// not validate the point; ParseDID refuses the result if it is invalid.
func (pub PublicKey) DID() DID { return FormatDID(ed25519.PublicKey(pub)) }

// String returns the DID of pub.
func (pub PublicKey) String() string { return string(pub.DID()) }

// X25519 returns the X25519 (Montgomery u) form of pub, the key to seal
// payloads to. It refuses a key that ValidatePublicKey refuses.
func (pub PublicKey) X25519() ([]byte, error) {
	p, err := decodePoint(pub)
	if err != nil {
		return nil, err
	}
	return p.BytesMontgomery(), nil
}
