package store_test

import (
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The store's benchmarks (DESIGN §7–§9, docs/PERFORMANCE.md): the cost of a durable
// single-record write against the floor of a raw durable file create, of an enqueue,
// of cached and cold reads, of a cached listing and of one after another instance
// changed the kind, and of the Ed25519 verification every cold read pays.
//
//	go test -run '^$' -bench . -benchtime 2s ./pkg/store

// benchLater is a clock one minute ahead. A store reading with it never finds a cached
// record or listing "racy" (taken within the racy window of its file's ctime or
// its directory's mtime), which is the steady state of a record read well after it was
// written, reached here without waiting.
func benchLater() time.Time { return time.Now().Add(time.Minute) }

// benchMessage returns a valid queued message record with the given id.
func benchMessage(peer, id string) *record.Message {
	now := time.Now().UnixMilli()
	return &record.Message{
		MessageID: id, Status: record.StatusQueued, PeerOwnerDID: peer,
		RelayURL: "http://127.0.0.1:9/relay", EnvelopeDigest: envelope.Digest([]byte(id)),
		DeliveryDeadline: now + time.Hour.Milliseconds(), CreatedAt: now, UpdatedAt: now,
		RetainUntil: now + 8*24*time.Hour.Milliseconds(),
	}
}

// benchPut durably writes r in its own transaction.
func benchPut(b *testing.B, s *store.Store, r record.Record) {
	if err := s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(r) }); err != nil {
		b.Fatal(err)
	}
}

// benchRecordBytes returns the signed file bytes of a message record.
func benchRecordBytes(b *testing.B) []byte {
	id := ownerIdentity(b)
	data, err := record.Encode(id.Signer(), id.DID(), benchMessage(string(peerDID(b)), uuid.NewString()))
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkDurableWrite: one Transaction that Puts one new message record (fresh id
// each op): lock, sign, stage+fsync, rename, generation, directory fsync, unlock.
func BenchmarkDurableWrite(b *testing.B) {
	s := openStore(b, store.Options{})
	peer := string(peerDID(b))
	benchPut(b, s, benchMessage(peer, uuid.NewString())) // create the directories
	recs := make([]*record.Message, b.N)
	for i := range recs {
		recs[i] = benchMessage(peer, uuid.NewString())
	}
	b.ResetTimer()
	for i := range b.N {
		benchPut(b, s, recs[i])
	}
}

// BenchmarkEnqueue2: Enqueue of a message of two envelopes (two outbox members, the
// message record, then the batch marker).
func BenchmarkEnqueue2(b *testing.B) {
	s := openStore(b, store.Options{})
	enqueue(b, s, 2) // create the directories
	reqs := make([]store.SendRequest, b.N)
	for i := range reqs {
		reqs[i] = sendRequest(b, 2)
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.Enqueue(ctx, reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// benchReadStore writes one message record and returns a reading store on the same
// directory (opts.Dir and opts.Now are set here) and the record's id.
func benchReadStore(b *testing.B, opts store.Options) (*store.Store, string) {
	w := openStore(b, store.Options{})
	id := uuid.NewString()
	benchPut(b, w, benchMessage(string(peerDID(b)), id))
	opts.Dir, opts.Now = w.Dir(), benchLater
	return openStore(b, opts), id
}

func benchGet(b *testing.B, s *store.Store, id string) {
	r, err := s.Get(record.KindMessages, id)
	if err != nil || r == nil {
		b.Fatalf("Get: %v %v", r, err)
	}
}

// BenchmarkReadCached: Get of the same record with the cache warm (lstat, fingerprint
// compare, copy).
func BenchmarkReadCached(b *testing.B) {
	s, id := benchReadStore(b, store.Options{})
	benchGet(b, s, id) // warm
	b.ResetTimer()
	for range b.N {
		benchGet(b, s, id)
	}
}

// BenchmarkReadCold: Get of the same record with the cache disabled (lstat, open,
// read, parse, verify the signature, validate, lstat).
func BenchmarkReadCold(b *testing.B) {
	s, id := benchReadStore(b, store.Options{CacheEntries: -1})
	b.ResetTimer()
	for range b.N {
		benchGet(b, s, id)
	}
}

// benchBuildMessages makes dir a store directory holding n signed message records,
// written with plain os.WriteFile (no fsync: only the benchmark reads them), and
// returns their ids.
func benchBuildMessages(b *testing.B, dir string, n int) []string {
	kindDir := filepath.Join(dir, string(record.KindMessages))
	if err := os.MkdirAll(kindDir, 0o700); err != nil {
		b.Fatal(err)
	}
	owner := ownerIdentity(b)
	signer, did, peer := owner.Signer(), owner.DID(), string(peerDID(b))
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
		data, err := record.Encode(signer, did, benchMessage(peer, ids[i]))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(kindDir, ids[i]+".json"), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return ids
}

// BenchmarkList10k: List of a kind holding 10,000 records. "cached": nothing changed
// since the last listing (stamp check and copy). "afterOneChange": before each
// listing another Store instance rewrote one record (not timed), so the stamp moved
// and the directory is read again.
func BenchmarkList10k(b *testing.B) {
	const n = 10_000
	dir := filepath.Join(b.TempDir(), "store")
	ids := benchBuildMessages(b, dir, n)
	r := openStore(b, store.Options{Dir: dir, Now: benchLater})
	list := func(b *testing.B) {
		got, err := r.List(record.KindMessages)
		if err != nil || len(got) != n {
			b.Fatalf("List: %d ids, %v", len(got), err)
		}
	}
	b.Run("cached", func(b *testing.B) {
		list(b)
		b.ResetTimer()
		for range b.N {
			list(b)
		}
	})
	b.Run("afterOneChange", func(b *testing.B) {
		w := openStore(b, store.Options{Dir: dir})
		ctx := context.Background()
		list(b)
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			id := ids[i%len(ids)]
			err := w.Transaction(ctx, func(tx *store.Tx) error {
				m, err := store.TxGet[*record.Message](tx, id)
				if err != nil || m == nil {
					b.Fatalf("TxGet: %v %v", m, err)
				}
				m.Attempts++
				return tx.Put(m)
			})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			list(b)
		}
	})
}

// BenchmarkRawDurableCreate is the floor of a durable write with plain calls: create a
// temp (O_EXCL, 0600), write a record's bytes, fsync, close, rename it to a new name,
// fsync the directory (kept open).
func BenchmarkRawDurableCreate(b *testing.B) {
	dir := b.TempDir()
	data := benchRecordBytes(b)
	d, err := os.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	names := make([]string, b.N)
	for i := range names {
		names[i] = uuid.NewString()
	}
	b.ResetTimer()
	for i := range b.N {
		tmp := filepath.Join(dir, "."+names[i]+".tmp")
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, names[i]+".json")); err != nil {
			b.Fatal(err)
		}
		if err := d.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEd25519Verify verifies an Ed25519 signature over a message the size of a
// message record file.
func BenchmarkEd25519Verify(b *testing.B) {
	msg := benchRecordBytes(b)
	priv := ed25519.NewKeyFromSeed(testSeed[:])
	pub := priv.Public().(ed25519.PublicKey)
	sig := ed25519.Sign(priv, msg)
	b.SetBytes(int64(len(msg)))
	b.ResetTimer()
	for range b.N {
		if !ed25519.Verify(pub, msg, sig) {
			b.Fatal("signature does not verify")
		}
	}
}
