package crashtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/crashtest"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// faultOp is one store operation under fault injection; it returns its error.
type faultOp struct {
	name string
	run  func(s *store.Store, c *clock) error
}

func faultOps() []faultOp {
	ctx := context.Background()
	return []faultOp{
		{"single-write", func(s *store.Store, c *clock) error { return put(ctx, s, newMessage(c.Now())) }},
		{"removal", func(s *store.Store, c *clock) error {
			return s.Transaction(ctx, func(tx *store.Tx) error { return tx.Delete(record.KindMessages, fixedMessage(c).MessageID) })
		}},
		{"enqueue", func(s *store.Store, c *clock) error { _, err := s.Enqueue(ctx, sendRequest(c.Now(), 2)); return err }},
		{"prepared-3", func(s *store.Store, c *clock) error {
			return s.PreparedTransaction(ctx, func(tx *store.Tx) error {
				return tx.PutAll(newMessage(c.Now()), newMessage(c.Now()), newMessage(c.Now()))
			})
		}},
		{"receipt-change", func(s *store.Store, c *clock) error {
			return s.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.Put(fixedReceipt(c, record.ReceiptProcessed)) })
		}},
		{"idempotency", func(s *store.Store, c *clock) error {
			start, err := s.BeginOperation(ctx, "k", []byte(`{}`))
			if err != nil {
				return err
			}
			return s.CompleteOperation(ctx, start.Operation.OperationID, json.RawMessage(`{"ok":true}`))
		}},
		{"maintenance", func(s *store.Store, c *clock) error {
			c.ns.Add(int64(2 * time.Hour))
			rep, err := s.Maintain(ctx)
			if err == nil && len(rep.Errors) > 0 {
				err = rep.Errors[0]
			}
			return err
		}},
	}
}

// faultSetup gives every operation something to work on: a message to remove, a
// receipt to raise, and the maintenance fixture.
func faultSetup(t *testing.T, dir string, c *clock) {
	s := openAt(t, dir, c, nil)
	if err := put(context.Background(), s, fixedMessage(c), fixedReceipt(c, record.ReceiptPersisted)); err != nil {
		t.Fatal(err)
	}
	maintenanceSetup(t, s, c)
	// the old temp of the maintenance fixture is work for maintenance, not a leftover
}

// readAll returns every record of the store that reads, by path.
func readAll(t *testing.T, s *store.Store) map[string]record.Record {
	out := map[string]record.Record{}
	for _, k := range record.Kinds {
		ids, err := s.List(k)
		if err != nil {
			t.Fatalf("list %s: %v", k, err)
		}
		for _, id := range ids {
			r, err := s.Get(k, id)
			if err != nil {
				t.Fatalf("%s/%s unreadable after a fault: %v", k, id, err)
			}
			out[record.Path(k, id)] = r
		}
	}
	return out
}

