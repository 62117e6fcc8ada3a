package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// incrementCounter is a prepared transaction adding one to message id's Attempts.
func incrementCounter(ctx context.Context, s *store.Store, id string, runs *atomic.Int64) error {
	return s.PreparedTransaction(ctx, func(tx *store.Tx) error {
		if runs != nil {
			runs.Add(1)
		}
		m, err := store.TxGet[*record.Message](tx, id)
		if err != nil {
			return err
		}
		if m == nil {
			return errors.New("counter record missing")
		}
		m.Attempts++
		return tx.Put(m)
	})
}

func counterValue(t *testing.T, dir, id string) int {
	t.Helper()
	s := openStore(t, store.Options{Dir: dir, CacheEntries: -1})
	m, err := store.GetAs[*record.Message](s, id)
	if err != nil || m == nil {
		t.Fatalf("counter: %v %v", m, err)
	}
	return m.Attempts
}

// tempFiles lists every staged temp left anywhere in the store.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(d.Name(), ".tmp") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

const preparedHelperEnv = "SEALBRIDGE_PREPARED_HELPER"

// TestPreparedHelperProcess is the child of TestPreparedCounterTwoProcesses.
func TestPreparedHelperProcess(t *testing.T) {
	spec := os.Getenv(preparedHelperEnv)
	if spec == "" {
		t.Skip("helper process only")
	}
	parts := strings.Split(spec, "|")
	if parts[2] == "lockonce" {
		// One transaction that takes the lock at its first attempt or fails.
		s := openStore(t, store.Options{Dir: parts[0], LockWait: -1})
		if err := s.Transaction(context.Background(), func(tx *store.Tx) error {
			return tx.Put(newMessage(t, time.Now()))
		}); err != nil {
			t.Fatalf("lock not free: %v", err)
		}
		return
	}
	n, _ := strconv.Atoi(parts[2])
	s := openStore(t, store.Options{Dir: parts[0], LockWait: 30 * time.Second})
	for i := 0; i < n; i++ {
		if err := incrementCounter(context.Background(), s, parts[1], nil); err != nil {
			t.Fatalf("increment %d: %v", i, err)
		}
	}
}

func TestPreparedCounterTwoProcesses(t *testing.T) {
	n := 500
	if testing.Short() {
		n = 100
	}
	s := openStore(t, store.Options{})
	m := newMessage(t, time.Now())
	mustPut(t, s, m)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	outs := make([][]byte, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestPreparedHelperProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d", preparedHelperEnv, s.Dir(), m.MessageID, n))
			outs[i], errs[i] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("child %d: %v\n%s", i, errs[i], outs[i])
		}
	}
	if got := counterValue(t, s.Dir(), m.MessageID); got != 2*n {
		t.Fatalf("counter = %d, want %d (lost or doubled updates)", got, 2*n)
	}
	if left := tempFiles(t, s.Dir()); len(left) != 0 {
		t.Fatalf("temps left: %v", left)
	}
}

// invalidatingFS calls hook once for each temp staged (the first write to a temp),
// outside the lock, and counts the mutating calls.
func stagingHook(hook func()) func(fsx.FS) fsx.FS {
	return func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if op.Kind == fsx.OpWrite && fsx.IsTempName(filepath.Base(op.Path)) && strings.HasPrefix(op.Path, "messages/") {
				hook()
			}
			return nil
		}
		return f
	}
}

