package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// streamDaemon runs a daemon on a fresh home with options adjusted by adjust (nil:
// none) and returns it with an HTTP client of its socket.
func streamDaemon(t *testing.T, adjust func(*Options)) (*Daemon, *http.Client) {
	t.Helper()
	home := t.TempDir()
	if _, err := InitIdentity(home, ""); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "sbstream-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	opts := Options{Home: home, Logger: quiet, SocketPath: filepath.Join(sockDir, "s.sock")}
	if adjust != nil {
		adjust(&opts)
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.SocketPath())
	}, ExpectContinueTimeout: 5 * time.Second}}
	t.Cleanup(hc.CloseIdleConnections)
	return d, hc
}

// streamPost sends body as a streamed send to to through a fictitious relay, with
// key (empty: none) and Content-Length size (-1: chunked).
func streamPost(hc *http.Client, key string, to identity.DID, body io.Reader, size int64) (apiAnswer, error) {
	req, _ := http.NewRequest(http.MethodPost, "http://sealbridged/v1/messages", io.NopCloser(body))
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Expect", "100-continue")
	req.Header.Set(client.HeaderTo, string(to))
	req.Header.Set(client.HeaderRelay, "http://127.0.0.1:9")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return doAnswer(hc, req)
}

func mustStreamPost(t *testing.T, hc *http.Client, key string, to identity.DID, body []byte, size int64) apiAnswer {
	t.Helper()
	a, err := streamPost(hc, key, to, bytes.NewReader(body), size)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func randomBody(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}).Read(b)
	return b
}

// pendingEnvelope returns the one pending envelope of message id.
func pendingEnvelope(t *testing.T, d *Daemon, id string) *envelope.Envelope {
	t.Helper()
	envs, err := d.Store().Pending(context.Background(), id)
	if err != nil || len(envs) != 1 {
		t.Fatalf("message %s: %d pending envelopes, %v", id, len(envs), err)
	}
	env, err := envelope.Parse(envs[0].Envelope)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// blobFiles lists the names in the store's blobs/ (committed and staged).
func blobFiles(t *testing.T, d *Daemon) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.Store().Dir(), store.BlobDir))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// A streamed body over the inline limit lands in the store as a committed blob that
// the enqueued envelope names (digest and size), and that opens for the recipient,
// with every chunk verified, to exactly the bytes sent — with a Content-Length and
// chunked. A streamed body within the limit takes the inline path: its envelope has
// no blob, and its request is the JSON send's (the same key replays it).
func TestStreamedSendStoresBlob(t *testing.T) {
	d, hc := streamDaemon(t, nil)
	peer, _ := identity.Generate()
	for i, size := range []int64{envelope.MaxBodySize + 1, 1<<20 + 3, -1} {
		body := randomBody(uint64(i), 1<<20+3)
		if size > 0 {
			body = body[:size]
		}
		a := mustStreamPost(t, hc, "", peer.DID(), body, size)
		id, _ := a.body["messageId"].(string)
		if a.status != http.StatusCreated || a.body["status"] != "queued" || a.body["to"] != string(peer.DID()) {
			t.Fatalf("size %d: %d %s", size, a.status, a.raw)
		}
		env := pendingEnvelope(t, d, id)
		ref, ok := env.Blob()
		if !ok || ref.MessageID != id || ref.Recipient != peer.DID() || ref.Sender != d.DID() {
			t.Fatalf("size %d: the envelope names no blob of this message to the peer: %+v %v", size, ref, ok)
		}
		sealed, err := d.Store().OpenBlob(ref.Digest)
		if err != nil {
			t.Fatalf("size %d: the blob the envelope names is not in the store: %v", size, err)
		}
		if sealed.Size() != ref.Size {
			t.Fatalf("size %d: the blob has %d bytes, the envelope names %d", size, sealed.Size(), ref.Size)
		}
		plain, err := envelope.OpenBlob(peer, ref, sealed)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(plain)
		sealed.Close()
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("size %d: the blob opens to %d bytes (%v), want the %d sent", size, len(got), err, len(body))
		}
	}
	if v, want := metricValue(t, d, `sealbridge_api_body_bytes_total{direction="sent"}`), float64(envelope.MaxBodySize+1+2*(1<<20+3)); v != want {
		t.Errorf("sealbridge_api_body_bytes_total{direction=\"sent\"} is %v, want the %v bytes of the three large bodies", v, want)
	}
	if n := len(blobFiles(t, d)); n != 3 {
		t.Fatalf("%d files in blobs/, want the 3 blobs: %v", n, blobFiles(t, d))
	}

	small := []byte("a small body")
	a := mustStreamPost(t, hc, "small-key", peer.DID(), small, int64(len(small)))
	if a.status != http.StatusCreated {
		t.Fatalf("small body: %d %s", a.status, a.raw)
	}
	if _, ok := pendingEnvelope(t, d, a.body["messageId"].(string)).Blob(); ok {
		t.Fatal("a small streamed body was sealed as a blob")
	}
	js, _ := json.Marshal(map[string]any{"to": string(peer.DID()), "relayUrl": "http://127.0.0.1:9", "body": small})
	if j := post(t, hc, "small-key", string(js)); j.raw != a.raw || j.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the JSON form of the small streamed send with its key: %d %s, want %s replayed", j.status, j.raw, a.raw)
	}
}

