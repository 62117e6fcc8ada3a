package carrier

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// ---- a relay that keeps blob bodies (scripted) ----

// bodyRelay is a scripted relay for blob envelopes: a blob envelope's post answers
// BODY_INCOMPLETE until the relay holds all of its body with the right digest, then
// Accepted; an upload appends at the relay's durable offset only, and a request that
// is cut keeps only what the relay had synced of it (every syncEvery bytes from the
// request's start), as the relay's fsync rule says. Other envelopes go to the
// scripted transport. It also takes batches (accepting every member), so that a test
// can see what went in one.
type bodyRelay struct {
	*scripted
	syncEvery int64

	mu       sync.Mutex
	bodies   map[string]*heldBody
	posts    []string // envelope ids of blob posts, in order
	uploads  []upload // every upload request
	received int64    // body bytes read from upload requests
	batches  [][]string
	// cut, if set, says after how many bytes upload request number req (from 1)
	// breaks (negative: it does not).
	cut func(req int) int64
	// hold, if set, is called by a cut request after the relay kept what it
	// synced; the request returns when hold does (with ctx's error if it ended).
	hold func(ctx context.Context)
	// gate, if set, holds every upload request before it reads anything until it
	// is closed or the request's ctx ends.
	gate chan struct{}
	// onUpload is told of every upload request as it starts.
	onUpload chan upload
	// down, while set, makes the relay unreachable for BodyOffset (a relay that
	// went away in the middle of a request).
	down bool
}

type heldBody struct {
	data   []byte
	size   int64
	digest string
	done   bool
}

type upload struct {
	envelopeID string
	offset, n  int64
}

func newBodyRelay(s *scripted, syncEvery int64) *bodyRelay {
	return &bodyRelay{scripted: s, syncEvery: syncEvery, bodies: map[string]*heldBody{}}
}

func (r *bodyRelay) Send(ctx context.Context, url string, wire []byte) Result {
	ref, ok := blobOf(wire)
	if !ok {
		return r.scripted.Send(ctx, url, wire)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.posts = append(r.posts, ref.EnvelopeID)
	b := r.bodies[ref.EnvelopeID]
	if b == nil {
		b = &heldBody{size: ref.Size, digest: ref.Digest}
		r.bodies[ref.EnvelopeID] = b
	}
	if b.done {
		return Result{Outcome: Accepted, Status: 200}
	}
	return Result{Outcome: Failed, Status: 202, Code: relayproto.CodeBodyIncomplete,
		Body: &BodyState{Offset: int64(len(b.data)), Size: b.size}, Err: errors.New("HTTP 202 BODY_INCOMPLETE")}
}

func (r *bodyRelay) Batches(string) bool { return true }

func (r *bodyRelay) SendBatch(ctx context.Context, url string, envs [][]byte) []Result {
	var ids []string
	out := make([]Result, len(envs))
	for i, e := range envs {
		if ref, ok := blobOf(e); ok {
			ids = append(ids, ref.EnvelopeID)
			out[i] = Result{Outcome: Refused, Status: 400, Err: errors.New("a blob envelope in a batch")}
			continue
		}
		out[i] = r.scripted.Send(ctx, url, e)
		ids = append(ids, envelopeIDOfFake(e))
	}
	r.mu.Lock()
	r.batches = append(r.batches, ids)
	r.mu.Unlock()
	return out
}

func envelopeIDOfFake(e []byte) string {
	if env, err := envelope.Parse(e); err == nil {
		return env.ID()
	}
	i := bytes.Index(e, []byte(`"envelopeId":"`))
	if i < 0 {
		return ""
	}
	return string(e[i+14 : i+14+36])
}

func (r *bodyRelay) UploadBody(ctx context.Context, _, id string, off int64, in io.Reader, n int64) Result {
	r.mu.Lock()
	r.uploads = append(r.uploads, upload{id, off, n})
	req := len(r.uploads)
	b := r.bodies[id]
	gate, notify := r.gate, r.onUpload
	r.mu.Unlock()
	if notify != nil {
		notify <- upload{id, off, n}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return Result{Outcome: Failed, Err: ctx.Err()}
		}
	}
	if b == nil {
		return Result{Outcome: Failed, Status: 404, Code: relayproto.CodeUploadUnknown, Err: errors.New("HTTP 404 UPLOAD_UNKNOWN")}
	}
	r.mu.Lock()
	held := int64(len(b.data))
	r.mu.Unlock()
	if off != held {
		return Result{Outcome: Failed, Status: 409, Code: relayproto.CodeUploadOffsetMismatch, Body: &BodyState{Offset: held},
			Err: errors.New("HTTP 409 UPLOAD_OFFSET_MISMATCH")}
	}
	cutAt := int64(-1)
	if r.cut != nil {
		cutAt = r.cut(req)
	}
	want := n
	if cutAt >= 0 && cutAt < n {
		want = cutAt
	}
	got, err := io.ReadAll(io.LimitReader(in, want))
	r.mu.Lock()
	r.received += int64(len(got))
	if err != nil || int64(len(got)) != want {
		r.mu.Unlock()
		return Result{Outcome: Failed, Err: errors.New("short upload")}
	}
	if want < n {
		// Cut: the relay keeps what it synced.
		synced := want / r.syncEvery * r.syncEvery
		b.data = append(b.data, got[:synced]...)
		hold := r.hold
		r.mu.Unlock()
		if hold != nil {
			hold(ctx)
		}
		return Result{Outcome: Failed, Err: errors.New("connection reset by peer")}
	}
	defer r.mu.Unlock()
	if int64(len(b.data))+n > b.size {
		return Result{Outcome: Refused, Status: 413, Err: errors.New("HTTP 413 BODY_TOO_LARGE")}
	}
	b.data = append(b.data, got...)
	if int64(len(b.data)) == b.size {
		sum := sha256.Sum256(b.data)
		if hex.EncodeToString(sum[:]) != b.digest {
			b.data = nil
			return Result{Outcome: Failed, Status: 422, Code: relayproto.CodeBodyDigestMismatch, Err: errors.New("HTTP 422")}
		}
		b.done = true
	}
	return Result{Outcome: Accepted, Status: 204, Body: &BodyState{Offset: int64(len(b.data))}}
}

