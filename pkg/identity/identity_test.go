package identity_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

func TestGenerate(t *testing.T) {
	a, b := newID(t), newID(t)
	if a.DID() == b.DID() {
		t.Fatal("two generated identities share a DID")
	}
	if err := identity.ValidatePublicKey(a.Public()); err != nil {
		t.Fatal(err)
	}
	if got := a.Signer().Public().(ed25519.PublicKey); !a.Public().Equal(identity.PublicKey(got)) {
		t.Fatal("Signer().Public() differs from Public()")
	}
	// Public returns a copy.
	p := a.Public()
	p[0] ^= 1
	if a.Public().Equal(p) {
		t.Fatal("Public exposes the identity's own slice")
	}
}

func TestFromSeedAndPrivateKey(t *testing.T) {
	seed := mustHex(t, "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
	id, err := identity.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(id.Public()); got != "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a" {
		t.Fatalf("RFC 8032 test 1 public key %s", got)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	id2, err := identity.FromPrivateKey(priv)
	if err != nil || id2.DID() != id.DID() {
		t.Fatalf("FromPrivateKey: %v %v", id2, err)
	}
	// The identity keeps its own copy.
	clear(priv)
	if sig, err := identity.SignDomain(id2.Signer(), identity.DomainEnvelope, b("p")); err != nil ||
		!identity.VerifyDomain(id.Public(), identity.DomainEnvelope, sig, b("p")) {
		t.Fatalf("identity changed with its input: %v", err)
	}

	for _, n := range []int{0, 31, 33} {
		if _, err := identity.FromSeed(make([]byte, n)); !errors.Is(err, identity.ErrPrivateKey) {
			t.Errorf("FromSeed(%d bytes) = %v", n, err)
		}
	}
	for _, n := range []int{0, 32, 63, 65} {
		if _, err := identity.FromPrivateKey(make(ed25519.PrivateKey, n)); !errors.Is(err, identity.ErrPrivateKey) {
			t.Errorf("FromPrivateKey(%d bytes) = %v", n, err)
		}
	}
	mismatched := ed25519.NewKeyFromSeed(seed)
	copy(mismatched[32:], newID(t).Public())
	if _, err := identity.FromPrivateKey(mismatched); !errors.Is(err, identity.ErrPrivateKey) {
		t.Errorf("mismatched halves: %v", err)
	}
}

// TestIdentityNeverFormatsKey: no fmt verb shows the seed of an Identity or
// of its Signer.
func TestIdentityNeverFormatsKey(t *testing.T) {
	seed := mustHex(t, "9b937b81322d816cfab9d5a3baacc9b2a5febe4b149f126b3630f93a29527017")
	id, err := identity.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	secrets := secretForms(seed)
	for _, v := range []any{id, *id, id.Signer()} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%d", "%q"} {
			out := fmt.Sprintf(verb, v)
			for _, s := range secrets {
				if strings.Contains(strings.ToLower(out), strings.ToLower(s)) {
					t.Fatalf("%s of %T shows the key: %s", verb, v, out)
				}
			}
			if !strings.Contains(out, string(id.DID())) {
				t.Errorf("%s of %T = %q, want the DID", verb, v, out)
			}
		}
	}
	var nilID *identity.Identity
	if got := fmt.Sprint(nilID); got != "<nil>" {
		t.Errorf("nil identity prints %q", got)
	}
}

// secretForms are encodings of a seed that must never appear in output.
func secretForms(seed []byte) []string {
	forms := []string{hex.EncodeToString(seed[:8]), base64.StdEncoding.EncodeToString(seed[:9])}
	var dec []string
	for _, c := range seed[:6] {
		dec = append(dec, fmt.Sprint(c))
	}
	return append(forms, strings.Join(dec, " "))
}
