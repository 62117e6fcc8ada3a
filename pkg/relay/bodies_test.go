package relay_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// blobMessage seals plain bytes of random plaintext from sender seed 1 to
// recipient: the envelope, its wire bytes and the sealed body.
func (e *env) blobMessage(recipient identity.DID, plain int, deadline time.Duration) (*envelope.Envelope, []byte, []byte) {
	e.t.Helper()
	var sealed bytes.Buffer
	w, err := envelope.NewBlobMessage(ident(e.t, 1), recipient, uuid.NewString(), e.clock.Now().Add(deadline), e.clock.Now(), &sealed)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := io.CopyN(w, rand.Reader, int64(plain)); err != nil {
		e.t.Fatal(err)
	}
	en, wire, err := w.Finish()
	if err != nil {
		e.t.Fatal(err)
	}
	return en, wire, sealed.Bytes()
}

// postIncomplete posts wire and wants the 202 with offset and size.
func (e *env) postIncomplete(wire []byte, offset, size int64) {
	e.t.Helper()
	_, _, err := e.client.Post(context.Background(), wire)
	var bi *relayproto.BodyIncompleteError
	if !errors.As(err, &bi) || bi.Offset != offset || bi.Size != size {
		e.t.Fatalf("post: %v, want a 202 at %d of %d", err, offset, size)
	}
}

func (e *env) upload(id string, off int64, data []byte) (int64, error) {
	return e.client.UploadBody(context.Background(), id, off, bytes.NewReader(data), int64(len(data)))
}

func (e *env) bodiesDir() string {
	return filepath.Join(e.home, "relay", hexDID(e.relID.DID()), "bodies")
}

