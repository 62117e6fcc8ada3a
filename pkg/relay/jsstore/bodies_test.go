package jsstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
)

// smallSeg is the segment size of most tests: two chunks, so that a body of a
// few hundred KiB spans many segments.
const smallSeg = 256 << 10

// bodiesOn opens a Bodies of its own connection (a relay process of its own,
// with its own locks) on the single node s.
func bodiesOn(t *testing.T, s *server.Server, seg int64, hooks *jsstore.BodiesHooks) (*jsstore.Bodies, jetstream.JetStream) {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, s.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := jsstore.OpenBodies(context.Background(), js, jsstore.BodiesOptions{Replicas: 1, SyncAlways: true, SegmentSize: seg, Hooks: hooks})
	if err != nil {
		t.Fatalf("OpenBodies: %v", err)
	}
	return b, js
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

func sum(p []byte) string {
	s := sha256.Sum256(p)
	return hex.EncodeToString(s[:])
}

func readBody(t *testing.T, b *jsstore.Bodies, id string, off int64) []byte {
	t.Helper()
	rc, err := b.Open(context.Background(), id, off)
	if err != nil {
		t.Fatalf("Open %d: %v", off, err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read from %d: %v", off, err)
	}
	return got
}

func offset(t *testing.T, b *jsstore.Bodies, id string) int64 {
	t.Helper()
	o, err := b.Offset(context.Background(), id)
	if err != nil {
		t.Fatalf("Offset: %v", err)
	}
	return o
}

// liveChunkSubjects returns the chunk subjects stored in the bucket's stream
// and the chunk subjects the live segment objects name: equal sets mean no
// chunk is left over (a replaced partial segment, a lost race) and none is
// missing.
func liveChunkSubjects(t *testing.T, js jetstream.JetStream) (stored, named []string) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, "OBJ_"+jsstore.DefaultBodiesBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("$O."+jsstore.DefaultBodiesBucket+".C.>"))
	if err != nil {
		t.Fatal(err)
	}
	for s := range info.State.Subjects {
		stored = append(stored, s)
	}
	obs, err := js.ObjectStore(ctx, jsstore.DefaultBodiesBucket)
	if err != nil {
		t.Fatal(err)
	}
	list, err := obs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		t.Fatal(err)
	}
	for _, o := range list {
		named = append(named, "$O."+jsstore.DefaultBodiesBucket+".C."+o.NUID)
	}
	slices.Sort(stored)
	slices.Sort(named)
	return stored, named
}