func (r *bodyRelay) BodyOffset(_ context.Context, _, id string) Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return Result{Outcome: Unreachable, Err: errors.New("connection refused")}
	}
	b := r.bodies[id]
	if b == nil || b.done {
		return Result{Outcome: Failed, Status: 404, Code: relayproto.CodeUploadUnknown, Err: errors.New("HTTP 404 UPLOAD_UNKNOWN")}
	}
	return Result{Outcome: Accepted, Status: 200, Body: &BodyState{Offset: int64(len(b.data)), Size: b.size}}
}

func (r *bodyRelay) body(id string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.bodies[id]; b != nil {
		return slices.Clone(b.data)
	}
	return nil
}

func (r *bodyRelay) uploadLog() []upload {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.uploads)
}

func (r *bodyRelay) receivedBytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.received
}

// ---- blob envelopes ----

// enqueueBlob seals plain bytes of random plaintext from owner to peer as a blob in
// h's store (the store's blob written first, then the envelope enqueued, as the
// daemon does) and returns the envelope and the sealed bytes. messageID "" is a
// fresh one.
func (h *harness) enqueueBlob(relayURL, messageID string, plain int) (*envelope.Envelope, []byte) {
	h.t.Helper()
	if messageID == "" {
		messageID = uuid.NewString()
	}
	bw, err := h.s.CreateBlob()
	if err != nil {
		h.t.Fatal(err)
	}
	defer bw.Abort()
	var sealed bytes.Buffer
	deadline := h.clock.Now().Add(time.Hour)
	w, err := envelope.NewBlobMessage(owner(h.t), peer(), messageID, deadline, h.clock.Now(), io.MultiWriter(bw, &sealed))
	if err != nil {
		h.t.Fatal(err)
	}
	src := rand.New(rand.NewPCG(uint64(plain), 1))
	buf := make([]byte, 32<<10)
	for rest := plain; rest > 0; rest -= len(buf[:min(rest, len(buf))]) {
		chunk := buf[:min(rest, len(buf))]
		for i := range chunk {
			chunk[i] = byte(src.Uint32())
		}
		if _, err := w.Write(chunk); err != nil {
			h.t.Fatal(err)
		}
	}
	env, wire, err := w.Finish()
	if err != nil {
		h.t.Fatal(err)
	}
	if _, _, err := bw.Commit(); err != nil {
		h.t.Fatal(err)
	}
	req := store.SendRequest{MessageID: messageID, PeerOwnerDID: peer(), RelayURL: relayURL, DeliveryDeadline: deadline,
		Envelopes: []store.OutgoingEnvelope{{EnvelopeID: env.ID(), Kind: record.EnvelopeMessage, Envelope: wire}}}
	if _, err := h.s.Enqueue(context.Background(), req); err != nil {
		h.t.Fatal(err)
	}
	return env, sealed.Bytes()
}

