package bench

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Fixture sizes (docs/PERFORMANCE.md): listings, fsck and scans over 10,000 records; churn
// after delivering and removing 20,000.
const (
	scanRecords  = 10_000
	churnRecords = 20_000
	groupSize    = 16 // records of one prepared transaction / one raw group commit
	writers      = 8  // concurrent writers / senders
)

// cacheRoot holds the fixtures shared by every benchmark of this process (built once,
// without fsync, since only benchmarks read them); TestMain removes it.
var cacheRoot string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sealbridge-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cacheRoot = dir
	code := m.Run()
	closeFixtures()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// benchDir returns a new empty directory under cacheRoot. Unlike b.TempDir it is
// removed only when the process ends: on ext4 without a journal every unlinked inode
// slows the creates near it for a minute or more (fs/ext4/ialloc.c, recently_deleted),
// so removing each benchmark's thousands of files as it ends would tax the next ones.
func benchDir(tb testing.TB) string {
	dir, err := os.MkdirTemp(cacheRoot, "b")
	if err != nil {
		tb.Fatal(err)
	}
	return dir
}

// seed gives every benchmark the same owner key (as pkg/store's tests).
var seed = [32]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}

var (
	ownerOnce sync.Once
	ownerID   *identity.Identity
	ownerKey  identity.PublicKey
	peerDID   string
)

// owner returns the store owner's identity, its parsed key and a peer DID.
func owner() (*identity.Identity, identity.PublicKey, string) {
	ownerOnce.Do(func() {
		id, err := identity.FromSeed(seed[:])
		if err != nil {
			panic(err)
		}
		key, err := identity.ParseDID(string(id.DID()))
		if err != nil {
			panic(err)
		}
		p := seed
		p[0] = 99
		ownerID, ownerKey = id, key
		peerDID = string(identity.FormatDID(ed25519.NewKeyFromSeed(p[:]).Public().(ed25519.PublicKey)))
	})
	return ownerID, ownerKey, peerDID
}

// newMessage returns a valid queued message record with the given id: the record every
// write benchmark stores (about 640 bytes once signed).
func newMessage(peer, id string) *record.Message {
	now := time.Now().UnixMilli()
	return &record.Message{
		MessageID: id, Status: record.StatusQueued, PeerOwnerDID: peer,
		RelayURL: "http://127.0.0.1:9/relay", EnvelopeDigest: envelope.Digest([]byte(id)),
		DeliveryDeadline: now + time.Hour.Milliseconds(), CreatedAt: now, UpdatedAt: now,
		RetainUntil: now + 8*24*time.Hour.Milliseconds(),
	}
}