// A body appended in pieces of uneven sizes (one byte, less than a chunk,
// exactly to a segment boundary, several segments at once) reads back equal
// from any offset; its segments are ordinary object store objects (the
// nats.go client reads them with their digests checked), all full but the
// last; extending a partial segment leaves no chunk of the old one behind.
func TestBodiesAppendUnevenReadBack(t *testing.T) {
	s := natstest.Node(t)
	b, js := bodiesOn(t, s, smallSeg, nil)
	ctx := context.Background()
	id := uuid.NewString()
	body := randomBytes(1, 5*smallSeg+12345)
	pieces := []int{1, 99, 128<<10 - 100, smallSeg - 128<<10, 3 * smallSeg / 2, 7, smallSeg + 1}
	var off int64
	for k := 0; off < int64(len(body)); k++ {
		n := len(body) - int(off)
		if k < len(pieces) && pieces[k] < n {
			n = pieces[k]
		}
		d, err := b.Append(ctx, id, off, bytes.NewReader(body[off:off+int64(n)]))
		if err != nil || d != off+int64(n) {
			t.Fatalf("Append %d bytes at %d = %d, %v; want %d", n, off, d, err, off+int64(n))
		}
		off = d
		if o := offset(t, b, id); o != d {
			t.Fatalf("Offset after append = %d, want %d", o, d)
		}
	}
	for _, from := range []int64{0, 1, 100, smallSeg - 1, smallSeg, smallSeg + 1, 3*smallSeg + 4567, int64(len(body)) - 1, int64(len(body))} {
		if got := readBody(t, b, id, from); !bytes.Equal(got, body[from:]) {
			t.Fatalf("read from %d: %d bytes (sha %s), want %d (sha %s)", from, len(got), sum(got), len(body)-int(from), sum(body[from:]))
		}
	}
	if _, err := b.Open(ctx, id, int64(len(body))+1); !errors.Is(err, jsstore.ErrBodyRange) {
		t.Fatalf("Open beyond the end: %v, want ErrBodyRange", err)
	}
	for name, dig := range map[string]func(context.Context, string) (string, int64, error){"Digest": b.Digest, "ReadDigest": b.ReadDigest} {
		digest, size, err := dig(ctx, id)
		if err != nil || digest != sum(body) || size != int64(len(body)) {
			t.Fatalf("%s = %s %d %v, want %s %d", name, digest, size, err, sum(body), len(body))
		}
	}

	obs, err := js.ObjectStore(ctx, jsstore.DefaultBodiesBucket)
	if err != nil {
		t.Fatal(err)
	}
	var joined []byte
	for i := int64(0); i < 6; i++ {
		seg, err := obs.GetBytes(ctx, jsstore.SegmentName(id, i))
		if err != nil {
			t.Fatalf("object store Get segment %d: %v", i, err)
		}
		if i < 5 && len(seg) != smallSeg {
			t.Fatalf("segment %d has %d bytes, want %d", i, len(seg), smallSeg)
		}
		joined = append(joined, seg...)
	}
	if !bytes.Equal(joined, body) {
		t.Fatal("the segment objects joined are not the body")
	}
	if _, err := obs.GetInfo(ctx, jsstore.SegmentName(id, 6)); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("segment 6: %v, want not found", err)
	}
	if stored, named := liveChunkSubjects(t, js); !slices.Equal(stored, named) {
		t.Fatalf("chunk subjects stored %v, named by segments %v", stored, named)
	}
}

