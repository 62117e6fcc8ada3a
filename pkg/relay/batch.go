package relay

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// stageWorkers bounds the inbox files of one batch written (and fsynced) at once.
const stageWorkers = 8

func (r *Relay) serveBatch(w http.ResponseWriter, req *http.Request) (int, error) {
	body, e := readBody(w, req, relayproto.MaxBatchBodySize, relayproto.CodeBodyTooLarge)
	if e != nil {
		return 0, e
	}
	var batch relayproto.BatchRequest
	if err := envelope.DecodeStrict(body, &batch); err != nil {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, `body must be one JSON object {"envelopes":[…]}: %s`, err)
	}
	if len(batch.Envelopes) == 0 || len(batch.Envelopes) > relayproto.MaxBatchEnvelopes {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "envelopes must list 1..%d envelopes", relayproto.MaxBatchEnvelopes)
	}
	wires := make([][]byte, len(batch.Envelopes))
	for i, raw := range batch.Envelopes {
		wires[i] = raw
	}
	results, err := r.AcceptBatch(req.Context(), wires)
	if err != nil {
		return 0, err
	}
	data, err := json.Marshal(relayproto.BatchResponse{Results: results})
	if err != nil {
		return 0, internalError(err)
	}
	writeJSONBytes(w, http.StatusOK, data)
	return http.StatusOK, nil
}

// batchItem is one envelope of a batch accept on its way through AcceptBatch.
type batchItem struct {
	env    *envelope.Envelope
	result relayproto.BatchResult
	// dupOf is the index of an earlier new envelope of the batch with this id
	// and digest, or -1.
	dupOf int
	// A new envelope's record, inbox directory, file name, sequence number and
	// staged file.
	rec    *record.Receipt
	rdir   string
	name   string
	seq    uint64
	staged *fsx.Staged
	// res is a new envelope's claim on its recipient's quota (admit).
	res *reservation
}

// AcceptBatch verifies and stores up to relayproto.MaxBatchEnvelopes wire
// envelopes with the rules of Accept, envelope by envelope: each one is
// accepted, answered as a duplicate with its stored receipt, or refused with
// the status and code Accept would answer. The new ones are committed
// together: their inbox files are staged (in parallel, each fsynced),
// published, and each recipient directory fsynced once, then their receipt
// records are written in one prepared transaction — one group commit for the
// batch instead of one per envelope. The order of the inbox files (their
// sequence numbers) is the batch's order. An error is about the whole batch
// (the store or the inbox cannot be written: nothing new is acknowledged) and
// is a *relayproto.Error.
// Exported for the package's external tests, which call it without an HTTP server.
func (r *Relay) AcceptBatch(ctx context.Context, wires [][]byte) ([]relayproto.BatchResult, error) {
	items := make([]*batchItem, len(wires))
	var stripes []int
	for i, data := range wires {
		it := &batchItem{dupOf: -1}
		items[i] = it
		env, err := envelope.Parse(data)
		if err != nil {
			it.refuse(envelopeError(err))
			r.count(func(s *Stats) { s.Refused++ })
			continue
		}
		it.env = env
		stripes = append(stripes, stripe(env.ID()))
	}
	// Every envelope id of the batch is serialised as Accept serialises one, the
	// stripes taken in ascending order so that two batches cannot deadlock.
	slices.Sort(stripes)
	stripes = slices.Compact(stripes)
	for _, s := range stripes {
		r.stripes[s].Lock()
	}
	defer func() {
		for _, s := range stripes {
			r.stripes[s].Unlock()
		}
	}()

	now := r.now()
	firstNew := map[string]int{} // envelope id → index of its new item
	var fresh []*batchItem
	for i, it := range items {
		if it.env == nil {
			continue
		}
		env := it.env
		if j, ok := firstNew[env.ID()]; ok {
			if items[j].env.Digest() != env.Digest() {
				r.count(func(s *Stats) { s.Conflicts++ })
				it.refuse(conflictError(env))
			} else {
				it.dupOf = j
			}
			continue
		}
		rec, err := store.GetAs[*record.Receipt](r.st, record.ReceiptID(env.ID()))
		if err != nil {
			return nil, storeError(err)
		}
		if rec != nil {
			receipt, err := r.existing(env, rec)
			if err != nil {
				it.refuse(asError(err))
			} else {
				it.result = relayproto.BatchResult{Outcome: relayproto.BatchDuplicate, Receipt: receipt}
			}
			continue
		}
		if err := env.CheckDeadline(now); err != nil {
			it.refuse(envelopeError(err))
			r.count(func(s *Stats) { s.Refused++ })
			continue
		}
		res, lerr := r.admit(env, len(wires[i]))
		if lerr != nil {
			it.refuse(lerr)
			r.count(func(s *Stats) { s.Refused++ })
			continue
		}
		defer r.release(res)
		it.res = res
		firstNew[env.ID()] = i
		fresh = append(fresh, it)
	}
	if len(fresh) > 0 {
		if err := r.commitBatch(ctx, wires, items, fresh, now); err != nil {
			return nil, err
		}
	}
	results := make([]relayproto.BatchResult, len(items))
	for i, it := range items {
		if it.dupOf >= 0 {
			first := items[it.dupOf]
			results[i] = relayproto.BatchResult{Outcome: relayproto.BatchDuplicate, Receipt: first.result.Receipt}
			r.count(func(s *Stats) { s.Duplicates++ })
			if r.onAccept != nil {
				r.onAccept(it.env.ID(), it.env.Digest(), true)
			}
			continue
		}
		results[i] = it.result
	}
	return results, nil
}

