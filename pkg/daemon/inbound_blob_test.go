package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// ---- a relay that serves blob bodies ----

// blobRelay is an inbox relay for one recipient that serves blob bodies with
// ranges, as pkg/relay answers them (206 + Content-Range from an offset, 416 at the
// end), and records every range asked, every byte served and every acknowledgement.
// serve, if set, says what the n-th download (from 1) of an envelope's body serves
// instead of the body (a damaged copy); cutAfter, if > 0, makes the next download
// stop after that many bytes: it signals cut and waits for ctx (the follower being
// stopped), then breaks the connection.
type blobRelay struct {
	srv *httptest.Server

	mu        sync.Mutex
	envs      []relayproto.InboxEnvelope
	bodies    map[string][]byte
	serve     func(id string, n int, body []byte) []byte
	downloads map[string]int
	ranges    []int64
	served    int64
	acked     []string
	cutAfter  int64
	cut       chan struct{}
}

func newBlobRelay(t *testing.T) *blobRelay {
	t.Helper()
	br := &blobRelay{bodies: map[string][]byte{}, downloads: map[string]int{}, cut: make(chan struct{}, 1)}
	br.srv = httptest.NewServer(http.HandlerFunc(br.handle))
	t.Cleanup(br.srv.Close)
	return br
}

// add puts a wire envelope, and its sealed body if it has one, in the inbox.
func (br *blobRelay) add(wire, sealed []byte) {
	env, err := envelope.Parse(wire)
	if err != nil {
		panic(err)
	}
	br.mu.Lock()
	defer br.mu.Unlock()
	br.envs = append(br.envs, relayproto.InboxEnvelope{Cursor: env.ID(), EnvelopeID: env.ID(), EnvelopeDigest: env.Digest(),
		ReceivedAt: time.Now().UnixMilli(), Envelope: wire})
	if sealed != nil {
		br.bodies[env.ID()] = sealed
	}
}

func (br *blobRelay) handle(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == relayproto.PathInbox:
		br.mu.Lock()
		page := relayproto.InboxPage{Envelopes: []relayproto.InboxEnvelope{}}
		for _, e := range br.envs {
			if !slices.Contains(br.acked, e.EnvelopeID) {
				page.Envelopes = append(page.Envelopes, e)
				page.Cursor = e.Cursor
			}
		}
		br.mu.Unlock()
		json.NewEncoder(w).Encode(page)
	case r.Method == http.MethodPost && r.URL.Path == relayproto.PathInboxAck:
		var req relayproto.AckRequest
		json.NewDecoder(r.Body).Decode(&req)
		br.mu.Lock()
		br.acked = append(br.acked, req.EnvelopeIDs...)
		br.mu.Unlock()
		json.NewEncoder(w).Encode(relayproto.AckResponse{Acknowledged: len(req.EnvelopeIDs)})
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, relayproto.PathInboxBodies):
		br.body(w, r, strings.TrimPrefix(r.URL.Path, relayproto.PathInboxBodies))
	default:
		http.NotFound(w, r)
	}
}

func (br *blobRelay) body(w http.ResponseWriter, r *http.Request, id string) {
	off := int64(0)
	if h := r.Header.Get("Range"); h != "" {
		o, ok := relayproto.RangeFrom(h)
		if !ok {
			http.Error(w, "bad range", http.StatusBadRequest)
			return
		}
		off = o
	}
	br.mu.Lock()
	data, ok := br.bodies[id]
	br.downloads[id]++
	if ok && br.serve != nil {
		data = br.serve(id, br.downloads[id], data)
	}
	br.ranges = append(br.ranges, off)
	cutAfter := br.cutAfter
	br.cutAfter = 0
	br.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(map[string]string{"code": relayproto.CodeBodyMissing})
		return
	}
	size := int64(len(data))
	if off >= size {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", size))
		w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(size-off, 10))
	status := http.StatusOK
	if r.Header.Get("Range") != "" {
		status = http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, size-1, size))
	}
	w.WriteHeader(status)
	rest := data[off:]
	if cutAfter > 0 && cutAfter < int64(len(rest)) {
		w.Write(rest[:cutAfter])
		w.(http.Flusher).Flush()
		br.count(cutAfter)
		br.cut <- struct{}{}
		<-r.Context().Done()
		panic(http.ErrAbortHandler)
	}
	n, _ := w.Write(rest)
	br.count(int64(n))
}

