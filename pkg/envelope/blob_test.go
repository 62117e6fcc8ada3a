package envelope_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// sealedChunk is the size of a full sealed chunk: BlobChunkSize plus its tag.
const sealedChunk = envelope.BlobChunkSize + 16

// sealBlob seals plain from alice to bob and returns the envelope and the
// sealed bytes.
func sealBlob(tb testing.TB, plain []byte) (*envelope.Envelope, []byte) {
	tb.Helper()
	var sealed bytes.Buffer
	w, err := envelope.NewBlobMessage(alice(tb), bob(tb).DID(), testMessageID, testDeadline, testNow, &sealed)
	if err != nil {
		tb.Fatal(err)
	}
	// Uneven writes, so chunk boundaries never line up with them.
	for rest := plain; len(rest) > 0; {
		n := min(len(rest), 1+rand.IntN(3*envelope.BlobChunkSize))
		if _, err := w.Write(rest[:n]); err != nil {
			tb.Fatal(err)
		}
		rest = rest[n:]
	}
	if w.PlainSize() != int64(len(plain)) {
		tb.Fatalf("PlainSize = %d, wrote %d", w.PlainSize(), len(plain))
	}
	env, _, err := w.Finish()
	if err != nil {
		tb.Fatal(err)
	}
	if env.ID() != w.EnvelopeID() {
		tb.Fatalf("envelope id %s, writer said %s", env.ID(), w.EnvelopeID())
	}
	return env, sealed.Bytes()
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// payloadStart is where the STREAM payload begins: after the header's
// "--- MAC\n" line and the 16-byte nonce.
func payloadStart(tb testing.TB, sealed []byte) int {
	tb.Helper()
	i := bytes.Index(sealed, []byte("\n--- "))
	if i < 0 {
		tb.Fatal("no header end")
	}
	j := bytes.IndexByte(sealed[i+1:], '\n')
	return i + 1 + j + 1 + 16
}

func TestBlobRoundTrip(t *testing.T) {
	for _, n := range []int{1, envelope.BlobChunkSize - 1, envelope.BlobChunkSize, envelope.BlobChunkSize + 1, 3*envelope.BlobChunkSize + 17, 1 << 20} {
		plain := randomBytes(n)
		env, sealed := sealBlob(t, plain)
		ref, ok := env.Blob()
		if !ok {
			t.Fatalf("%d: Blob() not ok", n)
		}
		sum := sha256.Sum256(sealed)
		if ref.Digest != hex.EncodeToString(sum[:]) || ref.Size != int64(len(sealed)) {
			t.Fatalf("%d: ref %+v does not name the sealed bytes (%d)", n, ref, len(sealed))
		}
		if ref.EnvelopeID != env.ID() || ref.MessageID != testMessageID || ref.Sender != alice(t).DID() || ref.Recipient != bob(t).DID() {
			t.Fatalf("%d: ref %+v", n, ref)
		}
		// The wire form parses back to the same reference, and is canonical.
		again, err := envelope.Parse(env.Bytes())
		if err != nil {
			t.Fatalf("%d: parse: %v", n, err)
		}
		if r2, _ := again.Blob(); r2 != ref {
			t.Fatalf("%d: parsed ref %+v, want %+v", n, r2, ref)
		}
		if !strings.Contains(string(env.Payload()), `"body":{"blob":"`+ref.Digest+`","size":`) {
			t.Fatalf("%d: payload %s", n, env.Payload())
		}
		r, err := envelope.OpenBlob(bob(t), ref, bytes.NewReader(sealed))
		if err != nil {
			t.Fatalf("%d: open: %v", n, err)
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("%d: read %d bytes, err %v; want the %d plaintext bytes", n, len(got), err, len(plain))
		}
		if l, err := envelope.VerifyBlob(bob(t), ref, bytes.NewReader(sealed)); err != nil || l != int64(n) {
			t.Fatalf("%d: VerifyBlob = %d, %v", n, l, err)
		}
	}
}

// TestBlobDamageRefused: every way of damaging the sealed stream is ErrBlob,
// and never a clean io.EOF.
func TestBlobDamageRefused(t *testing.T) {
	plain := randomBytes(4*envelope.BlobChunkSize + 100)
	env, sealed := sealBlob(t, plain)
	ref, _ := env.Blob()
	start := payloadStart(t, sealed)
	chunk := func(i int) []byte { return sealed[start+i*sealedChunk : min(len(sealed), start+(i+1)*sealedChunk)] }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	head := sealed[:start]
	damaged := map[string][]byte{
		"bit flipped in a chunk":        flip(sealed, start+sealedChunk+5),
		"bit flipped in a tag":          flip(sealed, start+sealedChunk-1),
		"bit flipped in the nonce":      flip(sealed, start-3),
		"bit flipped in the header":     flip(sealed, 30),
		"truncated at a chunk boundary": sealed[:start+2*sealedChunk],
		"truncated mid chunk":           sealed[:len(sealed)-7],
		"last chunk dropped":            cat(head, chunk(0), chunk(1), chunk(2), chunk(3)),
		"chunks reordered":              cat(head, chunk(1), chunk(0), chunk(2), chunk(3), chunk(4)),
		"chunk duplicated":              cat(head, chunk(0), chunk(0), chunk(1), chunk(2), chunk(3), chunk(4)),
		"trailing byte":                 cat(sealed, []byte{0}),
		"empty":                         {},
	}
	for name, bad := range damaged {
		r, err := envelope.OpenBlob(bob(t), ref, bytes.NewReader(bad))
		if err == nil {
			_, err = io.Copy(io.Discard, r)
		}
		if !errors.Is(err, envelope.ErrBlob) && !errors.Is(err, envelope.ErrOpen) {
			t.Errorf("%s: err %v, want ErrBlob or ErrOpen", name, err)
		}
		// Even a reference made to fit the damaged bytes is refused: the
		// chunks themselves do not verify.
		sum := sha256.Sum256(bad)
		fitted := ref
		fitted.Digest, fitted.Size = hex.EncodeToString(sum[:]), int64(len(bad))
		if len(bad) == 0 {
			continue
		}
		r, err = envelope.OpenBlob(bob(t), fitted, bytes.NewReader(bad))
		if err == nil {
			_, err = io.Copy(io.Discard, r)
		}
		if !errors.Is(err, envelope.ErrBlob) && !errors.Is(err, envelope.ErrOpen) {
			t.Errorf("%s, fitted reference: err %v, want ErrBlob or ErrOpen", name, err)
		}
	}
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0x10
	return c
}

// TestBlobReferenceMismatchRefused: intact bytes under another reference.
func TestBlobReferenceMismatchRefused(t *testing.T) {
	env, sealed := sealBlob(t, randomBytes(200_000))
	ref, _ := env.Blob()
	_, other := sealBlob(t, randomBytes(200_000))
	cases := map[string]struct {
		ref    envelope.BlobRef
		sealed []byte
		want   error
	}{
		"another blob's bytes": {ref, other, envelope.ErrOpen},
		"size one more":        {withSize(ref, ref.Size+1), sealed, envelope.ErrBlob},
		"size one less":        {withSize(ref, ref.Size-1), sealed, envelope.ErrBlob},
		"another digest":       {withDigest(ref, strings.Repeat("0", 64)), sealed, envelope.ErrBlob},
		"another envelope id":  {withEnvelope(ref, otherUUID), sealed, envelope.ErrOpen},
		"another message id":   {withMessage(ref, otherUUID), sealed, envelope.ErrOpen},
		"another sender":       {withSender(ref, carol(t)), sealed, envelope.ErrOpen},
	}
	for name, c := range cases {
		r, err := envelope.OpenBlob(bob(t), c.ref, bytes.NewReader(c.sealed))
		if err == nil {
			_, err = io.Copy(io.Discard, r)
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
	if _, err := envelope.OpenBlob(carol(t), ref, bytes.NewReader(sealed)); !errors.Is(err, envelope.ErrRecipient) {
		t.Errorf("carol opens bob's blob: %v", err)
	}
	// carol, claiming to be the recipient, still cannot open bob's key.
	forged := ref
	forged.Recipient = carol(t).DID()
	r, err := envelope.OpenBlob(carol(t), forged, bytes.NewReader(sealed))
	if err == nil {
		_, err = io.Copy(io.Discard, r)
	}
	if !errors.Is(err, envelope.ErrOpen) {
		t.Errorf("carol with a forged reference: %v", err)
	}
	if _, err := envelope.Open(bob(t), env); !errors.Is(err, envelope.ErrKind) {
		t.Errorf("Open of a blob envelope: %v, want ErrKind", err)
	}
	if _, ok := mustMessage(t).Blob(); ok {
		t.Error("an inline message reports a blob")
	}
}

func mustMessage(t *testing.T) *envelope.Envelope { env, _ := newMessage(t); return env }

func withSize(r envelope.BlobRef, n int64) envelope.BlobRef       { r.Size = n; return r }
func withDigest(r envelope.BlobRef, d string) envelope.BlobRef    { r.Digest = d; return r }
func withEnvelope(r envelope.BlobRef, id string) envelope.BlobRef { r.EnvelopeID = id; return r }
func withMessage(r envelope.BlobRef, id string) envelope.BlobRef  { r.MessageID = id; return r }
func withSender(r envelope.BlobRef, s *identity.Identity) envelope.BlobRef {
	r.Sender = s.DID()
	return r
}

// TestBlobBodyFormRules: the blob form's fields are checked as strictly as
// the inline form's, and the two never mix.
func TestBlobBodyFormRules(t *testing.T) {
	env, _ := sealBlob(t, randomBytes(1000))
	ref, _ := env.Blob()
	good := `"body":{"blob":"` + ref.Digest + `","size":` + fmt.Sprint(ref.Size) + `}`
	for name, body := range map[string]string{
		"upper-case digest":   `"body":{"blob":"` + strings.ToUpper(ref.Digest) + `","size":` + fmt.Sprint(ref.Size) + `}`,
		"short digest":        `"body":{"blob":"` + ref.Digest[:62] + `","size":` + fmt.Sprint(ref.Size) + `}`,
		"size zero":           `"body":{"blob":"` + ref.Digest + `","size":0}`,
		"size negative":       `"body":{"blob":"` + ref.Digest + `","size":-1}`,
		"size over the bound": `"body":{"blob":"` + ref.Digest + `","size":1099511627777}`,
		"size only":           `"body":{"size":` + fmt.Sprint(ref.Size) + `}`,
		"keys reordered":      `"body":{"size":` + fmt.Sprint(ref.Size) + `,"blob":"` + ref.Digest + `"}`,
		"mixed with enc":      `"body":{"enc":"` + strings.Repeat("A", 43) + `","blob":"` + ref.Digest + `","size":` + fmt.Sprint(ref.Size) + `}`,
	} {
		payload := strings.Replace(string(env.Payload()), good, body, 1)
		if payload == string(env.Payload()) {
			t.Fatalf("%s: the payload has no %s", name, good)
		}
		wire := forge(t, alice(t), []byte(payload))
		if _, err := envelope.Parse(wire); !errors.Is(err, envelope.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}
