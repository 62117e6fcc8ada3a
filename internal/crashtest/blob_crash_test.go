package crashtest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/crashtest"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// blobKind is the kind of the expectations that stand for blobs (blobAck, partAck):
// not a record kind, so the record checks skip them.
const blobKind record.Kind = "blobs"

// blobAck, given to a workload's ack, says the operation acknowledged blob Digest of
// Size bytes as durable (BlobWriter.Commit or Partial.Commit returned): from then on
// every state holds blobs/<Digest> whole.
type blobAck struct {
	Digest string
	Size   int64
}

func (blobAck) Kind() record.Kind  { return blobKind }
func (b blobAck) RecordID() string { return b.Digest }
func (blobAck) Validate() error    { return nil }

// partAck says a partial blob's Persist returned with Data written: from then on every
// state holds blobs/.<EnvelopeID>.part starting with Data, unless the commit to
// blobs/<Final> was attempted since and that blob is there whole.
type partAck struct {
	EnvelopeID string
	Data       []byte
	Final      string
}

func (partAck) Kind() record.Kind  { return blobKind }
func (p partAck) RecordID() string { return "." + p.EnvelopeID + ".part" }
func (partAck) Validate() error    { return nil }

func hexSHA(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// blobWhole says what is wrong with blobs/<digest> in dir for a reference of size
// bytes, or "".
func blobWhole(dir, digest string, size int64) string {
	data, err := os.ReadFile(filepath.Join(dir, store.BlobDir, digest))
	switch {
	case err != nil:
		return fmt.Sprintf("blob %.12s… is missing (%v)", digest, err)
	case int64(len(data)) != size:
		return fmt.Sprintf("blob %.12s… holds %d bytes, its reference says %d", digest, len(data), size)
	case hexSHA(data) != digest:
		return fmt.Sprintf("blob %.12s… does not hash to its name (%d bytes)", digest, len(data))
	}
	return ""
}

// checkAckedBlob checks a blob expectation e (blobAck or partAck) on the state in dir;
// it reports false for an expectation of a record.
func checkAckedBlob(dir string, e expectation) (bool, string) {
	switch a := e.rec.(type) {
	case blobAck:
		if why := blobWhole(dir, a.Digest, a.Size); why != "" {
			return true, "acknowledged " + why
		}
		return true, ""
	case partAck:
		data, err := os.ReadFile(filepath.Join(dir, store.BlobDir, a.RecordID()))
		if err == nil && bytes.HasPrefix(data, a.Data) {
			return true, ""
		}
		if a.Final != "" {
			if _, ferr := os.Lstat(filepath.Join(dir, store.BlobDir, a.Final)); ferr == nil {
				return true, "" // committed: the blob's wholeness is checked by its blobAck and invariant 10
			}
		}
		return true, fmt.Sprintf("persisted partial blob %s lost its first %d bytes (it holds %d: %v)", a.RecordID(), len(a.Data), len(data), err)
	}
	return false, ""
}

// checkReferencedBlobs is invariant 10: every blob a record refers to — an outbox
// record's envelope, an observation's blob — is there whole, with its digest and size
// (DESIGN §7: a blob is durable before any record that refers to it).
func checkReferencedBlobs(s *store.Store, dir string) []string {
	var bad []string
	ids, _ := s.List(record.KindOutbox)
	for _, id := range ids {
		o, err := store.GetAs[*record.Outbox](s, id)
		if err != nil || o == nil {
			continue
		}
		env, err := envelope.Parse(o.Envelope)
		if err != nil {
			continue // the explorer's placeholder envelopes
		}
		if ref, ok := env.Blob(); ok {
			if why := blobWhole(dir, ref.Digest, ref.Size); why != "" {
				bad = append(bad, fmt.Sprintf("outbox %s names a blob, but its %s", id, why))
			}
		}
	}
	ids, _ = s.List(record.KindObservations)
	for _, id := range ids {
		o, err := store.GetAs[*record.Observation](s, id)
		if err != nil || o == nil || o.Blob == nil {
			continue
		}
		if why := blobWhole(dir, o.Blob.Digest, o.Blob.Size); why != "" {
			bad = append(bad, fmt.Sprintf("observation %s names a blob, but its %s", id, why))
		}
	}
	return bad
}

// checkMaintenanceKeepsBlobs is invariant 11: on a copy of state st, dated as after a
// reboot (every blob older than the grace time), two maintenance passes leave every
// referenced blob whole (they remove only what nothing refers to).
func checkMaintenanceKeepsBlobs(t *testing.T, c *clock, st crashtest.State) []string {
	has := false
	for _, n := range st.Tree.Files() {
		has = has || strings.HasPrefix(n, store.BlobDir+"/")
	}
	if !has {
		return nil
	}
	s, dir := agedCopy(t, c, st)
	defer os.RemoveAll(dir)
	for range 2 {
		if _, err := s.Maintain(context.Background()); err != nil {
			return []string{fmt.Sprintf("maintenance: %v", err)}
		}
	}
	var bad []string
	for _, v := range checkReferencedBlobs(s, dir) {
		bad = append(bad, "after maintenance: "+v)
	}
	return bad
}

// sealBlob seals n bytes of plaintext from the owner to the peer into a blob of s,
// written in pieces of 20,000 bytes, and returns the envelope and its blob's digest
// and size as BlobWriter.Commit returned them.
func sealBlob(t *testing.T, s *store.Store, now time.Time, n int) (*envelope.Envelope, []byte, string, int64) {
	t.Helper()
	bw, err := s.CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	ew, err := envelope.NewBlobMessage(owner(t), peer(), uuid.NewString(), now.Add(24*time.Hour), now, bw)
	if err != nil {
		t.Fatal(err)
	}
	plain := bytes.Repeat([]byte("large body "), n/11+1)[:n]
	for rest := plain; len(rest) > 0; rest = rest[min(len(rest), 20_000):] {
		if _, err := ew.Write(rest[:min(len(rest), 20_000)]); err != nil {
			t.Fatal(err)
		}
	}
	env, raw, err := ew.Finish()
	if err != nil {
		t.Fatal(err)
	}
	digest, size, err := bw.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if ref, _ := env.Blob(); ref.Digest != digest || ref.Size != size {
		t.Fatalf("envelope names %+v, blob is %s %d", ref, digest, size)
	}
	return env, raw, digest, size
}

func blobRequest(env *envelope.Envelope, raw []byte) store.SendRequest {
	return store.SendRequest{MessageID: env.MessageID(), PeerOwnerDID: peer(), RelayURL: "http://127.0.0.1:9/",
		DeliveryDeadline: env.DeliveryDeadline(), Envelopes: []store.OutgoingEnvelope{{EnvelopeID: env.ID(), Kind: record.EnvelopeMessage, Envelope: raw}}}
}

// blobWorkloads are the blob write orders of DESIGN §7 and §10; the first seals a
// body of plain bytes. Without ackBlobs the workloads acknowledge only records, so that
// what a weakened protocol breaks is caught by the records' invariant (10) alone.
func blobWorkloads(plain int, ackBlobs bool) []workload {
	ctx := context.Background()
	return []workload{
		// (a) A large body sent: the sealed blob streamed into blobs/ and committed
		// (fsync, rename, fsync blobs/), then the enqueue of its envelope (the member,
		// then the message record). The blob is in a fresh store's new blobs/.
		{name: "blob-then-enqueue", run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			env, raw, digest, size := sealBlob(t, s, c.Now(), plain)
			if ackBlobs {
				ack(blobAck{Digest: digest, Size: size})
			}
			req := blobRequest(env, raw)
			m, err := s.Enqueue(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			members, err := s.Pending(ctx, req.MessageID)
			if err != nil || len(members) != 1 {
				t.Fatal(members, err)
			}
			ack(m, members[0])
		}},
		// A large body received: the sealed blob downloaded into its .part in two
		// persisted pieces, committed (size and digest checked, fsync, rename, fsync
		// blobs/), then the observation that names it.
		{name: "partial-then-observation", run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			sealed := bytes.Repeat([]byte("sealed bytes "), 3000)
			final := hexSHA(sealed)
			envID := uuid.NewString()
			p, err := s.PartialBlob(envID)
			if err != nil {
				t.Fatal(err)
			}
			half := len(sealed) / 2
			for _, piece := range [][]byte{sealed[:half], sealed[half:]} {
				if _, err := p.Write(piece); err != nil {
					t.Fatal(err)
				}
				if err := p.Persist(); err != nil {
					t.Fatal(err)
				}
				if ackBlobs {
					ack(partAck{EnvelopeID: envID, Data: sealed[:p.Offset()]})
				}
			}
			if ackBlobs {
				// From the commit on, the part may have become the blob.
				ack(partAck{EnvelopeID: envID, Data: sealed, Final: final})
			}
			if err := p.Commit(final, int64(len(sealed))); err != nil {
				t.Fatal(err)
			}
			if ackBlobs {
				ack(blobAck{Digest: final, Size: int64(len(sealed))})
			}
			now := c.Now()
			o := &record.Observation{MessageID: uuid.NewString(), SenderDID: string(peer()), EnvelopeDigest: envelope.Digest([]byte("in")),
				CreatedAt: now.UnixMilli(), DeliveryDeadline: now.Add(time.Hour).UnixMilli(), RetainUntil: now.Add(48 * time.Hour).UnixMilli(),
				Blob:  &record.ObservedBlob{EnvelopeID: envID, Digest: final, Size: int64(len(sealed)), BodySize: int64(len(sealed)) - 100},
				Facts: []json.RawMessage{json.RawMessage(`{"a":1}`)}, Published: []string{}}
			if err := s.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.Put(o) }); err != nil {
				t.Fatal(err)
			}
			ack(o)
		}},
		// (b) Orphan blob collection: maintenance, past the grace time, finishes a
		// settled single whose envelope names a blob (its record removed durably
		// first), then removes the blobs no record refers to any more (that one and an
		// orphan) and a stale staged and partial blob, keeping the blobs a pending
		// envelope and an observation name.
		{name: "blob-collection", setup: blobCollectionSetup, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			c.ns.Add(int64(2 * time.Hour)) // past the grace time, before any deadline
			rep, err := s.Maintain(ctx)
			if err != nil || len(rep.Errors) > 0 {
				t.Fatal(err, rep.Errors)
			}
			if rep.BatchesFinished != 1 || rep.BlobsRemoved != 2 || rep.BlobPartsRemoved != 2 {
				t.Fatalf("maintenance did not collect what it should: %+v", rep)
			}
		}},
	}
}

