package daemon

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/promtest"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// observeBlob stores, as the inbox follower does once a blob verified, a message
// from sender to d with body sealed as a blob: the committed blob and its
// observation. It returns the message id and the blob's digest.
func observeBlob(t *testing.T, d *Daemon, sender *identity.Identity, body []byte) (string, string) {
	t.Helper()
	id := uuid.NewString()
	bw, err := d.Store().CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	w, err := envelope.NewBlobMessage(sender, d.DID(), id, now.Add(time.Hour), now, bw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(body); err != nil {
		t.Fatal(err)
	}
	env, _, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	digest, size, err := bw.Commit()
	if err != nil {
		t.Fatal(err)
	}
	fc, _ := json.Marshal(fact{EnvelopeID: env.ID(), ReceivedAt: now.UnixMilli()})
	obs := &record.Observation{MessageID: id, SenderDID: string(sender.DID()), EnvelopeDigest: env.Digest(),
		CreatedAt: env.CreatedAtMillis(), DeliveryDeadline: env.DeliveryDeadlineMillis(),
		Blob:  &record.ObservedBlob{EnvelopeID: env.ID(), Digest: digest, Size: size, BodySize: int64(len(body))},
		Facts: []json.RawMessage{fc}, Published: []string{}, RetainUntil: now.Add(48 * time.Hour).UnixMilli()}
	putObservation(t, d, obs)
	return id, digest
}

// observeInline stores an observation of a message with an inline body.
func observeInline(t *testing.T, d *Daemon, sender *identity.Identity, body []byte) string {
	t.Helper()
	id := uuid.NewString()
	now := time.Now()
	env, _, err := envelope.NewMessage(sender, d.DID(), id, body, now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	fc, _ := json.Marshal(fact{EnvelopeID: env.ID(), ReceivedAt: now.UnixMilli(), Body: base64.StdEncoding.EncodeToString(body)})
	putObservation(t, d, &record.Observation{MessageID: id, SenderDID: string(sender.DID()), EnvelopeDigest: env.Digest(),
		CreatedAt: env.CreatedAtMillis(), DeliveryDeadline: env.DeliveryDeadlineMillis(),
		Facts: []json.RawMessage{fc}, Published: []string{}, RetainUntil: now.Add(48 * time.Hour).UnixMilli()})
	return id
}

func putObservation(t *testing.T, d *Daemon, obs *record.Observation) {
	t.Helper()
	if err := d.Store().PreparedTransaction(context.Background(), func(tx *store.Tx) error { return tx.Put(obs) }); err != nil {
		t.Fatal(err)
	}
}

// clientOf is a pkg/client Client of d's socket.
func clientOf(d *Daemon) *client.Client { return client.New(d.SocketPath()) }

// GET /v1/inbox/{id}/body streams a received body: a blob body opens, every chunk
// verified, to exactly the plaintext sent, with its length announced; an inline body
// comes from its observation; the inbox lists both with bodySize (a blob's body not
// inline, marked blob). A blob with a flipped byte in its third chunk yields the
// first two chunks (64 KiB each, all verified) and then an error BODY_CHUNK_INVALID
// at the client — never io.EOF — and so does a truncated blob; an unknown message
// is 404.
func TestInboxBody(t *testing.T) {
	ctx := context.Background()
	d, _ := streamDaemon(t, nil)
	c := clientOf(d)
	sender, _ := identity.Generate()
	big := randomBody(3, 5*envelope.BlobChunkSize+123)
	blobID, digest := observeBlob(t, d, sender, big)
	small := []byte("a small body")
	smallID := observeInline(t, d, sender, small)

	for id, want := range map[string][]byte{blobID: big, smallID: small} {
		rc, err := c.Body(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("message %s: %d bytes, %v; want the %d bytes sent", id, len(got), err, len(want))
		}
	}
	if v := metricValue(t, d, `sealbridge_api_body_bytes_total{direction="got"}`); v != float64(len(big)) {
		t.Errorf("sealbridge_api_body_bytes_total{direction=\"got\"} is %v, want the %d bytes of the blob body", v, len(big))
	}
	l, err := c.Inbox(ctx, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]client.InboxMessage{}
	for _, m := range l.Messages {
		sizes[m.MessageID] = m
	}
	if m := sizes[blobID]; m.BodySize != int64(len(big)) || !m.Blob || len(m.Body) != 0 {
		t.Fatalf("inbox entry of the blob message: size %d, blob %v, %d body bytes", m.BodySize, m.Blob, len(m.Body))
	}
	if m := sizes[smallID]; m.BodySize != int64(len(small)) || m.Blob || !bytes.Equal(m.Body, small) {
		t.Fatalf("inbox entry of the small message: size %d, blob %v, body %q", m.BodySize, m.Blob, m.Body)
	}

	path := filepath.Join(d.Store().Dir(), store.BlobDir, digest)
	sealed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const sealedChunk = envelope.BlobChunkSize + 16
	payload := len(sealed) - (5*sealedChunk + 123 + 16) // the header's length
	flipped := bytes.Clone(sealed)
	flipped[payload+2*sealedChunk+100] ^= 1
	for name, damaged := range map[string][]byte{"a flipped byte in the third chunk": flipped, "truncated after two chunks": sealed[:payload+2*sealedChunk+10]} {
		if err := os.WriteFile(path, damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		rc, err := c.Body(ctx, blobID)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != errcode.BodyChunkInvalid.String() {
			t.Fatalf("%s: read %d bytes, then %v; want a client error %s", name, len(got), err, errcode.BodyChunkInvalid)
		}
		if len(got) != 2*envelope.BlobChunkSize || !bytes.Equal(got, big[:len(got)]) {
			t.Fatalf("%s: %d bytes before the error; want the two verified chunks", name, len(got))
		}
	}
	if _, err := c.Body(ctx, uuid.NewString()); !isStatus(err, 404) {
		t.Fatalf("an unknown message: %v, want 404", err)
	}
}

func isStatus(err error, status int) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == status
}

// metricValue is the value of sample (name and labels, as /metrics writes them) in
// d's /metrics, or -1 if it has none.
func metricValue(t *testing.T, d *Daemon, sample string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	d.m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	promtest.Check(t, body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", sample, l)
			}
			return f
		}
	}
	return -1
}
