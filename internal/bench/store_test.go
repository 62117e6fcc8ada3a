package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Ours: the store's public API doing the work of each floor.

// freshStore opens the owner's store in a new temp directory and creates its messages
// directory with one write, so the timed writes do not pay the first mkdir.
func freshStore(b *testing.B, opts store.Options) *store.Store {
	opts.Dir = filepath.Join(benchDir(b), "store")
	s := openStore(b, opts)
	_, _, peer := owner()
	put(b, s, newMessage(peer, uuid.NewString()))
	return s
}

// noLimits lifts the capacity limits that long write benchmarks would reach.
var noLimits = store.Limits{PendingEnvelopes: 1 << 30, Messages: 1 << 30, EnvelopeBytes: 1 << 50}

// BenchmarkStoreWrite1 is the durable single-record write: one Transaction that Puts
// one new message record (lock, read the absent record, sign, stage + fsync, rename,
// generation, directory fsync, unlock). Its floor is BenchmarkFloorCreate1.
func BenchmarkStoreWrite1(b *testing.B) {
	s := freshStore(b, store.Options{})
	_, _, peer := owner()
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	for range b.N {
		m := newMessage(peer, uuid.NewString())
		t0 := time.Now()
		put(b, s, m)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
	lat.report(b)
}

// BenchmarkStorePrepared16 is one PreparedTransaction of 16 new message records: plan
// under the lock, sign + stage + fsync the 16 temps in parallel outside it, rename
// them under the lock, one directory fsync. Its floor is BenchmarkFloorGroup16.
func BenchmarkStorePrepared16(b *testing.B) {
	s := freshStore(b, store.Options{})
	_, _, peer := owner()
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		recs := make([]record.Record, groupSize)
		for i := range recs {
			recs[i] = newMessage(peer, uuid.NewString())
		}
		if err := s.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.PutAll(recs...) }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*groupSize), "records/s")
}

// sendRequest builds a message of n envelopes to the peer.
func sendRequest(n int) store.SendRequest {
	_, _, peer := owner()
	req := store.SendRequest{
		MessageID: uuid.NewString(), PeerOwnerDID: identity.DID(peer),
		RelayURL: "http://127.0.0.1:9/relay", DeliveryDeadline: time.Now().Add(time.Hour),
	}
	for i := range n {
		id := uuid.NewString()
		env, _ := json.Marshal(map[string]any{"envelopeId": id, "body": fmt.Sprintf("hello %d", i)})
		kind := record.EnvelopeMessage
		if i > 0 {
			kind = record.EnvelopeDeliveryStatus
		}
		req.Envelopes = append(req.Envelopes, store.OutgoingEnvelope{EnvelopeID: id, Kind: kind, Envelope: env})
	}
	return req
}