// blobCollectionSetup leaves a store with a pending blob envelope, an observation of a
// blob, a settled single whose envelope names a blob, an orphan blob, and a staged
// and a partial blob abandoned.
func blobCollectionSetup(t *testing.T, s *store.Store, c *clock) {
	ctx := context.Background()
	now := c.Now()
	env, raw, _, _ := sealBlob(t, s, now, 1000)
	if _, err := s.Enqueue(ctx, blobRequest(env, raw)); err != nil {
		t.Fatal(err)
	}
	env, raw, _, _ = sealBlob(t, s, now, 2000)
	if _, err := s.Enqueue(ctx, blobRequest(env, raw)); err != nil {
		t.Fatal(err)
	}
	o, _ := store.GetAs[*record.Outbox](s, env.ID())
	o.State = record.StateRelayed
	if err := put(ctx, s, o); err != nil {
		t.Fatal(err)
	}
	observed := bytes.Repeat([]byte("observed "), 100)
	p, err := s.PartialBlob(uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	p.Write(observed)
	if err := p.Commit(hexSHA(observed), int64(len(observed))); err != nil {
		t.Fatal(err)
	}
	obs := &record.Observation{MessageID: uuid.NewString(), SenderDID: string(peer()), EnvelopeDigest: envelope.Digest([]byte("in")),
		CreatedAt: now.UnixMilli(), DeliveryDeadline: now.Add(time.Hour).UnixMilli(), RetainUntil: now.Add(48 * time.Hour).UnixMilli(),
		Blob:  &record.ObservedBlob{EnvelopeID: uuid.NewString(), Digest: hexSHA(observed), Size: int64(len(observed)), BodySize: 10},
		Facts: []json.RawMessage{json.RawMessage(`{"a":1}`)}, Published: []string{}}
	if err := put(ctx, s, obs); err != nil {
		t.Fatal(err)
	}
	bw, err := s.CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	bw.Write([]byte("an orphan blob"))
	if _, _, err := bw.Commit(); err != nil {
		t.Fatal(err)
	}
	bw, _ = s.CreateBlob()
	bw.Write([]byte("abandoned")) // left as its .tmp
	p, _ = s.PartialBlob(uuid.NewString())
	p.Write([]byte("half a download"))
	p.Close()
}

func TestCrashStatesOfBlobs(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	total := 0
	for _, w := range blobWorkloads(70_000, true) { // two chunks
		t.Run(w.name, func(t *testing.T) {
			total += report(t, w.name, explore(t, w, nil))
		})
	}
	t.Logf("%d crash states of blob workloads explored in all", total)
}

// The test of the test for blobs: a blob commit without its file's fsync, or without
// blobs/'s fsync (everything else as it is), must be caught: a state then holds an
// outbox record (or an observation) naming a blob that is missing, empty or torn.
func TestCrashExplorerCatchesWeakenedBlobProtocol(t *testing.T) {
	t.Parallel()
	inBlobs := func(op fsx.Op) bool { return op.Path == store.BlobDir || path.Dir(op.Path) == store.BlobDir }
	for _, c := range []struct {
		name   string
		weaken func(*fsx.Faulty)
	}{
		{"no-blob-fsync", func(f *fsx.Faulty) { f.DropIf = func(op fsx.Op) bool { return op.Kind == fsx.OpSync && inBlobs(op) } }},
		{"no-blobs-directory-fsync", func(f *fsx.Faulty) {
			f.DropIf = func(op fsx.Op) bool { return op.Kind == fsx.OpSyncDir && op.Path == store.BlobDir }
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, w := range blobWorkloads(1000, false)[:2] { // one chunk: fewer states to reach the record
				w.until = "names a blob, but its blob"
				res := explore(t, w, c.weaken)
				caught := false
				for _, v := range res.violations {
					caught = caught || strings.Contains(v, "names a blob, but its blob")
				}
				if !caught {
					t.Errorf("%s: %d states, %d violations, none a record naming a broken blob: the explorer misses it", w.name, res.states, len(res.violations))
				} else {
					t.Logf("%s: caught (%d violations), e.g. %s", w.name, len(res.violations), res.violations[0])
				}
			}
		})
	}
}
