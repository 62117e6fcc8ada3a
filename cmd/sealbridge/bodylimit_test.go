package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	return b
}

func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// blobOfMessage is the blob reference of sent message id's one pending envelope
// (ok false: its body is inline).
func blobOfMessage(t *testing.T, d *daemon.Daemon, id string) (envelope.BlobRef, bool) {
	t.Helper()
	envs, err := d.Store().Pending(context.Background(), id)
	if err != nil || len(envs) != 1 {
		t.Fatalf("message %s: %d pending envelopes, %v", id, len(envs), err)
	}
	env, err := envelope.Parse(envs[0].Envelope)
	if err != nil {
		t.Fatal(err)
	}
	return env.Blob()
}

// send streams a body over envelope.MaxBodySize — from a file and from a pipe — to
// the daemon, which seals it as a blob (the envelope names it); a body of exactly
// the limit keeps the inline path. With no daemon, a large body is "no daemon" (exit
// 3); over the daemon's --max-body it is the daemon's 413 BODY_TOO_LARGE with the
// hint naming --max-body (exit 1), and nothing is stored; to several recipients it is
// a usage error (exit 2). send --help states the inline limit.
func TestSendLargeBody(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	as := []string{"--home", home, "--identity", "alice", "--to", bob, "--relay", "http://127.0.0.1:9"}
	t.Cleanup(func() { stdin = os.Stdin })

	big := writeTemp(t, "big", randomBytes(1, 300<<10))
	if code, _, errs := sb(t, append([]string{"send", "--file", big}, as...)...); code != exitNoDaemon {
		t.Fatalf("a large body, no daemon: exit %d\n%s", code, errs)
	}

	d := runDaemon(t, daemon.Options{Home: home, Identity: "alice", MaxBody: 1 << 20})
	for name, extra := range map[string][]string{"file": {"--file", big}, "pipe": nil} {
		stdin = bytes.NewReader(randomBytes(2, 200<<10))
		code, out, errs := sb(t, append([]string{"send"}, append(as, extra...)...)...)
		id := strings.TrimSpace(out)
		if code != exitOK || !uuid.Valid(id) {
			t.Fatalf("%s: a large body: exit %d %q\n%s", name, code, out, errs)
		}
		if ref, ok := blobOfMessage(t, d, id); !ok || ref.Recipient != identity.DID(bob) {
			t.Fatalf("%s: the message's envelope names no blob to bob: %+v", name, ref)
		}
	}
	exact := writeTemp(t, "exact", bytes.Repeat([]byte("x"), envelope.MaxBodySize))
	code, out, errs := sb(t, append([]string{"send", "--file", exact}, as...)...)
	if code != exitOK {
		t.Fatalf("a body of exactly the inline limit: exit %d\n%s", code, errs)
	}
	if _, ok := blobOfMessage(t, d, strings.TrimSpace(out)); ok {
		t.Fatal("a body of exactly the inline limit was sealed as a blob")
	}

	before := len(storedMessages(t, d))
	over := writeTemp(t, "over", randomBytes(3, 2<<20))
	for name, extra := range map[string][]string{"file": {"--file", over}, "pipe": nil} {
		stdin = bytes.NewReader(randomBytes(3, 2<<20))
		code, _, errs := sb(t, append([]string{"send"}, append(as, extra...)...)...)
		if code != exitFailure || !strings.Contains(errs, "BODY_TOO_LARGE") || !strings.Contains(errs, "sealbridge: hint:") ||
			!strings.Contains(errs, "--max-body") {
			t.Fatalf("%s: a body over the daemon's --max-body: exit %d\n%s", name, code, errs)
		}
	}
	if n := len(storedMessages(t, d)); n != before {
		t.Fatalf("%d messages stored by refused sends", n-before)
	}
	carol, _ := identity.Generate()
	code, _, errs = sb(t, append([]string{"send", "--file", big, "--to", string(carol.DID())}, as...)...)
	if code != exitUsage || !strings.Contains(errs, "one recipient") {
		t.Fatalf("a large body to two recipients: exit %d\n%s", code, errs)
	}
	if _, out, _ := sb(t, "send", "--help"); !strings.Contains(strings.Join(strings.Fields(out), " "), "at most "+fmt.Sprint(envelope.MaxBodySize)+" bytes") {
		t.Fatalf("send --help does not state the inline limit:\n%s", out)
	}
}

