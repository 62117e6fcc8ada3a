package relay

// The relay as a witness of its senders' store heads (docs/RELAY.md "Store
// heads", relayproto's witness.go).
//
// A post may carry the sender's latest signed store head (Sealbridge-Head).
// witness verifies it (it must be the head of every envelope's sender, else
// 400 HEAD_INVALID and nothing of the request is accepted) and, before any
// envelope of the request is put, makes the storage keep it if it is higher
// than the one kept (storage.raiseHead: durable before it returns, never
// lowered, across processes too). Each new envelope's record then holds the
// highest seq witnessed for its sender (senderSeqOf), which its receipt signs:
// at least the seq of the head its request carried, and never more than the
// highest one kept. A duplicate answers its record's, so the same bytes.
//
// The relay remembers the seq it last kept or read per sender in a bounded
// cache (headCache); a stripe lock per sender orders its updates, so the cache
// never goes down. With several JetStream relay processes the cache of one may
// be behind what another witnessed: its receipts then name a lower seq (never
// below their own request's head), which the sender learns the next time its
// head or a request reaches a process that knows better.

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// DefaultStatusRetention is how long an acknowledged delivery status is kept
// for GET /v1/inbox/statuses (Options.StatusRetention, --status-retention).
const DefaultStatusRetention = 7 * 24 * time.Hour

// maxCachedHeads bounds the senders whose witnessed seq the relay remembers.
const maxCachedHeads = 1 << 16

// headCache is the witnessed seq per sender key. Its updates for one sender
// are ordered by Relay.headStripes; mu guards the map. It holds only seqs
// the storage keeps (durable), so dropping entries is always safe: a sender
// not in it is read from the storage again. Full, it is emptied.
type headCache struct {
	mu  sync.Mutex
	seq map[string]int64
}

func newHeadCache() *headCache { return &headCache{seq: map[string]int64{}} }

func (c *headCache) get(key string) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.seq[key]
	return v, ok
}

func (c *headCache) set(key string, v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seq[key]; !ok && len(c.seq) >= maxCachedHeads {
		clear(c.seq)
	}
	c.seq[key] = v
}

// headInvalid is the refusal of a request whose head is not acceptable.
func headInvalid(format string, args ...any) *relayproto.Error {
	return newError(http.StatusBadRequest, relayproto.CodeHeadInvalid, format, args...)
}

// headOf returns the Sealbridge-Head of a post (nil: none); more than one is
// a 400 HEAD_INVALID.
func (r *Relay) headOf(req *http.Request) ([]byte, *relayproto.Error) {
	switch v := req.Header.Values(relayproto.HeaderHead); len(v) {
	case 0:
		return nil, nil
	case 1:
		return []byte(v[0]), nil
	}
	r.count(func(s *Stats) { s.HeadsInvalid++ })
	return nil, headInvalid("a post carries at most one %s", relayproto.HeaderHead)
}

// witness verifies the head raw (empty: none, 0) carried by a request whose
// envelopes' senders are senders, keeps it, and returns the highest seq
// witnessed for its owner now.
func (r *Relay) witness(ctx context.Context, raw string, senders []identity.DID) (int64, error) {
	if raw == "" {
		return 0, nil
	}
	sh, err := envelope.ParseStoreHead([]byte(raw))
	if err != nil {
		r.count(func(s *Stats) { s.HeadsInvalid++ })
		return 0, &relayproto.Error{Status: http.StatusBadRequest, Code: relayproto.CodeHeadInvalid,
			Message: relayproto.HeaderHead + ": " + err.Error(), Cause: err}
	}
	for _, s := range senders {
		if s != sh.Owner {
			r.count(func(s *Stats) { s.HeadsInvalid++ })
			return 0, headInvalid("%s is the head of %s, not of the sender %s of an envelope of this request",
				relayproto.HeaderHead, sh.Owner, s)
		}
	}
	key := headKey(sh.Owner)
	mu := &r.headStripes[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	if cur, ok := r.heads.get(key); ok && cur >= sh.Seq {
		r.countHead(cur, sh.Seq)
		return cur, nil // kept already: durable
	}
	kept, err := r.back.raiseHead(ctx, []byte(raw), sh)
	if err != nil {
		return 0, err
	}
	r.heads.set(key, kept)
	r.countHead(kept, sh.Seq)
	if kept == sh.Seq {
		r.log.Debug("relay: head witnessed", "sender", string(sh.Owner), "seq", sh.Seq)
	}
	return kept, nil
}

// countHead counts a head of seq witnessed when the relay kept kept.
func (r *Relay) countHead(kept, seq int64) {
	r.count(func(s *Stats) {
		s.HeadsWitnessed++
		if seq < kept {
			s.HeadsBehind++
		}
	})
}

// senderSeqOf returns the highest head seq witnessed for sender, at least
// floor (what the request's own head made it).
func (r *Relay) senderSeqOf(ctx context.Context, sender identity.DID, floor int64) (int64, error) {
	key := headKey(sender)
	mu := &r.headStripes[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	if cur, ok := r.heads.get(key); ok {
		return max(cur, floor), nil
	}
	data, err := r.back.senderHead(ctx, sender)
	if err != nil {
		return 0, err
	}
	var seq int64
	if data != nil {
		if sh, err := envelope.ParseStoreHead(data); err == nil && sh.Owner == sender {
			seq = sh.Seq
		}
	}
	r.heads.set(key, seq)
	return max(seq, floor), nil
}

// stamp sets the senderSeq of the new envelopes items before they are put.
func (r *Relay) stamp(ctx context.Context, items []*newEnvelope, floor int64) error {
	seqs := map[identity.DID]int64{}
	for _, it := range items {
		s := it.env.Sender()
		seq, ok := seqs[s]
		if !ok {
			var err error
			if seq, err = r.senderSeqOf(ctx, s, floor); err != nil {
				return err
			}
			seqs[s] = seq
		}
		it.senderSeq = seq
	}
	return nil
}

// serveSenderHead answers GET /v1/senders/head: the signer's witnessed head.
func (r *Relay) serveSenderHead(w http.ResponseWriter, req *http.Request) (int, error) {
	body, did, e := r.signedRequest(w, req)
	if e != nil {
		return 0, e
	}
	if len(body) != 0 || req.URL.RawQuery != "" {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "a head request has no body and no query")
	}
	data, err := r.SenderHead(req.Context(), did)
	if err != nil {
		return 0, err
	}
	if data == nil {
		return 0, newError(http.StatusNotFound, relayproto.CodeHeadUnknown, "this relay witnessed no store head of %s", did)
	}
	writeJSONBytes(w, http.StatusOK, data)
	return http.StatusOK, nil
}

// SenderHead returns the highest store head the relay witnessed from sender
// (nil: none).
func (r *Relay) SenderHead(ctx context.Context, sender identity.DID) ([]byte, error) {
	data, err := r.back.senderHead(ctx, sender)
	if err != nil || data == nil {
		return nil, err
	}
	if sh, perr := envelope.ParseStoreHead(data); perr != nil || sh.Owner != sender {
		return nil, internalError(perr)
	}
	return data, nil
}

// serveSenderReceipts answers POST /v1/senders/receipts.
func (r *Relay) serveSenderReceipts(w http.ResponseWriter, req *http.Request) (int, error) {
	body, did, e := r.signedRequest(w, req)
	if e != nil {
		return 0, e
	}
	if req.URL.RawQuery != "" {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "a receipts request has no query")
	}
	var q relayproto.SenderReceiptsRequest
	if e := decodeEnvelopeIDs(body, &q, &q.EnvelopeIDs); e != nil {
		return 0, e
	}
	ans, err := r.SenderReceipts(req.Context(), did, q.EnvelopeIDs)
	if err != nil {
		return 0, err
	}
	data, err := json.Marshal(relayproto.SenderReceiptsAnswer{Receipts: ans})
	if err != nil {
		return 0, internalError(err)
	}
	writeJSONBytes(w, http.StatusOK, data)
	return http.StatusOK, nil
}

