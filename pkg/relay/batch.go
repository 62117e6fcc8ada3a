package relay

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

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
	head, e := r.headOf(req)
	if e != nil {
		r.countRefusals(e.Code, len(wires))
		return 0, e
	}
	results, err := r.AcceptBatchHead(req.Context(), wires, head)
	if err != nil {
		r.countRefusals(asError(err).Code, len(wires)) // none was acknowledged
		return 0, err
	}
	for _, res := range results {
		if res.Outcome == relayproto.BatchRefused {
			r.countRefusals(res.Code, 1)
		}
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
	// put is a new envelope's, for storage.put.
	put *newEnvelope
	// res is a new envelope's claim on its recipient's quota (admit).
	res *reservation
}

// AcceptBatch verifies and stores up to relayproto.MaxBatchEnvelopes wire
// envelopes with the rules of Accept, envelope by envelope: each one is
// accepted, answered as a duplicate with its stored receipt, or refused with
// the status and code Accept would answer. The new ones are handed to the
// storage together: the file storage commits them as one group (their inbox
// files staged in parallel, published, each recipient directory fsynced once,
// their receipt records in one prepared transaction), JetStream puts them in
// order. Their order in the inbox is the batch's order. An error is about the
// whole batch (the storage cannot be written: nothing new is acknowledged) and
// is a *relayproto.Error.
// Exported for the package's external tests, which call it without an HTTP server.
func (r *Relay) AcceptBatch(ctx context.Context, wires [][]byte) ([]relayproto.BatchResult, error) {
	return r.AcceptBatchHead(ctx, wires, nil)
}

// AcceptBatchHead is AcceptBatch of a batch posted with the store head head
// (nil: none; witness.go): it must be the head of the sender of every
// envelope of the batch that parses (else a 400 HEAD_INVALID for the whole
// batch, nothing accepted), and is kept durably before any envelope is.
func (r *Relay) AcceptBatchHead(ctx context.Context, wires [][]byte, head []byte) ([]relayproto.BatchResult, error) {
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
	var senders []identity.DID
	for _, it := range items {
		if it.env != nil {
			senders = append(senders, it.env.Sender())
		}
	}
	floor, err := r.witness(ctx, string(head), senders)
	if err != nil {
		return nil, err
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
	var fresh []*newEnvelope
	var freshItems []*batchItem
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
		h, err := r.back.lookup(ctx, env.ID())
		if err != nil {
			return nil, err
		}
		if h != nil {
			receipt, err := r.existing(env, h)
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
		if _, blob := blobOf(env); blob {
			it.refuse(newError(http.StatusBadRequest, relayproto.CodeBodyIncomplete,
				"a blob envelope is sent alone to %s, its body to %s", relayproto.PathEnvelopes, relayproto.PathBodies+env.ID()))
			r.count(func(s *Stats) { s.Refused++ })
			continue
		}
		res, lerr := r.admit(ctx, env, int64(len(wires[i])))
		if lerr != nil {
			it.refuse(lerr)
			r.count(func(s *Stats) { s.Refused++ })
			continue
		}
		defer r.release(res)
		it.res = res
		it.put = &newEnvelope{env: env, wire: wires[i], receivedAt: now}
		firstNew[env.ID()] = i
		fresh = append(fresh, it.put)
		freshItems = append(freshItems, it)
	}
	if len(fresh) > 0 {
		if err := r.stamp(ctx, fresh, floor); err != nil {
			return nil, err
		}
		if err := r.back.put(ctx, fresh); err != nil {
			return nil, err
		}
		for _, it := range freshItems {
			receipt, err := r.answer(it.put, len(wires))
			switch {
			case err != nil:
				it.refuse(asError(err))
			case it.put.outcome == putNew:
				it.result = relayproto.BatchResult{Outcome: relayproto.BatchAccepted, Receipt: receipt}
			default:
				it.result = relayproto.BatchResult{Outcome: relayproto.BatchDuplicate, Receipt: receipt}
			}
		}
	}
	results := make([]relayproto.BatchResult, len(items))
	for i, it := range items {
		if it.dupOf >= 0 {
			first := items[it.dupOf]
			if first.result.Outcome == relayproto.BatchRefused {
				results[i] = first.result
				continue
			}
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