// A streamed body whose sealed size goes over the daemon's MaxBody is refused 413
// BODY_TOO_LARGE with the limit and a hint naming --max-body — chunked (found while
// it streams) and with a Content-Length (found from the headers), with and without
// a key — and leaves nothing: no message, no outbox record, no blob and no staged
// temp. A body that fits is then accepted with the same key.
func TestStreamedSendOverMaxBody(t *testing.T) {
	const limit = 1 << 20
	d, hc := streamDaemon(t, func(o *Options) { o.MaxBody = limit })
	peer, _ := identity.Generate()
	// Plaintext of exactly the limit seals to more than it: refused too.
	for _, n := range []int{limit, 3 * limit} {
		body := randomBody(7, n)
		for _, size := range []int64{-1, int64(n)} {
			for _, key := range []string{"", "over-" + strconv.Itoa(n)} {
				a := mustStreamPost(t, hc, key, peer.DID(), body, size)
				hint, _ := a.body["hint"].(string)
				if a.status != http.StatusRequestEntityTooLarge || a.body["code"] != errcode.BodyTooLarge.String() ||
					a.body["limit"] != float64(limit) || !strings.Contains(hint, "--max-body") {
					t.Fatalf("%d bytes, Content-Length %d, key %q: %d %s; want 413 BODY_TOO_LARGE with the limit and --max-body",
						n, size, key, a.status, a.raw)
				}
			}
		}
	}
	if m, o, b := countMessages(t, d), countKind(t, d, record.KindOutbox), blobFiles(t, d); m != 0 || o != 0 || len(b) != 0 {
		t.Fatalf("after the refusals: %d messages, %d outbox records, blobs/ %v; want nothing", m, o, b)
	}
	fits := randomBody(8, limit-64<<10)
	if a := mustStreamPost(t, hc, "over-"+strconv.Itoa(limit), peer.DID(), fits, -1); a.status != http.StatusCreated {
		t.Fatalf("a body within the limit, with the refused request's key: %d %s", a.status, a.raw)
	}
}