// A new Bodies (another relay process, or this one restarted) on the same
// server reads the durable offset and resumes from it; it takes the bucket's
// segment size and refuses another.
func TestBodiesOffsetAfterReopen(t *testing.T) {
	s := natstest.Node(t)
	b1, _ := bodiesOn(t, s, smallSeg, nil)
	ctx := context.Background()
	id := uuid.NewString()
	body := randomBytes(2, 2*smallSeg+777)
	if d, err := b1.Append(ctx, id, 0, bytes.NewReader(body[:smallSeg+10])); err != nil || d != smallSeg+10 {
		t.Fatalf("Append = %d, %v", d, err)
	}
	b2, _ := bodiesOn(t, s, 0, nil)
	if b2.SegmentSize() != smallSeg {
		t.Fatalf("reopened segment size %d, want the bucket's %d", b2.SegmentSize(), smallSeg)
	}
	o := offset(t, b2, id)
	if o != smallSeg+10 {
		t.Fatalf("Offset after reopen = %d, want %d", o, smallSeg+10)
	}
	if d, err := b2.Append(ctx, id, o, bytes.NewReader(body[o:])); err != nil || d != int64(len(body)) {
		t.Fatalf("resumed Append = %d, %v", d, err)
	}
	if got := readBody(t, b1, id, 0); !bytes.Equal(got, body) {
		t.Fatal("the resumed body differs")
	}
	if offset(t, b1, uuid.NewString()) != 0 {
		t.Fatal("an unknown body has a non-zero offset")
	}
	js, err := jetstream.New(natstest.Connect(t, s.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jsstore.OpenBodies(ctx, js, jsstore.BodiesOptions{Replicas: 1, SyncAlways: true, SegmentSize: 2 * smallSeg}); err == nil {
		t.Fatal("OpenBodies with another segment size than the bucket's succeeded")
	}
	if _, err := jsstore.OpenBodies(ctx, js, jsstore.BodiesOptions{Bucket: "OTHER", Replicas: 1}); !errors.Is(err, jsstore.ErrNotDurable) {
		t.Fatalf("OpenBodies with one replica, not synced: %v, want ErrNotDurable", err)
	}
}

// failReader fails the test if it is read.
type failReader struct{ t *testing.T }

func (f failReader) Read([]byte) (int, error) {
	f.t.Error("Append read the body after refusing the offset")
	return 0, io.EOF
}

// An Append at another offset than the durable one is refused with the
// durable offset, reads nothing and changes nothing.
func TestBodiesOffsetMismatch(t *testing.T) {
	s := natstest.Node(t)
	b, _ := bodiesOn(t, s, smallSeg, nil)
	ctx := context.Background()
	id := uuid.NewString()
	body := randomBytes(3, 1000)
	if _, err := b.Append(ctx, id, 0, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 999, 1001, smallSeg} {
		d, err := b.Append(ctx, id, off, failReader{t})
		var oe *jsstore.OffsetError
		if !errors.As(err, &oe) || !errors.Is(err, jsstore.ErrOffsetMismatch) || oe.Durable != 1000 || oe.Offset != off || d != 1000 {
			t.Fatalf("Append at %d = %d, %v; want an *OffsetError with durable 1000", off, d, err)
		}
	}
	if got := readBody(t, b, id, 0); !bytes.Equal(got, body) {
		t.Fatal("a refused Append changed the body")
	}
}

// errReader hands out p, then fails.
type errReader struct {
	p   []byte
	err error
}

func (e *errReader) Read(q []byte) (int, error) {
	if len(e.p) == 0 {
		return 0, e.err
	}
	n := copy(q, e.p)
	e.p = e.p[n:]
	return n, nil
}

// A request body that breaks off (the carrier was killed) keeps every byte
// read before: Append commits them and returns the reader's error with the
// new durable offset, and the upload resumes from there.
func TestBodiesReaderErrorCommitsBytesRead(t *testing.T) {
	s := natstest.Node(t)
	b, _ := bodiesOn(t, s, smallSeg, nil)
	ctx := context.Background()
	id := uuid.NewString()
	body := randomBytes(4, 3*smallSeg)
	broken := errors.New("connection reset")
	cut := smallSeg + 70000 // one full segment, then part of the next
	d, err := b.Append(ctx, id, 0, &errReader{p: body[:cut], err: broken})
	if !errors.Is(err, broken) || d != int64(cut) {
		t.Fatalf("Append of a broken body = %d, %v; want %d and the reader's error", d, err, cut)
	}
	if o := offset(t, b, id); o != int64(cut) {
		t.Fatalf("Offset = %d, want %d", o, cut)
	}
	if d, err := b.Append(ctx, id, int64(cut), bytes.NewReader(body[cut:])); err != nil || d != int64(len(body)) {
		t.Fatalf("resumed Append = %d, %v", d, err)
	}
	if got := readBody(t, b, id, 0); !bytes.Equal(got, body) {
		t.Fatal("the resumed body differs")
	}
}

// Many Appends at offset 0 of one envelope at once, each with its own bytes,
// spread over several Bodies (relay processes with their own locks) and
// started together: exactly one succeeds, every other is refused with
// ErrOffsetMismatch, and the body is exactly the winner's bytes. Then the
// same on a partial segment (appends at its end, extending it).
func TestBodiesConcurrentAppendsOneWins(t *testing.T) {
	s := natstest.Node(t)
	const procs, perProc = 4, 4
	var bs []*jsstore.Bodies
	var js jetstream.JetStream
	for range procs {
		b, j := bodiesOn(t, s, smallSeg, nil)
		bs, js = append(bs, b), j
	}
	ctx := context.Background()
	for _, start := range []int{0, 1000} {
		id := uuid.NewString()
		prefix := randomBytes(99, start)
		if start > 0 {
			if _, err := bs[0].Append(ctx, id, 0, bytes.NewReader(prefix)); err != nil {
				t.Fatal(err)
			}
		}
		const n = 3*smallSeg/2 + 5
		bodies := make([][]byte, procs*perProc)
		errs := make([]error, len(bodies))
		durables := make([]int64, len(bodies))
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for w := range bodies {
			bodies[w] = randomBytes(uint64(100+w), n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				durables[w], errs[w] = bs[w%procs].Append(ctx, id, int64(start), bytes.NewReader(bodies[w]))
			}()
		}
		close(gate)
		wg.Wait()
		winner := -1
		for w, err := range errs {
			switch {
			case err == nil:
				if winner >= 0 {
					t.Fatalf("start %d: Appends %d and %d both succeeded", start, winner, w)
				}
				if durables[w] != int64(start+n) {
					t.Fatalf("start %d: the winner's durable %d, want %d", start, durables[w], start+n)
				}
				winner = w
			case !errors.Is(err, jsstore.ErrOffsetMismatch):
				t.Fatalf("start %d: Append %d: %v, want success or ErrOffsetMismatch", start, w, err)
			}
		}
		if winner < 0 {
			t.Fatalf("start %d: no Append succeeded", start)
		}
		want := append(slices.Clone(prefix), bodies[winner]...)
		if got := readBody(t, bs[1], id, 0); !bytes.Equal(got, want) {
			t.Fatalf("start %d: the body (%d bytes, sha %s) is not the winner's (%d, sha %s)", start, len(got), sum(got), len(want), sum(want))
		}
	}
	if stored, named := liveChunkSubjects(t, js); !slices.Equal(stored, named) {
		t.Fatalf("chunk subjects stored %d, named by segments %d: the losers' chunks were left", len(stored), len(named))
	}
}

// Two relay processes extend one partial segment at the same offset, the
// second committing exactly between the first's chunks and its commit (a
// hook): the compare-and-set on the segment's meta makes the first lose with
// the second's durable offset, and the body is the second's bytes.
func TestBodiesRaceAcrossProcessesAtCommit(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	id := uuid.NewString()
	var other *jsstore.Bodies
	second := randomBytes(6, 5000)
	var once sync.Once
	var otherErr error
	first, js := bodiesOn(t, s, smallSeg, &jsstore.BodiesHooks{BeforeCommit: func(name string) {
		if name != jsstore.SegmentName(id, 0) {
			return
		}
		once.Do(func() { _, otherErr = other.Append(ctx, id, 100, bytes.NewReader(second)) })
	}})
	other, _ = bodiesOn(t, s, smallSeg, nil)
	prefix := randomBytes(5, 100)
	if _, err := other.Append(ctx, id, 0, bytes.NewReader(prefix)); err != nil {
		t.Fatal(err)
	}
	d, err := first.Append(ctx, id, 100, bytes.NewReader(randomBytes(7, 3000)))
	if otherErr != nil {
		t.Fatalf("the other process's Append: %v", otherErr)
	}
	var oe *jsstore.OffsetError
	if !errors.As(err, &oe) || oe.Durable != 5100 || d != 5100 {
		t.Fatalf("the losing Append = %d, %v; want an *OffsetError with durable 5100", d, err)
	}
	if got, want := readBody(t, first, id, 0), append(prefix, second...); !bytes.Equal(got, want) {
		t.Fatal("the body is not the winner's")
	}
	if stored, named := liveChunkSubjects(t, js); !slices.Equal(stored, named) {
		t.Fatalf("chunk subjects stored %v, named %v", stored, named)
	}
}

// aheadReader hands out size pseudo-random bytes, hashing them, and at every
// 4 MiB it has handed out it asks the store (through another Bodies) for the
// durable offset: more than two segments handed out and not durable means
// Append holds them somewhere, and the test fails.
type aheadReader struct {
	probe     *jsstore.Bodies
	id        string
	rng       *rand.Rand
	size, n   int64
	hash      hash.Hash
	maxAhead  int64
	nextCheck int64
	checks    int
}

func (a *aheadReader) Read(p []byte) (int, error) {
	if a.n == a.size {
		return 0, io.EOF
	}
	if a.n >= a.nextCheck {
		d, err := a.probe.Offset(context.Background(), a.id)
		if err != nil {
			return 0, err
		}
		if ahead := a.n - d; ahead > a.maxAhead {
			return 0, fmt.Errorf("read %d bytes ahead of the durable offset %d, more than %d", ahead, d, a.maxAhead)
		}
		a.nextCheck += 4 << 20
		a.checks++
	}
	if int64(len(p)) > a.size-a.n {
		p = p[:a.size-a.n]
	}
	for i := range p {
		p[i] = byte(a.rng.Uint32())
	}
	a.hash.Write(p)
	a.n += int64(len(p))
	return len(p), nil
}

// A 64 MiB body streams through Append with the default 8 MiB segments
// without Append ever reading more than two segments ahead of what is
// durable, and streams back out through Open with an equal SHA-256.
func TestBodiesLargeBodyStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB")
	}
	s := natstest.Node(t)
	b, _ := bodiesOn(t, s, 0, nil)
	probe, _ := bodiesOn(t, s, 0, nil)
	if b.SegmentSize() != jsstore.SegmentSize {
		t.Fatalf("default segment size %d, want %d", b.SegmentSize(), jsstore.SegmentSize)
	}
	ctx := context.Background()
	id := uuid.NewString()
	h := sha256.New()
	const size = 64 << 20
	r := &aheadReader{probe: probe, id: id, rng: rand.New(rand.NewPCG(8, 9)), size: size, hash: h, maxAhead: 2 * jsstore.SegmentSize}
	d, err := b.Append(ctx, id, 0, r)
	if err != nil || d != size || r.checks != size/(4<<20) {
		t.Fatalf("Append = %d, %v (%d checks of the offset)", d, err, r.checks)
	}
	want := hex.EncodeToString(h.Sum(nil))
	for name, dig := range map[string]func(context.Context, string) (string, int64, error){"Digest": b.Digest, "ReadDigest": b.ReadDigest} {
		digest, n, err := dig(ctx, id)
		if err != nil || n != size || digest != want {
			t.Fatalf("%s = %s %d %v, want %s %d", name, digest, n, err, want, size)
		}
	}
}