// SenderReceipts answers, per id in order, what the relay knows of an
// envelope sender sent: held (waits in its recipient's inbox), acked (no
// longer there: acknowledged, or removed at its deadline; its record
// remains) with the receipt as first answered, or unknown (no record, or the
// record is of another sender's envelope).
func (r *Relay) SenderReceipts(ctx context.Context, sender identity.DID, ids []string) ([]relayproto.SenderReceipt, error) {
	key := headKey(sender)
	out := make([]relayproto.SenderReceipt, len(ids))
	errs := make([]error, len(ids))
	sem := make(chan struct{}, senderReceiptReaders)
	var wg sync.WaitGroup
	for i, id := range ids {
		out[i] = relayproto.SenderReceipt{EnvelopeID: id, State: relayproto.SenderReceiptUnknown}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			h, waiting, err := r.back.sent(ctx, id)
			if err != nil {
				errs[i] = err
				return
			}
			if h == nil || h.senderKey != key || h.envelopeID != id {
				return
			}
			receipt, err := r.signReceipt(h)
			if err != nil {
				errs[i] = internalError(err)
				return
			}
			out[i].Receipt = receipt
			out[i].State = relayproto.SenderReceiptAcked
			if waiting {
				out[i].State = relayproto.SenderReceiptHeld
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// senderReceiptReaders bounds the records one SenderReceipts reads at once.
const senderReceiptReaders = 8

// serveStatuses answers GET /v1/inbox/statuses?since=&after=&limit=.
func (r *Relay) serveStatuses(w http.ResponseWriter, req *http.Request) (int, error) {
	_, did, e := r.signedRequest(w, req)
	if e != nil {
		return 0, e
	}
	q := req.URL.Query()
	for k := range q {
		if k != "since" && k != "after" && k != "limit" {
			return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "unknown query parameter %q", k)
		}
	}
	var since int64
	if s := q.Get("since"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 || strconv.FormatInt(v, 10) != s {
			return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "since must be Unix milliseconds")
		}
		since = v
	}
	limit := relayproto.DefaultFetchLimit
	if s := q.Get("limit"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > relayproto.MaxFetchLimit {
			return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "limit must be 1..%d", relayproto.MaxFetchLimit)
		}
		limit = v
	}
	page, err := r.Statuses(req.Context(), did, since, q.Get("after"), limit)
	if err != nil {
		return 0, err
	}
	data, err := json.Marshal(page)
	if err != nil {
		return 0, internalError(err)
	}
	writeJSONBytes(w, http.StatusOK, data)
	return http.StatusOK, nil
}

// Statuses returns a page of the delivery statuses retained for recipient:
// those it acknowledged within the status retention, received at or after
// since (Unix ms), in the order they were retained, after cursor after.
func (r *Relay) Statuses(ctx context.Context, recipient identity.DID, since int64, after string, limit int) (*relayproto.InboxPage, error) {
	if limit <= 0 {
		limit = relayproto.DefaultFetchLimit
	}
	return r.back.statusesPage(ctx, recipient, since, after, min(limit, relayproto.MaxFetchLimit))
}
