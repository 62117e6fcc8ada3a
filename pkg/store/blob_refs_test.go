package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// blobSend seals n bytes of plaintext as a blob envelope from the owner to the peer,
// writing the sealed blob into s (committed), and returns the one-envelope request
// that sends it and the blob's reference.
func blobSend(t testing.TB, s *store.Store, now time.Time, n int) (store.SendRequest, envelope.BlobRef) {
	t.Helper()
	bw, err := s.CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	defer bw.Abort()
	msgID := uuid.NewString()
	deadline := now.Add(24 * time.Hour)
	ew, err := envelope.NewBlobMessage(ownerIdentity(t), peerDID(t), msgID, deadline, now, bw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ew.Write(blobBytes(n, byte(n))); err != nil {
		t.Fatal(err)
	}
	env, raw, err := ew.Finish()
	if err != nil {
		t.Fatal(err)
	}
	digest, size, err := bw.Commit()
	if err != nil {
		t.Fatal(err)
	}
	ref, ok := env.Blob()
	if !ok || ref.Digest != digest || ref.Size != size {
		t.Fatalf("envelope names %+v, blob is %s %d", ref, digest, size)
	}
	return store.SendRequest{MessageID: msgID, PeerOwnerDID: peerDID(t), RelayURL: "http://127.0.0.1:9/relay",
		DeliveryDeadline: deadline, Envelopes: []store.OutgoingEnvelope{{EnvelopeID: env.ID(), Kind: record.EnvelopeMessage, Envelope: raw}}}, ref
}

func blobFile(s *store.Store, digest string) string {
	return filepath.Join(s.Dir(), store.BlobDir, digest)
}

// nothingEnqueued fails the test if the store holds any outbox or message record of req.
func nothingEnqueued(t *testing.T, s *store.Store, req store.SendRequest) {
	t.Helper()
	if m, err := s.Get(record.KindMessages, req.MessageID); m != nil || err != nil {
		t.Fatalf("message record written: %v %v", m, err)
	}
	for _, e := range req.Envelopes {
		if o, err := s.Get(record.KindOutbox, e.EnvelopeID); o != nil || err != nil {
			t.Fatalf("outbox record written: %v %v", o, err)
		}
	}
}

// Enqueue accepts a blob envelope whose blob is there with its size, and refuses with
// BODY_MISSING, writing nothing, one whose blob is absent or of another size.
func TestEnqueueChecksTheBlob(t *testing.T) {
	s := openStore(t, store.Options{})
	ctx := context.Background()
	req, ref := blobSend(t, s, time.Now(), 200<<10)
	if _, err := s.Enqueue(ctx, req); err != nil {
		t.Fatal(err)
	}
	if m, err := s.AcceptedMessage(req.MessageID); m == nil || err != nil {
		t.Fatalf("not accepted: %v", err)
	}
	if _, err := s.Enqueue(ctx, req); err != nil {
		t.Fatalf("enqueue again: %v", err)
	}

	req, ref = blobSend(t, s, time.Now(), 1000)
	if err := os.Remove(blobFile(s, ref.Digest)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Enqueue(ctx, req); !errors.Is(err, errcode.BodyMissing) {
		t.Fatalf("absent blob: %v, want BODY_MISSING", err)
	}
	nothingEnqueued(t, s, req)

	for _, size := range []int64{-1, +1} {
		req, ref = blobSend(t, s, time.Now(), 1000)
		if err := os.Truncate(blobFile(s, ref.Digest), ref.Size+size); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Enqueue(ctx, req); !errors.Is(err, errcode.BodyMissing) {
			t.Fatalf("blob of %+d bytes: %v, want BODY_MISSING", size, err)
		}
		nothingEnqueued(t, s, req)
	}

	// A blob envelope that does not parse (its signature broken) is refused: what it
	// refers to cannot be trusted.
	req, _ = blobSend(t, s, time.Now(), 1000)
	bad := []byte(string(req.Envelopes[0].Envelope))
	i := strings.Index(string(bad), `"sig":"`) + len(`"sig":"`)
	bad[i] ^= 'A' ^ 'B'
	req.Envelopes[0].Envelope = bad
	if _, err := s.Enqueue(ctx, req); !errors.Is(err, errcode.OutboxStoreInvalid) {
		t.Fatalf("unparsable blob envelope: %v", err)
	}
}

// The blob is checked under the lock when the plan is published, not only before it:
// a blob removed while the records are staged (after the plan) makes the enqueue fail
// with BODY_MISSING and publish nothing.
func TestEnqueueChecksTheBlobAtPublication(t *testing.T) {
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS { faulty = fsx.NewFaulty(inner); return faulty }})
	req, ref := blobSend(t, s, time.Now(), 5000)
	var once sync.Once
	faulty.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpCreate && strings.HasPrefix(op.Path, string(record.KindOutbox)+"/") {
			once.Do(func() {
				if err := os.Remove(blobFile(s, ref.Digest)); err != nil {
					t.Error(err)
				}
			})
		}
		return nil
	}
	if _, err := s.Enqueue(context.Background(), req); !errors.Is(err, errcode.BodyMissing) {
		t.Fatalf("blob removed while staging: %v, want BODY_MISSING", err)
	}
	nothingEnqueued(t, s, req)
}

