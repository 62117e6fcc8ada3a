package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// gate runs fn on n goroutines released together, and returns their results in order.
func gate[T any](n int, fn func(i int) T) []T {
	out := make([]T, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = fn(i)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// warmUp publishes one unrelated message, so the generation file exists and plans made
// on it are judged by its marks (a plan made before the file existed is stale anyway).
func warmUp(t *testing.T, s *store.Store) {
	t.Helper()
	enqueue(t, s, 1)
	if _, err := s.BeginOperation(context.Background(), "warm-up", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
}

// Concurrent BeginOperation calls with one key start one operation, whatever the
// concurrency: the others answer IDEMPOTENCY_IN_PROGRESS (their plans read the binding
// the winner wrote last in the same group commit, so they are stale and re-planned).
// On the old engine, which validated each plan of a group before the group's putLast
// writes (the binding) were published, several plans saw no binding and several
// operations were started, the later binding overwriting the earlier.
func TestConcurrentBeginOperationOneKeyOneOperation(t *testing.T) {
	const trials, workers = 40, 8
	for trial := range trials {
		s := openStore(t, store.Options{})
		warmUp(t, s)
		type result struct {
			start store.OperationStart
			err   error
		}
		res := gate(workers, func(int) result {
			st, err := s.BeginOperation(context.Background(), "one-key", []byte(`{"to":"bob"}`))
			return result{st, err}
		})
		started := map[string]bool{}
		for _, r := range res {
			switch {
			case r.err == nil && !r.start.Done:
				started[r.start.Operation.OperationID] = true
			case errors.Is(r.err, errcode.IdempotencyInProgress):
			default:
				t.Fatalf("trial %d: BeginOperation: %+v %v", trial, r.start, r.err)
			}
		}
		if len(started) != 1 {
			t.Fatalf("trial %d: %d operations started for one key, want 1", trial, len(started))
		}
		ops, err := s.List(record.KindOperations)
		if err != nil {
			t.Fatal(err)
		}
		if len(ops) != 2 { // the warm-up's and the key's
			t.Fatalf("trial %d: %d operation records, want 2", trial, len(ops))
		}
	}
}

// Concurrent one-envelope Enqueues of one message id with different envelopes accept
// one set of envelopes; the others answer DELIVERY_RECORD_CONFLICT. Every enqueue that
// returned nil must be the committed one. On the old engine several returned nil and
// all but one were left uncommitted (orphans maintenance removes).
func TestConcurrentEnqueueOneMessageIDOneAcceptedSet(t *testing.T) {
	const trials, workers = 40, 8
	for trial := range trials {
		s := openStore(t, store.Options{})
		warmUp(t, s)
		base := sendRequest(t, 1)
		reqs := make([]store.SendRequest, workers)
		for i := range reqs {
			r := base
			id := uuid.NewString()
			env, _ := json.Marshal(map[string]any{"envelopeId": id, "body": fmt.Sprintf("variant %d", i)})
			r.Envelopes = []store.OutgoingEnvelope{{EnvelopeID: id, Kind: record.EnvelopeMessage, Envelope: env}}
			reqs[i] = r
		}
		errs := gate(workers, func(i int) error {
			_, err := s.Enqueue(context.Background(), reqs[i])
			return err
		})
		accepted := 0
		for i, err := range errs {
			switch {
			case err == nil:
				accepted++
				mem, cerr := s.Committed(reqs[i].Envelopes[0].EnvelopeID)
				if cerr != nil || len(mem) != 1 {
					t.Fatalf("trial %d: enqueue %d returned nil but its envelope is not committed (%v)", trial, i, cerr)
				}
			case errors.Is(err, errcode.DeliveryRecordConflict):
			default:
				t.Fatalf("trial %d: enqueue %d: %v", trial, i, err)
			}
		}
		if accepted != 1 {
			t.Fatalf("trial %d: %d enqueues of one message id accepted, want 1", trial, accepted)
		}
	}
}

// The kind directories the store finds (made by a process that may have crashed before it
// fsynced the store directory) are made durable before the first record is published in
// them: the store directory is fsynced once.
func TestFoundKindDirectoryMadeDurableBeforeFirstPublication(t *testing.T) {
	home := t.TempDir()
	probe := openStore(t, store.Options{Home: home})
	// The generation file exists (its creation fsyncs the store directory too).
	if _, err := probe.BeginOperation(context.Background(), "k", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []record.Kind{record.KindOutbox, record.KindMessages} {
		if err := os.MkdirAll(filepath.Join(probe.Dir(), string(k)), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{Home: home, WrapFS: func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		return faulty
	}})
	enqueue(t, s, 1)
	synced := false
	for _, op := range faulty.Log() {
		switch {
		case op.Kind == fsx.OpSyncDir && op.Path == ".":
			synced = true
		case op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, "outbox/"):
			if !synced {
				t.Fatalf("published %s before the store directory holding the found outbox/ was fsynced", op.Path2)
			}
			return
		}
	}
	t.Fatal("no publication into outbox/ recorded")
}

// Capacity holds under concurrent enqueues in one group commit: a single's message
// record is published last, after the capacity checks of the later plans of its
// group, and those checks count it all the same. With room for one more message, of
// eight concurrent one-envelope enqueues exactly one is accepted.
func TestConcurrentEnqueuesKeepTheMessagesLimit(t *testing.T) {
	const trials, workers = 20, 8
	for trial := range trials {
		s := openStore(t, store.Options{Limits: store.Limits{Messages: 2}})
		warmUp(t, s) // one message: room for one more
		reqs := make([]store.SendRequest, workers)
		for i := range reqs {
			reqs[i] = sendRequest(t, 1)
		}
		errs := gate(workers, func(i int) error {
			_, err := s.Enqueue(context.Background(), reqs[i])
			return err
		})
		accepted := 0
		for i, err := range errs {
			switch {
			case err == nil:
				accepted++
			case errors.Is(err, errcode.OutboxFull):
			default:
				t.Fatalf("trial %d: enqueue %d: %v", trial, i, err)
			}
		}
		if accepted != 1 {
			t.Fatalf("trial %d: %d enqueues accepted with room for one message", trial, accepted)
		}
	}
}

// A caller whose context ends while it waits for another process's hold of the store
// lock gets OUTBOX_STORE_BUSY with the context's error as the cause (DESIGN §15).
func TestCancelledLockWaitIsBusy(t *testing.T) {
	home := t.TempDir()
	holder, waiter := openStore(t, store.Options{Home: home}), openStore(t, store.Options{Home: home, LockWait: time.Minute})
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- holder.Transaction(context.Background(), func(*store.Tx) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- waiter.Transaction(ctx, func(*store.Tx) error { return nil }) }()
	cancel()
	err := <-waited
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, errcode.OutboxStoreBusy) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a lock wait cut short by its context: %v, want OUTBOX_STORE_BUSY caused by context.Canceled", err)
	}
}
