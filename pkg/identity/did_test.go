package identity_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"filippo.io/edwards25519"
	"github.com/mr-tron/base58"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// didVectors are published Ed25519 did:key names with their keys. The first
// three are the examples of the W3C did:key specification; the fourth comes
// with its publicKeyBase58 in the ACA-Py test suite, an independent check of
// the multicodec framing; the last two are the DIDs of RFC 8032 §7.1 test 1
// and of a seed used in the did-key.js fixtures.
var didVectors = []struct {
	did, pubHex string
}{
	{"did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp", "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29"},
	{"did:key:z6MkjchhfUsD6mmvni8mCdXHw216Xrm9bQe2mBH1P5RDjVJG", "4cb5abf6ad79fbf5abbccafcc269d85cd2651ed4b885b5869f241aedf0a5ba29"},
	{"did:key:z6MknGc3ocHs3zdPiJbnaaqDi58NGb4pk1Sp9WxWufuXSdxf", "7422b9887598068e32c4448a949adb290d0f4e35b9e01b0ee5f1a1e600fe2674"},
	{"did:key:z6MkmjY8GnV5i9YTDtPETC2uUAW6ejw3nk5mXF5yci5ab7th", "6c2d48b1605684ef94363dc6158eeb6577466e1a36a740f2fc624617edb7712e"},
	{"did:key:z6MktwupdmLXVVqTzCw4i46r4uGyosGXRnR3XjN4Zq7oMMsw", "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"},
	{"did:key:z6Mkf5rGMoatrSj1f4CyvuHBeXJELe9RPdzo2PKGNCKVtZxP", "095f9a1a595dde755d82786864ad03dfa5a4fbd68832566364e2b65e13cc9e44"},
}

func TestDIDVectors(t *testing.T) {
	for _, v := range didVectors {
		pub, err := identity.ParseDID(v.did)
		if err != nil {
			t.Fatalf("ParseDID(%s): %v", v.did, err)
		}
		if got := hex.EncodeToString(pub); got != v.pubHex {
			t.Errorf("ParseDID(%s) = %s, want %s", v.did, got, v.pubHex)
		}
		if got := identity.FormatDID(ed25519.PublicKey(mustHex(t, v.pubHex))); string(got) != v.did {
			t.Errorf("FormatDID(%s) = %s, want %s", v.pubHex, got, v.did)
		}
		if len(v.did) != 56 {
			t.Errorf("%s: %d bytes, want 56", v.did, len(v.did))
		}
	}
	// ACA-Py lists this key's publicKeyBase58 separately.
	pub, err := identity.DID("did:key:z6MkmjY8GnV5i9YTDtPETC2uUAW6ejw3nk5mXF5yci5ab7th").PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := base58.Decode("8HH5gYEeNc3z7PYXmd54d4x6qAfCNrqQqEB3nS7Zfu7K"); !bytes.Equal(pub, want) {
		t.Errorf("key = %x, want %x", []byte(pub), want)
	}
	// RFC 8032 §7.1 test 1: the DID names the key of that seed.
	id, err := identity.FromSeed(mustHex(t, "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"))
	if err != nil {
		t.Fatal(err)
	}
	if id.DID() != "did:key:z6MktwupdmLXVVqTzCw4i46r4uGyosGXRnR3XjN4Zq7oMMsw" {
		t.Errorf("RFC 8032 test 1 DID = %s", id.DID())
	}
}

func TestDIDRoundTrip(t *testing.T) {
	for range 100 {
		id, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		did := id.DID()
		if !strings.HasPrefix(string(did), "did:key:z6Mk") || len(did) != 56 {
			t.Fatalf("unexpected DID shape %q", did)
		}
		pub, err := identity.ParseDID(string(did))
		if err != nil {
			t.Fatalf("ParseDID(%s): %v", did, err)
		}
		if !pub.Equal(id.Public()) || pub.DID() != did || pub.String() != string(did) {
			t.Fatalf("round trip of %s gave %x", did, []byte(pub))
		}
	}
}

func TestFormatDIDWrongLength(t *testing.T) {
	for _, n := range []int{0, 31, 33, 64} {
		if got := identity.FormatDID(make(ed25519.PublicKey, n)); got != "" {
			t.Errorf("FormatDID(%d bytes) = %q, want empty", n, got)
		}
	}
}

// encodeDID frames raw bytes as a did:key without any check.
func encodeDID(raw ...[]byte) string {
	return "did:key:z" + base58.Encode(bytes.Join(raw, nil))
}

var ed25519Codec = []byte{0xed, 0x01}

// notOnCurve returns a 32-byte string that is no curve point's encoding.
func notOnCurve(t testing.TB) []byte {
	for y := byte(2); y < 255; y++ {
		b := make([]byte, 32)
		b[0] = y
		if _, err := new(edwards25519.Point).SetBytes(b); err != nil {
			return b
		}
	}
	t.Fatal("no off-curve y below 255")
	return nil
}

var allDIDErrors = []error{
	identity.ErrDIDPrefix, identity.ErrDIDBase58, identity.ErrDIDMulticodec, identity.ErrDIDLength,
	identity.ErrKeyLength, identity.ErrKeyNotOnCurve, identity.ErrKeyNonCanonical, identity.ErrKeySmallOrder,
}