// List names every body with its size; Delete removes every segment and
// chunk of the body and nothing of another body; the body then reads as empty
// with offset 0, is no longer listed, and a new upload of it starts from 0.
func TestBodiesDelete(t *testing.T) {
	s := natstest.Node(t)
	b, js := bodiesOn(t, s, smallSeg, nil)
	ctx := context.Background()
	id, keep := uuid.NewString(), uuid.NewString()
	body, kept := randomBytes(10, 4*smallSeg+3), randomBytes(11, smallSeg+9)
	for _, x := range []struct {
		id string
		p  []byte
	}{{id, body}, {keep, kept}} {
		if _, err := b.Append(ctx, x.id, 0, bytes.NewReader(x.p)); err != nil {
			t.Fatal(err)
		}
	}
	list, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []jsstore.BodyInfo{{EnvelopeID: id, Size: int64(len(body)), Segments: 5}, {EnvelopeID: keep, Size: int64(len(kept)), Segments: 2}}
	slices.SortFunc(want, func(x, y jsstore.BodyInfo) int { return strings.Compare(x.EnvelopeID, y.EnvelopeID) })
	for i := range list {
		list[i].Modified = time.Time{}
	}
	if !slices.Equal(list, want) {
		t.Fatalf("List = %+v, want %+v", list, want)
	}
	if err := b.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if o := offset(t, b, id); o != 0 {
		t.Fatalf("Offset after Delete = %d", o)
	}
	if got := readBody(t, b, id, 0); len(got) != 0 {
		t.Fatalf("read %d bytes of a deleted body", len(got))
	}
	obs, err := js.ObjectStore(ctx, jsstore.DefaultBodiesBucket)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := obs.List(ctx, jetstream.ListObjectsShowDeleted())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if strings.HasPrefix(o.Name, id) {
			t.Fatalf("object %s (deleted %t) is left of the deleted body", o.Name, o.Deleted)
		}
	}
	if stored, named := liveChunkSubjects(t, js); !slices.Equal(stored, named) || len(named) != 2 {
		t.Fatalf("chunk subjects stored %v, named %v; want the kept body's two segments", stored, named)
	}
	if got := readBody(t, b, keep, 0); !bytes.Equal(got, kept) {
		t.Fatal("Delete changed another body")
	}
	if list, err := b.List(ctx); err != nil || len(list) != 1 || list[0].EnvelopeID != keep ||
		list[0].Size != int64(len(kept)) || list[0].Segments != 2 || list[0].Modified.IsZero() {
		t.Fatalf("List after Delete = %+v, %v; want the kept body only", list, err)
	}
	if err := b.Delete(ctx, id); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	again := randomBytes(12, smallSeg+1)
	if d, err := b.Append(ctx, id, 0, bytes.NewReader(again)); err != nil || d != int64(len(again)) {
		t.Fatalf("Append after Delete = %d, %v", d, err)
	}
	if got := readBody(t, b, id, 0); !bytes.Equal(got, again) {
		t.Fatal("the body uploaded again differs")
	}
}