// encodeMessage returns the signed file bytes of a fresh message record with id: the
// same work (validate, encode, sign) the store does before writing.
func encodeMessage(tb testing.TB, id string) []byte {
	data, err := encodeMessageErr(id)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

func encodeMessageErr(id string) ([]byte, error) {
	o, _, peer := owner()
	return record.Encode(o.Signer(), o.DID(), newMessage(peer, id))
}

// recordBytes returns one record's signed bytes (the floors write these).
func recordBytes(tb testing.TB) []byte { return encodeMessage(tb, uuid.NewString()) }

// signedMessage returns the exact message an Ed25519 record signature covers for a
// record of the benchmark's size: "sealbridge/record/v1" 0 kind 0 id 0 payload.
func signedMessage(tb testing.TB) []byte {
	data := recordBytes(tb)
	var h struct {
		Kind    string          `json:"kind"`
		ID      string          `json:"id"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(data, &h); err != nil {
		tb.Fatal(err)
	}
	return domainMessage(h.Kind, h.ID, h.Payload)
}

func domainMessage(kind, id string, payload []byte) []byte {
	msg := make([]byte, 0, len(identity.DomainRecord)+len(kind)+len(id)+len(payload)+3)
	msg = append(msg, identity.DomainRecord...)
	msg = append(msg, 0)
	msg = append(msg, kind...)
	msg = append(msg, 0)
	msg = append(msg, id...)
	msg = append(msg, 0)
	return append(msg, payload...)
}

// openStore opens the owner's store in directory dir.
func openStore(tb testing.TB, opts store.Options) *store.Store {
	tb.Helper()
	o, _, _ := owner()
	s, err := store.Open(o.Signer(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// later is a clock one minute ahead: a store reading with it never finds a cached
// record or listing "racy", the steady state of data read well after it was written.
func later() time.Time { return time.Now().Add(time.Minute) }

// put durably writes r in its own transaction.
func put(tb testing.TB, s *store.Store, r record.Record) {
	if err := s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(r) }); err != nil {
		tb.Fatal(err)
	}
}

// records is a set of signed message records: ids in order and their file bytes.
type records struct {
	ids  []string
	data [][]byte
}

// makeRecords signs n fresh message records on every core.
func makeRecords(n int) (*records, error) {
	r := &records{ids: make([]string, n), data: make([][]byte, n)}
	for i := range r.ids {
		r.ids[i] = uuid.NewString()
	}
	slices.Sort(r.ids)
	err := onAllCores(n, func(i int) (err error) {
		r.data[i], err = encodeMessageErr(r.ids[i])
		return err
	})
	return r, err
}

// writeRecords writes recs as message record files in storeDir/messages (0700/0600),
// without fsync.
func writeRecords(storeDir string, recs *records) error {
	kindDir := filepath.Join(storeDir, string(record.KindMessages))
	if err := os.MkdirAll(kindDir, 0o700); err != nil {
		return err
	}
	return onAllCores(len(recs.ids), func(i int) error {
		return os.WriteFile(filepath.Join(kindDir, recs.ids[i]+".json"), recs.data[i], 0o600)
	})
}

// onAllCores runs fn(0..n-1) on GOMAXPROCS goroutines and returns the first error.
func onAllCores(n int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && failed.Load() == nil; i = int(next.Add(1) - 1) {
				if err := fn(i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return *p
	}
	return nil
}

// scanFixture is the warm store of scanRecords message records shared by the listing,
// fsck and scan benchmarks (and by their SQLite and bbolt twins, which hold the same
// bytes).
type scanFixture struct {
	dir  string // store directory
	recs *records
}

var (
	scanOnce sync.Once
	scanFix  *scanFixture
	scanErr  error
)

// scanStore returns the shared 10,000-record store, building it on first use.
func scanStore(tb testing.TB) *scanFixture {
	scanOnce.Do(func() {
		// Laid out as in a data root (delivery/<hex sha256(owner DID)>): fsck checks
		// only a directory that looks like a store.
		o, _, _ := owner()
		f := &scanFixture{dir: dataroot.StoreDir(filepath.Join(cacheRoot, "scan10k"), string(o.DID()))}
		if err := os.MkdirAll(f.dir, 0o700); err != nil {
			scanErr = err
			return
		}
		if f.recs, scanErr = makeRecords(scanRecords); scanErr != nil {
			return
		}
		if scanErr = writeRecords(f.dir, f.recs); scanErr == nil {
			scanFix = f
		}
	})
	if scanErr != nil || scanFix == nil {
		tb.Fatalf("scan fixture: %v", scanErr)
	}
	return scanFix
}

// fixtureClosers are closed by TestMain after every benchmark (open databases).
var (
	closersMu      sync.Mutex
	fixtureClosers []func()
)

func onClose(f func()) {
	closersMu.Lock()
	fixtureClosers = append(fixtureClosers, f)
	closersMu.Unlock()
}

func closeFixtures() {
	closersMu.Lock()
	defer closersMu.Unlock()
	for _, f := range fixtureClosers {
		f()
	}
	fixtureClosers = nil
}

// runWriters runs op b.N times in total from n goroutines that take the next
// iteration from a shared counter, and fails b on the first error.
func runWriters(b *testing.B, n int, op func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// reportRate reports done units of work per second of timed work, as unit.
func reportRate(b *testing.B, done float64, unit string) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(done/s, unit)
	}
}

// latencies collects per-operation durations for a p99.
type latencies []time.Duration

// report reports the 50th and 99th percentiles in milliseconds.
func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	s := slices.Clone(l)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	pct := func(p float64) float64 {
		i := int(p * float64(len(s)-1))
		return float64(s[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