// A retry of a streamed send with its Idempotency-Key and the same body gets the
// stored answer byte for byte (replayed); with another body of the same length, 422
// IDEMPOTENCY_KEY_REUSED; either way nothing more is stored: one message, one
// outbox record, one blob.
func TestStreamedSendIdempotentRetry(t *testing.T) {
	d, hc := streamDaemon(t, nil)
	peer, _ := identity.Generate()
	body := randomBody(1, 300<<10)
	first := mustStreamPost(t, hc, "k1", peer.DID(), body, -1)
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %s", first.status, first.raw)
	}
	again := mustStreamPost(t, hc, "k1", peer.DID(), body, int64(len(body)))
	if again.status != first.status || again.raw != first.raw || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry: %d %s (replayed %q); want %s replayed", again.status, again.raw, again.header.Get("Idempotent-Replayed"), first.raw)
	}
	other := bytes.Clone(body)
	other[len(other)/2] ^= 1
	reused := mustStreamPost(t, hc, "k1", peer.DID(), other, -1)
	if reused.status != http.StatusUnprocessableEntity || reused.body["code"] != errcode.IdempotencyKeyReused.String() || reused.body["hint"] == nil {
		t.Fatalf("another body with the key: %d %s; want 422 %s with a hint", reused.status, reused.raw, errcode.IdempotencyKeyReused)
	}
	if m, o, b := countMessages(t, d), countKind(t, d, record.KindOutbox), blobFiles(t, d); m != 1 || o != 1 || len(b) != 1 {
		t.Fatalf("%d messages, %d outbox records, blobs/ %v; want one of each", m, o, b)
	}
}

// Twelve concurrent streamed sends with one Idempotency-Key and one body, let go at
// once, many times: each time exactly one makes the message (201, not replayed), and
// every other gets its answer replayed or 409 IDEMPOTENCY_IN_PROGRESS with
// Retry-After; one message, one outbox record and one blob per key, none left staged.
func TestConcurrentStreamedSends(t *testing.T) {
	const workers = 12
	trials := 8
	if testing.Short() {
		trials = 3
	}
	d, hc := streamDaemon(t, nil)
	peer, _ := identity.Generate()
	body := randomBody(2, 200<<10)
	inProgress := 0
	for trial := range trials {
		key := fmt.Sprintf("race-%d", trial)
		answers, errs := make([]apiAnswer, workers), make([]error, workers)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() {
				<-gate
				answers[i], errs[i] = streamPost(hc, key, peer.DID(), bytes.NewReader(body), -1)
			})
		}
		close(gate)
		wg.Wait()
		winners, id := 0, ""
		for i, a := range answers {
			if errs[i] != nil {
				t.Fatalf("trial %d, request %d: %v", trial, i, errs[i])
			}
			if a.status == http.StatusCreated && a.header.Get("Idempotent-Replayed") == "" {
				winners++
				id, _ = a.body["messageId"].(string)
			}
		}
		if winners != 1 {
			t.Fatalf("trial %d: %d requests made a message", trial, winners)
		}
		for i, a := range answers {
			switch {
			case a.status == http.StatusCreated:
				if a.body["messageId"] != id {
					t.Fatalf("trial %d, request %d: 201 %s, want message %s", trial, i, a.raw, id)
				}
			case a.status == http.StatusConflict:
				if a.body["code"] != errcode.IdempotencyInProgress.String() || a.header.Get("Retry-After") == "" {
					t.Fatalf("trial %d, request %d: 409 %s without %s or Retry-After", trial, i, a.raw, errcode.IdempotencyInProgress)
				}
				inProgress++
			default:
				t.Fatalf("trial %d, request %d: %d %s", trial, i, a.status, a.raw)
			}
		}
		if m, o, b := countMessages(t, d), countKind(t, d, record.KindOutbox), blobFiles(t, d); m != trial+1 || o != trial+1 || len(b) != trial+1 {
			t.Fatalf("trial %d: %d messages, %d outbox records, blobs/ %v; want %d of each", trial, m, o, b, trial+1)
		}
	}
	t.Logf("%d trials of %d requests: %d answered 409 in progress, the others the winner's message", trials, workers, inProgress)
}