// fetchBody downloads id's body as bob from off.
func (e *env) fetchBody(id *identity.Identity, envID string, off int64) ([]byte, error) {
	rc, err := e.client.FetchBody(context.Background(), id, envID, off)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func wantRelayCode(t *testing.T, err error, status int, code string) {
	t.Helper()
	var e *relayproto.Error
	if !errors.As(err, &e) || e.Status != status || e.Code != code {
		t.Fatalf("got %v, want %d %s", err, status, code)
	}
}

// A blob envelope is pending — not in the inbox, its body not downloadable —
// until all of its body is durable; a relay restarted mid-upload (a new Relay
// on the same directory) answers the durable offset, not 0, and the body
// continued from there verifies (the relay re-hashes what it held). Then the
// envelope is fetchable with its body, and a repeated POST answers the same
// receipt.
func TestBlobUploadResumesAfterRestart(t *testing.T) {
	eachBackend(t, testBlobUploadResumesAfterRestart)
}

func testBlobUploadResumesAfterRestart(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := e.blobMessage(bob.DID(), 9<<20, 72*time.Hour)
	size := int64(len(sealed))
	e.postIncomplete(wire, 0, size)
	e.postIncomplete(wire, 0, size) // again: the same pending upload
	half := int64(5 << 20)
	if off, err := e.upload(en.ID(), 0, sealed[:half]); err != nil || off != half {
		t.Fatalf("first half: %d, %v", off, err)
	}
	if page, err := e.client.Fetch(ctx, bob, "", 0); err != nil || len(page.Envelopes) != 0 {
		t.Fatalf("a pending envelope is in the inbox: %+v, %v", page, err)
	}
	if st, err := e.client.Status(ctx, bob); err != nil || st.Count != 0 {
		t.Fatalf("a pending envelope is counted in the inbox: %+v, %v", st, err)
	}
	_, err := e.fetchBody(bob, en.ID(), 0)
	wantRelayCode(t, err, 404, relayproto.CodeBodyMissing)

	e.restart()
	if backend == fileBackend {
		// The file relay keeps its pending envelopes; a JetStream relay
		// learns of one again from its sender's POST.
		if off, sz, err := e.client.BodyOffset(ctx, en.ID()); err != nil || off != half || sz != size {
			t.Fatalf("after the restart: offset %d of %d, %v; want %d", off, sz, err, half)
		}
	}
	e.postIncomplete(wire, half, size)
	if off, sz, err := e.client.BodyOffset(ctx, en.ID()); err != nil || off != half || sz != size {
		t.Fatalf("after the restart: offset %d of %d, %v; want %d", off, sz, err, half)
	}
	if off, err := e.upload(en.ID(), half, sealed[half:]); err != nil || off != size {
		t.Fatalf("second half: %d, %v", off, err)
	}
	receipt, rc, err := e.client.Post(ctx, wire)
	if err != nil || !rc.Matches(en.ID(), en.Digest()) {
		t.Fatalf("post after the body: %v", err)
	}
	e.restart()
	again, _, err := e.client.Post(ctx, wire)
	if err != nil || !bytes.Equal(again, receipt) {
		t.Fatalf("repeated post: %v, same receipt %v", err, bytes.Equal(again, receipt))
	}
	page, err := e.client.Fetch(ctx, bob, "", 0)
	if err != nil || len(page.Envelopes) != 1 || page.Envelopes[0].EnvelopeID != en.ID() {
		t.Fatalf("inbox: %+v, %v", page, err)
	}
	if st, _ := e.client.Status(ctx, bob); st.Count != 1 || st.Bytes != int64(len(wire))+size {
		t.Fatalf("status %+v: want the envelope's and the body's bytes", st)
	}
	got, err := e.fetchBody(bob, en.ID(), 0)
	if err != nil || !bytes.Equal(got, sealed) {
		t.Fatalf("body: %d bytes, %v", len(got), err)
	}
	ref, _ := en.Blob()
	if _, err := envelope.VerifyBlob(bob, ref, bytes.NewReader(got)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.client.BodyOffset(ctx, en.ID()); err == nil {
		t.Fatal("a complete upload is still pending")
	}
	// Acknowledging removes the body.
	if n, err := e.client.Ack(ctx, bob, []string{en.ID()}); n != 1 || err != nil {
		t.Fatalf("ack %d %v", n, err)
	}
	_, err = e.fetchBody(bob, en.ID(), 0)
	wantRelayCode(t, err, 404, relayproto.CodeBodyMissing)
	e.wantNoBody(backend, en.ID())
}

// wantNoBody checks that the relay's storage holds nothing of id's body.
func (e *env) wantNoBody(backend, id string) {
	e.t.Helper()
	if backend == fileBackend {
		if left, _ := filepath.Glob(filepath.Join(e.bodiesDir(), id+"*")); len(left) != 0 {
			e.t.Fatalf("left of the body: %v", left)
		}
		return
	}
	b, err := jsstore.OpenBodies(context.Background(), jetstreamOf(e.t, e.nats), jsstore.BodiesOptions{Replicas: 1, SyncAlways: true})
	if err != nil {
		e.t.Fatal(err)
	}
	if off, err := b.Offset(context.Background(), id); err != nil || off != 0 {
		e.t.Fatalf("the Object Store holds %d bytes of the body (%v)", off, err)
	}
}

// A PATCH whose connection ends early keeps what arrived: the upload resumes
// from the relay's offset (above 0), and a PATCH at another offset is 409
// with the relay's.
func TestBlobUploadCutResumes(t *testing.T) { eachBackend(t, testBlobUploadCutResumes) }

func testBlobUploadCutResumes(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob := ident(t, 2)
	en, wire, sealed := e.blobMessage(bob.DID(), 3<<20, time.Hour)
	size := int64(len(sealed))
	e.postIncomplete(wire, 0, size)
	cut := &failingReader{r: bytes.NewReader(sealed), left: 2 << 20}
	if _, err := e.client.UploadBody(context.Background(), en.ID(), 0, cut, size); err == nil {
		t.Fatal("a cut upload succeeded")
	}
	var off int64
	until(t, "the relay has the cut upload's bytes", func() bool {
		o, _, err := e.client.BodyOffset(context.Background(), en.ID())
		off = o
		return err == nil && o > 0
	})
	if off > 2<<20 {
		t.Fatalf("offset %d past the bytes sent", off)
	}
	got, err := e.upload(en.ID(), 0, sealed)
	wantRelayCode(t, err, 409, relayproto.CodeUploadOffsetMismatch)
	if got != off {
		t.Fatalf("409 says %d, the relay holds %d", got, off)
	}
	if got, err := e.upload(en.ID(), off, sealed[off:]); err != nil || got != size {
		t.Fatalf("resume: %d %v", got, err)
	}
	if _, _, err := e.client.Post(context.Background(), wire); err != nil {
		t.Fatal(err)
	}
}

// failingReader fails after left bytes.
type failingReader struct {
	r    io.Reader
	left int
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.left == 0 {
		return 0, errors.New("cut")
	}
	p = p[:min(len(p), f.left)]
	n, err := f.r.Read(p)
	f.left -= n
	return n, err
}

// A body whose SHA-256 is not the envelope's digest is refused at its last
// byte with 422, discarded (the upload starts again at 0), and nothing of it
// is fetchable; the right body then completes.
func TestBlobDigestMismatch(t *testing.T) { eachBackend(t, testBlobDigestMismatch) }

func testBlobDigestMismatch(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := e.blobMessage(bob.DID(), 1<<20, time.Hour)
	size := int64(len(sealed))
	e.postIncomplete(wire, 0, size)
	bad := bytes.Clone(sealed)
	bad[len(bad)/2] ^= 1
	if _, err := e.upload(en.ID(), 0, bad[:4096]); err != nil {
		t.Fatal(err)
	}
	off, err := e.upload(en.ID(), 4096, bad[4096:])
	wantRelayCode(t, err, 422, relayproto.CodeBodyDigestMismatch)
	if off != 0 {
		t.Fatalf("after the mismatch the offset is %d", off)
	}
	if o, _, err := e.client.BodyOffset(ctx, en.ID()); err != nil || o != 0 {
		t.Fatalf("HEAD: %d %v", o, err)
	}
	if page, _ := e.client.Fetch(ctx, bob, "", 0); len(page.Envelopes) != 0 {
		t.Fatal("a mismatched body's envelope is fetchable")
	}
	_, err = e.fetchBody(bob, en.ID(), 0)
	wantRelayCode(t, err, 404, relayproto.CodeBodyMissing)
	e.postIncomplete(wire, 0, size)
	if st := e.relay.Stats(); st.BodyDigestMismatches != 1 || st.Accepted != 0 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := e.upload(en.ID(), 0, sealed); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.client.Post(ctx, wire); err != nil {
		t.Fatal(err)
	}
	wantMetrics(t, e.scrape(), `sealbridge_relay_bodies_total{outcome="completed"} 1`,
		`sealbridge_relay_bodies_total{outcome="digest_mismatch"} 1`, `sealbridge_relay_bodies_pending 0`,
		`sealbridge_relay_body_bytes_total{direction="in"} `+strconv.FormatFloat(float64(2*size), 'g', -1, 64),
		`sealbridge_relay_envelopes_total{outcome="accepted"} 1`)
}

// A body larger than --max-body is refused when its envelope is posted (413,
// nothing pending); bytes past the body's size are refused (413, nothing
// appended); a blob envelope in a batch is refused with BODY_INCOMPLETE.
func TestBlobTooLarge(t *testing.T) { eachBackend(t, testBlobTooLarge) }

func testBlobTooLarge(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{MaxBody: 1 << 20})
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, _ := e.blobMessage(bob.DID(), 1<<20+1, time.Hour)
	_, _, err := e.client.Post(ctx, wire)
	wantRelayCode(t, err, 413, relayproto.CodeBodyTooLarge)
	_, _, err = e.client.BodyOffset(ctx, en.ID())
	wantRelayCode(t, err, 404, relayproto.CodeUploadUnknown)

	en, wire, sealed := e.blobMessage(bob.DID(), 1000, time.Hour)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	_, err = e.upload(en.ID(), 0, append(bytes.Clone(sealed), 0))
	wantRelayCode(t, err, 413, relayproto.CodeBodyTooLarge)
	if o, _, _ := e.client.BodyOffset(ctx, en.ID()); o != 0 {
		t.Fatalf("an oversized PATCH appended %d bytes", o)
	}
	ans, err := e.client.PostBatch(ctx, [][]byte{wire})
	if err != nil || ans[0].Refusal == nil || ans[0].Refusal.Code != relayproto.CodeBodyIncomplete {
		t.Fatalf("batch: %+v %v", ans, err)
	}
}

// A download resumes from any offset with a Range: a download cut short and
// continued from the bytes it got yields the body.
func TestBlobRangeDownloadResumes(t *testing.T) { eachBackend(t, testBlobRangeDownloadResumes) }

func testBlobRangeDownloadResumes(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := e.blobMessage(bob.DID(), 2<<20, time.Hour)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	if _, err := e.upload(en.ID(), 0, sealed); err != nil {
		t.Fatal(err)
	}
	rc, err := e.client.FetchBody(ctx, bob, en.ID(), 0)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 777_777)
	if _, err := io.ReadFull(rc, first); err != nil {
		t.Fatal(err)
	}
	rc.Close() // cut
	rest, err := e.fetchBody(bob, en.ID(), int64(len(first)))
	if err != nil {
		t.Fatal(err)
	}
	if got := append(first, rest...); !bytes.Equal(got, sealed) {
		t.Fatalf("resumed download differs (%d bytes, want %d)", len(got), len(sealed))
	}
	if tail, err := e.fetchBody(bob, en.ID(), int64(len(sealed))); err != nil || len(tail) != 0 {
		t.Fatalf("from the end: %d %v", len(tail), err)
	}
	// A raw Range other than bytes=O- is refused.
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+relayproto.PathInboxBodies+en.ID(), nil)
	req.Header.Set("Range", "bytes=0-10")
	if err := relayproto.SignInboxRequest(req, bob, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantCode(t, resp.StatusCode, body, 400, relayproto.CodeBadRequest)
}

