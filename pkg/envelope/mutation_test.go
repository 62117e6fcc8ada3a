package envelope_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
)

// TestBuilderTimeEdges: the builders' range check is exact at both ends. A now at
// the epoch is out of range (ErrMalformed) even when the deadline is not after it,
// and a now of MaxTime is in range, so a deadline equal to it is ErrExpired.
func TestBuilderTimeEdges(t *testing.T) {
	a, b := alice(t), bob(t)
	epoch := time.UnixMilli(0)
	_, _, err := envelope.NewMessage(a, b.DID(), testMessageID, testBody, epoch, epoch)
	if !errors.Is(err, envelope.ErrMalformed) || errors.Is(err, envelope.ErrExpired) {
		t.Errorf("now and deadline at the epoch: %v, want ErrMalformed", err)
	}
	maxT := time.UnixMilli(envelope.MaxTime)
	_, _, err = envelope.NewMessage(a, b.DID(), testMessageID, testBody, maxT, maxT)
	if !errors.Is(err, envelope.ErrExpired) || errors.Is(err, envelope.ErrMalformed) {
		t.Errorf("now and deadline at MaxTime: %v, want ErrExpired", err)
	}
}

// TestMessageOfExactlyMaxSize: NewMessage builds an envelope of exactly MaxSize
// bytes (the limit is inclusive for the builder as for Parse).
func TestMessageOfExactlyMaxSize(t *testing.T) {
	a, b := alice(t), bob(t)
	b64len := func(n int) int { return (4*n + 2) / 3 } // unpadded base64
	const tag = 16
	// The envelope's size is fixed but for the sealed body's ct, whose length is
	// the body's plus the tag; the number of digits of the times moves the rest
	// by one byte, so one of these pairs reaches MaxSize exactly.
	for _, now := range []time.Time{testNow, time.UnixMilli(100_000_000_000), time.UnixMilli(10_000_000_000)} {
		deadline := now.Add(time.Hour)
		env, _, err := envelope.NewMessage(a, b.DID(), testMessageID, nil, deadline, now)
		if err != nil {
			t.Fatal(err)
		}
		fixed := env.Size() - b64len(tag)
		for n := (envelope.MaxSize-fixed)*3/4 - tag - 2; n <= (envelope.MaxSize-fixed)*3/4-tag+2; n++ {
			if fixed+b64len(n+tag) != envelope.MaxSize {
				continue
			}
			env, data, err := envelope.NewMessage(a, b.DID(), testMessageID, make([]byte, n), deadline, now)
			if err != nil {
				t.Fatalf("body of %d bytes, envelope of MaxSize: %v", n, err)
			}
			if env.Size() != envelope.MaxSize || len(data) != envelope.MaxSize {
				t.Fatalf("size %d, want %d", env.Size(), envelope.MaxSize)
			}
			// One more body byte and it no longer fits.
			if _, _, err := envelope.NewMessage(a, b.DID(), testMessageID, make([]byte, n+1), deadline, now); !errors.Is(err, envelope.ErrTooLarge) {
				t.Fatalf("body of %d bytes: %v, want ErrTooLarge", n+1, err)
			}
			return
		}
	}
	t.Fatal("no body length gives an envelope of exactly MaxSize bytes")
}

// TestRefusedByteIsNamed: a space or a control byte is refused by the first,
// byte-wise check, whose error names its offset; '~' is printable and passes it,
// so what is wrong with the field that holds it is reported instead.
func TestRefusedByteIsNamed(t *testing.T) {
	a := alice(t)
	msg, data := newMessage(t)
	spaced := append([]byte("{ "), data[1:]...)
	if _, err := envelope.Parse(spaced); !errors.Is(err, envelope.ErrMalformed) || !strings.Contains(err.Error(), "byte 1 ") {
		t.Errorf("space at byte 1: %v, want ErrMalformed naming byte 1", err)
	}
	tilde := forge(t, a, replaceOnce(t, msg.Payload(), `"envelopeId":"`+msg.ID()+`"`, `"envelopeId":"~`+msg.ID()[1:]+`"`))
	_, err := envelope.Parse(tilde)
	if !errors.Is(err, envelope.ErrMalformed) || !strings.Contains(err.Error(), "envelopeId") {
		t.Errorf("'~' in envelopeId: %v, want ErrMalformed naming envelopeId", err)
	}

	_, receipt := testReceipt(t)
	spaced = append([]byte("{ "), receipt[1:]...)
	if _, err := envelope.ParseRelayReceipt(spaced); !errors.Is(err, envelope.ErrMalformed) || !strings.Contains(err.Error(), "byte 1 ") {
		t.Errorf("receipt, space at byte 1: %v, want ErrMalformed naming byte 1", err)
	}
	// A receipt with '~' in its envelopeId, validly signed by its relay: refused
	// for the envelopeId.
	tilde = bytes.Replace(receipt, []byte(`"envelopeId":"`), []byte(`"envelopeId":"~`), 1)
	if _, err := envelope.ParseRelayReceipt(tilde); !errors.Is(err, envelope.ErrMalformed) || !strings.Contains(err.Error(), "envelopeId") {
		t.Errorf("receipt, '~' in envelopeId: %v, want ErrMalformed naming envelopeId", err)
	}
}