func listTemps(dir string) map[string]bool {
	out := map[string]bool{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(d.Name(), ".tmp") {
			rel, _ := filepath.Rel(dir, p)
			out[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	return out
}

// Every mutating call of every operation fails in turn with ENOSPC, EIO and EACCES:
// the operation returns a coded error, the store stays readable, every record it
// held before is intact unless the operation had published it before the fault, and
// no temp is left behind unless the failing call was that temp's own cleanup.
func TestFaultsOnEveryCall(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	errnos := []syscall.Errno{syscall.ENOSPC, syscall.EIO, syscall.EACCES}
	runs := 0
	for _, op := range faultOps() {
		t.Run(op.name, func(t *testing.T) {
			// Count the calls of a clean run.
			c := &clock{}
			c.ns.Store(time.Now().UnixNano())
			dir := privateDir(t)
			faultSetup(t, dir, c)
			base, err := crashtest.Snapshot(dir)
			if err != nil {
				t.Fatal(err)
			}
			start := c.ns.Load()
			var counter *fsx.Faulty
			clean := openAt(t, dir, c, func(inner fsx.FS) fsx.FS { counter = fsx.NewFaulty(inner); return counter })
			if err := op.run(clean, c); err != nil {
				t.Fatalf("clean run: %v", err)
			}
			calls := counter.Count()
			for n := 1; n <= calls; n++ {
				for _, errno := range errnos {
					runs++
					checkFault(t, op, n, errno, base, start)
				}
			}
			t.Logf("%s: %d calls × %d errnos", op.name, calls, len(errnos))
		})
	}
	t.Logf("%d fault runs", runs)
}

func checkFault(t *testing.T, op faultOp, n int, errno syscall.Errno, base *crashtest.Tree, start int64) {
	t.Helper()
	c := &clock{}
	c.ns.Store(start)
	dir := privateDir(t)
	if err := base.Materialize(dir); err != nil {
		t.Fatal(err)
	}
	before := readAll(t, openAt(t, dir, c, nil))
	tempsBefore := listTemps(dir)
	var faulty *fsx.Faulty
	s := openAt(t, dir, c, func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		faulty.Inject = fsx.FailNth(n, errno)
		return faulty
	})
	err := op.run(s, c)
	log := faulty.Log()
	var failed *fsx.Op
	for i := range log {
		if log[i].Seq == n {
			failed = &log[i]
		}
	}
	where := ""
	if failed != nil {
		where = string(failed.Kind) + " " + failed.Path
	}
	if err != nil && errcode.CodeOf(err) == nil {
		t.Errorf("call %d (%s) failing with %v: error without a code: %v", n, where, errno, err)
	}
	if err == nil && failed != nil && !tolerated(failed) {
		t.Errorf("call %d (%s) failed with %v but the operation reported success", n, where, errno)
	}
	// Faults off: the store is readable, and what it held is intact unless this
	// operation published a change to it before the fault.
	after := readAll(t, openAt(t, dir, c, nil))
	published := publishedPaths(log)
	for p, r := range before {
		if published[p] {
			continue
		}
		if got, ok := after[p]; !ok || !reflect.DeepEqual(got, r) {
			t.Errorf("call %d (%s) failing with %v: %s changed without being published", n, where, errno, p)
		}
	}
	// No temp is left behind, unless the failing call was its cleanup.
	for p := range listTemps(dir) {
		if tempsBefore[p] || strings.HasPrefix(filepath.Base(p), ".lock-") && failed != nil && failed.Kind == fsx.OpRemove {
			continue
		}
		if failed != nil && failed.Kind == fsx.OpRemove && failed.Path == p {
			continue
		}
		t.Errorf("call %d (%s) failing with %v left temp %s", n, where, errno, p)
	}
	// fsck finds nothing it cannot repair, and after repair nothing at all.
	for _, v := range checkFsck(t, dir, c, crashtest.State{Prefix: -1}, nil, nil) {
		t.Errorf("call %d (%s) failing with %v: %s", n, where, errno, v)
	}
	// And the store accepts a write again.
	if err := put(context.Background(), openAt(t, dir, c, nil), newMessage(c.Now())); err != nil {
		t.Errorf("call %d (%s) failing with %v: the store does not accept writes afterwards: %v", n, where, errno, err)
	}
}

// tolerated reports whether a failed call may be absorbed by the operation: removing
// an already staged temp after its publication failed, or a lock temp's cleanup.
func tolerated(op *fsx.Op) bool {
	if op.Kind == fsx.OpRemove && strings.HasSuffix(op.Path, ".tmp") {
		return true // best-effort cleanup of an unpublished temp
	}
	if op.Kind == fsx.OpClose && !strings.HasSuffix(op.Path, ".tmp") {
		return true // a read-only descriptor
	}
	if op.Kind == fsx.OpWrite && op.Path == ".lock" && strings.HasPrefix(string(op.Data), `{"free":true`) {
		// Releasing the lock (writing the free record) failed in a round whose plan
		// was to be retried anyway; the retry takes over the leftover lock (its
		// holder is this very process) and succeeds. Only a failure in the round
		// that published is reported.
		return true
	}
	return false
}

// publishedPaths returns the record paths the log renamed into place or removed.
func publishedPaths(log []fsx.Op) map[string]bool {
	out := map[string]bool{}
	for _, op := range log {
		if op.Err != nil {
			continue
		}
		switch op.Kind {
		case fsx.OpRename:
			out[op.Path2] = true
		case fsx.OpRemove:
			out[op.Path] = true
		}
	}
	return out
}

// storeFailing opens a store in a fresh directory whose file system answers err to
// every call of kind k on a path (the source, or for a rename the destination) under
// prefix, and performs every other call.
func storeFailing(t *testing.T, k fsx.OpKind, prefix string, err error) (*store.Store, *fsx.Faulty, *clock, string) {
	t.Helper()
	c := &clock{}
	c.ns.Store(time.Now().UnixNano())
	dir := privateDir(t)
	var faulty *fsx.Faulty
	s := openAt(t, dir, c, func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		faulty.Inject = func(op fsx.Op) error {
			p := op.Path
			if op.Kind == fsx.OpRename {
				p = op.Path2
			}
			if op.Kind == k && strings.HasPrefix(p, prefix) {
				return err
			}
			return nil
		}
		return faulty
	})
	return s, faulty, c, dir
}

// A short write is never renamed into place.
func TestShortWriteNeverPublished(t *testing.T) {
	s, _, c, dir := storeFailing(t, fsx.OpWrite, "messages/", fsx.ErrShortWrite)
	m := newMessage(c.Now())
	err := put(context.Background(), s, m)
	if !errors.Is(err, errcode.OutboxStoreUnwritable) {
		t.Fatalf("short write: %v", err)
	}
	if _, statErr := os.Lstat(filepath.Join(dir, "messages", m.MessageID+".json")); !os.IsNotExist(statErr) {
		t.Fatal("a short write was published")
	}
	if temps := listTemps(dir); len(temps) != 0 {
		t.Fatalf("temps left: %v", temps)
	}
}

// EIO on the temp's fsync: no rename, and no retry of the fsync.
func TestFsyncFailureIsNotRetried(t *testing.T) {
	s, faulty, c, _ := storeFailing(t, fsx.OpSync, "messages/", syscall.EIO)
	m := newMessage(c.Now())
	if err := put(context.Background(), s, m); !errors.Is(err, errcode.OutboxStoreUnwritable) {
		t.Fatalf("fsync EIO: %v", err)
	}
	syncs, renames := 0, 0
	for _, op := range faulty.Log() {
		if op.Kind == fsx.OpSync && strings.HasPrefix(op.Path, "messages/") {
			syncs++
		}
		if op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, "messages/") {
			renames++
		}
	}
	if syncs != 1 || renames != 0 {
		t.Fatalf("after a failed fsync: %d fsyncs, %d renames (want 1 and 0)", syncs, renames)
	}
}

