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
	"github.com/sealbridge/sealbridge/pkg/record"
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

// A listing is current as of the call, also while one of this Store's publications
// is between its rename and its generation mark: a reader that already sees the
// new record through Message must find it in MessageSummaries too (the daemon's
// `status` showed a message relayed that `ls --status relayed` did not list yet).
// The check runs inside the publication, at the generation write that follows the
// rename of the message record.
func TestListingCurrentDuringOwnPublication(t *testing.T) {
	store.NoInFlightWaits(t) // the read runs inside the publication: it must not wait for it
	var s *store.Store
	var msgID string
	var renamed, checked atomic.Bool
	var seen string
	var listed []store.MessageSummary
	var checkErr error
	s = openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			switch {
			case msgID == "":
			case op.Kind == fsx.OpRename && op.Path2 == "messages/"+msgID+".json":
				renamed.Store(true)
			case op.Kind == fsx.OpWrite && op.Path == store.GenerationFile && renamed.Load() && !checked.Swap(true):
				m, err := s.Message(msgID)
				if err == nil && m != nil {
					seen = m.Status
				}
				listed, err = s.MessageSummaries(context.Background())
				checkErr = errors.Join(checkErr, err)
			}
			return nil
		}
		return f
	}})
	_, m := enqueue(t, s, 1)
	enqueue(t, s, 1)
	if _, err := s.MessageSummaries(context.Background()); err != nil { // the index is built and current
		t.Fatal(err)
	}
	msgID = m.MessageID
	err := s.Transaction(context.Background(), func(tx *store.Tx) error {
		m, err := store.TxGet[*record.Message](tx, msgID)
		if err != nil {
			return err
		}
		m.Status, m.UpdatedAt = record.StatusRelayed, m.UpdatedAt+1
		return tx.Put(m)
	})
	if err != nil || checkErr != nil {
		t.Fatal(err, checkErr)
	}
	if !checked.Load() || seen != record.StatusRelayed {
		t.Fatalf("the check did not run between the rename and the generation mark (seen %q)", seen)
	}
	for _, sum := range listed {
		if sum.MessageID == msgID && sum.Status != record.StatusRelayed {
			t.Fatalf("Message answered %s, then MessageSummaries %s", seen, sum.Status)
		}
	}
	if len(listed) != 2 {
		t.Fatalf("MessageSummaries listed %d messages, want 2", len(listed))
	}
}