// blobHarness is a harness whose transport is a bodyRelay.
func blobHarness(t *testing.T, opts Options, syncEvery int64) (*harness, *bodyRelay) {
	t.Helper()
	var br *bodyRelay
	h := newHarnessOn(t, opts, store.Options{}, func(s *scripted) Transport {
		br = newBodyRelay(s, syncEvery)
		return br
	})
	return h, br
}

// A blob envelope's upload that is cut after k bytes of its second request resumes
// from the relay's durable offset: the body arrives whole and equal, and the bytes
// sent again are exactly what the relay had read of the cut request but not synced
// (less than one sync interval, and so less than one request). An upload that
// started over from 0, or from the carrier's own count, would send more again (or be
// refused 409 forever).
func TestBlobUploadResumesFromTheRelaysOffset(t *testing.T) {
	const chunk, syncEvery, k = 256 << 10, 64 << 10, 100_000
	h, br := blobHarness(t, Options{UploadChunk: chunk}, syncEvery)
	br.cut = func(req int) int64 {
		if req == 2 {
			return k
		}
		return -1
	}
	env, sealed := h.enqueueBlob("http://relay.test", "", 1<<20+1000)
	size := int64(len(sealed))
	h.start()
	h.kick()
	waitFor(t, "the blob envelope relayed", func() bool { return h.outbox(env.ID()).State == record.StateRelayed })
	if got := br.body(env.ID()); !bytes.Equal(got, sealed) {
		t.Fatalf("the relay holds %d bytes, not the %d sealed ones", len(got), size)
	}
	resent := br.receivedBytes() - size
	if want := int64(k - k/syncEvery*syncEvery); resent != want {
		t.Fatalf("%d bytes sent again, want %d (the cut request's unsynced tail)", resent, want)
	}
	if resent >= chunk {
		t.Fatalf("%d bytes sent again: more than one request", resent)
	}
	ups := br.uploadLog()
	if ups[0].offset != 0 || ups[1].offset != chunk || ups[2].offset != chunk+syncEvery {
		t.Fatalf("upload offsets %v: the third must resume at the relay's %d", ups, chunk+syncEvery)
	}
	for _, u := range ups {
		if u.n > chunk {
			t.Fatalf("an upload request of %d bytes, over UploadChunk %d", u.n, chunk)
		}
	}
	if n := len(br.posts); n != 2 {
		t.Fatalf("%d posts of the envelope, want 2 (incomplete, then the receipt)", n)
	}
	if got := h.c.Stats().UploadedBytes; got != uint64(size) {
		t.Fatalf("UploadedBytes %d, want %d", got, size)
	}
	if m := h.message(env.MessageID()); m.Status != record.StatusRelayed {
		t.Fatalf("message %s, want relayed", m.Status)
	}
}

