package envelope

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// White-box tests: the HPKE layer under the recipient check, and the
// canonical-form check under Parse's character filter.

var (
	iNow      = time.UnixMilli(1_767_225_600_000)
	iDeadline = iNow.Add(time.Hour)
)

const iMessageID = "0b7e9f3c-4a1d-4c2e-9f00-5d6a7b8c9d0e"

func iIdent(tb testing.TB, n byte) *identity.Identity {
	tb.Helper()
	id, err := identity.FromSeed(bytes.Repeat([]byte{n}, 32))
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

func iMessage(tb testing.TB, body []byte) (*Envelope, []byte) {
	tb.Helper()
	env, data, err := NewMessage(iIdent(tb, 1), iIdent(tb, 2).DID(), iMessageID, body, iDeadline, iNow)
	if err != nil {
		tb.Fatal(err)
	}
	return env, data
}

// iForge signs payload as given and assembles the wire bytes by hand.
func iForge(tb testing.TB, signer *identity.Identity, payload string) []byte {
	tb.Helper()
	sig, err := identity.SignDomain(signer.Signer(), identity.DomainEnvelope, []byte(payload))
	if err != nil {
		tb.Fatal(err)
	}
	return []byte(`{"v":1,"payload":` + payload + `,"sig":"` + base64.RawURLEncoding.EncodeToString(sig) + `"}`)
}

// TestThirdPartyKeyDoesNotOpen goes beneath Open's recipient check: with the
// right info, only the recipient's X25519 key opens the body.
func TestThirdPartyKeyDoesNotOpen(t *testing.T) {
	body := []byte("for bob only")
	env, _ := iMessage(t, body)
	if got, err := openBody(iIdent(t, 2).X25519PrivateKey(), env); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("recipient's key: %q, %v", got, err)
	}
	for n := byte(1); n <= 4; n++ {
		if n == 2 {
			continue
		}
		if got, err := openBody(iIdent(t, n).X25519PrivateKey(), env); !errors.Is(err, ErrOpen) || got != nil {
			t.Errorf("key of identity %d: %q, %v; want ErrOpen", n, got, err)
		}
	}
	// The X25519 scalar is cleared after use.
	x := iIdent(t, 2).X25519PrivateKey()
	if _, err := openBody(x, env); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, make([]byte, len(x))) {
		t.Error("openBody did not clear the private scalar")
	}
	// A flipped bit anywhere in enc or ct does not open (the sender's
	// signature would refuse it first; this checks the AEAD on its own).
	for _, part := range []*[]byte{&env.enc, &env.ct} {
		for i := range *part {
			(*part)[i] ^= 0x01
			if _, err := openBody(iIdent(t, 2).X25519PrivateKey(), env); !errors.Is(err, ErrOpen) {
				t.Fatalf("flipped byte %d opened: %v", i, err)
			}
			(*part)[i] ^= 0x01
		}
	}
}

func TestBodyInfo(t *testing.T) {
	env, _ := iMessage(t, nil)
	want := "sealbridge/envelope-body/v1\x00" + env.ID() + "\x00" + iMessageID + "\x00" +
		string(iIdent(t, 1).DID()) + "\x00" + string(iIdent(t, 2).DID())
	if got := string(bodyInfo(&env.p)); got != want {
		t.Fatalf("bodyInfo = %q, want %q", got, want)
	}
}

// TestCanonicalCheckAlone: whitespace and escapes, which Parse's character
// filter refuses first, are refused by the canonical-form check on its own
// too, also inside a validly signed payload.
func TestCanonicalCheckAlone(t *testing.T) {
	env, data := iMessage(t, []byte("x"))
	a := iIdent(t, 1)
	s, p := string(data), string(env.payload)
	if _, err := parse([]byte(s)); err != nil {
		t.Fatalf("control: %v", err)
	}
	if _, err := parse(iForge(t, a, p)); err != nil {
		t.Fatalf("control: %v", err)
	}
	variants := map[string][]byte{
		"outer space":             []byte(strings.Replace(s, `"v":1`, `"v": 1`, 1)),
		"outer newline":           []byte(s + "\n"),
		"outer escaped key":       []byte(strings.Replace(s, `"v":1`, `"\u0076":1`, 1)),
		"payload space":           iForge(t, a, strings.Replace(p, `"kind":"message"`, `"kind": "message"`, 1)),
		"payload tab":             iForge(t, a, strings.Replace(p, `,"kind"`, ",\t\"kind\"", 1)),
		"payload escaped kind":    iForge(t, a, strings.Replace(p, `"kind":"message"`, `"kind":"m\u0065ssage"`, 1)),
		"payload escaped slash":   iForge(t, a, strings.Replace(p, `"senderDid":"did:key:`, `"senderDid":"did:key\/`, 1)),
		"payload escaped key":     iForge(t, a, strings.Replace(p, `"createdAt"`, `"created\u0041t"`, 1)),
		"ct with escaped newline": iForge(t, a, strings.Replace(p, `"ct":"`, `"ct":"\n`, 1)),
		"enc with escaped CR":     iForge(t, a, strings.Replace(p, `"enc":"`, `"enc":"\r`, 1)),
		"non-ASCII in a string":   iForge(t, a, strings.Replace(p, `"kind":"message"`, `"kind":"messagé"`, 1)),
		"invalid UTF-8":           iForge(t, a, strings.Replace(p, `"kind":"message"`, "\"kind\":\"message\xff\"", 1)),
	}
	// An escape of a sig character: decode it to the same sig.
	sigStart := strings.LastIndex(s, `"sig":"`) + len(`"sig":"`)
	variants["outer escaped sig char"] = []byte(s[:sigStart] + `\u00` + hexByte(s[sigStart]) + s[sigStart+1:])
	for name, v := range variants {
		if _, err := parse(v); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
		if _, err := Parse(v); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse %s: %v, want ErrMalformed", name, err)
		}
	}
}

func hexByte(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&15]})
}
