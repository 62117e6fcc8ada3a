package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// sized is a fixture size that depends on how the benchmarks run: the full report
// (and a benchmark run alone with a benchtime), the quick report, and the smoke run
// that runs every benchmark once (-benchtime Nx), which must stay quick.
type sized struct{ full, quick, smoke int }

// reportMode is "full" or "quick" while TestBenchReport runs, "" otherwise.
var reportMode string

func (z sized) get() int {
	switch {
	case reportMode == "quick":
		return z.quick
	case reportMode == "full":
		return z.full
	case smokeRun():
		return z.smoke
	}
	return z.full
}

// smokeRun reports whether the benchmarks run a fixed number of iterations
// (-benchtime 1x: every benchmark once, as CI may), not for a time.
func smokeRun() bool {
	f := flag.Lookup("test.benchtime")
	return f != nil && strings.HasSuffix(f.Value.String(), "x")
}

// Stored-history sizes of the senders rows.
var (
	history10k  = sized{full: 10_000, quick: 10_000, smoke: 10_000}
	history100k = sized{full: 100_000, quick: 30_000, smoke: 10_000}
)

// historyFixture is a store holding n delivered messages, opened once per process.
type historyFixture struct {
	s     *store.Store
	built time.Duration // signing, writing and syncfs of the records, and the index build
}

var (
	historyMu sync.Mutex
	histories = map[int]*historyFixture{}
)

// historyStore returns the Store of a store directory holding n delivered messages,
// building it on first use and keeping it open for the process (as a daemon keeps its
// Store): the steady state of a store with history (DESIGN §10), where maintenance has
// removed the delivered messages' outbox records and batch markers and the message
// records (status relayed) stay until their retention ends. The records are signed on
// every core and written directly as files (no fsync, one syncfs), then the store is
// opened and its indexes prepared, as a daemon does once at start-up. Later runs find
// the messages earlier runs enqueued too (pending, on top of the n; each run reports
// stored-msgs).
func historyStore(b *testing.B, n int) *store.Store {
	historyMu.Lock()
	defer historyMu.Unlock()
	if h := histories[n]; h != nil {
		return h.s
	}
	t0 := time.Now()
	dir := filepath.Join(cacheRoot, fmt.Sprintf("history%d", n))
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	o, _, peer := owner()
	files := make([]recordFile, n)
	err := onAllCores(n, func(i int) error {
		m := newMessage(peer, uuid.NewString())
		m.Status, m.Attempts = record.StatusRelayed, 1
		data, err := record.Encode(o.Signer(), o.DID(), m)
		files[i] = recordFile{kind: record.KindMessages, id: m.MessageID, data: data}
		return err
	})
	if err == nil {
		err = writeFiles(dir, files)
	}
	if err != nil {
		b.Fatal(err)
	}
	s := openStore(b, store.Options{Dir: dir, Limits: noLimits})
	if err := s.Prepare(context.Background()); err != nil {
		b.Fatal(err)
	}
	histories[n] = &historyFixture{s: s, built: time.Since(t0)}
	return s
}