// A carrier stopped in the middle of an upload releases its lease without a verdict
// (no attempt counted, nothing closed), and the next carrier on the store resumes
// from the relay's durable offset: its first upload request starts there, and the
// bytes sent again are only the cut request's unsynced tail.
func TestBlobUploadResumesAfterTheCarrierStopped(t *testing.T) {
	const chunk, syncEvery, k = 256 << 10, 64 << 10, 200_000
	h, br := blobHarness(t, Options{UploadChunk: chunk}, syncEvery)
	cutting := make(chan struct{})
	br.cut = func(req int) int64 {
		if req == 3 {
			return k
		}
		return -1
	}
	br.hold = func(ctx context.Context) {
		close(cutting)
		<-ctx.Done() // the carrier is being stopped: the connection dies with it
	}
	env, sealed := h.enqueueBlob("http://relay.test", "", 1<<20+77)
	h.start()
	h.c.Kick()
	recv(t, (<-chan struct{})(cutting))
	h.stop()
	o := h.outbox(env.ID())
	if o.State != record.StatePending || o.Lease != nil || o.Attempts != 0 {
		t.Fatalf("after the stop: state %s, lease %v, attempts %d; want pending, released, 0", o.State, o.Lease, o.Attempts)
	}
	durable := int64(2*chunk) + k/syncEvery*syncEvery
	if got := int64(len(br.body(env.ID()))); got != durable {
		t.Fatalf("the relay holds %d bytes, want %d", got, durable)
	}
	before := len(br.uploadLog())
	// The next carrier (another holder: a restarted daemon).
	c2 := New(h.s, br, Options{Clock: h.clock, Watch: WatchOff, HolderID: "second", UploadChunk: chunk,
		Jitter: func() float64 { return 0.5 }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c2.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the blob envelope relayed by the second carrier", func() bool { return h.outbox(env.ID()).State == record.StateRelayed })
	if ups := br.uploadLog()[before:]; ups[0].offset != durable {
		t.Fatalf("the second carrier's first upload at %d, want the relay's %d", ups[0].offset, durable)
	}
	if got := br.body(env.ID()); !bytes.Equal(got, sealed) {
		t.Fatal("the relay's body differs from the sealed blob")
	}
	if resent, want := br.receivedBytes()-int64(len(sealed)), k-k/syncEvery*syncEvery; resent != int64(want) {
		t.Fatalf("%d bytes sent again, want %d", resent, want)
	}
}

// While an upload runs the lease is renewed every LeaseFor/2 (a long upload keeps
// the envelope to its holder), and a renewal that finds the lease taken over stops
// the upload and settles nothing over the new holder's lease.
func TestBlobUploadRenewsItsLeaseAndStopsWhenItIsLost(t *testing.T) {
	h, br := blobHarness(t, Options{UploadChunk: 64 << 10}, 16<<10)
	renewed := make(chan bool, 8)
	h.c.onRenew = func(_ string, kept bool) { renewed <- kept }
	br.gate = make(chan struct{}) // never opened: the upload waits for its ctx
	br.onUpload = make(chan upload, 8)
	env, _ := h.enqueueBlob("http://relay.test", "", 200<<10)
	h.start()
	h.c.Kick()
	recv(t, br.onUpload)
	lease := h.c.o.LeaseFor
	first := h.outbox(env.ID()).Lease
	if first == nil || first.Holder != "test-carrier" {
		t.Fatalf("lease %v during the upload", first)
	}
	h.clock.set(h.clock.Now().Add(lease / 2))
	if kept := recv(t, renewed); !kept {
		t.Fatal("the first renewal found the lease lost")
	}
	if l := h.outbox(env.ID()).Lease; l == nil || l.Until != h.clock.Now().UnixMilli()+lease.Milliseconds() || l.Until <= first.Until {
		t.Fatalf("lease after the renewal %v, want until %d", l, h.clock.Now().UnixMilli()+lease.Milliseconds())
	}
	// Another holder takes the envelope over (as after a lease that ran out).
	other := &record.Lease{Holder: "other", Until: h.clock.Now().Add(10 * lease).UnixMilli()}
	if err := h.s.PreparedTransaction(context.Background(), func(tx *store.Tx) error {
		o, err := store.TxGet[*record.Outbox](tx, env.ID())
		if err != nil {
			return err
		}
		o.Lease = other
		return tx.Put(o)
	}); err != nil {
		t.Fatal(err)
	}
	h.clock.set(h.clock.Now().Add(lease / 2))
	if kept := recv(t, renewed); kept {
		t.Fatal("the renewal kept a lease another holder had taken")
	}
	h.settle()
	o := h.outbox(env.ID())
	if o.State != record.StatePending || o.Lease == nil || *o.Lease != *other || o.Attempts != 0 {
		t.Fatalf("after the lost lease: state %s, lease %v, attempts %d; want the other holder's lease untouched", o.State, o.Lease, o.Attempts)
	}
}

// A blob envelope whose blob is gone from the store is closed for good by the
// carrier (BODY_MISSING, worded as the carrier's refusal, its message closed as
// refused) without asking the relay anything.
func TestBlobMissingClosesTheEnvelope(t *testing.T) {
	h, br := blobHarness(t, Options{}, 64<<10)
	env, _ := h.enqueueBlob("http://relay.test", "", 100<<10)
	ref, _ := env.Blob()
	if err := os.Remove(filepath.Join(h.s.Dir(), "blobs", ref.Digest)); err != nil {
		t.Fatal(err)
	}
	h.start()
	h.kick()
	o := h.outbox(env.ID())
	if o.State != record.StateClosed || !strings.HasPrefix(o.LastError, record.CarrierRefusedPrefix) ||
		!strings.Contains(o.LastError, errcode.BodyMissing.String()) {
		t.Fatalf("outbox %s %q, want closed, refused by the carrier, BODY_MISSING", o.State, o.LastError)
	}
	if m := h.message(env.MessageID()); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByRefused {
		t.Fatalf("message %s/%s, want closed/refused", m.Status, m.ClosedBy)
	}
	if len(br.posts) != 0 || len(br.uploadLog()) != 0 {
		t.Fatalf("the relay was asked %d posts, %d uploads; want none", len(br.posts), len(br.uploadLog()))
	}
}

// recv receives from ch, failing the test after a minute.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatal("timed out waiting")
	}
	panic("unreachable")
}

