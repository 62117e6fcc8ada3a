package identity_test

import (
	"bytes"
	"crypto/ecdh"
	"encoding/hex"
	"errors"
	"slices"
	"testing"

	"filippo.io/edwards25519"
	"github.com/mr-tron/base58"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// smallOrder are the canonical encodings of the eight points of small order
// (the torsion subgroup of edwards25519).
var smallOrder = []string{
	"0100000000000000000000000000000000000000000000000000000000000000", // identity, order 1
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // (0, -1), order 2
	"0000000000000000000000000000000000000000000000000000000000000000", // order 4
	"0000000000000000000000000000000000000000000000000000000000000080", // order 4
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05", // order 8
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85", // order 8
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a", // order 8
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa", // order 8
}

// smallOrderNonCanonical are other encodings the decoder accepts for
// small-order points: y ≥ p, and x = 0 with the sign bit set.
var smallOrderNonCanonical = []string{
	"0100000000000000000000000000000000000000000000000000000000000080", // identity, -0
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", // (0, -1), -0
	"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // y = p ≡ 0
	"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", // y = p ≡ 0, sign set
	"eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // y = p+1 ≡ 1
	"eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", // y = p+1 ≡ 1, sign set
}

// TestSmallOrderList checks the list above against the group itself: the
// multiples of an order-8 point are exactly those eight encodings.
func TestSmallOrderList(t *testing.T) {
	p8, err := new(edwards25519.Point).SetBytes(mustHex(t, smallOrder[4]))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	q := edwards25519.NewIdentityPoint()
	for range 8 {
		got = append(got, hex.EncodeToString(q.Bytes()))
		q.Add(q, p8)
	}
	if q.Equal(edwards25519.NewIdentityPoint()) != 1 {
		t.Fatal("point does not have order 8")
	}
	want := slices.Clone(smallOrder)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("torsion points %v, list %v", got, want)
	}
}

func TestValidatePublicKeySmallOrder(t *testing.T) {
	for _, h := range smallOrder {
		if err := identity.ValidatePublicKey(mustHex(t, h)); !errors.Is(err, identity.ErrKeySmallOrder) {
			t.Errorf("ValidatePublicKey(%s) = %v, want ErrKeySmallOrder", h, err)
		}
		did := encodeDID(ed25519Codec, mustHex(t, h))
		if _, err := identity.ParseDID(did); !errors.Is(err, identity.ErrKeySmallOrder) {
			t.Errorf("ParseDID(%s) = %v, want ErrKeySmallOrder", did, err)
		}
	}
	for _, h := range smallOrderNonCanonical {
		b := mustHex(t, h)
		if _, err := new(edwards25519.Point).SetBytes(b); err != nil {
			t.Fatalf("%s: decoder refuses it, so the test proves nothing: %v", h, err)
		}
		if err := identity.ValidatePublicKey(b); !errors.Is(err, identity.ErrKeyNonCanonical) {
			t.Errorf("ValidatePublicKey(%s) = %v, want ErrKeyNonCanonical", h, err)
		}
	}
}

func TestValidatePublicKeyNonCanonical(t *testing.T) {
	// y = p+3 names the same point as y = 3, which is a valid key.
	nonCanonical := mustHex(t, "f0ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")
	canonical := mustHex(t, "0300000000000000000000000000000000000000000000000000000000000000")
	p, err := new(edwards25519.Point).SetBytes(nonCanonical)
	if err != nil {
		t.Fatalf("decoder refuses y = p+3: %v", err)
	}
	if !bytes.Equal(p.Bytes(), canonical) {
		t.Fatalf("y = p+3 decodes to %x", p.Bytes())
	}
	if err := identity.ValidatePublicKey(canonical); err != nil {
		t.Fatalf("canonical form refused: %v", err)
	}
	if err := identity.ValidatePublicKey(nonCanonical); !errors.Is(err, identity.ErrKeyNonCanonical) {
		t.Fatalf("ValidatePublicKey(y = p+3) = %v, want ErrKeyNonCanonical", err)
	}

	// Every encoding with y ≥ p that the decoder accepts is refused.
	accepted := 0
	for k := range 19 {
		for _, sign := range []byte{0, 0x80} {
			b := bytes.Repeat([]byte{0xff}, 32)
			b[0] = byte(0xed + k)
			b[31] = 0x7f | sign
			if _, err := new(edwards25519.Point).SetBytes(b); err != nil {
				continue
			}
			accepted++
			if err := identity.ValidatePublicKey(b); !errors.Is(err, identity.ErrKeyNonCanonical) {
				t.Errorf("ValidatePublicKey(%x) = %v, want ErrKeyNonCanonical", b, err)
			}
		}
	}
	if accepted == 0 {
		t.Fatal("the decoder accepted no y ≥ p encoding; the test proves nothing")
	}
}