// EIO on the directory fsync: the error is surfaced, the write is not acknowledged.
func TestDirectoryFsyncFailureNotAcknowledged(t *testing.T) {
	for _, op := range []faultOp{faultOps()[0], faultOps()[2], faultOps()[3]} {
		c := &clock{}
		c.ns.Store(time.Now().UnixNano())
		dir := privateDir(t)
		faultSetup(t, dir, c)
		s := openAt(t, dir, c, func(inner fsx.FS) fsx.FS {
			f := fsx.NewFaulty(inner)
			f.Inject = func(op fsx.Op) error {
				if op.Kind == fsx.OpSyncDir && op.Path != "." {
					return syscall.EIO
				}
				return nil
			}
			return f
		})
		if err := op.run(s, c); !errors.Is(err, errcode.OutboxStoreUnwritable) {
			t.Errorf("%s with a failing directory fsync: %v, want OUTBOX_STORE_UNWRITABLE", op.name, err)
		}
	}
}

// EXDEV on rename: an error, and no copy is attempted in its place.
func TestRenameEXDEVIsAnError(t *testing.T) {
	s, faulty, c, dir := storeFailing(t, fsx.OpRename, "messages/", syscall.EXDEV)
	m := newMessage(c.Now())
	if err := put(context.Background(), s, m); !errors.Is(err, errcode.OutboxStoreUnwritable) || !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("EXDEV: %v", err)
	}
	for _, op := range faulty.Log() {
		if op.Kind == fsx.OpCreate && strings.HasPrefix(op.Path, "messages/") && !fsx.IsTempName(filepath.Base(op.Path)) {
			t.Fatalf("a copy was attempted: %s", op.Path)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "messages", m.MessageID+".json")); !os.IsNotExist(err) {
		t.Fatal("record appeared despite EXDEV")
	}
}