// putObservation stores an inbound observation whose body is blob ref.
func putObservation(t *testing.T, s *store.Store, now time.Time, digest string, size int64) {
	t.Helper()
	o := &record.Observation{MessageID: uuid.NewString(), SenderDID: string(peerDID(t)), EnvelopeDigest: envelope.Digest([]byte("e")),
		CreatedAt: ms(now), DeliveryDeadline: ms(now.Add(time.Hour)), RetainUntil: ms(now.Add(48 * time.Hour)),
		Blob:  &record.ObservedBlob{EnvelopeID: uuid.NewString(), Digest: digest, Size: size, BodySize: size - 1},
		Facts: []json.RawMessage{json.RawMessage(`{"a":1}`)}, Published: []string{}}
	mustPut(t, s, o)
}

// Maintenance removes, once older than Limits.BlobGrace, the blobs no record refers
// to and the leftover staged and partial blobs; it keeps a blob an outbox record's
// envelope names, one an observation names, younger files, and names it does not
// know (fsck's). The report counts what it removed.
func TestMaintainRemovesUnreferencedBlobs(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now})
	ctx := context.Background()
	sent, sentRef := blobSend(t, s, clock.Now(), 3000)
	if _, err := s.Enqueue(ctx, sent); err != nil {
		t.Fatal(err)
	}
	observed, observedSize := writeBlob(t, s, blobBytes(4000, 9), 1000)
	putObservation(t, s, clock.Now(), observed, observedSize)
	orphan, _ := writeBlob(t, s, blobBytes(5000, 10), 1000)
	staged, err := s.CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	staged.Write([]byte("abandoned"))
	part, err := s.PartialBlob(uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	part.Write([]byte("half a download"))
	part.Close()
	dir := filepath.Join(s.Dir(), store.BlobDir)
	if err := os.WriteFile(filepath.Join(dir, "unknown"), []byte("?"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(dir)

	// Nothing is old enough yet.
	if rep := maintain(t, s); rep.BlobsRemoved != 0 || rep.BlobPartsRemoved != 0 {
		t.Fatalf("young files removed: %+v", rep)
	}
	clock.Advance(store.DefaultBlobGrace + time.Minute)
	young := blobBytes(6000, 11)
	youngDigest, _ := writeBlob(t, s, young, 1000)
	// The young blob is dated now by the file system, the store's clock is ahead:
	// date it at the store's clock so it is younger than the grace time.
	if err := os.Chtimes(blobFile(s, youngDigest), clock.Now(), clock.Now()); err != nil {
		t.Fatal(err)
	}
	rep := maintain(t, s)
	if rep.BlobsRemoved != 1 || rep.BlobPartsRemoved != 2 {
		t.Fatalf("report %+v, want 1 blob and 2 staged/partial removed", rep)
	}
	var left []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := map[string]bool{sentRef.Digest: true, observed: true, youngDigest: true, "unknown": true}
	if len(left) != len(want) {
		t.Fatalf("blobs/ holds %v (before: %d names), want %v", left, len(before), want)
	}
	for _, n := range left {
		if !want[n] {
			t.Fatalf("blobs/ holds %s, want %v", n, want)
		}
	}
	if _, err := s.OpenBlob(orphan); !errors.Is(err, errcode.BodyMissing) {
		t.Fatalf("orphan blob: %v", err)
	}
	// Once its outbox record is gone, the sent blob is an orphan too.
	if err := s.Transaction(ctx, func(tx *store.Tx) error {
		return tx.Delete(record.KindOutbox, sent.Envelopes[0].EnvelopeID)
	}); err != nil {
		t.Fatal(err)
	}
	if rep := maintain(t, s); rep.BlobsRemoved != 1 {
		t.Fatalf("after its record went: %+v", rep)
	}
	if _, err := s.OpenBlob(sentRef.Digest); !errors.Is(err, errcode.BodyMissing) {
		t.Fatalf("sent blob after its record went: %v", err)
	}
}

// The references are checked again under the lock: a record that refers to a blob,
// published after maintenance scanned the references and before it removes the blob,
// keeps the blob — an enqueued envelope, an observation, each alone (the check under
// the lock must see a publication of either kind).
func TestMaintainRechecksReferencesUnderTheLock(t *testing.T) {
	for _, kind := range []record.Kind{record.KindOutbox, record.KindObservations} {
		t.Run(string(kind), func(t *testing.T) {
			clock := newTestClock(time.Now())
			s := openStore(t, store.Options{Now: clock.Now})
			ctx := context.Background()
			enqueue(t, s, 1) // records of both kinds exist, so the scan has something to keep
			putObservation(t, s, clock.Now(), sha([]byte("none")), 10)
			clock.Advance(store.DefaultBlobGrace + time.Minute) // every blob written now is old
			req, ref := blobSend(t, s, clock.Now(), 3000)
			digest := ref.Digest
			if kind == record.KindObservations {
				var size int64
				digest, size = writeBlob(t, s, blobBytes(100, 1), 10)
				store.OnBlobsScanned(t, func() { putObservation(t, s, clock.Now(), digest, size) })
			} else {
				store.OnBlobsScanned(t, func() {
					if _, err := s.Enqueue(ctx, req); err != nil {
						t.Error(err)
					}
				})
			}
			rep, err := s.Maintain(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b, err := s.OpenBlob(digest)
			if err != nil {
				t.Fatalf("blob referred to by a %s record published before the removal: %v (report %+v)", kind, err, rep)
			}
			b.Close()
		})
	}
}

// An outbox record or observation that cannot be read stops the removal of blobs for
// the pass (what it refers to cannot be told), and is reported; staged and partial
// blobs are still removed.
func TestMaintainKeepsBlobsWhenAReferenceIsUnreadable(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now})
	enqueue(t, s, 1)
	clock.Advance(store.DefaultBlobGrace + time.Minute)
	orphan, _ := writeBlob(t, s, blobBytes(100, 1), 10)
	w, _ := s.CreateBlob()
	w.Write([]byte("x"))
	ids, _ := s.List(record.KindOutbox)
	p := filepath.Join(s.Dir(), string(record.KindOutbox), ids[0]+".json")
	data, _ := os.ReadFile(p)
	data[len(data)/2] ^= 1
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Maintain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.BlobsRemoved != 0 || rep.BlobPartsRemoved != 1 || len(rep.Errors) == 0 {
		t.Fatalf("report %+v", rep)
	}
	if b, err := s.OpenBlob(orphan); err != nil {
		t.Fatalf("blob removed although a record could not be read: %v", err)
	} else {
		b.Close()
	}
}

// Enqueue of a blob envelope races maintenance removing that blob (older than the
// grace time, referred to by nothing yet): whichever wins, no accepted envelope's
// blob is gone. Many pairs start together at a gate, under -race. The maintenance
// passes start once an enqueue of the round is staging its records (planned, not yet
// published: a check made before the lock would be out of date, and maintenance
// usually wins) or, every other round, publishing them (so maintenance usually comes
// after, and must see the new references under the lock).
func TestEnqueueRacesBlobMaintenance(t *testing.T) {
	clock := newTestClock(time.Now())
	// signal, when set, is closed at the round's first call of kind signalAt into
	// outbox/: OpCreate (an enqueue is staging) or OpRename (one is publishing).
	type trigger struct {
		at   fsx.OpKind
		ch   chan struct{}
		once sync.Once
	}
	var signal atomic.Pointer[trigger]
	s := openStore(t, store.Options{Now: clock.Now, WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			tr := signal.Load()
			if tr != nil && op.Kind == tr.at && strings.HasPrefix(op.Path+op.Path2, string(record.KindOutbox)+"/") {
				tr.once.Do(func() { close(tr.ch) })
			}
			return nil
		}
		return f
	}})
	ctx := context.Background()
	clock.Advance(store.DefaultBlobGrace + time.Minute)
	const rounds, pairs = 6, 6
	accepted, refused := 0, 0
	for round := 0; round < rounds; round++ {
		reqs := make([]store.SendRequest, pairs)
		refs := make([]envelope.BlobRef, pairs)
		for i := range reqs {
			reqs[i], refs[i] = blobSend(t, s, clock.Now(), 1000+i)
		}
		gate := make(chan struct{})
		tr := &trigger{at: fsx.OpCreate, ch: make(chan struct{})}
		if round%2 == 1 {
			tr.at = fsx.OpRename
		}
		signal.Store(tr)
		errs := make([]error, pairs)
		var wg, enqueues sync.WaitGroup
		enqueuesDone := make(chan struct{})
		for i := 0; i < pairs; i++ {
			enqueues.Go(func() {
				<-gate
				_, errs[i] = s.Enqueue(ctx, reqs[i])
			})
			wg.Go(func() {
				<-gate
				select {
				case <-tr.ch:
				case <-enqueuesDone:
				}
				if _, err := s.Maintain(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		close(gate)
		enqueues.Wait()
		close(enqueuesDone)
		wg.Wait()
		for i, err := range errs {
			switch {
			case err == nil:
				accepted++
				b, oerr := s.OpenBlob(refs[i].Digest)
				if oerr != nil {
					t.Fatalf("round %d: message %s accepted, its blob: %v", round, reqs[i].MessageID, oerr)
				}
				if b.Size() != refs[i].Size {
					t.Fatalf("accepted blob of %d bytes, want %d", b.Size(), refs[i].Size)
				}
				b.Close()
			case errors.Is(err, errcode.BodyMissing):
				refused++
				nothingEnqueued(t, s, reqs[i])
			default:
				t.Fatalf("enqueue: %v", err)
			}
		}
	}
	// A last pass after the race keeps every accepted blob.
	maintain(t, s)
	sums, err := s.OutboxSummaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(sums) != accepted {
		t.Fatalf("%d outbox records, %d accepted", len(sums), accepted)
	}
	for _, o := range sums {
		r, _ := store.GetAs[*record.Outbox](s, o.EnvelopeID)
		env, err := envelope.Parse(r.Envelope)
		if err != nil {
			t.Fatal(err)
		}
		ref, _ := env.Blob()
		b, err := s.OpenBlob(ref.Digest)
		if err != nil {
			t.Fatalf("after the last pass, accepted %s's blob: %v", o.EnvelopeID, err)
		}
		b.Close()
	}
	t.Logf("%d accepted, %d refused with BODY_MISSING", accepted, refused)
}

// An observation naming a blob is published only if the blob is there, checked
// under the lock in the hold that publishes it: a blob removed while the
// observation is staged (a collection of a blob committed longer than the grace
// time before, by a receiver that crashed before its records) makes the
// transaction fail with BODY_MISSING and publish nothing.
func TestObservationChecksItsBlobAtPublication(t *testing.T) {
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS { faulty = fsx.NewFaulty(inner); return faulty }})
	now := time.Now()
	digest, size := writeBlob(t, s, blobBytes(4000, 12), 1000)
	o := &record.Observation{MessageID: uuid.NewString(), SenderDID: string(peerDID(t)), EnvelopeDigest: envelope.Digest([]byte("e")),
		CreatedAt: ms(now), DeliveryDeadline: ms(now.Add(time.Hour)), RetainUntil: ms(now.Add(48 * time.Hour)),
		Blob:  &record.ObservedBlob{EnvelopeID: uuid.NewString(), Digest: digest, Size: size, BodySize: size - 1},
		Facts: []json.RawMessage{json.RawMessage(`{"a":1}`)}, Published: []string{}}
	var once sync.Once
	faulty.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpCreate && strings.HasPrefix(op.Path, string(record.KindObservations)+"/") {
			once.Do(func() {
				if err := os.Remove(blobFile(s, digest)); err != nil {
					t.Error(err)
				}
			})
		}
		return nil
	}
	err := s.PreparedTransaction(context.Background(), func(tx *store.Tx) error { return tx.Put(o) })
	if !errors.Is(err, errcode.BodyMissing) {
		t.Fatalf("blob removed while the observation was staged: %v, want BODY_MISSING", err)
	}
	if got, err := s.Get(record.KindObservations, o.MessageID); err != nil || got != nil {
		t.Fatalf("the observation naming a missing blob was published: %v %v", got, err)
	}
	// With its blob there, the same observation is published.
	faulty.Inject = nil
	writeBlob(t, s, blobBytes(4000, 12), 1000)
	if err := s.PreparedTransaction(context.Background(), func(tx *store.Tx) error { return tx.Put(o) }); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(record.KindObservations, o.MessageID); err != nil || got == nil {
		t.Fatalf("the observation with its blob there: %v %v", got, err)
	}
}
