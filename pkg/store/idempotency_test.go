package store_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func begin(t *testing.T, s *store.Store, key, req string) (store.OperationStart, error) {
	t.Helper()
	return s.BeginOperation(context.Background(), key, []byte(req))
}

func TestIdempotencySameKeySameRequestReturnsStoredResponse(t *testing.T) {
	s := openStore(t, store.Options{})
	first, err := begin(t, s, "key-1", `{"to":"bob"}`)
	if err != nil || first.Done || first.Operation == nil || first.Operation.State != record.OperationInFlight {
		t.Fatalf("first begin: %+v %v", first, err)
	}
	resp := json.RawMessage(`{"messageId":"m-1"}`)
	if err := s.CompleteOperation(context.Background(), first.Operation.OperationID, resp); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*store.Store{s, openStore(t, store.Options{Dir: s.Dir(), CacheEntries: -1})} {
		again, err := begin(t, st, "key-1", `{"to":"bob"}`)
		if err != nil || !again.Done || string(again.Operation.Response) != string(resp) ||
			again.Operation.OperationID != first.Operation.OperationID {
			t.Fatalf("repeat: %+v %v", again, err)
		}
	}
	// completing with another response is refused; with the same, a no-op
	wantCode(t, s.CompleteOperation(context.Background(), first.Operation.OperationID, json.RawMessage(`{"x":1}`)),
		errcode.DeliveryRecordConflict)
	if err := s.CompleteOperation(context.Background(), first.Operation.OperationID, resp); err != nil {
		t.Fatal(err)
	}
}

func TestIdempotencyKeyReusedWithAnotherRequest(t *testing.T) {
	s := openStore(t, store.Options{})
	if _, err := begin(t, s, "k", `{"a":1}`); err != nil {
		t.Fatal(err)
	}
	_, err := begin(t, s, "k", `{"a":2}`)
	wantCode(t, err, errcode.IdempotencyKeyReused)
}

func TestIdempotencyInProgressThenTakeoverAfterLease(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now, OperationLease: time.Minute})
	first, err := begin(t, s, "k", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = begin(t, s, "k", `{}`)
	wantCode(t, err, errcode.IdempotencyInProgress)
	clock.Advance(2 * time.Minute) // the first holder died without completing
	again, err := begin(t, s, "k", `{}`)
	if err != nil || again.Done || again.Operation.OperationID != first.Operation.OperationID {
		t.Fatalf("takeover after the lease: %+v %v", again, err)
	}
	_, err = begin(t, s, "k", `{}`)
	wantCode(t, err, errcode.IdempotencyInProgress)
}

func TestIdempotencyAfterRetentionIsANewOperation(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now})
	first, _ := begin(t, s, "k", `{}`)
	if err := s.CompleteOperation(context.Background(), first.Operation.OperationID, json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(store.DefaultOperationRetention + time.Minute)
	// even another request is fine once the binding's retention ended
	next, err := begin(t, s, "k", `{"other":true}`)
	if err != nil || next.Done || next.Operation.OperationID == first.Operation.OperationID {
		t.Fatalf("after retention: %+v %v", next, err)
	}
}

func TestIdempotencyCapacityFullWritesNothing(t *testing.T) {
	s := openStore(t, store.Options{Limits: store.Limits{Operations: 2}})
	for _, k := range []string{"a", "b"} {
		if _, err := begin(t, s, k, `{}`); err != nil {
			t.Fatal(err)
		}
	}
	ops, _ := s.List(record.KindOperations)
	binds, _ := s.List(record.KindIdempotency)
	_, err := begin(t, s, "c", `{}`)
	wantCode(t, err, errcode.IdempotencyStoreFull)
	ops2, _ := s.List(record.KindOperations)
	binds2, _ := s.List(record.KindIdempotency)
	if len(ops2) != len(ops) || len(binds2) != len(binds) {
		t.Fatalf("a refused operation wrote records: ops %d→%d, bindings %d→%d", len(ops), len(ops2), len(binds), len(binds2))
	}
	// the existing keys still answer
	if _, err := begin(t, s, "a", `{}`); !errorsIs(err, errcode.IdempotencyInProgress) {
		t.Fatalf("existing key: %v", err)
	}
}

func TestIdempotencyCapacityCountsAnotherProcessesOperations(t *testing.T) {
	// Two instances (as two processes): the second's index is stale after the first
	// writes; the capacity decision must still see both operations.
	dir := filepath.Join(t.TempDir(), "store")
	a := openStore(t, store.Options{Dir: dir, Limits: store.Limits{Operations: 2}})
	b := openStore(t, store.Options{Dir: dir, Limits: store.Limits{Operations: 2}})
	if _, err := begin(t, b, "x", `{}`); err != nil {
		t.Fatal(err)
	}
	if _, err := begin(t, a, "y", `{}`); err != nil {
		t.Fatal(err)
	}
	_, err := begin(t, b, "z", `{}`)
	wantCode(t, err, errcode.IdempotencyStoreFull)
}

func TestOrphanedOperationCleanedOnlyAfterItsLease(t *testing.T) {
	clock := newTestClock(time.Now())
	s := openStore(t, store.Options{Now: clock.Now, OperationLease: time.Minute})
	first, _ := begin(t, s, "k", `{}`)
	// Make it an orphan: remove its binding (as an interrupted bind would leave it).
	if err := s.Transaction(context.Background(), func(tx *store.Tx) error {
		return tx.Delete(record.KindIdempotency, record.IdempotencyID("k"))
	}); err != nil {
		t.Fatal(err)
	}
	bound, _ := begin(t, s, "other", `{}`) // a bound operation, same age
	maintain(t, s)
	if op, _ := store.GetAs[*record.Operation](s, first.Operation.OperationID); op == nil {
		t.Fatal("an orphan was removed before its lease ran out")
	}
	clock.Advance(2 * time.Minute)
	rep := maintain(t, s)
	if op, _ := store.GetAs[*record.Operation](s, first.Operation.OperationID); op != nil || rep.OrphansRemoved != 1 {
		t.Fatalf("aged orphan kept (report %+v)", rep)
	}
	if op, _ := store.GetAs[*record.Operation](s, bound.Operation.OperationID); op == nil {
		t.Fatal("a bound operation was removed as an orphan")
	}
}

func errorsIs(err error, c *errcode.Code) bool { return errcode.CodeOf(err) == c }
