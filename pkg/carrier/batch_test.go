package carrier

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// localRelay is a reference relay behind an HTTP server that counts requests by
// path and records the order in which it accepted envelopes.
type localRelay struct {
	relay    *relay.Relay
	srv      *httptest.Server
	batches  atomic.Int64 // batch requests
	singles  atomic.Int64 // single-envelope requests
	noBatch  int          // if set, the batch path answers this status (an old relay)
	mu       sync.Mutex
	accepted []string // envelope ids accepted new, in order
	fresh    map[string]int
}

func newLocalRelay(t testing.TB, noBatch int) *localRelay {
	t.Helper()
	lr := &localRelay{noBatch: noBatch, fresh: map[string]int{}}
	r, err := relay.New(relay.Options{Identity: relayIdentity(t), Home: t.TempDir(), Logger: slog.New(slog.DiscardHandler),
		OnAccept: func(id, _ string, dup bool) {
			if dup {
				return
			}
			lr.mu.Lock()
			lr.accepted = append(lr.accepted, id)
			lr.fresh[id]++
			lr.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := r.Handler()
	lr.relay = r
	lr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case relayproto.PathEnvelopesBatch:
			lr.batches.Add(1)
			if lr.noBatch != 0 {
				io.Copy(io.Discard, req.Body)
				w.WriteHeader(lr.noBatch)
				return
			}
		case relayproto.PathEnvelopes:
			lr.singles.Add(1)
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(func() { lr.srv.Close(); r.Close() })
	return lr
}

func (lr *localRelay) order() []string {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return slices.Clone(lr.accepted)
}

// lossy is an HTTPTransport whose first batch answer is lost after the relay
// committed it: what a sender sees when it dies between send and settle.
type lossy struct {
	*HTTPTransport
	lost atomic.Bool
}

func (l *lossy) SendBatch(ctx context.Context, url string, envs [][]byte) []Result {
	res := l.HTTPTransport.SendBatch(ctx, url, envs)
	if res != nil && l.lost.CompareAndSwap(false, true) {
		for i := range res {
			res[i] = Result{Outcome: Failed, Err: fmt.Errorf("answer lost")}
		}
	}
	return res
}

// deliverAll enqueues msgs messages of per envelopes (real signed ones) to lr, plus
// one envelope that is not an envelope in the middle, runs a carrier until every
// envelope is settled and returns the good envelope ids in (message, ordinal) order
// and the bad one.
func deliverAll(t *testing.T, lr *localRelay, tr Transport, msgs, per int) (want []string, bad string) {
	t.Helper()
	clock := newFakeClock()
	s := openStore(t, t.TempDir(), store.Options{Now: clock.Now})
	var reqs []store.SendRequest
	for m := range msgs {
		req := wireRequest(t, lr.srv.URL, per)
		if m == 1 {
			req.Envelopes[per/2].Envelope = []byte(`{"envelopeId":"` + req.Envelopes[per/2].EnvelopeID + `"}`)
			bad = req.Envelopes[per/2].EnvelopeID
		}
		if _, err := s.Enqueue(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, req)
	}
	// (message, ordinal) order: by message id, then in the message's order.
	slices.SortFunc(reqs, func(a, b store.SendRequest) int { return strings.Compare(a.MessageID, b.MessageID) })
	for _, req := range reqs {
		for _, e := range req.Envelopes {
			if e.EnvelopeID != bad {
				want = append(want, e.EnvelopeID)
			}
		}
	}
	c := New(s, tr, Options{Clock: clock, Watch: WatchOff, Jitter: func() float64 { return 0.5 }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	settled := func(id, state string) bool {
		o, err := store.GetAs[*record.Outbox](s, id)
		if err != nil {
			t.Fatal(err)
		}
		return o != nil && o.State == state
	}
	waitFor(t, "every envelope settled", func() bool {
		if settled(bad, record.StateClosed) && !slices.ContainsFunc(want, func(id string) bool { return !settled(id, record.StateRelayed) }) {
			return true
		}
		// A failed attempt waits for its backoff: move the clock on.
		if next, ok := clock.next(); ok && c.quiet(0, 0) {
			clock.set(next)
		}
		return false
	})
	if o, err := store.GetAs[*record.Outbox](s, bad); err != nil || !strings.Contains(o.LastError, relayproto.CodeEnvelopeMalformed) {
		t.Fatalf("the bad envelope was closed with %q (%v), want %s", o.LastError, err, relayproto.CodeEnvelopeMalformed)
	}
	return want, bad
}

// The carrier delivers a target's backlog in batches: the relay accepts every
// envelope once, in (message, ordinal) order, a bad envelope is refused (and
// closed) without refusing the rest of its batch, and the number of requests is the
// number of runs, not of envelopes.
func TestBatchedDeliveryToRelay(t *testing.T) {
	lr := newLocalRelay(t, 0)
	want, _ := deliverAll(t, lr, NewHTTPTransport(HTTPOptions{}), 3, 50)
	if got := lr.order(); !slices.Equal(got, want) {
		t.Fatalf("accepted in the order\n%v\nwant\n%v", got, want)
	}
	if b, s := lr.batches.Load(), lr.singles.Load(); b == 0 || b > 150/runChunk+2 || s != 0 {
		t.Fatalf("%d batch and %d single requests for 150 envelopes, want at most %d batches", b, s, 150/runChunk+2)
	}
	if st := lr.relay.Stats(); st.Accepted != int64(len(want)) || st.Duplicates != 0 {
		t.Fatalf("relay stats %+v", st)
	}
}

// A batch whose answer is lost after the relay committed it (the sender died
// between send and settle) is sent again: each of its envelopes is a duplicate
// once, none is stored twice, and the order holds.
func TestLostBatchAnswerYieldsOneDuplicateEach(t *testing.T) {
	lr := newLocalRelay(t, 0)
	tr := &lossy{HTTPTransport: NewHTTPTransport(HTTPOptions{})}
	want, _ := deliverAll(t, lr, tr, 2, 40)
	if !tr.lost.Load() {
		t.Fatal("no batch answer was lost")
	}
	if got := lr.order(); !slices.Equal(got, want) {
		t.Fatalf("accepted in the order\n%v\nwant\n%v", got, want)
	}
	for id, n := range lr.fresh {
		if n != 1 {
			t.Fatalf("envelope %s stored %d times", id, n)
		}
	}
	st := lr.relay.Stats()
	if st.Accepted != int64(len(want)) || st.Duplicates == 0 || st.Duplicates > relayproto.MaxBatchEnvelopes {
		t.Fatalf("relay stats %+v: want every envelope once and at most one batch of duplicates", st)
	}
}

// A relay without the batch endpoint (404 or 405) gets every envelope on the
// single endpoint, after one batch attempt, and accepts each once.
func TestBatchFallsBackToSingleEndpoint(t *testing.T) {
	for _, status := range []int{http.StatusNotFound, http.StatusMethodNotAllowed} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			lr := newLocalRelay(t, status)
			want, _ := deliverAll(t, lr, NewHTTPTransport(HTTPOptions{}), 2, 20)
			if b, s := lr.batches.Load(), lr.singles.Load(); b != 1 || s != int64(len(want))+1 {
				t.Fatalf("%d batch and %d single requests, want 1 and %d", b, s, len(want)+1)
			}
			if got := lr.order(); !slices.Equal(got, want) {
				t.Fatalf("accepted in the order\n%v\nwant\n%v", got, want)
			}
			if st := lr.relay.Stats(); st.Accepted != int64(len(want)) || st.Duplicates != 0 {
				t.Fatalf("relay stats %+v", st)
			}
		})
	}
}

// publications counts, in a store's recorded file calls, the outbox records each
// publication wrote: the records renamed or linked into outbox/ before each fsync of
// the outbox directory.
func publications(log []fsx.Op) []int {
	var out []int
	n := 0
	for _, op := range log {
		switch {
		case (op.Kind == fsx.OpRename || op.Kind == fsx.OpLink) && strings.HasPrefix(op.Path2, "outbox/") && !fsx.IsTempName(strings.TrimPrefix(op.Path2, "outbox/")):
			n++
		case op.Kind == fsx.OpSyncDir && op.Path == "outbox" && n > 0:
			out = append(out, n)
			n = 0
		}
	}
	return out
}

// A target with a backlog of 300 that goes unreachable and comes back: telling the
// backlog of the wait and clearing it are written in transactions of at most
// expireChunk records, so no lock hold grows with the backlog.
func TestWaitMarkAndClearAreChunked(t *testing.T) {
	var faulty *fsx.Faulty
	h := newHarness(t, Options{}, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		return faulty
	}})
	var up atomic.Bool
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		if up.Load() {
			return Result{Outcome: Accepted, Status: 200}
		}
		return unreachable(ctx, url, id, n)
	}
	var ids []string
	for range 5 {
		r := h.enqueue(relayA, 60, 24*time.Hour)
		for _, e := range r.Envelopes {
			ids = append(ids, e.EnvelopeID)
		}
	}
	faulty.Reset()
	t0 := h.clock.Now()
	h.start()
	h.settle()
	waiting := 0
	for _, id := range ids {
		if o := h.outbox(id); o.UnreachableSince == t0.UnixMilli() {
			waiting++
		}
	}
	if waiting != len(ids) {
		t.Fatalf("%d of %d envelopes know of the wait", waiting, len(ids))
	}
	marked := publications(faulty.Log())
	faulty.Reset()
	up.Store(true)
	h.runUntil(t0.Add(300 * time.Second))
	h.settle()
	for _, id := range ids {
		if o := h.outbox(id); o.State != record.StateRelayed {
			t.Fatalf("after recovery: %+v", o)
		}
	}
	cleared := publications(faulty.Log())
	for what, pubs := range map[string][]int{"marking the wait": marked, "clearing it and delivering": cleared} {
		if len(pubs) == 0 || slices.Max(pubs) > expireChunk {
			t.Errorf("%s: outbox records per publication %v, want at most %d each", what, pubs, expireChunk)
		}
	}
	if total := sum(marked); total < len(ids) {
		t.Errorf("marking wrote %d records for %d envelopes", total, len(ids))
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