// A segment deleted through the object store API (a deleted marker) does not
// count; the upload resumes at its start and writes it again. A segment
// written by a plain object store client reads as well. A chunk missing under
// a live segment is detected on read (ErrBodyCorrupt), not returned as a
// shorter body.
func TestBodiesDeletedMarkerAndMissingChunk(t *testing.T) {
	s := natstest.Node(t)
	b, js := bodiesOn(t, s, smallSeg, nil)
	ctx := context.Background()
	id := uuid.NewString()
	body := randomBytes(13, 2*smallSeg+500)
	if _, err := b.Append(ctx, id, 0, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctx, jsstore.DefaultBodiesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Delete(ctx, jsstore.SegmentName(id, 2)); err != nil {
		t.Fatal(err)
	}
	if o := offset(t, b, id); o != 2*smallSeg {
		t.Fatalf("Offset with the last segment deleted = %d, want %d", o, 2*smallSeg)
	}
	if d, err := b.Append(ctx, id, 2*smallSeg, bytes.NewReader(body[2*smallSeg:])); err != nil || d != int64(len(body)) {
		t.Fatalf("Append over a deleted marker = %d, %v", d, err)
	}
	if got := readBody(t, b, id, 0); !bytes.Equal(got, body) {
		t.Fatal("the body differs")
	}
	// The last segment written again by a plain object store client (no
	// chunk list, no hash state in its meta): read by subject, and its
	// digest computed by reading.
	if _, err := obs.PutBytes(ctx, jsstore.SegmentName(id, 2), body[2*smallSeg:]); err != nil {
		t.Fatal(err)
	}
	if got := readBody(t, b, id, smallSeg+5); !bytes.Equal(got, body[smallSeg+5:]) {
		t.Fatal("the body with a foreign last segment differs")
	}
	if digest, n, err := b.Digest(ctx, id); err != nil || digest != sum(body) || n != int64(len(body)) {
		t.Fatalf("Digest with a foreign last segment = %s %d %v", digest, n, err)
	}

	info, err := obs.GetInfo(ctx, jsstore.SegmentName(id, 1))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "OBJ_"+jsstore.DefaultBodiesBucket)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, "$O."+jsstore.DefaultBodiesBucket+".C."+info.NUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, m.Sequence); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.ReadDigest(ctx, id); !errors.Is(err, jsstore.ErrBodyCorrupt) {
		t.Fatalf("ReadDigest with a chunk missing: %v, want ErrBodyCorrupt", err)
	}
}

