package envelope

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// FuzzParseEnvelope: Parse never panics; it refuses with one of its
// sentinels, or it accepts an envelope that re-parses to the same envelope,
// whose decoded fields re-encode to exactly the input bytes, whose signature
// verifies over the exact payload bytes under the sender's strictly valid
// key, and whose body (for a message) Open handles without panicking.
func FuzzParseEnvelope(f *testing.F) {
	a, b := iIdent(f, 1), iIdent(f, 2)
	msg, msgData := iMessage(f, []byte("fuzz seed body"))
	_, statusData, err := NewDeliveryStatus(b, a.DID(), ConfirmationOf(msg), iDeadline, iNow)
	if err != nil {
		f.Fatal(err)
	}
	_, empty, err := NewMessage(a, b.DID(), iMessageID, nil, iDeadline, iNow)
	if err != nil {
		f.Fatal(err)
	}
	p := string(msg.payload)
	for _, seed := range [][]byte{
		msgData, statusData, empty,
		msgData[:len(msgData)-1], append(bytes.Clone(msgData), ' '),
		bytes.Replace(msgData, []byte(`"v":1`), []byte(`"v":2`), 1),
		bytes.Replace(msgData, []byte(`"kind":"message"`), []byte(`"kind":"delivery-status"`), 1),
		iForge(f, a, p), // valid: re-signed canonical payload
		iForge(f, a, strings.Replace(p, `"kind":"message"`, `"kind":"message","kind":"message"`, 1)),
		iForge(f, a, strings.Replace(p, `"envelopeId":"`, `"envelopeId":"0`, 1)),
		iForge(f, b, p),
		[]byte(`{}`), []byte(`{"v":1,"payload":{},"sig":""}`), []byte(`null`), []byte(``), []byte(`[[[[[[[[[[]]]]]]]]]]`),
		[]byte(`{"v":1,"payload":{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{"i":{}}}}}}}}}},"sig":""}`),
	} {
		f.Add(seed)
	}
	sentinels := []error{ErrTooLarge, ErrMalformed, ErrVersion, ErrSignature}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Parse(data)
		if err != nil {
			if env != nil {
				t.Fatal("Parse returned an envelope and an error")
			}
			n := 0
			for _, s := range sentinels {
				if errors.Is(err, s) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("error wraps %d of the sentinels: %v", n, err)
			}
			return
		}
		if !bytes.Equal(env.Bytes(), data) || env.Digest() != Digest(data) {
			t.Fatal("accepted envelope's bytes or digest differ from the input")
		}
		// Re-encode from the decoded fields.
		payload, err := marshalCompact(&env.p)
		if err != nil || !bytes.Equal(payload, env.payload) {
			t.Fatalf("payload re-encodes differently: %v", err)
		}
		sigStart := bytes.LastIndex(data, []byte(`"sig":"`)) + len(`"sig":"`)
		sig, err := b64.DecodeString(string(data[sigStart : len(data)-2]))
		if err != nil {
			t.Fatal(err)
		}
		wire, err := marshalCompact(&wireJSON{V: version, Payload: payload, Sig: b64.EncodeToString(sig)})
		if err != nil || !bytes.Equal(wire, data) {
			t.Fatalf("envelope re-encodes differently: %v", err)
		}
		// The signature verifies, under the key the sender DID names.
		key, err := identity.ParseDID(string(env.Sender()))
		if err != nil || !key.Equal(env.sender) {
			t.Fatalf("sender key: %v", err)
		}
		if !identity.VerifyDomain(key, identity.DomainEnvelope, sig, payload) {
			t.Fatal("accepted envelope's signature does not verify")
		}
		again, err := Parse(env.Bytes())
		if err != nil || again.ID() != env.ID() || again.Digest() != env.Digest() || !payloadEqual(again, env) {
			t.Fatalf("re-parse differs: %v", err)
		}
		if env.Kind() == KindMessage {
			if _, err := Open(b, env); err != nil && !errors.Is(err, ErrOpen) && !errors.Is(err, ErrRecipient) {
				t.Fatalf("Open: %v", err)
			}
		} else if _, ok := env.Confirmation(); !ok {
			t.Fatal("a delivery-status without a Confirmation")
		}
	})
}

func payloadEqual(x, y *Envelope) bool {
	px, _ := marshalCompact(&x.p)
	py, _ := marshalCompact(&y.p)
	return bytes.Equal(px, py)
}
