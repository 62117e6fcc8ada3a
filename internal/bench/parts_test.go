package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The parts of the durable write path, each alone, so the gap between
// BenchmarkStoreWrite1 and BenchmarkFloorCreate1 can be split between them:
// the store lock, fsx's durable write (beneath-resolution on every call), signing,
// and the per-call cost of a path lookup.

// BenchmarkPartLock takes and releases the store lock (internal/lockfile) of an
// otherwise empty store directory: temp create + holder write + flock + link +
// unlink + checks + orphan sweep, then check + unlink + unflock.
func BenchmarkPartLock(b *testing.B) {
	fsys := fsx.NewOS(benchDir(b))
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		l, err := lockfile.Acquire(ctx, fsys, lockfile.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "locks/s")
}

// BenchmarkPartFsxWrite is fsx.WriteFile of one record's bytes to a new name: the
// floor's work through fsx.OS (every call resolves its name beneath the root with
// openat2, RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS).
func BenchmarkPartFsxWrite(b *testing.B) {
	dir := benchDir(b)
	if err := os.Mkdir(filepath.Join(dir, "messages"), 0o700); err != nil {
		b.Fatal(err)
	}
	fsys := fsx.NewOS(dir)
	data := recordBytes(b)
	b.ResetTimer()
	for range b.N {
		if err := fsx.WriteFile(fsys, "messages", uuid.NewString()+".json", data); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// BenchmarkPartEncode is record.Encode of a fresh message record: validate,
// encode, strict decode back, sign (identity.SignDomain verifies what it signed).
func BenchmarkPartEncode(b *testing.B) {
	o, _, peer := owner()
	b.ResetTimer()
	for range b.N {
		if _, err := record.Encode(o.Signer(), o.DID(), newMessage(peer, uuid.NewString())); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// lstatFixture returns a store directory holding one record file and its name.
func lstatFixture(b *testing.B) (dir, name string) {
	dir = benchDir(b)
	id := uuid.NewString()
	recs := &records{ids: []string{id}, data: [][]byte{recordBytes(b)}}
	if err := writeRecords(dir, recs); err != nil {
		b.Fatal(err)
	}
	return dir, "messages/" + id + ".json"
}

// BenchmarkPartFsxLstat is fsx.OS.Lstat of a record: open the root (O_PATH), openat2
// the kind directory beneath it, fstatat, two closes — what a cached read and every
// listing stamp pay per file.
func BenchmarkPartFsxLstat(b *testing.B) {
	dir, name := lstatFixture(b)
	fsys := fsx.NewOS(dir)
	b.ResetTimer()
	for range b.N {
		if _, err := fsys.Lstat(name); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "lstats/s")
}

// BenchmarkPartRawLstat is the floor of that: one fstatat(AT_SYMLINK_NOFOLLOW) relative
// to a kind-directory descriptor kept open.
func BenchmarkPartRawLstat(b *testing.B) {
	dir, name := lstatFixture(b)
	d, err := unix.Open(filepath.Join(dir, filepath.Dir(name)), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(d)
	base := filepath.Base(name)
	var st unix.Stat_t
	b.ResetTimer()
	for range b.N {
		if err := unix.Fstatat(d, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "lstats/s")
}
