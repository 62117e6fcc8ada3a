package identity

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
)

// Signature domains (DESIGN §3).
const (
	// DomainRecord signs a store record: parts kind, id, payload bytes.
	DomainRecord = "sealbridge/record/v1"
	// DomainEnvelope signs a wire envelope: one part, the payload bytes.
	DomainEnvelope = "sealbridge/envelope/v1"
)

// domainParts is the number of parts of each domain this package defines.
var domainParts = map[string]int{
	DomainRecord:   3,
	DomainEnvelope: 1,
}

// SignatureSize is the length of every signature SignDomain returns.
const SignatureSize = ed25519.SignatureSize

// domainMessage returns domain 0x00 part1 0x00 part2 … after checking that it
// is unambiguous: a non-empty domain without 0x00, at least one part, no 0x00
// in any part but the last, and the fixed number of parts of a known domain.
func domainMessage(domain string, parts [][]byte) ([]byte, error) {
	switch {
	case domain == "":
		return nil, fmt.Errorf("%w: empty domain", ErrDomain)
	case strings.IndexByte(domain, 0) >= 0:
		return nil, fmt.Errorf("%w: domain contains 0x00", ErrDomain)
	case len(parts) == 0:
		return nil, fmt.Errorf("%w: no parts", ErrDomain)
	}
	if n, ok := domainParts[domain]; ok && len(parts) != n {
		return nil, fmt.Errorf("%w: %s takes %d parts, got %d", ErrDomain, domain, n, len(parts))
	}
	size := len(domain)
	for i, p := range parts {
		if i < len(parts)-1 && bytes.IndexByte(p, 0) >= 0 {
			return nil, fmt.Errorf("%w: part %d contains 0x00", ErrDomain, i+1)
		}
		size += 1 + len(p)
	}
	msg := make([]byte, 0, size)
	msg = append(msg, domain...)
	for _, p := range parts {
		msg = append(msg, 0)
		msg = append(msg, p...)
	}
	return msg, nil
}

// SignDomain signs domain 0x00 part1 0x00 … with signer, which must hold an
// Ed25519 key. It returns an error wrapping ErrDomain if the domain or parts
// are ambiguous (see the package documentation), and an error if the signer
// fails or returns a signature that does not verify under its public key.
func SignDomain(signer crypto.Signer, domain string, parts ...[]byte) ([]byte, error) {
	if signer == nil {
		return nil, fmt.Errorf("identity: sign %s: nil signer", domain)
	}
	pub, ok := signer.Public().(ed25519.PublicKey)
	if !ok || len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("identity: sign %s: signer does not hold an Ed25519 key", domain)
	}
	msg, err := domainMessage(domain, parts)
	if err != nil {
		return nil, err
	}
	sig, err := signer.Sign(rand.Reader, msg, crypto.Hash(0))
	if err != nil {
		return nil, fmt.Errorf("identity: sign %s: %w", domain, err)
	}
	// A signature that does not verify would make the record it protects
	// unreadable after it was acknowledged; refuse it now instead.
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(pub, msg, sig) {
		return nil, fmt.Errorf("identity: sign %s: signer returned an invalid signature", domain)
	}
	return sig, nil
}

// VerifyDomain reports whether sig is pub's valid signature of domain 0x00
// part1 0x00 …. It returns false, never panicking, for a key or signature of
// the wrong length, a key refused by ValidatePublicKey, and a domain or parts
// SignDomain would refuse.
func VerifyDomain(pub PublicKey, domain string, sig []byte, parts ...[]byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize {
		return false
	}
	if ValidatePublicKey(pub) != nil {
		return false
	}
	msg, err := domainMessage(domain, parts)
	if err != nil {
		return false
	}
	return ed25519.Verify(ed25519.PublicKey(pub), msg, sig)
}
