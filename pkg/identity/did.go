package identity

import (
	"crypto/ed25519"
	"fmt"
	"strings"

	"github.com/mr-tron/base58"
)

// DID is a did:key name of an Ed25519 public key. A DID from FormatDID or an
// Identity is well formed; any other must go through ParseDID.
type DID string

const (
	didPrefix = "did:key:z"
	// maxDIDLen bounds the input before base58 decoding, which is quadratic.
	// An Ed25519 did:key is always 56 bytes; the slack lets other did:key
	// types (P-256, secp256k1, …) be reported as ErrDIDMulticodec.
	maxDIDLen = 128
)

// multicodecEd25519Pub is the unsigned varint of multicodec 0xed, ed25519-pub.
var multicodecEd25519Pub = [2]byte{0xed, 0x01}

// FormatDID returns the did:key name of pub: "did:key:z" and the base58btc
// encoding of 0xed 0x01 followed by the 32 key bytes. It returns "" if pub is
// not 32 bytes. It does not validate the point (see ValidatePublicKey).
func FormatDID(pub ed25519.PublicKey) DID {
	if len(pub) != ed25519.PublicKeySize {
		return ""
	}
	var buf [len(multicodecEd25519Pub) + ed25519.PublicKeySize]byte
	copy(buf[:], multicodecEd25519Pub[:])
	copy(buf[len(multicodecEd25519Pub):], pub)
	return DID(didPrefix + base58.Encode(buf[:]))
}

// ParseDID returns the public key named by s, refusing anything but the exact
// canonical did:key form of a strictly valid Ed25519 key. The error wraps
// ErrDIDLength, ErrDIDPrefix, ErrDIDBase58, ErrDIDMulticodec or one of the
// ValidatePublicKey errors. ParseDID never panics.
func ParseDID(s string) (PublicKey, error) {
	if len(s) > maxDIDLen {
		return nil, fmt.Errorf("%w (%d bytes)", ErrDIDLength, len(s))
	}
	// The errors wrapped already say "identity: …": add the DID, not a second prefix.
	fail := func(err error) (PublicKey, error) {
		return nil, fmt.Errorf("%w: %q", err, s)
	}
	rest, ok := strings.CutPrefix(s, didPrefix)
	if !ok {
		return fail(ErrDIDPrefix)
	}
	raw, err := base58.Decode(rest)
	if err != nil {
		return fail(ErrDIDBase58)
	}
	if len(raw) < len(multicodecEd25519Pub) || [2]byte(raw) != multicodecEd25519Pub {
		return fail(ErrDIDMulticodec)
	}
	key := PublicKey(raw[len(multicodecEd25519Pub):])
	if len(key) != ed25519.PublicKeySize {
		return fail(fmt.Errorf("%w (key of %d bytes)", ErrDIDLength, len(key)))
	}
	if err := ValidatePublicKey(key); err != nil {
		return fail(err)
	}
	// Base58 is bijective once the prefix rules out leading zero bytes, so
	// this only guards against decoder leniency; it is cheap.
	if string(FormatDID(ed25519.PublicKey(key))) != s {
		return fail(ErrDIDBase58)
	}
	return key, nil
}

// PublicKey is ParseDID(string(d)).
func (d DID) PublicKey() (PublicKey, error) { return ParseDID(string(d)) }

// String returns d as a string.
func (d DID) String() string { return string(d) }
