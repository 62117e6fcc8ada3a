package bench

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"golang.org/x/sys/unix"
)

// The floors: what the hardware and the crypto allow, measured with plain calls and no
// store logic, on the same disk and the same record bytes as ours.

// rawDir is a directory for raw durable creates, kept open for its fsyncs.
type rawDir struct {
	path string
	d    *os.File
	data []byte
}

func newRawDir(b *testing.B) *rawDir {
	dir := benchDir(b)
	d, err := os.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return &rawDir{path: dir, d: d, data: recordBytes(b)}
}

// writeTemp creates a fresh ".<uuid>.tmp" (O_EXCL, 0600), writes the record's bytes,
// optionally fsyncs it, closes it, and returns the id it is meant for.
func (r *rawDir) writeTemp(sync bool) (string, error) {
	id := uuid.NewString()
	f, err := os.OpenFile(r.temp(id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	_, err = f.Write(r.data)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return id, err
}

func (r *rawDir) temp(id string) string  { return filepath.Join(r.path, "."+id+".tmp") }
func (r *rawDir) final(id string) string { return filepath.Join(r.path, id+".json") }

// create is one raw durable create: temp, write, fsync, close, rename, fsync the
// directory.
func (r *rawDir) create() error {
	id, err := r.writeTemp(true)
	if err != nil {
		return err
	}
	if err := os.Rename(r.temp(id), r.final(id)); err != nil {
		return err
	}
	return r.d.Sync()
}

// BenchmarkFloorCreate1 is the floor of a durable single-record write: one writer
// doing create-temp + write + fsync + rename + fsync-dir in a loop.
func BenchmarkFloorCreate1(b *testing.B) {
	r := newRawDir(b)
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := r.create(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
	lat.report(b)
}

// BenchmarkFloorCreate8 is the floor of eight concurrent writers that hold no lock
// across their fsyncs: eight goroutines doing raw durable creates in one directory.
func BenchmarkFloorCreate8(b *testing.B) {
	r := newRawDir(b)
	b.ResetTimer()
	runWriters(b, writers, r.create)
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// group is one raw group commit of n records: n temps written and fsynced in
// parallel, n renames, one directory fsync (or, with syncfs, temps not fsynced one by
// one and a single syncfs(2) instead of every fsync).
func (r *rawDir) group(n int, syncfs bool) error {
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i], errs[i] = r.writeTemp(!syncfs) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, id := range ids {
		if err := os.Rename(r.temp(id), r.final(id)); err != nil {
			return err
		}
	}
	if syncfs {
		return unix.Syncfs(int(r.d.Fd()))
	}
	return r.d.Sync()
}

// BenchmarkFloorGroup16 is the floor of a prepared transaction of 16 records: 16 temps
// written and fsynced in parallel, 16 renames, one directory fsync.
func BenchmarkFloorGroup16(b *testing.B) {
	r := newRawDir(b)
	b.ResetTimer()
	for range b.N {
		if err := r.group(groupSize, false); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*groupSize), "records/s")
}

// BenchmarkFloorGroup16Syncfs is an alternative floor: 16 temps written in parallel
// without fsync, 16 renames, one syncfs(2) of the whole file system. It is what a
// store that trusted syncfs (one journal commit for everything) could reach; syncfs
// also flushes every other writer's dirty data, so on a shared disk it is noisy.
func BenchmarkFloorGroup16Syncfs(b *testing.B) {
	r := newRawDir(b)
	b.ResetTimer()
	for range b.N {
		if err := r.group(groupSize, true); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*groupSize), "records/s")
}

// BenchmarkFloorAppend1 is the floor of a log-structured store (what SQLite's WAL and
// bbolt pay per commit): write the record's bytes at the next offset of a log file
// that was preallocated (written and fsynced once, like a reused WAL), then
// fdatasync. No inode is allocated, no directory or file size changes.
func BenchmarkFloorAppend1(b *testing.B) {
	r := newRawDir(b)
	const logSize = 4 << 20
	f, err := os.OpenFile(filepath.Join(r.path, "log"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, logSize)); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	off := int64(0)
	b.ResetTimer()
	for range b.N {
		if off+int64(len(r.data)) > logSize {
			off = 0
		}
		if _, err := f.WriteAt(r.data, off); err != nil {
			b.Fatal(err)
		}
		off += int64(len(r.data))
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// BenchmarkFloorSign signs a record-sized message with Ed25519 (what every write pays,
// once; identity.SignDomain also verifies what it signed).
func BenchmarkFloorSign(b *testing.B) {
	msg := signedMessage(b)
	priv := ed25519.NewKeyFromSeed(seed[:])
	b.SetBytes(int64(len(msg)))
	b.ResetTimer()
	for range b.N {
		_ = ed25519.Sign(priv, msg)
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "signs/s")
}

// BenchmarkFloorVerify verifies an Ed25519 signature over a record-sized message (what
// every cold read and every record fsck checks pays) on one core.
func BenchmarkFloorVerify(b *testing.B) {
	msg := signedMessage(b)
	priv := ed25519.NewKeyFromSeed(seed[:])
	pub := priv.Public().(ed25519.PublicKey)
	sig := ed25519.Sign(priv, msg)
	b.SetBytes(int64(len(msg)))
	b.ResetTimer()
	for range b.N {
		if !ed25519.Verify(pub, msg, sig) {
			b.Fatal("signature does not verify")
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "verifies/s")
}

// rawRecord is what the raw scan parses: the header and, loosely, the payload.
type rawRecord struct {
	V       int             `json:"v"`
	Kind    string          `json:"kind"`
	ID      string          `json:"id"`
	Signer  string          `json:"signer"`
	Payload json.RawMessage `json:"payload"`
	Sig     string          `json:"sig"`
}

// rawVerify parses a record file with plain encoding/json and verifies its signature.
func rawVerify(pub ed25519.PublicKey, data []byte) error {
	var h rawRecord
	if err := json.Unmarshal(data, &h); err != nil {
		return err
	}
	var payload map[string]any
	if err := json.Unmarshal(h.Payload, &payload); err != nil {
		return err
	}
	sig, err := base64.RawURLEncoding.DecodeString(h.Sig)
	if err != nil {
		return err
	}
	if !ed25519.Verify(pub, domainMessage(h.Kind, h.ID, h.Payload), sig) {
		return errors.New("bad signature")
	}
	return nil
}

// BenchmarkFloorScan10k is the floor of fsck: a warm read + parse + verify of the
// 10,000 record files of the scan fixture on all cores (one ReadDir, then GOMAXPROCS
// goroutines each reading a file with os.ReadFile, decoding it with plain
// encoding/json and verifying its Ed25519 signature).
func BenchmarkFloorScan10k(b *testing.B) {
	f := scanStore(b)
	dir := filepath.Join(f.dir, "messages")
	pub := ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey)
	b.ResetTimer()
	for range b.N {
		d, err := os.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil || len(names) < scanRecords {
			b.Fatalf("readdir: %d names, %v", len(names), err)
		}
		err = onAllCores(len(names), func(i int) error {
			data, err := os.ReadFile(filepath.Join(dir, names[i]))
			if err != nil {
				return err
			}
			return rawVerify(pub, data)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*scanRecords), "records/s")
	b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "cores")
}

// BenchmarkFloorReadDir10k is the floor of a listing that is not cached: open the
// directory of 10,000 records and read every name (getdents), nothing else.
func BenchmarkFloorReadDir10k(b *testing.B) {
	f := scanStore(b)
	dir := filepath.Join(f.dir, "messages")
	b.ResetTimer()
	for range b.N {
		d, err := os.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil || len(names) < scanRecords {
			b.Fatalf("readdir: %d names, %v", len(names), err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "lists/s")
}