// enqueueStore opens a fresh store and enqueues one message so every directory exists.
func enqueueStore(b *testing.B) *store.Store {
	s := openStore(b, store.Options{Dir: filepath.Join(benchDir(b), "store"), Limits: noLimits})
	if _, err := s.Enqueue(context.Background(), sendRequest(1)); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkStoreEnqueue2 is Enqueue of a message of two envelopes: two outbox
// members and the message record staged and published, then the batch marker.
func BenchmarkStoreEnqueue2(b *testing.B) {
	s := enqueueStore(b)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, err := s.Enqueue(ctx, sendRequest(2)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "msgs/s")
	reportRate(b, float64(b.N*4), "records/s")
}

// BenchmarkStoreSenders8 is eight concurrent senders on one Store: eight goroutines
// each enqueueing messages of one envelope (outbox member, message record, batch
// marker). Group commit across callers (DESIGN §9) should make it scale like
// BenchmarkFloorCreate8, eight writers that hold no lock across fsync.
func BenchmarkStoreSenders8(b *testing.B) {
	s := enqueueStore(b)
	ctx := context.Background()
	b.ResetTimer()
	runWriters(b, writers, func() error {
		_, err := s.Enqueue(ctx, sendRequest(1))
		return err
	})
	b.StopTimer()
	reportRate(b, float64(b.N), "msgs/s")
	reportRate(b, float64(b.N*2), "records/s") // the member and the message record (DESIGN §7)
}

// BenchmarkStoreSenders8Full10k is BenchmarkStoreSenders8 on a store that already holds
// 10,000 delivered messages (historyStore): what senders see once a store has history.
// Compare it with BenchmarkStoreSenders8 to see how the enqueue path scales with the
// number of stored messages (1.0 = not at all).
func BenchmarkStoreSenders8Full10k(b *testing.B) { benchSenders(b, historyStore(b, history10k.get())) }

// BenchmarkStoreSenders8Full100k is the same on a store holding 100,000 delivered
// messages (the default messages limit; 30,000 in the quick report and 10,000 in the
// every-benchmark-once smoke run).
func BenchmarkStoreSenders8Full100k(b *testing.B) {
	benchSenders(b, historyStore(b, history100k.get()))
}

// benchSenders is eight concurrent senders enqueueing one-envelope messages on s.
func benchSenders(b *testing.B, s *store.Store) {
	ctx := context.Background()
	ids, err := s.List(record.KindMessages)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	runWriters(b, writers, func() error {
		_, err := s.Enqueue(ctx, sendRequest(1))
		return err
	})
	b.StopTimer()
	reportRate(b, float64(b.N), "msgs/s")
	reportRate(b, float64(b.N*2), "records/s")
	b.ReportMetric(float64(len(ids)), "stored-msgs")
}

// BenchmarkStorePut8 is eight goroutines each running PreparedTransactions of one new
// record on one Store: the group-commit path alone, record for record comparable with
// BenchmarkFloorCreate8.
func BenchmarkStorePut8(b *testing.B) {
	s := freshStore(b, store.Options{})
	_, _, peer := owner()
	ctx := context.Background()
	b.ResetTimer()
	runWriters(b, writers, func() error {
		m := newMessage(peer, uuid.NewString())
		return s.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.Put(m) })
	})
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// BenchmarkStoreTx8 is eight goroutines each running Transactions of one new record:
// Transaction holds the lock across its fsyncs, so this is the serialized baseline
// that group commit is meant to beat.
func BenchmarkStoreTx8(b *testing.B) {
	s := freshStore(b, store.Options{})
	_, _, peer := owner()
	ctx := context.Background()
	b.ResetTimer()
	runWriters(b, writers, func() error {
		m := newMessage(peer, uuid.NewString())
		return s.Transaction(ctx, func(tx *store.Tx) error { return tx.Put(m) })
	})
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// readStore writes one message record and returns a store reading the same directory
// with a clock a minute ahead (nothing looks racy) and the record's id.
func readStore(b *testing.B, opts store.Options) (*store.Store, string) {
	w := freshStore(b, store.Options{})
	id := uuid.NewString()
	_, _, peer := owner()
	put(b, w, newMessage(peer, id))
	opts.Dir, opts.Now = w.Dir(), later
	return openStore(b, opts), id
}

func get(b *testing.B, s *store.Store, id string) {
	r, err := s.Get(record.KindMessages, id)
	if err != nil || r == nil {
		b.Fatalf("Get: %v %v", r, err)
	}
}

// BenchmarkStoreReadCached is Get of a record with the cache warm: lstat, fingerprint
// compare, copy.
func BenchmarkStoreReadCached(b *testing.B) {
	s, id := readStore(b, store.Options{})
	get(b, s, id)
	b.ResetTimer()
	for range b.N {
		get(b, s, id)
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "reads/s")
}

// BenchmarkStoreReadCold is Get of a record with the cache disabled: lstat, open,
// fstat, read, strict parse, verify, validate, lstat (the page cache is warm).
func BenchmarkStoreReadCold(b *testing.B) {
	s, id := readStore(b, store.Options{CacheEntries: -1})
	b.ResetTimer()
	for range b.N {
		get(b, s, id)
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "reads/s")
}

// listStore opens a store on the shared 10,000-record fixture with a clock a minute
// ahead, and lists it once (warm).
func listStore(b *testing.B) (*store.Store, *scanFixture) {
	f := scanStore(b)
	s := openStore(b, store.Options{Dir: f.dir, Now: later})
	list(b, s)
	return s, f
}

func list(b *testing.B, s *store.Store) {
	ids, err := s.List(record.KindMessages)
	if err != nil || len(ids) != scanRecords {
		b.Fatalf("List: %d ids, %v", len(ids), err)
	}
}

// BenchmarkStoreList10kCached is List of a kind holding 10,000 records when nothing
// changed since the last listing: the stamp check (two lstats) and a copy of the ids.
func BenchmarkStoreList10kCached(b *testing.B) {
	s, _ := listStore(b)
	b.ResetTimer()
	for range b.N {
		list(b, s)
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "lists/s")
}

// BenchmarkStoreList10kAfterChange is List of the 10,000 records after another Store
// instance (another process, as far as the lister knows) rewrote one of them (not
// timed): the stamp moved, so the directory is read again, validated and sorted.
func BenchmarkStoreList10kAfterChange(b *testing.B) {
	s, f := listStore(b)
	w := openStore(b, store.Options{Dir: f.dir})
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		id := f.recs.ids[i%len(f.recs.ids)]
		err := w.Transaction(ctx, func(tx *store.Tx) error {
			m, err := store.TxGet[*record.Message](tx, id)
			if err != nil || m == nil {
				return fmt.Errorf("TxGet %s: %v %v", id, m, err)
			}
			m.Attempts++
			return tx.Put(m)
		})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		list(b, s)
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "lists/s")
}