// observeBlob stores in d's store, as the inbox follower does once a blob verified,
// a message from sender with body sealed as a blob, and returns its id and the
// blob's path.
func observeBlob(t *testing.T, d *daemon.Daemon, sender *identity.Identity, body []byte) (string, string) {
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
	fc, _ := json.Marshal(map[string]any{"envelopeId": env.ID(), "receivedAt": now.UnixMilli(), "body": ""})
	obs := &record.Observation{MessageID: id, SenderDID: string(sender.DID()), EnvelopeDigest: env.Digest(),
		CreatedAt: env.CreatedAtMillis(), DeliveryDeadline: env.DeliveryDeadlineMillis(),
		Blob:  &record.ObservedBlob{EnvelopeID: env.ID(), Digest: digest, Size: size, BodySize: int64(len(body))},
		Facts: []json.RawMessage{fc}, Published: []string{}, RetainUntil: now.Add(48 * time.Hour).UnixMilli()}
	if err := d.Store().PreparedTransaction(context.Background(), func(tx *store.Tx) error { return tx.Put(obs) }); err != nil {
		t.Fatal(err)
	}
	return id, filepath.Join(d.Store().Dir(), store.BlobDir, digest)
}

// get writes a received large body to standard output and, with --out, to a file
// (0600, no temp left beside it), each equal to the body; inbox shows its size. A
// blob with a damaged chunk makes get exit 1 with BODY_CHUNK_INVALID and a hint: on
// standard output only the verified chunks before it were written, and --out leaves
// the file as it was (absent, or its old contents) and no temp. An unknown message
// is exit 1 with the hint to list the inbox.
func TestGetBody(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "bob")
	d := startDaemon(t, home, "bob")
	sender, _ := identity.Generate()
	body := randomBytes(4, 4*envelope.BlobChunkSize+5)
	id, blob := observeBlob(t, d, sender, body)
	who := []string{"--home", home, "--identity", "bob"}

	code, out, errs := sb(t, append([]string{"get", id}, who...)...)
	if code != exitOK || out != string(body) {
		t.Fatalf("get to stdout: exit %d, %d bytes\n%s", code, len(out), errs)
	}
	dir := t.TempDir()
	dst := filepath.Join(dir, "body.bin")
	if code, _, errs := sb(t, append([]string{"get", id, "--out", dst}, who...)...); code != exitOK {
		t.Fatalf("get --out: exit %d\n%s", code, errs)
	}
	got, err := os.ReadFile(dst)
	fi, _ := os.Stat(dst)
	if err != nil || !bytes.Equal(got, body) || fi.Mode().Perm() != 0o600 {
		t.Fatalf("get --out wrote %d bytes (mode %v, %v), want the %d of the body, 0600", len(got), fi.Mode(), err, len(body))
	}
	code, out, errs = sb(t, append([]string{"inbox"}, who...)...)
	if code != exitOK || !strings.Contains(out, "SIZE") || !strings.Contains(out, "256.0 KiB") || !strings.Contains(out, "sealbridge get "+id) {
		t.Fatalf("inbox: exit %d\n%s%s", code, out, errs)
	}

	sealed, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	const sealedChunk = envelope.BlobChunkSize + 16
	chunks := len(sealed) - (4*sealedChunk + 5 + 16)
	sealed[chunks+sealedChunk+7] ^= 0x80 // the second chunk
	if err := os.WriteFile(blob, sealed, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = sb(t, append([]string{"get", id}, who...)...)
	if code != exitFailure || !strings.Contains(errs, "BODY_CHUNK_INVALID") || !strings.Contains(errs, "sealbridge: hint:") ||
		out != string(body[:envelope.BlobChunkSize]) {
		t.Fatalf("get of a damaged blob to stdout: exit %d, %d bytes written\n%s", code, len(out), errs)
	}
	fresh := filepath.Join(dir, "fresh.bin")
	for _, path := range []string{dst, fresh} {
		code, _, errs = sb(t, append([]string{"get", id, "--out", path}, who...)...)
		if code != exitFailure || !strings.Contains(errs, "BODY_CHUNK_INVALID") {
			t.Fatalf("get --out %s of a damaged blob: exit %d\n%s", path, code, errs)
		}
	}
	if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("a failed get --out changed the existing file: %d bytes, %v", len(got), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("a failed get --out left files beside its target: %v", ents)
	}
	code, _, errs = sb(t, append([]string{"get", uuid.NewString()}, who...)...)
	if code != exitFailure || !strings.Contains(errs, "sealbridge inbox") {
		t.Fatalf("get of an unknown message: exit %d\n%s", code, errs)
	}
}
