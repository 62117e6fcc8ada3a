package identity_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

func newID(t testing.TB) *identity.Identity {
	t.Helper()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func b(s string) []byte { return []byte(s) }

func TestSignDomainMessageLayout(t *testing.T) {
	id := newID(t)
	payload := b(`{"a":1}`)
	sig, err := identity.SignDomain(id.Signer(), identity.DomainRecord, b("outbox"), b("id-1"), payload)
	if err != nil {
		t.Fatal(err)
	}
	// docs/FORMAT.md §3: "sealbridge/record/v1" 0x00 kind 0x00 id 0x00 payload-bytes.
	msg := b("sealbridge/record/v1\x00outbox\x00id-1\x00" + `{"a":1}`)
	if !ed25519.Verify(ed25519.PublicKey(id.Public()), msg, sig) {
		t.Fatal("record signature is not over the DESIGN §3 message")
	}
	sig, err = identity.SignDomain(id.Signer(), identity.DomainEnvelope, payload)
	if err != nil {
		t.Fatal(err)
	}
	if !ed25519.Verify(ed25519.PublicKey(id.Public()), b("sealbridge/envelope/v1\x00"+`{"a":1}`), sig) {
		t.Fatal("envelope signature is not over the DESIGN §3 message")
	}
	if len(sig) != identity.SignatureSize {
		t.Fatalf("signature of %d bytes", len(sig))
	}
}

func TestVerifyDomainSeparation(t *testing.T) {
	id, other := newID(t), newID(t)
	pub := id.Public()
	kind, rid, payload := b("outbox"), b("8c1b0f3e-6a43-4e8e-9a55-0b8f1b2d6c11"), b(`{"state":"pending"}`)
	sig, err := identity.SignDomain(id.Signer(), identity.DomainRecord, kind, rid, payload)
	if err != nil {
		t.Fatal(err)
	}
	if !identity.VerifyDomain(pub, identity.DomainRecord, sig, kind, rid, payload) {
		t.Fatal("valid signature refused")
	}
	envSig, err := identity.SignDomain(id.Signer(), identity.DomainEnvelope, payload)
	if err != nil {
		t.Fatal(err)
	}
	if !identity.VerifyDomain(pub, identity.DomainEnvelope, envSig, payload) {
		t.Fatal("valid envelope signature refused")
	}

	refused := []struct {
		name   string
		pub    identity.PublicKey
		domain string
		sig    []byte
		parts  [][]byte
	}{
		{"other key", other.Public(), identity.DomainRecord, sig, [][]byte{kind, rid, payload}},
		{"other kind", pub, identity.DomainRecord, sig, [][]byte{b("batches"), rid, payload}},
		{"other id", pub, identity.DomainRecord, sig, [][]byte{kind, b("8c1b0f3e-6a43-4e8e-9a55-0b8f1b2d6c12"), payload}},
		{"other payload", pub, identity.DomainRecord, sig, [][]byte{kind, rid, b(`{"state":"closed"}`)}},
		{"kind and id swapped", pub, identity.DomainRecord, sig, [][]byte{rid, kind, payload}},
		{"byte moved from id to payload", pub, identity.DomainRecord, sig, [][]byte{kind, rid[:len(rid)-1], slices.Concat(rid[len(rid)-1:], payload)}},
		{"byte moved from kind to id", pub, identity.DomainRecord, sig, [][]byte{kind[:5], slices.Concat(kind[5:], rid), payload}},
		{"record as envelope", pub, identity.DomainEnvelope, sig, [][]byte{payload}},
		{"envelope as record", pub, identity.DomainRecord, envSig, [][]byte{kind, rid, payload}},
		{"record under another domain", pub, "sealbridge/record/v2", sig, [][]byte{kind, rid, payload}},
		{"envelope under another domain", pub, "sealbridge/receipt/v1", envSig, [][]byte{payload}},
		{"flipped signature bit", pub, identity.DomainRecord, flip(sig), [][]byte{kind, rid, payload}},
	}
	for _, c := range refused {
		if identity.VerifyDomain(c.pub, c.domain, c.sig, c.parts...) {
			t.Errorf("%s: verified", c.name)
		}
	}
}

func flip(sig []byte) []byte {
	s := append([]byte(nil), sig...)
	s[10] ^= 1
	return s
}

// TestDomainZeroBytes: with 0x00 separators, a 0x00 inside a part could move
// a boundary. The last part (the payload) may hold any bytes; the others may
// not, so ("a", "b\x00c") and ("a\x00b", "c") cannot share a signature.
func TestDomainZeroBytes(t *testing.T) {
	id := newID(t)
	pub := id.Public()
	sig, err := identity.SignDomain(id.Signer(), identity.DomainRecord, b("outbox"), b("a"), b("b\x00c"))
	if err != nil {
		t.Fatalf("0x00 in the payload refused: %v", err)
	}
	if !identity.VerifyDomain(pub, identity.DomainRecord, sig, b("outbox"), b("a"), b("b\x00c")) {
		t.Fatal("valid signature refused")
	}
	if identity.VerifyDomain(pub, identity.DomainRecord, sig, b("outbox"), b("a\x00b"), b("c")) {
		t.Fatal("0x00 in the id moved a field boundary")
	}
	if identity.VerifyDomain(pub, identity.DomainRecord, sig, b("outbox\x00a"), b("b"), b("c")) {
		t.Fatal("0x00 in the kind moved a field boundary")
	}

	bad := []struct {
		name   string
		domain string
		parts  [][]byte
	}{
		{"0x00 in id", identity.DomainRecord, [][]byte{b("outbox"), b("a\x00b"), b("c")}},
		{"0x00 in kind", identity.DomainRecord, [][]byte{b("out\x00box"), b("a"), b("c")}},
		{"0x00 in domain", "sealbridge/x\x00y", [][]byte{b("c")}},
		{"empty domain", "", [][]byte{b("c")}},
		{"no parts", "sealbridge/x/v1", nil},
		{"record with 2 parts", identity.DomainRecord, [][]byte{b("outbox"), b("c")}},
		{"record with 4 parts", identity.DomainRecord, [][]byte{b("outbox"), b("a"), b("b"), b("c")}},
		{"envelope with 2 parts", identity.DomainEnvelope, [][]byte{b("a"), b("c")}},
	}
	for _, c := range bad {
		if _, err := identity.SignDomain(id.Signer(), c.domain, c.parts...); !errors.Is(err, identity.ErrDomain) {
			t.Errorf("SignDomain %s: %v, want ErrDomain", c.name, err)
		}
		if identity.VerifyDomain(pub, c.domain, make([]byte, 64), c.parts...) {
			t.Errorf("VerifyDomain %s: true", c.name)
		}
	}

	// Other domains take any fixed number of parts.
	sig, err = identity.SignDomain(id.Signer(), "sealbridge/test/v1", b("x"), b("y"), b(""))
	if err != nil || !identity.VerifyDomain(pub, "sealbridge/test/v1", sig, b("x"), b("y"), b("")) {
		t.Fatalf("custom domain: %v", err)
	}
}

func TestVerifyDomainNeverPanics(t *testing.T) {
	id := newID(t)
	pub := id.Public()
	payload := b("p")
	sig, err := identity.SignDomain(id.Signer(), identity.DomainEnvelope, payload)
	if err != nil {
		t.Fatal(err)
	}
	keys := []identity.PublicKey{nil, {}, pub[:31], append(pub[:32:32], 0), make(identity.PublicKey, 64)}
	for _, k := range keys {
		if identity.VerifyDomain(k, identity.DomainEnvelope, sig, payload) {
			t.Errorf("key of %d bytes verified", len(k))
		}
	}
	sigs := [][]byte{nil, {}, sig[:63], append(sig[:64:64], 0), make([]byte, 128)}
	for _, s := range sigs {
		if identity.VerifyDomain(pub, identity.DomainEnvelope, s, payload) {
			t.Errorf("signature of %d bytes verified", len(s))
		}
	}
	if identity.VerifyDomain(pub, identity.DomainEnvelope, sig) {
		t.Error("no parts verified")
	}
}

// TestVerifyDomainRefusesSmallOrderKey: Go's ed25519.Verify accepts, for the
// identity point as key, the signature R = identity, S = 0 on every message.
// VerifyDomain must not.
func TestVerifyDomainRefusesSmallOrderKey(t *testing.T) {
	key := mustHex(t, smallOrder[0])
	sig := make([]byte, 64)
	copy(sig, key) // R = identity, S = 0
	msg := b(identity.DomainEnvelope + "\x00anything")
	if !ed25519.Verify(key, msg, sig) {
		t.Fatal("premise: ed25519.Verify refuses the forgery; test proves nothing")
	}
	if identity.VerifyDomain(identity.PublicKey(key), identity.DomainEnvelope, sig, b("anything")) {
		t.Fatal("VerifyDomain accepted a forgery under a small-order key")
	}
	nonCanonical := mustHex(t, smallOrderNonCanonical[0])
	if identity.VerifyDomain(identity.PublicKey(nonCanonical), identity.DomainEnvelope, sig, b("anything")) {
		t.Fatal("VerifyDomain accepted a non-canonical small-order key")
	}
}

type badSigner struct {
	pub crypto.PublicKey
	sig []byte
	err error
}

func (s badSigner) Public() crypto.PublicKey { return s.pub }
func (s badSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return s.sig, s.err
}

func TestSignDomainRefusesBadSigner(t *testing.T) {
	id := newID(t)
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub := ed25519.PublicKey(id.Public())
	boom := errors.New("agent unavailable")
	signers := map[string]crypto.Signer{
		"nil":             nil,
		"ecdsa":           ec,
		"short key":       badSigner{pub: pub[:31], sig: make([]byte, 64)},
		"signer error":    badSigner{pub: pub, err: boom},
		"short signature": badSigner{pub: pub, sig: make([]byte, 63)},
		"wrong signature": badSigner{pub: pub, sig: make([]byte, 64)},
	}
	for name, s := range signers {
		if sig, err := identity.SignDomain(s, identity.DomainEnvelope, b("p")); err == nil {
			t.Errorf("%s: signed %x", name, sig)
		}
	}
	if _, err := identity.SignDomain(badSigner{pub: pub, err: boom}, identity.DomainEnvelope, b("p")); !errors.Is(err, boom) {
		t.Errorf("signer error not wrapped: %v", err)
	}
	// A plain ed25519.PrivateKey is a crypto.Signer too.
	_, priv, _ := ed25519.GenerateKey(nil)
	sig, err := identity.SignDomain(priv, identity.DomainEnvelope, b("p"))
	if err != nil || !identity.VerifyDomain(identity.PublicKey(priv.Public().(ed25519.PublicKey)), identity.DomainEnvelope, sig, b("p")) {
		t.Fatalf("ed25519.PrivateKey signer: %v", err)
	}
}