// BenchmarkStoreFsck10k is pkg/fsck's Check of the warm 10,000-record store (every
// record listed, lstat'ed, read, strictly parsed, verified and related) on all cores.
// Its floor is BenchmarkFloorScan10k.
func BenchmarkStoreFsck10k(b *testing.B) {
	f := scanStore(b)
	o, _, _ := owner()
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		rep, err := fsck.Check(ctx, f.dir, fsck.Options{Owner: o.DID()})
		if err != nil {
			b.Fatal(err)
		}
		if rep.Valid < scanRecords {
			b.Fatalf("fsck: %d valid of %d records; findings %v", rep.Valid, rep.Records, rep.Findings)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*scanRecords), "records/s")
}

// Churn (DESIGN §10): creates after delivering and removing 20,000 records, against
// creates in a fresh store.

// churnEpoch selects the churned fixture: the report raises it each round in full
// mode so every round measures creates right after a fresh mass delete; benchmarks
// run alone build it once.
var churnEpoch int

type churnFixture struct {
	epoch          int
	dir            string
	built, removed time.Duration // writing+syncfs of the 20,000, and their bulk removal
}

var (
	churnMu  sync.Mutex
	churnFix *churnFixture
)

// churnedStore returns a store directory whose messages directory held 20,000
// durable records that were then removed (unlink each, one directory fsync: the
// "retention then bulk removal" strategy), building it for the current epoch.
func churnedStore(b *testing.B) *churnFixture {
	churnMu.Lock()
	defer churnMu.Unlock()
	if churnFix != nil && churnFix.epoch == churnEpoch {
		return churnFix
	}
	if churnFix != nil {
		_ = os.RemoveAll(churnFix.dir)
		churnFix = nil
	}
	f := &churnFixture{epoch: churnEpoch, dir: filepath.Join(cacheRoot, fmt.Sprintf("churn%d", churnEpoch))}
	if err := os.Mkdir(f.dir, 0o700); err != nil {
		b.Fatal(err)
	}
	recs, err := makeRecords(churnRecords)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if err := writeRecords(f.dir, recs); err != nil {
		b.Fatal(err)
	}
	kindDir := filepath.Join(f.dir, string(record.KindMessages))
	d, err := os.Open(kindDir)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	// Delivered records were durable: make these so before removing them.
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		b.Fatal(err)
	}
	f.built = time.Since(t0)
	t0 = time.Now()
	err = onAllCores(len(recs.ids), func(i int) error {
		return os.Remove(filepath.Join(kindDir, recs.ids[i]+".json"))
	})
	if err == nil {
		err = d.Sync()
	}
	if err != nil {
		b.Fatal(err)
	}
	f.removed = time.Since(t0)
	churnFix = f
	return f
}

