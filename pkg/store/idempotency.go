package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// Idempotency defaults (DESIGN §9).
const (
	defaultOperationLease     = 120 * time.Second
	defaultOperationRetention = 24 * time.Hour
)

// OperationStart is what BeginOperation found or made for an Idempotency-Key.
type OperationStart struct {
	Operation *record.Operation
	// Done is true when the operation already finished: Operation.Response is the
	// stored response to return again. Otherwise the caller holds the operation's
	// lease and must perform it, then call CompleteOperation.
	Done bool
}

// BeginOperation binds sha256(key) to an operation for request, durably, or answers
// from an existing binding:
//
//   - the same key with the same request, finished: the stored response (Done);
//   - the same key with the same request, in flight under a live lease:
//     IDEMPOTENCY_IN_PROGRESS;
//   - in flight but its lease expired (its holder died): the caller takes it over;
//   - the same key with another request: IDEMPOTENCY_KEY_REUSED;
//   - a new key, or one whose binding's retention ended: a new in-flight operation
//     with a lease, and its binding (written after the operation is durable).
//
// Capacity (operations count and cached response bytes, DESIGN §5) is decided under the lock
// from the operations index, which is prepared outside the lock; if another process
// published meanwhile the index is re-prepared and the attempt repeated (bounded;
// then IDEMPOTENCY_STORE_BUSY). Past a limit: IDEMPOTENCY_STORE_FULL, nothing written.
func (s *Store) BeginOperation(ctx context.Context, key string, request []byte) (OperationStart, error) {
	keyHash, reqDigest := record.IdempotencyID(key), envelope.Digest(request)
	var out OperationStart
	for round := 0; round < maxIndexRounds; round++ {
		if _, err := s.prepareIndex(ctx, record.KindOperations); err != nil {
			return out, err
		}
		err := s.preparedTx(ctx, func(tx *Tx) error {
			var err error
			out, err = s.planBegin(tx, keyHash, reqDigest)
			return err
		}, func(pub *Tx) error { return s.checkOperationCapacity(pub) })
		switch {
		case err == nil:
			return out, nil
		case !errors.Is(err, errIndexStale):
			return OperationStart{}, err
		}
	}
	return OperationStart{}, errcode.New(errcode.IdempotencyStoreBusy, "operations", errors.New("the operations index kept changing"))
}

var errIndexStale = errcode.New(errcode.IdempotencyStoreBusy, "operations", errors.New("the operations index is stale"))

func (s *Store) planBegin(tx *Tx, keyHash, reqDigest string) (OperationStart, error) {
	now := s.nowMs()
	b, err := TxGet[*record.Binding](tx, keyHash)
	if err != nil {
		return OperationStart{}, err
	}
	if b != nil && b.RetainUntil > now {
		if b.RequestDigest != reqDigest {
			return OperationStart{}, errcode.New(errcode.IdempotencyKeyReused, "idempotency/"+keyHash, nil)
		}
		op, err := TxGet[*record.Operation](tx, b.OperationID)
		if err != nil {
			return OperationStart{}, err
		}
		switch {
		case op != nil && op.State == record.OperationDone:
			return OperationStart{Operation: op, Done: true}, nil
		case op != nil && op.LeaseUntil > now:
			return OperationStart{}, errcode.New(errcode.IdempotencyInProgress, "operations/"+op.OperationID, nil)
		case op != nil:
			// The holder's lease ran out: take the operation over.
			op.LeaseUntil = now + s.leaseMs()
			return OperationStart{Operation: op}, tx.Put(op)
		}
		// The binding's operation is gone: bind afresh below.
	}
	if b != nil {
		if err := tx.Delete(record.KindIdempotency, keyHash); err != nil {
			return OperationStart{}, err
		}
	}
	op := &record.Operation{OperationID: uuid.NewString(), RequestDigest: reqDigest, State: record.OperationInFlight,
		CreatedAt: now, LeaseUntil: now + s.leaseMs(), RetainUntil: now + defaultOperationRetention.Milliseconds()}
	binding := &record.Binding{KeyHash: keyHash, OperationID: op.OperationID, RequestDigest: reqDigest,
		CreatedAt: now, RetainUntil: op.RetainUntil}
	if err := tx.Put(op); err != nil {
		return OperationStart{}, err
	}
	return OperationStart{Operation: record.Clone(op).(*record.Operation)}, tx.putLast(binding)
}