// withPrefix returns a fresh UUID whose first hex digit is c: message ids that sort
// in a chosen order (the plan's (message, ordinal) order).
func withPrefix(c byte) string {
	id := []byte(uuid.NewString())
	id[0] = c
	return string(id)
}

// A blob envelope is never sent in a batch: in a run of small envelopes around it,
// the ones before go in one batch, the blob envelope alone (post, upload, post),
// and the ones after in the next batch; all are relayed.
func TestBlobEnvelopeIsSentAlone(t *testing.T) {
	h, br := blobHarness(t, Options{}, 64<<10)
	small := func(c byte, n int) []string {
		req := request("http://relay.test", n, h.clock.Now().Add(time.Hour))
		req.MessageID = withPrefix(c)
		if _, err := h.s.Enqueue(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range req.Envelopes {
			ids = append(ids, e.EnvelopeID)
		}
		return ids
	}
	before := small('1', 3)
	env, _ := h.enqueueBlob("http://relay.test", withPrefix('2'), 70<<10)
	after := small('3', 2)
	h.start()
	h.kick()
	for _, id := range append(append(slices.Clone(before), env.ID()), after...) {
		if o := h.outbox(id); o.State != record.StateRelayed {
			t.Fatalf("%s is %s, want relayed", id, o.State)
		}
	}
	br.mu.Lock()
	batches := slices.Clone(br.batches)
	br.mu.Unlock()
	for _, b := range batches {
		if slices.Contains(b, env.ID()) {
			t.Fatalf("the blob envelope went in a batch %v", b)
		}
	}
	if len(batches) != 2 || !slices.Equal(batches[0], before) || !slices.Equal(batches[1], after) {
		t.Fatalf("batches %v, want %v then %v", batches, before, after)
	}
	if len(br.posts) != 2 {
		t.Fatalf("%d posts of the blob envelope, want 2", len(br.posts))
	}
}

// A relay that goes away in the middle of an upload (the request breaks, the
// offset cannot be asked) puts the target in a wait, as an unreachable post does
// (no backoff of a failure); its probe, once the relay is back, resumes the upload
// from the relay's offset and the envelope is relayed.
func TestBlobUploadRelayGoneMidway(t *testing.T) {
	const chunk, syncEvery = 128 << 10, 32 << 10
	h, br := blobHarness(t, Options{UploadChunk: chunk}, syncEvery)
	br.cut = func(req int) int64 {
		if req == 2 {
			return 50_000
		}
		return -1
	}
	br.hold = func(context.Context) { br.mu.Lock(); br.down = true; br.mu.Unlock() }
	env, sealed := h.enqueueBlob("http://relay.test", "", 500<<10)
	h.start()
	h.kick()
	o := h.outbox(env.ID())
	if o.State != record.StatePending || o.UnreachableSince == 0 || o.Attempts != 1 {
		t.Fatalf("after the relay went away: state %s, unreachableSince %d, attempts %d; want pending, waiting, 1",
			o.State, o.UnreachableSince, o.Attempts)
	}
	if got := h.c.Stats().Attempts["unreachable"]; got != 1 {
		t.Fatalf("attempts by outcome %v, want one unreachable", h.c.Stats().Attempts)
	}
	br.mu.Lock()
	br.down = false
	br.mu.Unlock()
	h.runUntil(time.UnixMilli(o.NextAttemptAt))
	waitFor(t, "the blob envelope relayed after the probe", func() bool { return h.outbox(env.ID()).State == record.StateRelayed })
	if got := br.body(env.ID()); !bytes.Equal(got, sealed) {
		t.Fatal("the relay's body differs from the sealed blob")
	}
	if ups := br.uploadLog(); ups[2].offset != chunk+32<<10 {
		t.Fatalf("the probe's upload resumed at %d, want the relay's %d", ups[2].offset, chunk+32<<10)
	}
}