func TestPreparedPlanInvalidatedRunsAgain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	other := openStore(t, store.Options{Dir: dir})
	m := newMessage(t, time.Now())
	mustPut(t, other, m)
	var interfered atomic.Bool
	s := openStore(t, store.Options{Dir: dir, WrapFS: stagingHook(func() {
		if interfered.CompareAndSwap(false, true) {
			// Another writer publishes while our plan is being staged.
			if err := other.Transaction(context.Background(), func(tx *store.Tx) error {
				cur, _ := store.TxGet[*record.Message](tx, m.MessageID)
				cur.Attempts += 10
				return tx.Put(cur)
			}); err != nil {
				t.Error(err)
			}
		}
	})})
	var runs atomic.Int64
	if err := incrementCounter(context.Background(), s, m.MessageID, &runs); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 {
		t.Fatalf("fn ran %d times, want 2 (the first plan was invalidated)", runs.Load())
	}
	// The stale plan (0+1) was never published: 10 from the other writer, then +1.
	if got := counterValue(t, dir, m.MessageID); got != 11 {
		t.Fatalf("counter = %d, want 11", got)
	}
	if left := tempFiles(t, dir); len(left) != 0 {
		t.Fatalf("temps of the abandoned plan left: %v", left)
	}
}

func TestPreparedRoundsExhaustedIsBusy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	other := openStore(t, store.Options{Dir: dir})
	m := newMessage(t, time.Now())
	mustPut(t, other, m)
	s := openStore(t, store.Options{Dir: dir, OptimisticOnly: true, WrapFS: stagingHook(func() {
		if err := other.Transaction(context.Background(), func(tx *store.Tx) error {
			cur, _ := store.TxGet[*record.Message](tx, m.MessageID)
			cur.Attempts += 10
			return tx.Put(cur)
		}); err != nil {
			t.Error(err)
		}
	})})
	var runs atomic.Int64
	err := incrementCounter(context.Background(), s, m.MessageID, &runs)
	wantCode(t, err, errcode.OutboxStoreBusy)
	if runs.Load() != store.MaxPlanRounds {
		t.Fatalf("fn ran %d times, want %d", runs.Load(), store.MaxPlanRounds)
	}
	if got := counterValue(t, dir, m.MessageID); got != 10*store.MaxPlanRounds {
		t.Fatalf("counter = %d: a stale plan was published", got)
	}
	if left := tempFiles(t, dir); len(left) != 0 {
		t.Fatalf("temps left: %v", left)
	}
}

// By default the last round runs locked, so even a plan invalidated every time it is
// staged outside the lock completes.
func TestPreparedLastRoundLockedGuaranteesProgress(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	other := openStore(t, store.Options{Dir: dir, LockWait: -1})
	m := newMessage(t, time.Now())
	mustPut(t, other, m)
	var busy atomic.Int64
	s := openStore(t, store.Options{Dir: dir, WrapFS: stagingHook(func() {
		err := other.Transaction(context.Background(), func(tx *store.Tx) error {
			cur, _ := store.TxGet[*record.Message](tx, m.MessageID)
			cur.Attempts += 10
			return tx.Put(cur)
		})
		if errors.Is(err, errcode.OutboxStoreBusy) {
			busy.Add(1) // the locked round holds the lock while it stages
		} else if err != nil {
			t.Error(err)
		}
	})})
	var runs atomic.Int64
	if err := incrementCounter(context.Background(), s, m.MessageID, &runs); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != store.MaxPlanRounds || busy.Load() != 1 {
		t.Fatalf("fn ran %d times (want %d), interferer refused %d times (want 1)", runs.Load(), store.MaxPlanRounds, busy.Load())
	}
	if got := counterValue(t, dir, m.MessageID); got != 10*(store.MaxPlanRounds-1)+1 {
		t.Fatalf("counter = %d, want %d", got, 10*(store.MaxPlanRounds-1)+1)
	}
}

// While a prepared transaction stages (a write held up in the file system), another
// process takes the lock at its first attempt and finishes a transaction: the lock is
// held only for planning and publishing.
func TestPreparedLockNotHeldWhileStaging(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	m := newMessage(t, time.Now())
	mustPut(t, openStore(t, store.Options{Dir: dir}), m)
	var once sync.Once
	s := openStore(t, store.Options{Dir: dir, WrapFS: stagingHook(func() {
		once.Do(func() {
			// Our staging write is held here until the other process is done.
			cmd := exec.Command(os.Args[0], "-test.run=^TestPreparedHelperProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|-|lockonce", preparedHelperEnv, dir))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("another process could not take the lock while we staged: %v\n%s", err, out)
			}
		})
	})})
	if err := incrementCounter(context.Background(), s, m.MessageID, nil); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, dir, m.MessageID); got != 1 {
		t.Fatalf("counter = %d, want 1", got)
	}
	if ids, _ := s.List(record.KindMessages); len(ids) != 2 {
		t.Fatalf("%d messages, want 2 (the other process's write)", len(ids))
	}
}

