package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// cutLock leaves the store's ".lock" as a power cut left it on the code before the
// lock file was made durably: empty (its first contents never reached the disk),
// dated now (a file-system shutdown and remount: no reboot, so no boot rule helps).
func cutLock(t *testing.T, dir string) {
	t.Helper()
	if err := os.Truncate(filepath.Join(dir, ".lock"), 0); err != nil {
		t.Fatal(err)
	}
}

// After a power cut, the first writer takes an empty ".lock" whose flock is free at
// its first attempt: LockWait -1 is a single attempt, so any wait for the stale bound
// (an hour here) would be OUTBOX_STORE_BUSY. On the code before the fix it was.
func TestEmptyLockAfterCutTakenAtOnce(t *testing.T) {
	s := openStore(t, store.Options{})
	enqueue(t, s, 1)
	cutLock(t, s.Dir())
	now := time.Now()
	next := openStore(t, store.Options{Dir: s.Dir(), LockWait: -1, LockStale: time.Hour, Now: func() time.Time { return now }})
	for range 2 {
		if _, err := next.Enqueue(context.Background(), sendRequest(t, 2)); err != nil {
			t.Fatalf("the first write after the cut: %v (busy: %v)", err, errors.Is(err, errcode.OutboxStoreBusy))
		}
	}
	b, err := os.ReadFile(filepath.Join(s.Dir(), ".lock"))
	if err != nil || !strings.HasPrefix(string(b), `{"free":true`) {
		t.Fatalf(".lock after the writes = %q, %v; want the free record", b, err)
	}
}

// Many writers of their own Store (as many processes) meet the cut ".lock" at once,
// released by a start gate: each gets the store in turn, none waits for the stale bound.
func TestEmptyLockAfterCutManyWriters(t *testing.T) {
	s := openStore(t, store.Options{})
	enqueue(t, s, 1)
	cutLock(t, s.Dir())
	const writers = 8
	now := time.Now()
	stores := make([]*store.Store, writers)
	for i := range stores {
		// LockWait bounds the turns of 8 writers, not the stale bound (an hour).
		stores[i] = openStore(t, store.Options{Dir: s.Dir(), LockWait: 30 * time.Second, LockStale: time.Hour, Now: func() time.Time { return now }})
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for _, w := range stores {
		wg.Go(func() {
			<-start
			if _, err := w.Enqueue(context.Background(), sendRequest(t, 1)); err != nil {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ids, err := s.List("messages")
	if err != nil || len(ids) != writers+1 {
		t.Fatalf("messages: %d, %v; want %d", len(ids), err, writers+1)
	}
}