// Chunks no segment names (a relay process died while writing a segment)
// are purged by Sweep once older than its cutoff; chunks of live segments and
// of a segment being written at that moment by this Bodies are kept.
func TestBodiesSweepPurgesOrphanChunks(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	var b *jsstore.Bodies
	during, sweeps := 0, 0
	var duringErr error
	b, js := bodiesOn(t, s, smallSeg, &jsstore.BodiesHooks{BeforeCommit: func(string) {
		n, err := b.Sweep(ctx, time.Now().Add(time.Hour)) // before each of the body's three commits
		during, sweeps = during+n, sweeps+1
		duringErr = errors.Join(duringErr, err)
	}})
	id := uuid.NewString()
	body := randomBytes(20, 2*smallSeg+10)
	orphan := "$O." + jsstore.DefaultBodiesBucket + ".C.deadbeefdeadbeefdeadbeefdeadbeef"
	for range 3 {
		if _, err := js.Publish(ctx, orphan, randomBytes(21, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := b.Sweep(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("Sweep with a cutoff before the orphan = %d, %v; want 0", n, err)
	}
	if _, err := b.Append(ctx, id, 0, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	if duringErr != nil || during != 1 || sweeps != 3 {
		t.Fatalf("%d Sweeps during an Append = %d, %v; want 3 purging the orphan only", sweeps, during, duringErr)
	}
	if n, err := b.Sweep(ctx, time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("second Sweep = %d, %v; want 0", n, err)
	}
	if stored, named := liveChunkSubjects(t, js); !slices.Equal(stored, named) || len(named) != 3 {
		t.Fatalf("chunk subjects stored %v, named %v", stored, named)
	}
	if digest, _, err := b.ReadDigest(ctx, id); err != nil || digest != sum(body) {
		t.Fatalf("ReadDigest after Sweep = %s, %v", digest, err)
	}
}

// Two relay processes on two nodes of a three-node cluster share an R3
// bodies bucket (allow_direct off). A carrier uploads a body in pieces of
// uneven sizes, alternating between them and, after any failure, asking the
// durable offset and going on from there, while one node is stopped and
// restarted. The body read back through either equals the input.
func TestBodiesClusterNodeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster")
	}
	c := natstest.Cluster(t, 3)
	c.WaitReady()
	var bs []*jsstore.Bodies
	var jss []jetstream.JetStream
	for _, node := range []int{0, 1} {
		js, err := jetstream.New(natstest.Connect(t, c.URLs(node)))
		if err != nil {
			t.Fatal(err)
		}
		var b *jsstore.Bodies
		retry(t, func(ctx context.Context) (err error) {
			b, err = jsstore.OpenBodies(ctx, js, jsstore.BodiesOptions{SegmentSize: smallSeg, Timeout: 2 * time.Second})
			return err
		})
		bs, jss = append(bs, b), append(jss, js)
	}
	if cfg := streamConfig(t, jss[0], "OBJ_"+jsstore.DefaultBodiesBucket); cfg.Replicas != 3 || cfg.AllowDirect {
		t.Fatalf("bucket stream: %d replicas, allow_direct %t; want 3, false", cfg.Replicas, cfg.AllowDirect)
	}
	id := uuid.NewString()
	body := randomBytes(30, 12*smallSeg+321)
	rng := rand.New(rand.NewPCG(31, 32))
	var durable int64
	failures := 0
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond) // the carrier's backoff, not a wait for an event
	defer tick.Stop()
	for k := 0; durable < int64(len(body)); k++ {
		if time.Now().After(deadline) {
			t.Fatalf("upload stuck at %d of %d after %d failures", durable, len(body), failures)
		}
		switch k {
		case 4:
			c.Stop(1)
		case 12:
			c.Start(1)
		}
		b := bs[k%2]
		n := min(int64(1+rng.IntN(smallSeg)), int64(len(body))-durable)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := b.Append(ctx, id, durable, bytes.NewReader(body[durable:durable+n]))
		if err == nil && d != durable+n {
			t.Fatalf("Append of %d at %d = %d", n, durable, d)
		}
		cancel()
		if err != nil {
			failures++
			<-tick.C
			// Ask for the durable offset, as a carrier does after a failure.
			retry(t, func(ctx context.Context) (err error) {
				d, err = b.Offset(ctx, id)
				return err
			})
			if d < durable {
				t.Fatalf("the durable offset went back from %d to %d", durable, d)
			}
		}
		durable = d
	}
	t.Logf("uploaded %d bytes, %d failed attempts", len(body), failures)
	for i, b := range bs {
		var digest string
		var size int64
		retry(t, func(ctx context.Context) (err error) {
			digest, size, err = b.ReadDigest(ctx, id)
			return err
		})
		if digest != sum(body) || size != int64(len(body)) {
			t.Fatalf("body read through relay %d: %d bytes sha %s, want %d sha %s", i, size, digest, len(body), sum(body))
		}
		if fast, _, err := b.Digest(context.Background(), id); err != nil || fast != digest {
			t.Fatalf("Digest through relay %d = %s, %v", i, fast, err)
		}
	}
}

// cancelReader hands out p, then ends the request's context and fails, as a
// carrier whose connection drops does to the relay's request.
type cancelReader struct {
	p      []byte
	cancel context.CancelFunc
}

func (c *cancelReader) Read(q []byte) (int, error) {
	if len(c.p) == 0 {
		c.cancel()
		return 0, errors.New("client gone")
	}
	n := copy(q, c.p)
	c.p = c.p[n:]
	return n, nil
}

// The bytes read before the carrier went away are committed although the
// request's context has ended with it, including a partial segment extended
// with them.
func TestBodiesCommitAfterCallerGone(t *testing.T) {
	s := natstest.Node(t)
	b, _ := bodiesOn(t, s, smallSeg, nil)
	id := uuid.NewString()
	body := randomBytes(40, 2*smallSeg)
	var off int64
	for _, n := range []int64{1000, smallSeg + 5000, smallSeg - 6000} {
		ctx, cancel := context.WithCancel(context.Background())
		d, err := b.Append(ctx, id, off, &cancelReader{p: body[off : off+n], cancel: cancel})
		if err == nil || d != off+n {
			t.Fatalf("Append of %d at %d with the caller gone = %d, %v; want %d and the reader's error", n, off, d, err, off+n)
		}
		off = d
	}
	if got := readBody(t, b, id, 0); !bytes.Equal(got, body) {
		t.Fatal("the body differs")
	}
}

// A second Append of a body waits for the first in this process; its own
// context bounds the wait, and giving up changes nothing.
func TestBodiesSecondAppendWaitsBoundedByItsContext(t *testing.T) {
	s := natstest.Node(t)
	inCommit, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b, _ := bodiesOn(t, s, smallSeg, &jsstore.BodiesHooks{BeforeCommit: func(string) {
		once.Do(func() { close(inCommit); <-release })
	}})
	id := uuid.NewString()
	body := randomBytes(41, 5000)
	done := make(chan error, 1)
	go func() {
		_, err := b.Append(context.Background(), id, 0, bytes.NewReader(body))
		done <- err
	}()
	<-inCommit
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := b.Append(ctx, id, 0, failReader{t})
		waited <- err
	}()
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiting Append: %v, want context.Canceled", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := readBody(t, b, id, 0); !bytes.Equal(got, body) {
		t.Fatal("the body differs")
	}
}

