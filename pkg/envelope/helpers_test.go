package envelope_test

import (
	"bytes"
	"crypto"
	"encoding/base64"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Fixed test values: identities from fixed seeds, fixed times and ids.
var (
	testNow      = time.UnixMilli(1_767_225_600_000) // 2026-01-01T00:00:00Z
	testDeadline = testNow.Add(72 * time.Hour)
	testBody     = []byte("hello, bob: the plaintext body of a test message")
)

const (
	testMessageID = "0b7e9f3c-4a1d-4c2e-9f00-5d6a7b8c9d0e"
	otherUUID     = "11111111-2222-4333-8444-555555555555"
)

// ident returns the identity whose seed is 32 bytes of n.
func ident(tb testing.TB, n byte) *identity.Identity {
	tb.Helper()
	id, err := identity.FromSeed(bytes.Repeat([]byte{n}, 32))
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// alice sends, bob receives, carol is a third party.
func alice(tb testing.TB) *identity.Identity { return ident(tb, 1) }
func bob(tb testing.TB) *identity.Identity   { return ident(tb, 2) }
func carol(tb testing.TB) *identity.Identity { return ident(tb, 3) }

// newMessage builds alice's message to bob.
func newMessage(tb testing.TB) (*envelope.Envelope, []byte) {
	tb.Helper()
	env, data, err := envelope.NewMessage(alice(tb), bob(tb).DID(), testMessageID, testBody, testDeadline, testNow)
	if err != nil {
		tb.Fatal(err)
	}
	return env, data
}

// newStatus builds bob's delivery-status to alice for msg.
func newStatus(tb testing.TB, msg *envelope.Envelope) (*envelope.Envelope, []byte) {
	tb.Helper()
	env, data, err := envelope.NewDeliveryStatus(bob(tb), alice(tb).DID(), envelope.ConfirmationOf(msg),
		testDeadline, testNow)
	if err != nil {
		tb.Fatal(err)
	}
	return env, data
}

// forge signs payload, exactly as given, with signer's key under the envelope
// domain and assembles the wire bytes around it by hand (no re-encoding), so a
// test can make validly signed envelopes whose payload breaks a rule.
func forge(tb testing.TB, signer *identity.Identity, payload []byte) []byte {
	tb.Helper()
	sig, err := identity.SignDomain(signer.Signer(), identity.DomainEnvelope, payload)
	if err != nil {
		tb.Fatal(err)
	}
	return wire(payload, base64.RawURLEncoding.EncodeToString(sig))
}

func wire(payload []byte, sig string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"v":1,"payload":`)
	b.Write(payload)
	b.WriteString(`,"sig":"`)
	b.WriteString(sig)
	b.WriteString(`"}`)
	return b.Bytes()
}

// replaceOnce replaces the single occurrence of old in b, failing if there is
// not exactly one.
func replaceOnce(tb testing.TB, b []byte, old, new string) []byte {
	tb.Helper()
	if n := bytes.Count(b, []byte(old)); n != 1 {
		tb.Fatalf("%q occurs %d times, want 1", old, n)
	}
	return bytes.Replace(b, []byte(old), []byte(new), 1)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func b64strict(s string) ([]byte, error) { return base64.RawURLEncoding.Strict().DecodeString(s) }

// ed25519Sign signs msg with id's key as plain Ed25519, without any domain.
func ed25519Sign(tb testing.TB, id *identity.Identity, msg []byte) []byte {
	tb.Helper()
	sig, err := id.Signer().Sign(nil, msg, crypto.Hash(0))
	if err != nil {
		tb.Fatal(err)
	}
	return sig
}