func (br *blobRelay) count(n int64) {
	br.mu.Lock()
	br.served += n
	br.mu.Unlock()
}

func (br *blobRelay) isAcked(id string) bool {
	br.mu.Lock()
	defer br.mu.Unlock()
	return slices.Contains(br.acked, id)
}

func (br *blobRelay) rangesAsked() []int64 {
	br.mu.Lock()
	defer br.mu.Unlock()
	return slices.Clone(br.ranges)
}

// acker tells whether an envelope was acknowledged at a relay.
type acker interface{ isAcked(envelopeID string) bool }

// ---- blob envelopes ----

// sealBlob seals plain random bytes from sender to recipient as a blob envelope and
// returns its wire bytes, the sealed blob and the plaintext. damage, if set, may
// change the sealed bytes in place as they are written, at their offset: the
// envelope then names the digest of the damaged bytes (a sender that signed a
// damaged blob), which only a chunk's tag can tell.
func sealBlob(t *testing.T, sender *identity.Identity, recipient identity.DID, plain int, damage func(p []byte, off int64)) (wire, sealed, body []byte) {
	t.Helper()
	body = make([]byte, plain)
	src := rand.New(rand.NewPCG(uint64(plain), 3))
	for i := range body {
		body[i] = byte(src.Uint32())
	}
	var out bytes.Buffer
	var dst io.Writer = &out
	if damage != nil {
		dst = &damager{w: &out, f: damage}
	}
	w, err := envelope.NewBlobMessage(sender, recipient, uuid.NewString(), time.Now().Add(time.Hour), time.Now(), dst)
	if err != nil {
		t.Fatal(err)
	}
	for rest := body; len(rest) > 0; {
		n := min(len(rest), 100_000)
		if _, err := w.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	_, wire, err = w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return wire, out.Bytes(), body
}

// damager changes what it is given in place before it passes it on (the blob
// writer hashes the bytes after they are written, so the digest is the damaged
// bytes').
type damager struct {
	w   io.Writer
	f   func(p []byte, off int64)
	off int64
}

func (d *damager) Write(p []byte) (int, error) {
	d.f(p, d.off)
	d.off += int64(len(p))
	return d.w.Write(p)
}

// blobFollower opens bob's daemon in home (created if needed; not running) and a
// follower of relayURL.
func blobFollower(t *testing.T, home, relayURL string) (*Daemon, *follower) {
	t.Helper()
	if _, err := LoadIdentity(home, "bob"); err != nil {
		if _, err := InitIdentity(home, "bob"); err != nil {
			t.Fatal(err)
		}
	}
	d, err := New(Options{Home: home, Identity: "bob", Logger: quiet, InboxRelay: relayURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, &follower{d: d, url: relayURL, kick: make(chan struct{}, 1), pending: map[string]*pendingReceipt{},
		rc: &relayproto.Client{BaseURL: relayURL}, bodies: &relayproto.Client{BaseURL: relayURL}}
}

func newSender(t *testing.T) *identity.Identity {
	t.Helper()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func observationOf(t *testing.T, d *Daemon, messageID string) *record.Observation {
	t.Helper()
	o, err := store.GetAs[*record.Observation](d.Store(), messageID)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// storedBlobs lists blobs/: the committed blobs and the partial or staged ones.
func storedBlobs(t *testing.T, d *Daemon) (blobs, partial []string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.Store().Dir(), "blobs"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			partial = append(partial, e.Name())
		} else {
			blobs = append(blobs, e.Name())
		}
	}
	return blobs, partial
}

// checkDelivered checks that env's blob is stored and observed: one observation
// with Blob (sealed size, plaintext length), a fact without a body, the receipt, the
// acknowledgement, and the plaintext that opens from the stored blob.
func checkDelivered(t *testing.T, d *Daemon, br acker, wire, sealed, body []byte) {
	t.Helper()
	env, _ := envelope.Parse(wire)
	ref, _ := env.Blob()
	o := observationOf(t, d, env.MessageID())
	if o == nil || o.Blob == nil {
		t.Fatalf("observation %+v, want one with its blob", o)
	}
	if *o.Blob != (record.ObservedBlob{EnvelopeID: env.ID(), Digest: ref.Digest, Size: int64(len(sealed)), BodySize: int64(len(body))}) {
		t.Fatalf("observed blob %+v", *o.Blob)
	}
	if len(o.Facts) != 1 || bytes.Contains(o.Facts[0], []byte(`"body"`)) {
		t.Fatalf("facts %s: want one, without a body", o.Facts)
	}
	if rc := receiptOf(t, d.Store(), env.ID()); rc == nil {
		t.Fatal("no receipt")
	}
	if !br.isAcked(env.ID()) {
		t.Fatal("not acknowledged at the relay")
	}
	b, err := d.Store().OpenBlob(ref.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, err := envelope.OpenBlob(d.id, ref, b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("the stored blob opens to %d bytes (%v), want the %d sent", len(got), err, len(body))
	}
}

// checkRefused checks that env was refused for reason: a refusal record, the
// acknowledgement (it is not fetched again), and no receipt, no observation, no
// delivery-status owed.
func checkRefused(t *testing.T, d *Daemon, br acker, wire []byte, reason string) {
	t.Helper()
	env, _ := envelope.Parse(wire)
	rf, err := store.GetAs[*record.Refusal](d.Store(), record.RefusalID(env.Digest()))
	if err != nil || rf == nil || rf.Reason != reason {
		t.Fatalf("refusal %+v (%v), want reason %s", rf, err, reason)
	}
	if rc := receiptOf(t, d.Store(), env.ID()); rc != nil {
		t.Fatalf("a receipt %+v of a refused envelope", rc)
	}
	if o := observationOf(t, d, env.MessageID()); o != nil {
		t.Fatalf("an observation of a refused envelope: %+v", o)
	}
	if m, err := store.GetAs[*record.Message](d.Store(), confirmationID(env.ID())); err != nil || m != nil {
		t.Fatalf("a delivery-status %+v (%v) for a refused envelope", m, err)
	}
	if !br.isAcked(env.ID()) {
		t.Fatal("a refused envelope is acknowledged at the relay (evidence kept), so it is not fetched again")
	}
}

// ---- tests ----

// A follower stopped in the middle of a body's download (its context cancelled)
// leaves nothing recorded and nothing acknowledged, keeps what it downloaded
// durably, and the follower of the restarted daemon on the same store resumes from
// there: its one download asks for the body from that offset, and no byte is
// served twice. The stored blob opens to the plaintext sent.
func TestBlobInboundResumesFromTheDurableOffset(t *testing.T) {
	br := newBlobRelay(t)
	home := t.TempDir()
	d, f := blobFollower(t, home, br.srv.URL)
	wire, sealed, body := sealBlob(t, newSender(t), d.DID(), 6<<20+12345, nil)
	br.add(wire, sealed)
	const k = 5<<20 + 777
	br.cutAfter = k
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, _, err := f.poll(ctx, 0); errc <- err }()
	select {
	case <-br.cut:
	case <-time.After(time.Minute):
		t.Fatal("the download never started")
	}
	env, _ := envelope.Parse(wire)
	// Stop the follower once it has written all the relay sent (the part grows
	// as it writes; it persists at least every blobSyncEvery and when stopped).
	part := filepath.Join(d.Store().Dir(), "blobs", "."+env.ID()+".part")
	eventually(t, time.Minute, "the part to hold what the relay sent", func() (bool, string) {
		fi, err := os.Stat(part)
		if err != nil {
			return false, err.Error()
		}
		return fi.Size() == k, fmt.Sprintf("%d bytes", fi.Size())
	})
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a poll stopped in the middle of a download reported success")
	}
	if br.isAcked(env.ID()) || receiptOf(t, d.Store(), env.ID()) != nil || observationOf(t, d, env.MessageID()) != nil {
		t.Fatal("an interrupted download left a receipt, an observation or an acknowledgement")
	}
	p, err := d.Store().PartialBlob(env.ID())
	if err != nil {
		t.Fatal(err)
	}
	held := p.Offset()
	p.Close()
	if held != k {
		t.Fatalf("the partial blob holds %d bytes, want the %d downloaded", held, k)
	}
	d.Close()
	// The restarted daemon's follower.
	d2, f2 := blobFollower(t, home, br.srv.URL)
	if _, _, err := f2.poll(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if got := br.rangesAsked(); !slices.Equal(got, []int64{0, k}) {
		t.Fatalf("downloads from %v, want from 0 then from the durable %d", got, k)
	}
	br.mu.Lock()
	served := br.served
	br.mu.Unlock()
	if served != int64(len(sealed)) {
		t.Fatalf("the relay served %d bytes of a %d-byte body", served, len(sealed))
	}
	checkDelivered(t, d2, br, wire, sealed, body)
	if _, partial := storedBlobs(t, d2); len(partial) != 0 {
		t.Fatalf("partial files left: %v", partial)
	}
}

// A relay that serves a damaged copy of a body (chunks reordered or one
// duplicated over the next: the same size; truncated; extended) has it refused by
// its digest or size after blobDownloadTries downloads from 0, each starting over;
// a relay that serves it damaged once and whole the next time has it delivered.
func TestBlobInboundRefusesADamagedCopy(t *testing.T) {
	const chunk = envelope.BlobChunkSize + 16
	swap := func(b []byte) []byte {
		c := slices.Clone(b)
		start := len(c) - 3*chunk - 100 // inside the payload, two whole chunks
		copy(c[start:], b[start+chunk:start+2*chunk])
		copy(c[start+chunk:], b[start:start+chunk])
		return c
	}
	dup := func(b []byte) []byte {
		c := slices.Clone(b)
		start := len(c) - 3*chunk - 100
		copy(c[start+chunk:], b[start:start+chunk])
		return c
	}
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
		reason string
		code   *errcode.Code
	}{
		{"reordered", swap, record.RefusedBodyDigest, errcode.BodyDigestMismatch},
		{"duplicated", dup, record.RefusedBodyDigest, errcode.BodyDigestMismatch},
		{"bit flipped", func(b []byte) []byte { c := slices.Clone(b); c[len(c)/2] ^= 1; return c }, record.RefusedBodyDigest, errcode.BodyDigestMismatch},
		{"truncated", func(b []byte) []byte { return b[:len(b)-chunk] }, record.RefusedBodySize, errcode.BodySizeMismatch},
		{"extended", func(b []byte) []byte { return append(slices.Clone(b), b[len(b)-chunk:]...) }, record.RefusedBodySize, errcode.BodySizeMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := newBlobRelay(t)
			d, f := blobFollower(t, t.TempDir(), br.srv.URL)
			br.serve = func(_ string, _ int, b []byte) []byte { return tc.damage(b) }
			wire, sealed, _ := sealBlob(t, newSender(t), d.DID(), 5*envelope.BlobChunkSize+999, nil)
			br.add(wire, sealed)
			if _, _, err := f.poll(context.Background(), 0); err != nil {
				t.Fatal(err)
			}
			checkRefused(t, d, br, wire, tc.reason)
			if got := br.rangesAsked(); !slices.Equal(got, make([]int64, blobDownloadTries)) {
				t.Fatalf("downloads from %v, want %d from 0", got, blobDownloadTries)
			}
			if n := f.redownloads.Load(); n != blobDownloadTries {
				t.Fatalf("%d mismatched downloads counted, want %d", n, blobDownloadTries)
			}
			if blobs, partial := storedBlobs(t, d); len(blobs)+len(partial) != 0 {
				t.Fatalf("blobs/ holds %v %v after a refusal of a damaged copy", blobs, partial)
			}
		})
	}
	t.Run("damaged once", func(t *testing.T) {
		br := newBlobRelay(t)
		d, f := blobFollower(t, t.TempDir(), br.srv.URL)
		br.serve = func(_ string, n int, b []byte) []byte {
			if n == 1 {
				return swap(b)
			}
			return b
		}
		wire, sealed, body := sealBlob(t, newSender(t), d.DID(), 5*envelope.BlobChunkSize+999, nil)
		br.add(wire, sealed)
		if _, _, err := f.poll(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		checkDelivered(t, d, br, wire, sealed, body)
		if got := br.rangesAsked(); !slices.Equal(got, []int64{0, 0}) {
			t.Fatalf("downloads from %v, want two from 0", got)
		}
	})
}

// A body whose sender sealed a damaged chunk (a bit flipped after sealing, the
// envelope naming the damaged bytes' digest: the size and digest match, only the
// chunk's tag tells) is refused as BODY_CHUNK_INVALID: never observed, no receipt,
// no delivery-status. A chunk-level damage of any kind — reordered, duplicated,
// truncated at a chunk boundary, bit flipped — with a reference naming the damaged
// bytes is refused the same way by receiveBlob.
func TestBlobInboundRefusesAnInvalidChunk(t *testing.T) {
	br := newBlobRelay(t)
	d, f := blobFollower(t, t.TempDir(), br.srv.URL)
	const at = 3*envelope.BlobChunkSize + 500 // inside the fourth chunk
	wire, sealed, _ := sealBlob(t, newSender(t), d.DID(), 6*envelope.BlobChunkSize, func(p []byte, off int64) {
		if at >= off && at < off+int64(len(p)) {
			p[at-off] ^= 0x40
		}
	})
	br.add(wire, sealed)
	if _, _, err := f.poll(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	checkRefused(t, d, br, wire, record.RefusedBodyChunk)

	// Chunk-level damage behind a reference that names it.
	const chunk = envelope.BlobChunkSize + 16
	wire, sealed, _ = sealBlob(t, newSender(t), d.DID(), 6*envelope.BlobChunkSize+10, nil)
	env, _ := envelope.Parse(wire)
	ref, _ := env.Blob()
	last := len(sealed) - (10 + 16) - 6*chunk // where the first payload chunk begins
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
	}{
		{"reordered", func(b []byte) []byte {
			c := slices.Clone(b)
			copy(c[last+chunk:], b[last+2*chunk:last+3*chunk])
			copy(c[last+2*chunk:], b[last+chunk:last+2*chunk])
			return c
		}},
		{"duplicated", func(b []byte) []byte {
			return slices.Concat(b[:last+2*chunk], b[last+chunk:])
		}},
		{"truncated", func(b []byte) []byte { return b[:last+4*chunk] }},
		{"bit flipped", func(b []byte) []byte { c := slices.Clone(b); c[last+chunk+7] ^= 1; return c }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := tc.damage(sealed)
			ref := ref
			ref.Digest, ref.Size = envelope.Digest(bad), int64(len(bad))
			br.mu.Lock()
			br.bodies[ref.EnvelopeID] = bad
			br.mu.Unlock()
			unlock := lockBlob(d.st, ref.EnvelopeID)
			_, err := f.receiveBlob(context.Background(), ref)
			unlock()
			var rf *blobRefusal
			if !errors.As(err, &rf) || rf.reason != record.RefusedBodyChunk || !errors.Is(err, errcode.BodyChunkInvalid) {
				t.Fatalf("receiveBlob: %v, want a refusal %s (BODY_CHUNK_INVALID)", err, record.RefusedBodyChunk)
			}
		})
	}
}

// A body over the daemon's limit is refused as BODY_TOO_LARGE before any byte of
// it is downloaded.
func TestBlobInboundRefusesABodyOverTheLimit(t *testing.T) {
	br := newBlobRelay(t)
	d, f := blobFollower(t, t.TempDir(), br.srv.URL)
	wire, sealed, _ := sealBlob(t, newSender(t), d.DID(), 300<<10, nil)
	d.opts.MaxBody = int64(len(sealed)) - 1
	br.add(wire, sealed)
	if _, _, err := f.poll(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	checkRefused(t, d, br, wire, record.RefusedBodyTooLarge)
	if got := br.rangesAsked(); len(got) != 0 {
		t.Fatalf("downloads from %v of a body over the limit", got)
	}
	// At the limit it is taken.
	wire, sealed, body := sealBlob(t, newSender(t), d.DID(), 300<<10, nil)
	d.opts.MaxBody = int64(len(sealed))
	br.add(wire, sealed)
	if _, _, err := f.poll(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, d, br, wire, sealed, body)
}

// Followers racing on one blob envelope in one store (many at once, from a start
// gate) store one blob and one observation and one receipt; every one of them
// either records it or finds it recorded; no partial file is left.
func TestBlobInboundConcurrentFollowers(t *testing.T) {
	br := newBlobRelay(t)
	d, _ := blobFollower(t, t.TempDir(), br.srv.URL)
	wire, sealed, body := sealBlob(t, newSender(t), d.DID(), 700<<10, nil)
	br.add(wire, sealed)
	const workers = 8
	gate := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, workers)
	acks := make([]bool, workers)
	ie := relayproto.InboxEnvelope{EnvelopeID: mustID(t, wire), Envelope: wire}
	for i := range workers {
		f := &follower{d: d, url: br.srv.URL, kick: make(chan struct{}, 1), pending: map[string]*pendingReceipt{},
			rc: &relayproto.Client{BaseURL: br.srv.URL}, bodies: &relayproto.Client{BaseURL: br.srv.URL}}
		wg.Go(func() {
			<-gate
			_, acks[i], errs[i] = f.processEnvelope(context.Background(), ie)
		})
	}
	close(gate)
	wg.Wait()
	for i := range workers {
		if errs[i] != nil || !acks[i] {
			t.Errorf("follower %d: ack %v, err %v; want each to record it or find it recorded", i, acks[i], errs[i])
		}
	}
	if n := countKind(t, d, record.KindRefusals); n != 0 {
		ids, _ := d.Store().List(record.KindRefusals)
		rf, _ := store.GetAs[*record.Refusal](d.Store(), ids[0])
		t.Fatalf("%d refusals: %+v", n, rf)
	}
	// Acknowledge as poll would, then check the store.
	env, _ := envelope.Parse(wire)
	if _, err := (&relayproto.Client{BaseURL: br.srv.URL}).Ack(context.Background(), d.id, []string{env.ID()}); err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, d, br, wire, sealed, body)
	if n := countKind(t, d, record.KindObservations); n != 1 {
		t.Fatalf("%d observations, want 1", n)
	}
	if n := countKind(t, d, record.KindReceipts); n != 1 {
		t.Fatalf("%d receipts, want 1", n)
	}
	blobs, partial := storedBlobs(t, d)
	if len(blobs) != 1 || len(partial) != 0 {
		t.Fatalf("blobs/ holds %v and partial %v; want one blob", blobs, partial)
	}
	if got := br.rangesAsked(); len(got) != 1 {
		t.Fatalf("%d downloads of one body, want 1", len(got))
	}
}