// Concurrent senders share lock holds and directory fsyncs (group commit). Every
// sender has planned and staged before any publishes (their temp fsyncs are held
// until all are staged), and the first leader's lock acquisition is held until all
// eight are queued: they publish as one group, with one fsync per directory.
func TestPreparedGroupCommitSharesDirectoryFsyncs(t *testing.T) {
	const senders = 8
	var faulty *fsx.Faulty
	var staged atomic.Int64
	var s *store.Store
	release := make(chan struct{})
	var released, leaderHeld atomic.Bool
	s = openStore(t, store.Options{LockWait: 10 * time.Second, WrapFS: func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		return faulty
	}})
	enqueue(t, s, 2) // creates the directories
	faulty.Reset()
	faulty.Inject = func(op fsx.Op) error {
		switch {
		case op.Kind == fsx.OpSync && fsx.IsTempName(filepath.Base(op.Path)):
			if staged.Add(1) == senders*4 {
				released.Store(true)
				close(release)
			}
			<-release
		case op.Kind == fsx.OpWrite && op.Path == ".lock" && !strings.HasPrefix(string(op.Data), `{"free":true`) &&
			released.Load() && leaderHeld.CompareAndSwap(false, true):
			// Every plan took the lock before the temps were released: this is the
			// first group's leader taking it.
			deadline := time.Now().Add(time.Minute)
			for store.QueuedPublications(s) < senders {
				if time.Now().After(deadline) {
					t.Error("the senders never all queued for the first group")
					break
				}
				runtime.Gosched()
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			if _, err := s.Enqueue(context.Background(), sendRequest(t, 2)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	syncDirs, renames := 0, 0
	for _, op := range faulty.Log() {
		switch op.Kind {
		case fsx.OpSyncDir:
			syncDirs++
		case fsx.OpRename:
			renames++
		}
	}
	if renames != senders*4 {
		t.Fatalf("%d renames, want %d", renames, senders*4)
	}
	// Without group commit: 3 directory fsyncs per sender (outbox, messages, batches).
	if syncDirs != 3 {
		t.Fatalf("%d directory fsyncs for %d senders in one group, want 3", syncDirs, senders)
	}
}

func TestUpdateStagedSingleWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	other := openStore(t, store.Options{Dir: dir})
	m := newMessage(t, time.Now())
	mustPut(t, other, m)
	var seen []int
	var once sync.Once
	s := openStore(t, store.Options{Dir: dir, WrapFS: stagingHook(func() {
		once.Do(func() { // a concurrent change while the first version is staged
			cur, _ := store.GetAs[*record.Message](other, m.MessageID)
			cur.Attempts = 5
			mustPut(t, other, cur)
		})
	})})
	err := s.Update(context.Background(), record.KindMessages, m.MessageID, func(cur record.Record) (record.Record, error) {
		msg := cur.(*record.Message)
		seen = append(seen, msg.Attempts)
		msg.Status = record.StatusRelayed
		return msg, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := store.GetAs[*record.Message](openStore(t, store.Options{Dir: dir, CacheEntries: -1}), m.MessageID)
	if len(seen) != 2 || seen[0] != 0 || seen[1] != 5 || got.Attempts != 5 || got.Status != record.StatusRelayed {
		t.Fatalf("fn saw %v; stored %+v: the stale version was published or the change lost", seen, got)
	}
	// Writing another record than the one read is refused.
	err = s.Update(context.Background(), record.KindMessages, m.MessageID, func(record.Record) (record.Record, error) {
		return newMessage(t, time.Now()), nil
	})
	wantCode(t, err, errcode.OutboxStoreInvalid)
}
