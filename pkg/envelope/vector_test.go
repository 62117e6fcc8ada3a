package envelope_test

import (
	"bytes"
	"crypto/fips140"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"testing/cryptotest"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
)

var update = flag.Bool("update", false, "rewrite testdata/vector-*.json from the current code")

// The vectors: alice (seed 32×0x01) sends bob (seed 32×0x02) vectorBody as
// message vectorMessageID, and bob confirms it. The envelopes' random parts
// (envelope ids, the HPKE ephemeral key) come from crypto/rand, made
// deterministic by testing/cryptotest.SetGlobalRandom(t, vectorSeed).
const (
	vectorSeed      = 20260101
	vectorMessageID = "8f0c1a2b-3c4d-4e5f-8a6b-7c8d9e0f1a2b"
	vectorMessage   = "testdata/vector-message.json"
	vectorStatus    = "testdata/vector-delivery-status.json"

	// The pinned digests of the two files. A change here is a change of the
	// wire format.
	vectorMessageDigest = "df4ebe1896033a32e96efa35196c8102b174a241a3213e4354ef6f39313e0e25"
	vectorStatusDigest  = "716e858639cf2558f68e00bbc19b6bcc87cab30b88a9969274e35251c253885d"
)

var (
	vectorBody     = []byte("Hello Bob! A sealed test vector body.")
	vectorNow      = time.UnixMilli(1_767_225_600_000) // 2026-01-01T00:00:00Z
	vectorDeadline = time.UnixMilli(1_767_484_800_000) // + 72 h
)

// buildVectors builds the two vector envelopes under the deterministic
// random source.
func buildVectors(t *testing.T) (msg, status []byte) {
	t.Helper()
	cryptotest.SetGlobalRandom(t, vectorSeed)
	m, msg, err := envelope.NewMessage(alice(t), bob(t).DID(), vectorMessageID, vectorBody, vectorDeadline, vectorNow)
	if err != nil {
		t.Fatal(err)
	}
	_, status, err = envelope.NewDeliveryStatus(bob(t), alice(t).DID(), envelope.ConfirmationOf(m), vectorDeadline, vectorNow)
	if err != nil {
		t.Fatal(err)
	}
	return msg, status
}

// TestVectorsParseAndOpen: the stored vectors parse, have the pinned digests
// and fields, and the message opens for bob. This holds whatever Go version
// built them: it is the compatibility promise of the wire format.
func TestVectorsParseAndOpen(t *testing.T) {
	if *update {
		t.Skip("-update: TestVectorsReproducible rewrites the files")
	}
	msgData, err := os.ReadFile(vectorMessage)
	if err != nil {
		t.Fatal(err)
	}
	statusData, err := os.ReadFile(vectorStatus)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := envelope.Parse(msgData)
	if err != nil {
		t.Fatal(err)
	}
	status, err := envelope.Parse(statusData)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Digest() != vectorMessageDigest || status.Digest() != vectorStatusDigest {
		t.Fatalf("digests %s, %s; want %s, %s", msg.Digest(), status.Digest(), vectorMessageDigest, vectorStatusDigest)
	}
	if msg.Sender() != alice(t).DID() || msg.Recipient() != bob(t).DID() || msg.MessageID() != vectorMessageID ||
		!msg.CreatedAt().Equal(vectorNow) || !msg.DeliveryDeadline().Equal(vectorDeadline) {
		t.Errorf("message fields: %v", msg)
	}
	body, err := envelope.Open(bob(t), msg)
	if err != nil || !bytes.Equal(body, vectorBody) {
		t.Fatalf("Open = %q, %v", body, err)
	}
	if err := status.ConfirmsDelivery(alice(t).DID(), bob(t).DID(), vectorMessageID, vectorMessageDigest); err != nil {
		t.Fatal(err)
	}
}

// TestVectorsReproducible: with the same seeds, times and random source the
// builders produce exactly the stored bytes, twice in a row. crypto/rand's
// use by Go's crypto packages is not a stable API: if a Go upgrade changes
// it, this test fails while TestVectorsParseAndOpen passes; then (and only
// then) regenerate with -update and re-pin the digests.
func TestVectorsReproducible(t *testing.T) {
	if fips140.Version() == "v1.0.0" {
		t.Skip("SetGlobalRandom is not supported with the Go Cryptographic Module v1.0.0")
	}
	msg, status := buildVectors(t)
	msg2, status2 := buildVectors(t)
	if !bytes.Equal(msg, msg2) || !bytes.Equal(status, status2) {
		t.Fatal("the builders are not deterministic under SetGlobalRandom")
	}
	if *update {
		for path, data := range map[string][]byte{vectorMessage: msg, vectorStatus: status} {
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s: digest %s", filepath.Base(path), envelope.Digest(data))
		}
		return
	}
	for path, data := range map[string][]byte{vectorMessage: msg, vectorStatus: status} {
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, want) {
			t.Errorf("%s differs:\n got %s\nwant %s", path, data, want)
		}
	}
}