// Only the recipient gets a body: an unsigned request is 401, another
// identity's signed one is 404 (nothing says the envelope exists).
func TestBlobDownloadOnlyForTheRecipient(t *testing.T) {
	eachBackend(t, testBlobDownloadOnlyForTheRecipient)
}

func testBlobDownloadOnlyForTheRecipient(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob, eve := ident(t, 2), ident(t, 5)
	en, wire, sealed := e.blobMessage(bob.DID(), 100_000, time.Hour)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	if _, err := e.upload(en.ID(), 0, sealed); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(e.srv.URL + relayproto.PathInboxBodies + en.ID())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantCode(t, resp.StatusCode, body, 401, relayproto.CodeAuthMissing)
	_, err = e.fetchBody(eve, en.ID(), 0)
	wantRelayCode(t, err, 404, relayproto.CodeBodyMissing)
	if got, err := e.fetchBody(bob, en.ID(), 0); err != nil || !bytes.Equal(got, sealed) {
		t.Fatalf("bob: %d %v", len(got), err)
	}
}

// A pending upload its sender abandons is removed at its envelope's deadline:
// the upload is unknown, its files are gone, and its quota is free again.
func TestBlobPendingExpires(t *testing.T) { eachBackend(t, testBlobPendingExpires) }

func testBlobPendingExpires(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{QuotaBytes: 3 << 20})
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := e.blobMessage(bob.DID(), 2<<20, time.Minute)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	if _, err := e.upload(en.ID(), 0, sealed[:1<<20]); err != nil {
		t.Fatal(err)
	}
	// The pending envelope holds its place in the quota.
	_, wire2, sealed2 := e.blobMessage(bob.DID(), 2<<20, time.Hour)
	_, _, err := e.client.Post(ctx, wire2)
	wantRelayCode(t, err, 429, relayproto.CodeRelayQuota)
	e.clock.Add(2 * time.Minute)
	if _, err := e.relay.Expire(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, err = e.client.BodyOffset(ctx, en.ID())
	wantRelayCode(t, err, 404, relayproto.CodeUploadUnknown)
	e.wantNoBody(backend, en.ID())
	if st := e.relay.Stats(); st.BodiesExpired != 1 || st.BodiesPending != 0 {
		t.Fatalf("stats %+v", st)
	}
	_, wire2, sealed2 = e.blobMessage(bob.DID(), 2<<20, time.Hour)
	e.postIncomplete(wire2, 0, int64(len(sealed2)))
	// A body larger than the quota itself can never fit: 413, not 429.
	_, wire3, _ := e.blobMessage(bob.DID(), 3<<20, time.Hour)
	_, _, err = e.client.Post(ctx, wire3)
	wantRelayCode(t, err, 413, relayproto.CodeBodyTooLarge)
}

