package envelope

import (
	"crypto/ecdh"
	"crypto/hpke"
	"fmt"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// bodyInfoDomain starts the HPKE info string of a sealed body (see bodyInfo).
const bodyInfoDomain = "sealbridge/envelope-body/v1"

// The HPKE ciphersuite (RFC 9180): DHKEM(X25519, HKDF-SHA256) = 0x0020,
// HKDF-SHA256 = 0x0001, ChaCha20-Poly1305 = 0x0003, mode base.
var (
	kem  = hpke.DHKEM(ecdh.X25519())
	kdf  = hpke.HKDFSHA256()
	aead = hpke.ChaCha20Poly1305()
)

// bodyInfo is the HPKE info of the body of the envelope p describes:
//
//	"sealbridge/envelope-body/v1" 0x00 envelopeId 0x00 messageId 0x00 senderDid 0x00 recipientDid
//
// The fields are validated (UUIDs, did:key names) and hold no 0x00, so the
// string names them unambiguously. A body sealed under one envelope's info
// does not open under another's: it cannot be moved to another envelope,
// message, sender or recipient, not even by its sender re-signing.
func bodyInfo(p *payloadJSON) []byte {
	info := make([]byte, 0, len(bodyInfoDomain)+4+2*36+2*len(p.SenderDID))
	info = append(info, bodyInfoDomain...)
	for _, f := range []string{p.EnvelopeID, p.MessageID, string(p.SenderDID), string(p.RecipientDID)} {
		info = append(info, 0)
		info = append(info, f...)
	}
	return info
}

// seal seals body to the recipient named in p (whose DID must be valid) and
// returns the encapsulated key and the ciphertext.
func seal(p *payloadJSON, body []byte) (enc, ct []byte, err error) {
	pub, err := identity.ParseDID(string(p.RecipientDID))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: recipient: %w", ErrMalformed, err)
	}
	x, err := pub.X25519()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: recipient: %w", ErrMalformed, err)
	}
	pk, err := kem.NewPublicKey(x)
	if err != nil {
		return nil, nil, fmt.Errorf("envelope: seal to %s: %w", p.RecipientDID, err)
	}
	enc, sender, err := hpke.NewSender(pk, kdf, aead, bodyInfo(p))
	if err != nil {
		return nil, nil, fmt.Errorf("envelope: seal to %s: %w", p.RecipientDID, err)
	}
	ct, err = sender.Seal(nil, body)
	if err != nil {
		return nil, nil, fmt.Errorf("envelope: seal to %s: %w", p.RecipientDID, err)
	}
	return enc, ct, nil
}

// Open returns the plaintext body of the message envelope env, opened with
// recipient's key. It refuses an envelope of another kind (ErrKind) or one
// addressed to another identity (ErrRecipient), and a body that does not open
// under this envelope's info with the recipient's X25519 key (ErrOpen). env
// came from Parse, so its signature was verified: the sender signed the
// sealed bytes. Open does not check the deadline (CheckDeadline).
func Open(recipient *identity.Identity, env *Envelope) ([]byte, error) {
	switch {
	case env == nil:
		return nil, fmt.Errorf("%w: nil envelope", ErrMalformed)
	case env.p.Kind != KindMessage || env.p.Body == nil:
		return nil, fmt.Errorf("%w: envelope %s is a %s and has no sealed body", ErrKind, env.p.EnvelopeID, env.p.Kind)
	case env.p.Body.Blob != "":
		return nil, fmt.Errorf("%w: envelope %s carries its body as a blob (OpenBlob)", ErrKind, env.p.EnvelopeID)
	case recipient == nil:
		return nil, fmt.Errorf("%w: nil identity", ErrRecipient)
	}
	if err := env.CheckRecipient(recipient.DID()); err != nil {
		return nil, err
	}
	return openBody(recipient.X25519PrivateKey(), env)
}

// openBody opens env's body with the X25519 private scalar x, which it
// clears.
func openBody(x []byte, env *Envelope) ([]byte, error) {
	defer clear(x)
	fail := func() ([]byte, error) {
		// The HPKE errors say nothing useful and nothing secret; keep the
		// message fixed.
		return nil, fmt.Errorf("%w: envelope %s", ErrOpen, env.p.EnvelopeID)
	}
	sk, err := kem.NewPrivateKey(x)
	if err != nil {
		return fail()
	}
	r, err := hpke.NewRecipient(env.enc, sk, kdf, aead, bodyInfo(&env.p))
	if err != nil {
		return fail()
	}
	pt, err := r.Open(nil, env.ct)
	if err != nil {
		return fail()
	}
	return pt, nil
}