func TestParseDIDRefuses(t *testing.T) {
	valid := didVectors[0].did
	validPub := mustHex(t, didVectors[0].pubHex)
	cases := []struct {
		name, did string
		want      error
	}{
		{"empty", "", identity.ErrDIDPrefix},
		{"did:web", "did:web:example.com", identity.ErrDIDPrefix},
		{"upper-case method", strings.ToUpper(valid[:8]) + valid[8:], identity.ErrDIDPrefix},
		{"multibase base16", "did:key:f" + hex.EncodeToString(append(ed25519Codec, validPub...)), identity.ErrDIDPrefix},
		{"multibase Z", "did:key:Z" + valid[9:], identity.ErrDIDPrefix},
		{"no multibase", "did:key:", identity.ErrDIDPrefix},
		{"leading space", " " + valid, identity.ErrDIDPrefix},
		{"empty base58", "did:key:z", identity.ErrDIDBase58},
		{"base58 zero digit", valid[:20] + "0" + valid[21:], identity.ErrDIDBase58},
		{"base58 capital O", valid[:20] + "O" + valid[21:], identity.ErrDIDBase58},
		{"non-ASCII", valid[:20] + "é" + valid[22:], identity.ErrDIDBase58},
		{"DID URL fragment", valid + "#" + valid[8:], identity.ErrDIDBase58},
		{"path", valid + "/x", identity.ErrDIDBase58},
		{"trailing newline", valid + "\n", identity.ErrDIDBase58},
		{"x25519 multicodec", "did:key:z6LSnjagzhe8Df6gZmroW3wjDd7XQLwAuYfwa4ZeTBCGFoYc", identity.ErrDIDMulticodec},
		{"secp256k1 multicodec", encodeDID([]byte{0xe7, 0x01}, bytes.Repeat([]byte{2}, 33)), identity.ErrDIDMulticodec},
		{"non-minimal varint", encodeDID([]byte{0xed, 0x81, 0x00}, validPub), identity.ErrDIDMulticodec},
		{"one byte", encodeDID([]byte{0xed}), identity.ErrDIDMulticodec},
		// A leading '1' decodes to a leading zero byte: the same key with
		// another spelling is refused, never accepted as a second name.
		{"leading zero (base58 '1')", "did:key:z1" + valid[9:], identity.ErrDIDMulticodec},
		{"did-key test suite: too large", "did:key:z6MkA9MEcFWsoUVqj2zX6LACFaikLQ28i9WAsJnURDS3HLGKSkUbwUbiLH22ohgZ2BwgpQ6qC3VBTNV3pLhYDTVgR", identity.ErrDIDMulticodec},
		{"did-key test suite: too small", "did:key:zTjsVPtY", identity.ErrDIDLength},
		{"codec only", encodeDID(ed25519Codec), identity.ErrDIDLength},
		{"31-byte key", encodeDID(ed25519Codec, validPub[:31]), identity.ErrDIDLength},
		{"33-byte key", encodeDID(ed25519Codec, validPub, []byte{0}), identity.ErrDIDLength},
		{"64-byte key", encodeDID(ed25519Codec, validPub, validPub), identity.ErrDIDLength},
		{"over the length bound", valid + strings.Repeat("z", 200), identity.ErrDIDLength},
		{"huge", "did:key:z" + strings.Repeat("2", 1<<20), identity.ErrDIDLength},
		{"not on curve", encodeDID(ed25519Codec, notOnCurve(t)), identity.ErrKeyNotOnCurve},
		{"non-canonical y = p+3", encodeDID(ed25519Codec, mustHex(t, "f0ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")), identity.ErrKeyNonCanonical},
		{"small order: identity", encodeDID(ed25519Codec, mustHex(t, "0100000000000000000000000000000000000000000000000000000000000000")), identity.ErrKeySmallOrder},
		{"small order: order 8", encodeDID(ed25519Codec, mustHex(t, "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05")), identity.ErrKeySmallOrder},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pub, err := identity.ParseDID(c.did)
			if err == nil {
				t.Fatalf("ParseDID(%q) = %x, want %v", c.did, []byte(pub), c.want)
			}
			if pub != nil {
				t.Errorf("ParseDID returned a key with its error")
			}
			for _, e := range allDIDErrors {
				if errors.Is(err, e) != (e == c.want) {
					t.Errorf("ParseDID(%q) = %v: errors.Is(%v) = %v", c.did, err, e, !(e == c.want))
				}
			}
			if len(err.Error()) > 600 {
				t.Errorf("error of %d bytes: input not bounded in the message", len(err.Error()))
			}
		})
	}
}

// TestParseDIDErrorSaysItOnce: the DID error has one "identity:" prefix.
func TestParseDIDErrorSaysItOnce(t *testing.T) {
	for _, s := range []string{"did:key:nope", "did:web:x", "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2do", strings.Repeat("x", 200)} {
		_, err := identity.ParseDID(s)
		if err == nil || strings.Count(err.Error(), "identity:") != 1 {
			t.Errorf("ParseDID(%q): %v, want one \"identity:\" prefix", s, err)
		}
	}
}