// The sender byte rate counts bodies: a body larger than the burst is
// admitted on a full bucket, and the sender's next envelope waits for the
// bytes to refill.
func TestBlobSenderByteRate(t *testing.T) {
	e := newLimitedEnv(t, relay.Limits{SenderByteRate: 1 << 20})
	bob := ident(t, 2)
	ctx := context.Background()
	_, wire, _ := e.blobMessage(bob.DID(), 2<<20, time.Hour)
	if _, _, err := e.client.Post(ctx, wire); !errors.As(err, new(*relayproto.BodyIncompleteError)) {
		t.Fatalf("first: %v", err)
	}
	_, small := e.message(bob.DID())
	_, _, err := e.client.Post(ctx, small)
	wantRelayCode(t, err, 429, relayproto.CodeRelayRateLimited)
	var re *relayproto.Error
	errors.As(err, &re)
	if re.RetryAfter < 2 || re.RetryAfter > 4 {
		t.Fatalf("Retry-After %d, want about the 2 s the body's bytes take", re.RetryAfter)
	}
	e.clock.Add(time.Duration(re.RetryAfter) * time.Second)
	if _, _, err := e.client.Post(ctx, small); err != nil {
		t.Fatalf("after Retry-After: %v", err)
	}
}

// Many PATCHes at the same offset at once, each with different bytes:
// exactly one is appended (204), every other is 409, and the part holds
// exactly the winner's bytes — never a mix.
func TestBlobConcurrentPatches(t *testing.T) {
	e := newEnv(t)
	bob := ident(t, 2)
	en, wire, sealed := e.blobMessage(bob.DID(), 8<<20, time.Hour)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	const workers = 12
	const n = 2 << 20
	fills := make([][]byte, workers)
	for i := range fills {
		fills[i] = bytes.Repeat([]byte{byte('a' + i)}, n)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]error, workers)
	for i := range workers {
		wg.Go(func() {
			<-start
			_, results[i] = e.upload(en.ID(), 0, fills[i])
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range results {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("two appends at offset 0 won: %d and %d", winner, i)
		case err == nil:
			winner = i
		default:
			wantRelayCode(t, err, 409, relayproto.CodeUploadOffsetMismatch)
		}
	}
	if winner < 0 {
		t.Fatal("no append won")
	}
	part, err := os.ReadFile(filepath.Join(e.bodiesDir(), en.ID()+".part"))
	if err != nil || !bytes.Equal(part, fills[winner]) {
		t.Fatalf("the part is not the winner's bytes (%d bytes, %v)", len(part), err)
	}
	if o, _, _ := e.client.BodyOffset(context.Background(), en.ID()); o != n {
		t.Fatalf("offset %d", o)
	}
}

// Many POSTs of one blob envelope at once make one pending upload; the body's
// concurrent final PATCH races and a POST make one inbox entry.
func TestBlobConcurrentPosts(t *testing.T) { eachBackend(t, testBlobConcurrentPosts) }

func testBlobConcurrentPosts(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := e.blobMessage(bob.DID(), 1<<20, time.Hour)
	const workers = 16
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for i := range workers {
		wg.Go(func() {
			<-start
			_, _, errs[i] = e.client.Post(ctx, wire)
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		var bi *relayproto.BodyIncompleteError
		if !errors.As(err, &bi) || bi.Offset != 0 {
			t.Fatalf("post: %v", err)
		}
	}
	if st := e.relay.Stats(); st.BodiesPending != 1 {
		t.Fatalf("pending uploads: %d", st.BodiesPending)
	}
	if pend, _ := filepath.Glob(filepath.Join(e.bodiesDir(), "*.pending")); backend == fileBackend && len(pend) != 1 {
		t.Fatalf("pending files: %v", pend)
	}
	// The last PATCH and POSTs race: one inbox entry, one receipt.
	half := int64(len(sealed) / 2)
	if _, err := e.upload(en.ID(), 0, sealed[:half]); err != nil {
		t.Fatal(err)
	}
	start = make(chan struct{})
	receipts := make([][]byte, workers)
	for i := range workers {
		wg.Go(func() {
			<-start
			if i == 0 {
				_, errs[i] = e.upload(en.ID(), half, sealed[half:])
				return
			}
			receipts[i], _, errs[i] = e.client.Post(ctx, wire)
		})
	}
	close(start)
	wg.Wait()
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	final, _, err := e.client.Post(ctx, wire)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < workers; i++ {
		if errs[i] == nil && !bytes.Equal(receipts[i], final) {
			t.Fatal("two receipts for one envelope")
		}
	}
	if page, _ := e.client.Fetch(ctx, bob, "", 0); len(page.Envelopes) != 1 {
		t.Fatalf("inbox holds %d envelopes", len(page.Envelopes))
	}
	if st := e.relay.Stats(); st.Accepted != 1 || st.BodiesCompleted != 1 || st.BodiesPending != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The relay streams a body: uploading and downloading 32 MiB allocates far
// less than the body (a relay that read the body into memory would allocate
// at least all of it).
func TestBlobStreamsInBoundedMemory(t *testing.T) {
	e := newEnv(t)
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := e.blobMessage(bob.DID(), 32<<20, time.Hour)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := e.upload(en.ID(), 0, sealed); err != nil {
		t.Fatal(err)
	}
	rc, err := e.client.FetchBody(ctx, bob, en.ID(), 0)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.CopyBuffer(io.Discard, rc, make([]byte, 32<<10))
	rc.Close()
	if err != nil || n != int64(len(sealed)) {
		t.Fatalf("download %d %v", n, err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 12<<20 {
		t.Fatalf("moving a %d-byte body allocated %d bytes", len(sealed), alloc)
	}
}

// hexDID is the relay's directory name of a DID.
func hexDID(did identity.DID) string { return relay.RecipientDir(did) }

// jetstreamOf is a JetStream context on s, for reading what the relay stored.
func jetstreamOf(t *testing.T, s *server.Server) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, s.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Two relay processes on one JetStream share a body's upload: one begun at A
// continues at B from the offset the Object Store holds (B learns of the
// envelope from the sender's POST), concurrent PATCHes at A and B at one
// offset append once, and the recipient downloads the body at A; both answer
// the same receipt.
func TestBlobUploadAcrossJetStreamRelays(t *testing.T) {
	a := newEnvOn(t, jetStreamBackend, relay.Limits{})
	_, b := a.second()
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := a.blobMessage(bob.DID(), 3<<20, time.Hour)
	size := int64(len(sealed))
	a.postIncomplete(wire, 0, size)
	first := int64(1 << 20)
	if _, err := a.upload(en.ID(), 0, sealed[:first]); err != nil {
		t.Fatal(err)
	}
	b.postIncomplete(wire, first, size)
	a.postIncomplete(wire, first, size)
	second := int64(2 << 20)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, e := range []*env{a, b} {
		wg.Go(func() {
			<-start
			_, errs[i] = e.upload(en.ID(), first, sealed[first:second])
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else {
			wantRelayCode(t, err, 409, relayproto.CodeUploadOffsetMismatch)
		}
	}
	if won != 1 {
		t.Fatalf("%d appends at one offset won: %v", won, errs)
	}
	if off, err := b.upload(en.ID(), second, sealed[second:]); err != nil || off != size {
		t.Fatalf("the rest at B: %d %v", off, err)
	}
	rb, _, err := b.client.Post(ctx, wire)
	if err != nil {
		t.Fatal(err)
	}
	ra, _, err := a.client.Post(ctx, wire)
	if err != nil || !bytes.Equal(ra, rb) {
		t.Fatalf("A's answer: %v, same receipt %v", err, bytes.Equal(ra, rb))
	}
	if got, err := a.fetchBody(bob, en.ID(), 0); err != nil || !bytes.Equal(got, sealed) {
		t.Fatalf("download at A: %d %v", len(got), err)
	}
}

// An append fsyncs the part at least every 4 MiB and at the end of the PATCH
// (its directory after the write that created it), so the offset it answers
// is durable; a failed fsync discards the part (its state is unknown): 503,
// and the upload starts again at 0.
func TestBlobAppendSyncs(t *testing.T) {
	var faulty *fsx.Faulty
	e := &env{t: t, home: t.TempDir(), clock: newFakeClock(time.UnixMilli(1_767_225_600_000)), relID: ident(t, 9), backend: fileBackend}
	e.opts.WrapFS = func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		if filepath.Base(filepath.Dir(inner.Root())) == "relay" {
			faulty = f
		}
		return f
	}
	e.start()
	t.Cleanup(e.stop)
	bob := ident(t, 2)
	en, wire, sealed := e.blobMessage(bob.DID(), 10<<20, time.Hour)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	part := "bodies/" + en.ID() + ".part"
	if _, err := e.upload(en.ID(), 0, sealed[:9<<20]); err != nil {
		t.Fatal(err)
	}
	unsynced, syncs, dirSynced := 0, 0, false
	for _, op := range faulty.Log() {
		switch {
		case op.Kind == fsx.OpWrite && op.Path == part:
			unsynced += len(op.Data)
			if unsynced > 4<<20+256<<10 {
				t.Fatalf("%d bytes written without an fsync", unsynced)
			}
		case op.Kind == fsx.OpSync && op.Path == part:
			unsynced = 0
			syncs++
		case op.Kind == fsx.OpSyncDir && op.Path == "bodies" && syncs > 0:
			dirSynced = true
		}
	}
	if unsynced != 0 || syncs < 3 || !dirSynced {
		t.Fatalf("after the PATCH: %d bytes not fsynced, %d fsyncs, directory fsynced %v", unsynced, syncs, dirSynced)
	}
	faulty.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpSync && op.Path == part {
			return syscall.EIO
		}
		return nil
	}
	_, err := e.upload(en.ID(), 9<<20, sealed[9<<20:])
	wantRelayCode(t, err, 503, relayproto.CodeInboxUnwritable)
	faulty.Inject = nil
	if off, _, err := e.client.BodyOffset(context.Background(), en.ID()); err != nil || off != 0 {
		t.Fatalf("after a failed fsync the offset is %d (%v), want 0", off, err)
	}
	if _, err := e.upload(en.ID(), 0, sealed); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.client.Post(context.Background(), wire); err != nil {
		t.Fatal(err)
	}
}

// newFaultyEnv is a file relay whose inbox directory's file system is a
// Faulty (returned; it survives restarts).
func newFaultyEnv(t *testing.T) (*env, *fsx.Faulty) {
	faulty := new(fsx.Faulty)
	e := &env{t: t, home: t.TempDir(), clock: newFakeClock(time.UnixMilli(1_767_225_600_000)), relID: ident(t, 9), backend: fileBackend}
	e.opts.WrapFS = func(inner fsx.FS) fsx.FS {
		if filepath.Base(filepath.Dir(inner.Root())) == "relay" {
			faulty.Inner = inner
			return faulty
		}
		return inner
	}
	e.start()
	t.Cleanup(e.stop)
	return e, faulty
}

// A crash between the sealed body and the envelope's entry into its inbox
// (here: the inbox file cannot be written) loses nothing: after a restart the
// envelope's POST puts it into its inbox from the sealed body, without the
// body sent again. A crash after its entry and before its pending file's
// removal leaves nothing pending after the restart, and the same receipt.
func TestBlobCompletionSurvivesCrash(t *testing.T) {
	e, faulty := newFaultyEnv(t)
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := e.blobMessage(bob.DID(), 1<<20, time.Hour)
	size := int64(len(sealed))
	e.postIncomplete(wire, 0, size)
	rdir := relay.RecipientDir(bob.DID())
	faulty.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpCreate && filepath.Dir(op.Path) == rdir {
			return syscall.ENOSPC
		}
		return nil
	}
	_, err := e.upload(en.ID(), 0, sealed)
	wantRelayCode(t, err, 503, relayproto.CodeInboxUnwritable)
	faulty.Inject = nil
	if _, err := os.Stat(filepath.Join(e.bodiesDir(), en.ID()+".blob")); err != nil {
		t.Fatalf("the body is not sealed: %v", err)
	}
	e.restart()
	in := e.relay.Stats().BodyBytesIn
	receipt, _, err := e.client.Post(ctx, wire)
	if err != nil {
		t.Fatalf("post after the restart: %v", err)
	}
	if st := e.relay.Stats(); st.BodyBytesIn != in || st.BodiesCompleted != 1 {
		t.Fatalf("stats %+v: the body was sent again, or not completed", st)
	}
	if got, err := e.fetchBody(bob, en.ID(), 0); err != nil || !bytes.Equal(got, sealed) {
		t.Fatalf("body: %d %v", len(got), err)
	}

	// The pending file's removal fails after the envelope entered its inbox.
	en2, wire2, sealed2 := e.blobMessage(bob.DID(), 1<<20, time.Hour)
	e.postIncomplete(wire2, 0, int64(len(sealed2)))
	faulty.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpRemove && op.Path == "bodies/"+en2.ID()+".pending" {
			return syscall.EIO
		}
		return nil
	}
	if _, err := e.upload(en2.ID(), 0, sealed2); err != nil {
		t.Fatal(err)
	}
	faulty.Inject = nil
	receipt2, _, err := e.client.Post(ctx, wire2)
	if err != nil {
		t.Fatal(err)
	}
	e.restart()
	if _, err := os.Stat(filepath.Join(e.bodiesDir(), en2.ID()+".pending")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pending file is still there after the restart: %v", err)
	}
	if st := e.relay.Stats(); st.BodiesPending != 0 {
		t.Fatalf("pending after the restart: %d", st.BodiesPending)
	}
	for _, c := range []struct {
		wire, receipt []byte
	}{{wire, receipt}, {wire2, receipt2}} {
		if again, _, err := e.client.Post(ctx, c.wire); err != nil || !bytes.Equal(again, c.receipt) {
			t.Fatalf("repeated post: %v, same receipt %v", err, bytes.Equal(again, c.receipt))
		}
	}
	if page, _ := e.client.Fetch(ctx, bob, "", 0); len(page.Envelopes) != 2 {
		t.Fatalf("inbox holds %d envelopes", len(page.Envelopes))
	}
}

// A write that fails part-way (a full disk) leaves the part longer than the
// offset answered: the next PATCH is told the part's length (409), and the
// body continued from there verifies — those bytes are the body's, in order.
func TestBlobShortWriteResumes(t *testing.T) {
	e, faulty := newFaultyEnv(t)
	bob := ident(t, 2)
	en, wire, sealed := e.blobMessage(bob.DID(), 6<<20, time.Hour)
	size := int64(len(sealed))
	e.postIncomplete(wire, 0, size)
	part := "bodies/" + en.ID() + ".part"
	// The first write from 5 MiB on: past the first fsync (at 4 MiB and at
	// most one buffer), before the second (at 8 MiB). Counted in bytes, not
	// writes: how much one write carries is how much the connection had.
	injected := false
	faulty.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpWrite && op.Path == part && op.Offset >= 5<<20 && !injected {
			injected = true
			return fsx.ErrShortWrite
		}
		return nil
	}
	off, err := e.upload(en.ID(), 0, sealed)
	wantRelayCode(t, err, 503, relayproto.CodeInboxUnwritable)
	faulty.Inject = nil
	held, _, err := e.client.BodyOffset(context.Background(), en.ID())
	if err != nil || held < 4<<20 || off != held {
		t.Fatalf("the relay holds %d (%v), its 503 said %d; want the first fsync's 4 MiB at least", held, err, off)
	}
	got, err := e.upload(en.ID(), held, sealed[held:])
	wantRelayCode(t, err, 409, relayproto.CodeUploadOffsetMismatch)
	if got <= held {
		t.Fatalf("the 409 says %d, not the part's longer length", got)
	}
	if o, err := e.upload(en.ID(), got, sealed[got:]); err != nil || o != size {
		t.Fatalf("resume from %d: %d %v", got, o, err)
	}
	if _, _, err := e.client.Post(context.Background(), wire); err != nil {
		t.Fatal(err)
	}
}

// The expiry pass removes an inbox envelope's body with it.
func TestBlobInboxExpiryRemovesBody(t *testing.T) { eachBackend(t, testBlobInboxExpiryRemovesBody) }

func testBlobInboxExpiryRemovesBody(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob := ident(t, 2)
	ctx := context.Background()
	en, wire, sealed := e.blobMessage(bob.DID(), 1<<20, time.Minute)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	if _, err := e.upload(en.ID(), 0, sealed); err != nil {
		t.Fatal(err)
	}
	e.clock.Add(2 * time.Minute)
	_, err := e.fetchBody(bob, en.ID(), 0)
	wantRelayCode(t, err, 404, relayproto.CodeBodyMissing) // past its deadline: never served
	if n, err := e.relay.Expire(ctx); err != nil || n != 1 {
		t.Fatalf("expire: %d %v", n, err)
	}
	e.wantNoBody(backend, en.ID())
}

// A HEAD or a PATCH that comes while another request is still appending to the
// upload — what a sender killed mid-request leaves, its last bytes still
// arriving — answers once that append ended, with the offset it made durable,
// not the one before it (which would send the resumed upload's bytes again, or
// into a 409 at a stale offset).
func TestBlobHeadWaitsForTheAppendInFlight(t *testing.T) {
	e := newEnv(t)
	en, wire, sealed := e.blobMessage(ident(t, 2).DID(), 8<<20, time.Hour)
	e.postIncomplete(wire, 0, int64(len(sealed)))
	const first = 3 << 20
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.CloseWithError(io.ErrClosedPipe) })
	appended := make(chan error, 1)
	go func() {
		_, err := e.client.UploadBody(context.Background(), en.ID(), 0, pr, first)
		appended <- err
	}()
	// Half of the first request is at the relay; its append is running.
	if _, err := pw.Write(sealed[:first/2]); err != nil {
		t.Fatal(err)
	}
	heads := make(chan int64, 1)
	go func() {
		o, _, err := e.client.BodyOffset(context.Background(), en.ID())
		if err != nil {
			t.Error(err)
		}
		heads <- o
	}()
	select {
	case o := <-heads:
		t.Fatalf("HEAD answered %d while an append was running", o)
	case <-time.After(100 * time.Millisecond): // a HEAD that does not wait answers at once
	}
	if _, err := pw.Write(sealed[first/2 : first]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if o := <-heads; o != first {
		t.Fatalf("HEAD answered %d after the append made %d durable", o, first)
	}
}
