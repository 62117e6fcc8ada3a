package store_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// lstatHookFS calls hook on every Lstat of a record file.
type lstatHookFS struct {
	fsx.FS
	hook func(name string)
}

func (f lstatHookFS) Lstat(name string) (fsx.Info, error) {
	if strings.HasSuffix(name, ".json") {
		f.hook(name)
	}
	return f.FS.Lstat(name)
}

// A reader of the outbox index outside the lock never fails while another process
// keeps publishing — here during every scan it makes (the e2e tests once got
// OUTBOX_STORE_BUSY here): after its optimistic rounds it scans once under the lock,
// so what it returns is current, and it sees every write once the writer stops.
func TestIndexReaderUnderConstantPublication(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	// The writer tries the lock once: while the reader's last, locked round holds it,
	// the writer's publication is refused (OUTBOX_STORE_BUSY) rather than waited for.
	writer := openStore(t, store.Options{Dir: dir, LockWait: -1})
	for range 20 {
		enqueue(t, writer, 1)
	}
	var publishing atomic.Bool
	var lstats, written atomic.Int64
	publishing.Store(true)
	reader := openStore(t, store.Options{Dir: dir, WrapFS: func(inner fsx.FS) fsx.FS {
		return lstatHookFS{FS: inner, hook: func(name string) {
			if publishing.Load() && strings.HasPrefix(name, "outbox/") && lstats.Add(1)%10 == 0 {
				_, err := writer.Enqueue(context.Background(), sendRequest(t, 1))
				switch {
				case err == nil:
					written.Add(1)
				case !errors.Is(err, errcode.OutboxStoreBusy):
					t.Error(err)
				}
			}
		}}
	}})
	for range 2 {
		if _, err := reader.OutboxSummaries(context.Background()); err != nil {
			t.Fatalf("reading the index while another process publishes: %v", err)
		}
	}
	if written.Load() < 4 {
		t.Fatalf("only %d publications during the scans: the test did not race", written.Load())
	}
	publishing.Store(false)
	sums, err := reader.OutboxSummaries(context.Background())
	if err != nil || len(sums) != 20+int(written.Load()) {
		t.Fatalf("after the writer stopped: %d summaries, want %d (%v)", len(sums), 20+written.Load(), err)
	}
}