// Another relay process extends the partial last segment, and purges its
// old chunks, while this one is about to copy them to extend it too: this
// one's Append is refused with the other's durable offset (ErrOffsetMismatch,
// the relay's 409), not a storage error, and the body is the other's.
func TestBodiesRaceWhileCopyingPartialSegment(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	id := uuid.NewString()
	var other *jsstore.Bodies
	second := randomBytes(51, 3*smallSeg/2)
	var once sync.Once
	var otherErr error
	first, _ := bodiesOn(t, s, smallSeg, &jsstore.BodiesHooks{BeforeSegment: func(name string) {
		once.Do(func() { _, otherErr = other.Append(ctx, id, 200<<10, bytes.NewReader(second)) })
	}})
	other, _ = bodiesOn(t, s, smallSeg, nil)
	prefix := randomBytes(50, 200<<10) // a partial segment of two chunks
	if _, err := other.Append(ctx, id, 0, bytes.NewReader(prefix)); err != nil {
		t.Fatal(err)
	}
	d, err := first.Append(ctx, id, 200<<10, bytes.NewReader(randomBytes(52, 1000)))
	if otherErr != nil {
		t.Fatalf("the other process's Append: %v", otherErr)
	}
	want := int64(len(prefix) + len(second))
	var oe *jsstore.OffsetError
	if !errors.As(err, &oe) || oe.Durable != want || d != want {
		t.Fatalf("the losing Append = %d, %v; want an *OffsetError with durable %d", d, err, want)
	}
	if got := readBody(t, first, id, 0); !bytes.Equal(got, append(prefix, second...)) {
		t.Fatal("the body is not the winner's")
	}
}
