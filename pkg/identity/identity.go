package identity

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/sha512"
	"fmt"
	"io"
)

// Identity is an Ed25519 key pair and its DID. It never formats its private
// key: every fmt verb prints the DID.
type Identity struct {
	priv ed25519.PrivateKey
	pub  PublicKey
	did  DID
}

// Generate returns a new random identity.
func Generate() (*Identity, error) {
	_, priv, err := ed25519.GenerateKey(nil) // nil: crypto/rand
	if err != nil {
		return nil, fmt.Errorf("identity: generate: %w", err)
	}
	return FromPrivateKey(priv)
}

// FromSeed returns the identity of the 32-byte RFC 8032 private key seed.
func FromSeed(seed []byte) (*Identity, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%w: seed of %d bytes, want %d", ErrPrivateKey, len(seed), ed25519.SeedSize)
	}
	return newIdentity(ed25519.NewKeyFromSeed(seed))
}

// FromPrivateKey returns the identity of priv, which must be 64 bytes whose
// public half matches its seed, with a strictly valid public key. It keeps a
// copy of priv. Exported for the package's tests of a private key whose halves
// disagree, a case no seed or key file can produce.
func FromPrivateKey(priv ed25519.PrivateKey) (*Identity, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrPrivateKey, len(priv), ed25519.PrivateKeySize)
	}
	derived := ed25519.NewKeyFromSeed(priv.Seed())
	if !bytes.Equal(derived[ed25519.SeedSize:], priv[ed25519.SeedSize:]) {
		clear(derived)
		return nil, fmt.Errorf("%w: public half does not match seed", ErrPrivateKey)
	}
	return newIdentity(derived)
}

// newIdentity takes ownership of priv.
func newIdentity(priv ed25519.PrivateKey) (*Identity, error) {
	pub := PublicKey(bytes.Clone(priv[ed25519.SeedSize:]))
	if err := ValidatePublicKey(pub); err != nil {
		clear(priv)
		return nil, fmt.Errorf("identity: derived public key refused: %w", err)
	}
	return &Identity{priv: priv, pub: pub, did: FormatDID(ed25519.PublicKey(pub))}, nil
}

// DID returns the identity's name.
func (id *Identity) DID() DID { return id.did }

// Public returns a copy of the identity's public key.
func (id *Identity) Public() PublicKey { return bytes.Clone(id.pub) }

// Signer returns a crypto.Signer over the identity's key, for SignDomain. Its
// Public method returns an ed25519.PublicKey; it signs pure Ed25519 (opts
// must be crypto.Hash(0) or *ed25519.Options without a hash) and does not
// expose the private key bytes.
func (id *Identity) Signer() crypto.Signer { return signer{id.priv} }

// X25519PrivateKey returns the X25519 private scalar matching
// Public().X25519(): the first half of SHA-512 of the seed, clamped
// (RFC 8032 §5.1.5, RFC 7748 §5). The caller owns the returned slice and
// should clear it after use.
func (id *Identity) X25519PrivateKey() []byte {
	h := sha512.Sum512(id.priv.Seed())
	defer clear(h[:])
	s := bytes.Clone(h[:32])
	s[0] &= 248
	s[31] &= 127
	s[31] |= 64
	return s
}

// Format prints the DID for every verb, so an Identity (or a copy of one) in
// a log line or an error never shows key bytes.
func (id Identity) Format(f fmt.State, _ rune) {
	io.WriteString(f, string(id.did))
}

// signer is the crypto.Signer of an Identity.
type signer struct{ priv ed25519.PrivateKey }

func (s signer) Public() crypto.PublicKey {
	return ed25519.PublicKey(bytes.Clone(s.priv[ed25519.SeedSize:]))
}

func (s signer) Sign(rand io.Reader, msg []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.priv.Sign(rand, msg, opts)
}

// Format prints the public key's DID for every verb.
func (s signer) Format(f fmt.State, _ rune) {
	io.WriteString(f, string(FormatDID(ed25519.PublicKey(s.priv[ed25519.SeedSize:]))))
}
