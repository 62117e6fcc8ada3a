package fsck_test

import (
	"crypto"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// largeRecords is the size of valid-large for the throughput test and benchmark:
// $SEALBRIDGE_FSCK_RECORDS, else 2,000 (docs/FSCK.md measures 100,000:
// SEALBRIDGE_FSCK_RECORDS=100000 go test -run Throughput -v ./pkg/fsck).
func largeRecords(t testing.TB) int {
	n := 2000
	if s := os.Getenv("SEALBRIDGE_FSCK_RECORDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 3 {
			t.Fatalf("SEALBRIDGE_FSCK_RECORDS=%q", s)
		}
		n = v
	}
	if testing.Short() && n > 2000 {
		t.Skip("large throughput run skipped in -short mode")
	}
	return n
}

// verifyRate measures single-core Ed25519 verifications per second of a real record
// signature (the owner's key, a message of a record's size), for at least d.
func verifyRate(t testing.TB, dir string, d time.Duration) float64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, record.Path(record.KindOutbox, fsfixtures.ID("large/0/envelope/0"))))
	if err != nil {
		t.Fatal(err)
	}
	owner := fsfixtures.Owner()
	msg := append([]byte("sealbridge/record/v1\x00outbox\x00"+fsfixtures.ID("large/0/envelope/0")+"\x00"), data...)
	sig, err := owner.Signer().Sign(nil, msg, crypto.Hash(0))
	if err != nil {
		t.Fatal(err)
	}
	pub := ed25519.PublicKey(owner.Public())
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		for range 100 {
			if !ed25519.Verify(pub, msg, sig) {
				t.Fatal("verify failed")
			}
		}
		n += 100
	}
	return float64(n) / time.Since(start).Seconds()
}

// TestThroughput reports fsck's records/second on valid-large beside one core's
// Ed25519 verifications/second, measured in the same run (the target: fsck at
// least 1.5× one core's verify rate on a 2-core machine).
func TestThroughput(t *testing.T) {
	n := largeRecords(t)
	dir := fsfixtures.Build(t, "valid-large", fsfixtures.Records(n))
	syscall.Sync() // the fixture is written without fsync: keep its write-back out of the measurement
	verify := verifyRate(t, dir, 300*time.Millisecond)
	rate := func(workers int) float64 {
		start := time.Now()
		rep := check(t, dir, fsck.Options{Workers: workers})
		elapsed := time.Since(start)
		if rep.Valid != n || len(rep.Findings) != 0 {
			t.Fatalf("%d valid of %d, findings %+v", rep.Valid, n, rep.Findings)
		}
		return float64(n) / elapsed.Seconds()
	}
	one := rate(1)
	all := rate(0)
	verify = (verify + verifyRate(t, dir, 300*time.Millisecond)) / 2
	t.Logf("fsck of valid-large, %d records: %.0f records/s on %d cores (%.0f on 1 worker); single-core Ed25519 verify: %.0f/s; ratio %.2f× (target 1.5×)",
		n, all, runtime.GOMAXPROCS(0), one, verify, all/verify)
}

// BenchmarkCheck: records/s of a check of valid-large, beside verify/s on one core.
func BenchmarkCheck(b *testing.B) {
	n := largeRecords(b)
	dir := fsfixtures.Build(b, "valid-large", fsfixtures.Records(n))
	syscall.Sync()
	verify := verifyRate(b, dir, 200*time.Millisecond)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := fsck.Check(ctx, dir, fsck.Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	recs := float64(n) * float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(recs, "records/s")
	b.ReportMetric(verify, "verify/s(1core)")
	b.ReportMetric(recs/verify, "ratio")
}