func (it *batchItem) refuse(e *relayproto.Error) {
	it.result = relayproto.BatchResult{Outcome: relayproto.BatchRefused, Status: e.Status, Code: e.Code, Message: e.Message,
		RetryAfter: e.RetryAfter}
}

// commitBatch writes the new envelopes of a batch: files staged, published,
// directories fsynced, then the records in one prepared transaction. On
// success every fresh item has its receipt as its result.
func (r *Relay) commitBatch(ctx context.Context, wires [][]byte, items, fresh []*batchItem, now time.Time) error {
	index := map[*batchItem]int{}
	for i, it := range items {
		index[it] = i
	}
	var dones []func()
	defer func() {
		for _, d := range dones {
			d()
		}
	}()
	dirs := map[string]bool{}
	for _, it := range fresh {
		var done func()
		it.seq, done = r.allocSeq()
		dones = append(dones, done)
		it.rdir = recipientDir(it.env.Recipient())
		it.name = fileName(it.seq, it.env.ID())
		it.rec = r.receiptRecord(it.env, now.UnixMilli())
		if !dirs[it.rdir] {
			if _, err := fsx.MkdirPrivate(r.fs, it.rdir); err != nil {
				return unavailable("INBOX_UNWRITABLE", "the relay cannot write its inbox", err)
			}
			dirs[it.rdir] = true
		}
	}
	// Stage every file (write and fsync each) with a bounded pool.
	var mu sync.Mutex
	var stageErr error
	work := make(chan *batchItem)
	var wg sync.WaitGroup
	for range min(stageWorkers, len(fresh)) {
		wg.Go(func() {
			for it := range work {
				s, err := fsx.Stage(r.fs, it.rdir, wires[index[it]])
				mu.Lock()
				if err != nil && stageErr == nil {
					stageErr = err
				}
				it.staged = s
				mu.Unlock()
			}
		})
	}
	for _, it := range fresh {
		work <- it
	}
	close(work)
	wg.Wait()
	cleanup := func() {
		for _, it := range fresh {
			if it.staged == nil {
				continue
			}
			if it.staged.Published() {
				_ = r.fs.Remove(path.Join(it.rdir, it.name))
			} else {
				_ = it.staged.Cleanup()
			}
		}
		for d := range dirs {
			_ = r.fs.SyncDir(d)
		}
	}
	if stageErr != nil {
		cleanup()
		return unavailable("INBOX_UNWRITABLE", "the relay cannot write its inbox", stageErr)
	}
	// Publish in sequence order; each name's sequence number is new, so
	// nothing may be there (PublishNoReplace refuses to replace what is).
	for _, it := range fresh {
		if err := it.staged.PublishNoReplace(it.name); err != nil {
			cleanup()
			return unavailable("INBOX_UNWRITABLE", "the relay cannot write its inbox", err)
		}
	}
	for d := range dirs {
		if err := r.fs.SyncDir(d); err != nil {
			cleanup()
			return unavailable("INBOX_UNWRITABLE", "the relay cannot write its inbox", err)
		}
	}
	err := r.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
		for _, it := range fresh {
			cur, err := store.TxGet[*record.Receipt](tx, it.rec.RecordID())
			if err != nil {
				return err
			}
			if cur != nil {
				return errConflict // another process wrote it; cannot happen under the directory lock
			}
			if err := tx.Put(it.rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		// Keep a file only if its record made it to disk after all (a failure
		// after publication): it is then the envelope the record names.
		removed := false
		for _, it := range fresh {
			if cur, gerr := store.GetAs[*record.Receipt](r.st, it.rec.RecordID()); gerr == nil && cur != nil && cur.EnvelopeDigest == it.env.Digest() {
				r.mu.Lock()
				r.insert(r.entryOf(it, len(wires[index[it]])))
				r.settleLocked(it.res)
				r.mu.Unlock()
				continue
			}
			_ = r.fs.Remove(path.Join(it.rdir, it.name))
			removed = true
		}
		if removed {
			for d := range dirs {
				_ = r.fs.SyncDir(d)
			}
		}
		if errors.Is(err, errConflict) {
			return internalError(err)
		}
		return storeError(err)
	}
	r.mu.Lock()
	for _, it := range fresh {
		r.insert(r.entryOf(it, len(wires[index[it]])))
		r.settleLocked(it.res)
	}
	r.stats.Accepted += int64(len(fresh))
	r.mu.Unlock()
	for _, it := range fresh {
		receipt, err := r.signReceipt(it.rec)
		if err != nil {
			return internalError(err)
		}
		it.result = relayproto.BatchResult{Outcome: relayproto.BatchAccepted, Receipt: receipt}
		r.log.Info("relay: envelope accepted", "envelopeId", it.env.ID(), "digest", it.env.Digest()[:16],
			"sender", string(it.env.Sender()), "recipient", string(it.env.Recipient()), "size", len(wires[index[it]]), "batch", len(wires))
		if r.onAccept != nil {
			r.onAccept(it.env.ID(), it.env.Digest(), false)
		}
	}
	return nil
}

func (r *Relay) entryOf(it *batchItem, size int) *entry {
	return &entry{seq: it.seq, envelopeID: it.env.ID(), digest: it.env.Digest(), receivedAt: it.rec.ReceivedAt,
		size: size, deadline: it.env.DeliveryDeadlineMillis(), file: path.Join(it.rdir, it.name), recipient: it.rdir}
}