// genReader yields n pseudo-random bytes without holding them, hashing what it
// yields.
type genReader struct {
	rng  *rand.ChaCha8
	left int64
	sum  interface {
		Write([]byte) (int, error)
		Sum([]byte) []byte
	}
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > g.left {
		p = p[:g.left]
	}
	g.rng.Read(p)
	g.sum.Write(p)
	g.left -= int64(len(p))
	return len(p), nil
}

// A 64 MiB body streamed through the API (client and daemon in this process) never
// raises the heap in use by more than 16 MiB over what it was before: the body is
// sealed and written as it arrives, never held. The heap is sampled every 2 ms
// during the send, after a GC before it, so the peak counts everything live and
// not yet collected; a daemon that buffered the body would hold 64 MiB at once.
// The blob then opens to the bytes sent.
func TestStreamedSendMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB")
	}
	const size = 64 << 20
	d, hc := streamDaemon(t, nil)
	peer, _ := identity.Generate()
	gen := &genReader{rng: rand.NewChaCha8([32]byte{9}), left: size, sum: sha256.New()}

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	a, err := streamPost(hc, "", peer.DID(), gen, size)
	close(stop)
	<-sampled
	if err != nil || a.status != http.StatusCreated {
		t.Fatalf("%d %s %v", a.status, a.raw, err)
	}
	grew := int64(peak.Load()) - int64(base)
	t.Logf("heap in use: %d MiB before, peak %d MiB during the send (+%.1f MiB)", base>>20, peak.Load()>>20, float64(grew)/(1<<20))
	if grew > 16<<20 {
		t.Fatalf("the heap in use grew by %d MiB while 64 MiB streamed; want at most 16 MiB", grew>>20)
	}
	ref, _ := pendingEnvelope(t, d, a.body["messageId"].(string)).Blob()
	sealed, err := d.Store().OpenBlob(ref.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer sealed.Close()
	plain, err := envelope.OpenBlob(peer, ref, sealed)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if n, err := io.Copy(h, plain); err != nil || n != size || !bytes.Equal(h.Sum(nil), gen.sum.Sum(nil)) {
		t.Fatalf("the blob opens to %d bytes (%v) with another SHA-256 than the %d sent", n, err, size)
	}
}

// gateReader yields head, then blocks until release is closed, then yields tail.
type gateReader struct {
	head, tail []byte
	started    chan struct{} // closed when head has been read
	release    chan struct{}
	once       sync.Once
}

func (g *gateReader) Read(p []byte) (int, error) {
	if len(g.head) > 0 {
		n := copy(p, g.head)
		g.head = g.head[n:]
		return n, nil
	}
	g.once.Do(func() { close(g.started) })
	<-g.release
	if len(g.tail) == 0 {
		return 0, io.EOF
	}
	n := copy(p, g.tail)
	g.tail = g.tail[n:]
	return n, nil
}