// TestReceiptSizeLimitInclusive: MaxReceiptSize bytes are looked at (garbage of
// that size is ErrMalformed), one more is ErrTooLarge.
func TestReceiptSizeLimitInclusive(t *testing.T) {
	at := bytes.Repeat([]byte("{"), envelope.MaxReceiptSize)
	if _, err := envelope.ParseRelayReceipt(at); !errors.Is(err, envelope.ErrMalformed) || errors.Is(err, envelope.ErrTooLarge) {
		t.Errorf("MaxReceiptSize bytes: %v, want ErrMalformed", err)
	}
	if _, err := envelope.ParseRelayReceipt(append(at, '{')); !errors.Is(err, envelope.ErrTooLarge) {
		t.Errorf("MaxReceiptSize+1 bytes: %v, want ErrTooLarge", err)
	}
}

// TestSignRelayReceiptDefaults: an empty State means persisted and an empty
// RelayDID means the signer's.
func TestSignRelayReceiptDefaults(t *testing.T) {
	env, _ := newMessage(t)
	relay := carol(t)
	data, err := envelope.SignRelayReceipt(relay, envelope.RelayReceipt{EnvelopeID: env.ID(),
		EnvelopeDigest: env.Digest(), ReceivedAt: testNow})
	if err != nil {
		t.Fatal(err)
	}
	r, err := envelope.ParseRelayReceipt(data)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != envelope.ReceiptStatePersisted || r.RelayDID != relay.DID() {
		t.Errorf("defaults: state %q relay %s, want %q %s", r.State, r.RelayDID, envelope.ReceiptStatePersisted, relay.DID())
	}
	if !r.Matches(env.ID(), env.Digest()) {
		t.Errorf("receipt %+v does not match its envelope", r)
	}
}

// TestDecodeStrictKeyAfterArray: the key walk goes on past a nested array, so a
// duplicate key after one is still refused. (It comes before the depth test: a
// walk that ignored an error inside an array would loop there.)
func TestDecodeStrictKeyAfterArray(t *testing.T) {
	type withList struct {
		IDs []string `json:"ids"`
		To  string   `json:"to"`
	}
	var w withList
	err := envelope.DecodeStrict([]byte(`{"ids":["x","y"],"to":"a","to":"b"}`), &w)
	if err == nil || !strings.Contains(err.Error(), "duplicate key") {
		t.Errorf("duplicate key after an array: %v", err)
	}
}

// TestDecodeStrictDepth: a value nested as deep as the bound is accepted, one
// level more is refused, counting objects and arrays alike.
func TestDecodeStrictDepth(t *testing.T) {
	type anyField struct {
		X any `json:"x"`
	}
	// The top-level object is depth 0 and its value depth 1, so x holding k
	// nested containers puts the innermost value at depth k+1; the bound is 8.
	nest := func(open, close string, k int) string {
		return `{"x":` + strings.Repeat(open, k) + `1` + strings.Repeat(close, k) + `}`
	}
	for _, c := range []struct{ open, close string }{{`{"a":`, `}`}, {`[`, `]`}} {
		var v anyField
		if err := envelope.DecodeStrict([]byte(nest(c.open, c.close, 7)), &v); err != nil {
			t.Errorf("%s nested 7 deep: %v, want accepted", c.open, err)
		}
		err := envelope.DecodeStrict([]byte(nest(c.open, c.close, 8)), &v)
		if err == nil || !strings.Contains(err.Error(), "nested too deeply") {
			t.Errorf("%s nested 8 deep: %v, want nested too deeply", c.open, err)
		}
	}
}