// syncFS makes everything written on dir's file system durable (syncfs(2)).
func syncFS(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Syncfs(int(d.Fd()))
}

// creates runs b.N durable single-record writes (Transaction Put of a new message).
func creates(b *testing.B, s *store.Store) {
	_, _, peer := owner()
	b.ResetTimer()
	for range b.N {
		put(b, s, newMessage(peer, uuid.NewString()))
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// BenchmarkChurnFresh is durable single-record creates in a fresh store.
func BenchmarkChurnFresh(b *testing.B) {
	creates(b, freshStore(b, store.Options{}))
}

// BenchmarkChurnAfterDelete20k is the same creates in the directory where 20,000
// durable records were just removed in bulk.
func BenchmarkChurnAfterDelete20k(b *testing.B) {
	f := churnedStore(b)
	s := openStore(b, store.Options{Dir: f.dir})
	creates(b, s)
	b.ReportMetric(float64(churnRecords)/f.removed.Seconds(), "bulk-removed/s")
}

// durableMessages writes n signed message records into a new store directory and
// makes them durable (syncfs), outside the timer's concern.
func durableMessages(b *testing.B, n int) (string, *records) {
	dir := filepath.Join(benchDir(b), "store")
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	recs, err := makeRecords(n)
	if err != nil {
		b.Fatal(err)
	}
	if err := writeRecords(dir, recs); err != nil {
		b.Fatal(err)
	}
	if err := syncFS(dir); err != nil {
		b.Fatal(err)
	}
	return dir, recs
}

// BenchmarkMaintainRemove is the "retention, then bulk removal" cleanup strategy as
// the store runs it: Store.Maintain removing b.N records past their retainUntil, a
// chunk of up to 64 per lock hold with one directory fsync each. Compare its rate
// with StoreRemove1 (one durable removal per transaction).
func BenchmarkMaintainRemove(b *testing.B) {
	dir, _ := durableMessages(b, b.N)
	past := func() time.Time { return time.Now().Add(9 * 24 * time.Hour) } // past every retainUntil
	s := openStore(b, store.Options{Dir: dir, Now: past})
	b.ResetTimer()
	rep, err := s.Maintain(context.Background())
	b.StopTimer()
	if err != nil || len(rep.Errors) > 0 || rep.ExpiredRemoved != b.N {
		b.Fatalf("Maintain removed %d of %d: %v %v", rep.ExpiredRemoved, b.N, err, rep.Errors)
	}
	reportRate(b, float64(b.N), "records/s")
}

// BenchmarkStoreRemove1 is the "immediate unlink" cleanup strategy, one record at a
// time: a Transaction that Deletes one durable record (read it, unlink, generation,
// directory fsync). Compare its rate with bulk-removed/s of ChurnAfterDelete20k.
func BenchmarkStoreRemove1(b *testing.B) {
	dir, recs := durableMessages(b, b.N)
	s := openStore(b, store.Options{Dir: dir, Now: later})
	ctx := context.Background()
	b.ResetTimer()
	for _, id := range recs.ids {
		if err := s.Transaction(ctx, func(tx *store.Tx) error { return tx.Delete(record.KindMessages, id) }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}