// While a streamed body arrives for longer than the operation's lease, the lease is
// renewed: the operation's leaseUntil moves forward, and a second request with the
// key after the first lease would have ended is answered 409
// IDEMPOTENCY_IN_PROGRESS instead of taking the operation over; the first then
// finishes with the one message. (The store's lease is 3 s here; the test waits,
// polling, for the renewal and for the first lease's end.)
func TestStreamedSendRenewsItsLease(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a 3 s lease")
	}
	d, hc := streamDaemon(t, func(o *Options) { o.Store.OperationLease = 3 * time.Second })
	peer, _ := identity.Generate()
	body := randomBody(5, 400<<10)
	g := &gateReader{head: body[:200<<10], tail: body[200<<10:], started: make(chan struct{}), release: make(chan struct{})}
	type result struct {
		a   apiAnswer
		err error
	}
	first := make(chan result, 1)
	go func() {
		a, err := streamPost(hc, "slow", peer.DID(), g, -1)
		first <- result{a, err}
	}()
	<-g.started
	// The operation, once the daemon began it (the head of the body may be in the
	// socket's buffers before).
	op := func() *record.Operation {
		b, err := store.GetAs[*record.Binding](d.Store(), record.IdempotencyID("slow"))
		if err != nil {
			t.Fatalf("the binding of the key: %v", err)
		}
		if b == nil {
			return nil
		}
		o, err := store.GetAs[*record.Operation](d.Store(), b.OperationID)
		if err != nil || o == nil {
			t.Fatalf("the operation: %v %v", o, err)
		}
		return o
	}
	deadline := time.Now().Add(30 * time.Second)
	var first0 *record.Operation
	for first0 = op(); first0 == nil; first0 = op() {
		if time.Now().After(deadline) {
			t.Fatal("the daemon did not begin the operation")
		}
		time.Sleep(10 * time.Millisecond) // polling the store, bounded above
	}
	original := first0.LeaseUntil
	for op().LeaseUntil == original || time.Now().UnixMilli() <= original+500 {
		if time.Now().After(deadline) {
			t.Fatalf("the lease (until %d) was not renewed past its end (now %d)", original, time.Now().UnixMilli())
		}
		time.Sleep(50 * time.Millisecond) // polling the store and the clock, bounded above
	}
	second, err := streamPost(hc, "slow", peer.DID(), bytes.NewReader(body), -1)
	if err != nil {
		t.Fatal(err)
	}
	if second.status != http.StatusConflict || second.body["code"] != errcode.IdempotencyInProgress.String() {
		t.Fatalf("a second request after the first lease's end: %d %s; want 409 %s", second.status, second.raw, errcode.IdempotencyInProgress)
	}
	close(g.release)
	r := <-first
	if r.err != nil || r.a.status != http.StatusCreated {
		t.Fatalf("the slow request: %d %s %v", r.a.status, r.a.raw, r.err)
	}
	if m := countMessages(t, d); m != 1 {
		t.Fatalf("%d messages, want 1", m)
	}
}

// brokenReader yields n bytes, then fails: a client that dies mid-body.
type brokenReader struct{ n int }

func (b *brokenReader) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, errors.New("the sender died")
	}
	k := min(len(p), b.n)
	clear(p[:k])
	b.n -= k
	return k, nil
}

// A streamed send whose client breaks off mid-body (chunked, and short of its
// Content-Length) stores nothing: the staged blob is removed and no message or
// outbox record is made; the operation of its key is released, so the retry with the
// whole body makes the message — once the broken request's handler is done, which
// the retry's 409s until then show, the store holds exactly the retries' blobs.
func TestStreamedSendBrokenOffStoresNothing(t *testing.T) {
	d, hc := streamDaemon(t, nil)
	peer, _ := identity.Generate()
	sizes := []int64{-1, 2 << 20}
	for i, size := range sizes {
		if _, err := streamPost(hc, fmt.Sprint("broken-", i), peer.DID(), &brokenReader{n: 600 << 10}, size); err == nil {
			t.Fatalf("Content-Length %d: the broken request got an answer", size)
		}
	}
	body := randomBody(11, 300<<10)
	deadline := time.Now().Add(30 * time.Second)
	for i := range sizes {
		for {
			a := mustStreamPost(t, hc, fmt.Sprint("broken-", i), peer.DID(), body, -1)
			if a.status == http.StatusCreated {
				break
			}
			// The broken request's handler may still hold the operation.
			if a.status != http.StatusConflict || time.Now().After(deadline) {
				t.Fatalf("the retry with the whole body: %d %s", a.status, a.raw)
			}
			time.Sleep(10 * time.Millisecond) // polling the daemon, bounded above
		}
	}
	if m, o, b := countMessages(t, d), countKind(t, d, record.KindOutbox), blobFiles(t, d); m != 2 || o != 2 || len(b) != 2 {
		t.Fatalf("%d messages, %d outbox records, blobs/ %v; want the two retries' only", m, o, b)
	}
}
