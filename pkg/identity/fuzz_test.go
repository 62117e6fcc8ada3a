package identity_test

import (
	"bytes"
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// FuzzParseDID: ParseDID never panics, and whatever it accepts is a strictly
// valid key whose DID is the input, byte for byte.
func FuzzParseDID(f *testing.F) {
	for _, v := range didVectors {
		f.Add(v.did)
		f.Add(v.did[:len(v.did)-1])
		f.Add(v.did + "1")
		f.Add("did:key:z1" + v.did[9:])
	}
	for _, h := range append(append([]string(nil), smallOrder...), smallOrderNonCanonical...) {
		f.Add(encodeDID(ed25519Codec, mustHex(f, h)))
	}
	for _, s := range []string{
		"", "did:key:", "did:key:z", "did:key:zTjsVPtY", "did:web:example.com",
		"did:key:z6LSnjagzhe8Df6gZmroW3wjDd7XQLwAuYfwa4ZeTBCGFoYc",
		"did:key:z6MkA9MEcFWsoUVqj2zX6LACFaikLQ28i9WAsJnURDS3HLGKSkUbwUbiLH22ohgZ2BwgpQ6qC3VBTNV3pLhYDTVgR",
		"did:key:z" + strings.Repeat("1", 60), "did:key:z" + strings.Repeat("z", 130),
		"did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp#z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pub, err := identity.ParseDID(s)
		if err != nil {
			if pub != nil {
				t.Fatalf("ParseDID(%q) returned a key with error %v", s, err)
			}
			return
		}
		if len(pub) != ed25519.PublicKeySize {
			t.Fatalf("ParseDID(%q) = %d-byte key", s, len(pub))
		}
		if err := identity.ValidatePublicKey(pub); err != nil {
			t.Fatalf("ParseDID(%q) accepted a key ValidatePublicKey refuses: %v", s, err)
		}
		if got := identity.FormatDID(ed25519.PublicKey(pub)); string(got) != s {
			t.Fatalf("ParseDID(%q) re-formats to %q", s, got)
		}
		again, err := identity.ParseDID(string(pub.DID()))
		if err != nil || !bytes.Equal(again, pub) {
			t.Fatalf("re-parse of %q: %x %v", s, []byte(again), err)
		}
	})
}

// FuzzValidatePublicKey: ValidatePublicKey never panics, and a key it
// accepts works for X25519 and for VerifyDomain without panicking.
func FuzzValidatePublicKey(f *testing.F) {
	for _, h := range append(append([]string(nil), smallOrder...), smallOrderNonCanonical...) {
		f.Add(mustHex(f, h))
	}
	for _, v := range didVectors {
		f.Add(mustHex(f, v.pubHex))
	}
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 32))
	f.Fuzz(func(t *testing.T, key []byte) {
		err := identity.ValidatePublicKey(key)
		_, xerr := identity.PublicKey(key).X25519()
		if (err == nil) != (xerr == nil) {
			t.Fatalf("ValidatePublicKey %v but X25519 %v", err, xerr)
		}
		identity.VerifyDomain(identity.PublicKey(key), identity.DomainEnvelope, make([]byte, 64), key)
		if err == nil {
			if _, err := identity.ParseDID(string(identity.PublicKey(key).DID())); err != nil {
				t.Fatalf("valid key %x: its DID is refused: %v", key, err)
			}
		}
	})
}