func mustID(t *testing.T, wire []byte) string {
	t.Helper()
	env, err := envelope.Parse(wire)
	if err != nil {
		t.Fatal(err)
	}
	return env.ID()
}

// realRelay is a pkg/relay server seen as an acker: an envelope is acknowledged
// once it left the recipient's inbox.
type realRelay struct {
	t   *testing.T
	url string
	id  *identity.Identity
}

func (r realRelay) isAcked(envelopeID string) bool {
	page, err := (&relayproto.Client{BaseURL: r.url}).Fetch(context.Background(), r.id, "", 0)
	if err != nil {
		r.t.Fatal(err)
	}
	return !slices.ContainsFunc(page.Envelopes, func(e relayproto.InboxEnvelope) bool { return e.EnvelopeID == envelopeID })
}

// postBlob delivers a blob envelope to a relay as a carrier does: post, upload
// the body from the relay's offset, post again for the receipt.
func postBlob(t *testing.T, relayURL string, wire, sealed []byte) {
	t.Helper()
	ctx := context.Background()
	c := &relayproto.Client{BaseURL: relayURL}
	_, _, err := c.Post(ctx, wire)
	var bi *relayproto.BodyIncompleteError
	if !errors.As(err, &bi) {
		t.Fatalf("post of a blob envelope: %v, want BODY_INCOMPLETE", err)
	}
	env, _ := envelope.Parse(wire)
	if _, err := c.UploadBody(ctx, env.ID(), bi.Offset, bytes.NewReader(sealed[bi.Offset:]), int64(len(sealed))-bi.Offset); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Post(ctx, wire); err != nil {
		t.Fatal(err)
	}
}

// Through a pkg/relay server: a blob body posted and uploaded by its sender is
// downloaded, verified and observed by the recipient's follower; a body whose
// sender sealed a damaged chunk (the relay holds it whole: its digest matches) is
// refused BODY_CHUNK_INVALID and acknowledged, with no receipt or observation.
func TestBlobInboundThroughARelay(t *testing.T) {
	relayURL := newTestRelay(t)
	d, f := blobFollower(t, t.TempDir(), relayURL)
	rr := realRelay{t: t, url: relayURL, id: d.id}
	wire, sealed, body := sealBlob(t, newSender(t), d.DID(), 3<<20+5, nil)
	postBlob(t, relayURL, wire, sealed)
	if _, _, err := f.poll(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, d, rr, wire, sealed, body)

	const at = 2*envelope.BlobChunkSize + 3
	wire, sealed, _ = sealBlob(t, newSender(t), d.DID(), 4*envelope.BlobChunkSize, func(p []byte, off int64) {
		if at >= off && at < off+int64(len(p)) {
			p[at-off] ^= 1
		}
	})
	postBlob(t, relayURL, wire, sealed)
	if _, _, err := f.poll(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	checkRefused(t, d, rr, wire, record.RefusedBodyChunk)
}