func (s *Store) leaseMs() int64 { return s.opLease.Milliseconds() }

// checkOperationCapacity runs under the lock. It never scans: a stale operations
// index answers errIndexStale (IDEMPOTENCY_STORE_BUSY) and BeginOperation prepares it
// again outside the lock.
func (s *Store) checkOperationCapacity(pub *Tx) error {
	var st Stamp
	var err error
	if gen := pub.heldGeneration(); gen != nil {
		st, err = s.stampWith(record.KindOperations, *gen)
	} else {
		st, err = s.ListingStamp(record.KindOperations)
	}
	if err != nil {
		return err
	}
	now := s.nowMs()
	s.mu.Lock()
	defer s.mu.Unlock()
	ix := s.indexes[record.KindOperations]
	if !s.indexCurrent(record.KindOperations, ix, st) {
		return errIndexStale
	}
	count, bytes := 0, int64(0)
	for _, e := range ix.ops {
		if e.RetainUntil > now {
			count++
			bytes += e.Bytes
		}
	}
	if count >= s.limits.Operations || bytes+s.limits.OperationBytes > s.limits.CachedResultBytes {
		return errcode.New(errcode.IdempotencyStoreFull, "operations", fmt.Errorf("%d operations, %d response bytes", count, bytes))
	}
	return nil
}

// CompleteOperation durably stores the response of an in-flight operation. Completing
// it again with the same response does nothing; with another, DELIVERY_RECORD_CONFLICT.
func (s *Store) CompleteOperation(ctx context.Context, operationID string, response json.RawMessage) error {
	return s.PreparedTransaction(ctx, func(tx *Tx) error {
		op, err := TxGet[*record.Operation](tx, operationID)
		if err != nil {
			return err
		}
		if op == nil {
			return errcode.New(errcode.OutboxStoreInvalid, "operations/"+operationID, errors.New("no such operation"))
		}
		if op.State == record.OperationDone && bytes.Equal(op.Response, response) {
			return nil
		}
		op.State, op.Response = record.OperationDone, response
		return tx.Put(op)
	})
}

// ExpireOperationLeases ends the leases of the in-flight operations created before
// before, so that a retry with their key takes them over at once instead of answering
// IDEMPOTENCY_IN_PROGRESS until the lease runs out. It is for a process that knows it
// is the only one performing operations on this store (the daemon, under its pid
// lock) and that the operations it did not start belong to a dead predecessor. Each
// lease is ended by its own prepared transaction. It returns how many were ended.
func (s *Store) ExpireOperationLeases(ctx context.Context, before time.Time) (int, error) {
	ix, err := s.prepareIndex(ctx, record.KindOperations)
	if err != nil {
		return 0, err
	}
	cut, now := before.UnixMilli(), s.nowMs()
	var ids []string
	s.mu.Lock()
	for id, e := range ix.ops {
		if e.State != record.OperationDone && e.CreatedAt < cut && e.LeaseUntil > now {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, id := range ids {
		ended, err := s.endLease(ctx, id, func(op *record.Operation) bool { return op.CreatedAt < cut })
		if err != nil {
			return n, err
		}
		if ended {
			n++
		}
	}
	return n, nil
}

// ReleaseOperation ends the lease of in-flight operation id without completing it
// (its holder gave up, e.g. on a transient failure): a retry with its key takes it
// over at once. A finished or missing operation is left alone.
func (s *Store) ReleaseOperation(ctx context.Context, id string) error {
	_, err := s.endLease(ctx, id, func(*record.Operation) bool { return true })
	return err
}

func (s *Store) endLease(ctx context.Context, id string, match func(*record.Operation) bool) (bool, error) {
	ended := false
	err := s.PreparedTransaction(ctx, func(tx *Tx) error {
		ended = false
		op, err := TxGet[*record.Operation](tx, id)
		if err != nil || op == nil {
			return err
		}
		now := s.nowMs()
		if op.State == record.OperationDone || op.LeaseUntil <= now || !match(op) {
			return nil
		}
		op.LeaseUntil = now
		ended = true
		return tx.Put(op)
	})
	return ended, err
}