func TestValidatePublicKeyOther(t *testing.T) {
	for _, n := range []int{0, 1, 31, 33, 64} {
		if err := identity.ValidatePublicKey(make([]byte, n)); !errors.Is(err, identity.ErrKeyLength) {
			t.Errorf("%d bytes: %v, want ErrKeyLength", n, err)
		}
	}
	if err := identity.ValidatePublicKey(notOnCurve(t)); !errors.Is(err, identity.ErrKeyNotOnCurve) {
		t.Errorf("off-curve: %v, want ErrKeyNotOnCurve", err)
	}
	for _, v := range didVectors {
		if err := identity.ValidatePublicKey(mustHex(t, v.pubHex)); err != nil {
			t.Errorf("%s: %v", v.did, err)
		}
	}
}

func TestX25519Vectors(t *testing.T) {
	// ACA-Py lists the X25519 key agreement key of this DID.
	pub, err := identity.ParseDID("did:key:z6MkmjY8GnV5i9YTDtPETC2uUAW6ejw3nk5mXF5yci5ab7th")
	if err != nil {
		t.Fatal(err)
	}
	x, err := pub.X25519()
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := base58.Decode("79CXkde3j8TNuMXxPdV7nLUrT2g7JAEjH5TreyVY7GEZ"); !bytes.Equal(x, want) {
		t.Errorf("X25519 = %x, want %x", x, want)
	}

	// did-key.js fixtures: an Ed25519 seed and its converted X25519 pair.
	id, err := identity.FromSeed(mustHex(t, "9b937b81322d816cfab9d5a3baacc9b2a5febe4b149f126b3630f93a29527017"))
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(id.Public()); got != "095f9a1a595dde755d82786864ad03dfa5a4fbd68832566364e2b65e13cc9e44" {
		t.Errorf("public key %s", got)
	}
	x, err = id.Public().X25519()
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(x); got != "1150c79f402e26a82afee189c4648778ff91605aee8a96d4ca922c30e6482b09" {
		t.Errorf("X25519 public %s", got)
	}
	if got := hex.EncodeToString(id.X25519PrivateKey()); got != "784f007ed065f6f0ceae66a19e9cb6590ea0c97ecec758d858e3f75d9f336f62" {
		t.Errorf("X25519 private %s", got)
	}
}

func TestX25519MatchesECDH(t *testing.T) {
	a, _ := identity.Generate()
	b, _ := identity.Generate()
	for _, id := range []*identity.Identity{a, b} {
		priv, err := ecdh.X25519().NewPrivateKey(id.X25519PrivateKey())
		if err != nil {
			t.Fatal(err)
		}
		x, err := id.Public().X25519()
		if err != nil {
			t.Fatal(err)
		}
		// X25519(priv, basepoint) is the Montgomery form of the Ed25519 key.
		if !bytes.Equal(priv.PublicKey().Bytes(), x) {
			t.Fatalf("X25519(priv, 9) = %x, Montgomery form %x", priv.PublicKey().Bytes(), x)
		}
		if s := id.X25519PrivateKey(); s[0]&7 != 0 || s[31]&0xc0 != 0x40 {
			t.Fatalf("scalar not clamped: %x", s)
		}
	}
	// And the two sides of a Diffie-Hellman agree.
	aPriv, _ := ecdh.X25519().NewPrivateKey(a.X25519PrivateKey())
	bPriv, _ := ecdh.X25519().NewPrivateKey(b.X25519PrivateKey())
	bX, _ := b.Public().X25519()
	aX, _ := a.Public().X25519()
	bPub, _ := ecdh.X25519().NewPublicKey(bX)
	aPub, _ := ecdh.X25519().NewPublicKey(aX)
	s1, err1 := aPriv.ECDH(bPub)
	s2, err2 := bPriv.ECDH(aPub)
	if err1 != nil || err2 != nil || !bytes.Equal(s1, s2) {
		t.Fatalf("shared secrets differ: %x %v / %x %v", s1, err1, s2, err2)
	}
}

func TestX25519RefusesInvalidKey(t *testing.T) {
	for _, h := range append(slices.Clone(smallOrder), smallOrderNonCanonical...) {
		if x, err := identity.PublicKey(mustHex(t, h)).X25519(); err == nil {
			t.Errorf("X25519 of %s = %x", h, x)
		}
	}
	if _, err := identity.PublicKey(nil).X25519(); !errors.Is(err, identity.ErrKeyLength) {
		t.Errorf("X25519(nil) = %v", err)
	}
}
