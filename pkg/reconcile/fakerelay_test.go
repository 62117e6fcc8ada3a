package reconcile_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// fakeRelay speaks the relay protocol's wire types for what the carrier and
// reconcile use: single posts (witnessing the Sealbridge-Head they carry, a
// duplicate answered with its first receipt), no batch endpoint, the sender's
// head and receipts (signed requests verified). It counts the posts of each
// envelope.
type fakeRelay struct {
	t   testing.TB
	id  *identity.Identity
	srv *httptest.Server

	mu       sync.Mutex
	head     []byte            // the highest head witnessed (one sender)
	headSeq  int64             //
	receipts map[string][]byte // envelope id → first receipt
	senderOf map[string]identity.DID
	acked    map[string]bool // held envelopes the recipient acknowledged
	posts    map[string]int  // envelope id → posts that reached the relay
	down     bool            // answer every request 503
}

func newFakeRelay(t testing.TB) *fakeRelay {
	seed := [32]byte{42}
	id, err := identity.FromSeed(seed[:])
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeRelay{t: t, id: id, receipts: map[string][]byte{}, senderOf: map[string]identity.DID{}, acked: map[string]bool{}, posts: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *fakeRelay) url() string { return r.srv.URL }

func (r *fakeRelay) setDown(v bool) {
	r.mu.Lock()
	r.down = v
	r.mu.Unlock()
}

// postsOf returns how many posts of each envelope reached the relay.
func (r *fakeRelay) postCounts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.posts {
		out[k] = v
	}
	return out
}

func fail(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "message": code})
}

func (r *fakeRelay) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		fail(w, 400, "BAD_REQUEST")
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		fail(w, 503, "UNAVAILABLE")
		return
	}
	switch req.URL.Path {
	case relayproto.PathEnvelopes:
		r.post(w, req, body)
	case relayproto.PathSenderHead:
		if _, e := relayproto.VerifyInboxRequest(req, body, time.Now(), time.Time{}); e != nil {
			fail(w, e.Status, e.Code)
			return
		}
		if r.head == nil {
			fail(w, 404, relayproto.CodeHeadUnknown)
			return
		}
		w.Write(r.head)
	case relayproto.PathSenderReceipts:
		auth, e := relayproto.VerifyInboxRequest(req, body, time.Now(), time.Time{})
		if e != nil {
			fail(w, e.Status, e.Code)
			return
		}
		var q relayproto.SenderReceiptsRequest
		if json.Unmarshal(body, &q) != nil || len(q.EnvelopeIDs) == 0 || len(q.EnvelopeIDs) > relayproto.MaxAckIDs {
			fail(w, 400, "BAD_REQUEST")
			return
		}
		var ans relayproto.SenderReceiptsAnswer
		for _, id := range q.EnvelopeIDs {
			sr := relayproto.SenderReceipt{EnvelopeID: id, State: relayproto.SenderReceiptUnknown}
			if rc, ok := r.receipts[id]; ok && auth.DID == r.senderOf[id] {
				sr.State, sr.Receipt = relayproto.SenderReceiptHeld, rc
				if r.acked[id] {
					sr.State = relayproto.SenderReceiptAcked
				}
			}
			ans.Receipts = append(ans.Receipts, sr)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ans)
	default:
		fail(w, 404, "NOT_FOUND")
	}
}

func (r *fakeRelay) post(w http.ResponseWriter, req *http.Request, body []byte) {
	env, err := envelope.Parse(body)
	if err != nil {
		fail(w, 400, "ENVELOPE_INVALID")
		return
	}
	if hb := req.Header.Get(relayproto.HeaderHead); hb != "" {
		h, err := envelope.ParseStoreHead([]byte(hb))
		if err != nil || h.Owner != env.Sender() {
			fail(w, 400, relayproto.CodeHeadInvalid)
			return
		}
		if h.Seq > r.headSeq {
			r.head, r.headSeq = []byte(hb), h.Seq
		}
	}
	r.posts[env.ID()]++
	rc, ok := r.receipts[env.ID()]
	if !ok {
		rc, err = envelope.SignRelayReceipt(r.id, envelope.RelayReceipt{EnvelopeID: env.ID(), EnvelopeDigest: envelope.Digest(body),
			ReceivedAt: time.Now(), SenderSeq: r.headSeq})
		if err != nil {
			r.t.Error(err)
			fail(w, 500, "INTERNAL")
			return
		}
		r.receipts[env.ID()] = rc
		r.senderOf[env.ID()] = env.Sender()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(rc)
}
