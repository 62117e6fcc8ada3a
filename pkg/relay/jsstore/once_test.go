package jsstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
)

// openOn opens a Store of its own connection on the single node s.
func openOn(t *testing.T, s *server.Server, hooks *jsstore.Hooks) (*jsstore.Store, *nats.Conn) {
	t.Helper()
	nc := natstest.Connect(t, s.ClientURL())
	st, err := jsstore.Open(context.Background(), nc, jsstore.Options{Replicas: 1, SyncAlways: true, Hooks: hooks})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return st, nc
}

// fetchIDs is one Fetch of to's whole inbox from the start (one page).
func fetchIDs(t *testing.T, st *jsstore.Store, to identity.DID) []string {
	t.Helper()
	page, err := st.Fetch(context.Background(), to, "", 256)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	ids := []string{}
	for _, e := range page.Envelopes {
		ids = append(ids, e.EnvelopeID)
	}
	return ids
}

// A Put that published its message and then failed before its record (the
// relay answered 503) leaves a message the recipient fetches and acknowledges.
// The carrier's retry afterwards is a duplicate with the first attempt's
// receivedAt and sequence, and the envelope is never fetched again. The same
// when the recipient acknowledges without fetching here (it fetched at a relay
// process that did not write records): the ack writes the record first.
func TestAckedWithoutRecordIsNeverServedAgain(t *testing.T) {
	st, nc := openSingle(t)
	ctx := context.Background()
	for _, fetchFirst := range []bool{true, false} {
		w := newWire(fmt.Sprint("no record, fetched first ", fetchFirst))
		seq := publishWithoutRecord(t, nc, alice, w, t0)
		if fetchFirst {
			if got := fetchIDs(t, st, alice); !slices.Equal(got, []string{w.id}) {
				t.Fatalf("inbox = %v, want the envelope without a record", got)
			}
		}
		if n, err := st.Ack(ctx, alice, []string{w.id}); err != nil || n != 1 {
			t.Fatalf("Ack = %d, %v", n, err)
		}
		h, ok, err := st.Lookup(ctx, w.id)
		if err != nil || !ok || h.Cursor != strconv.FormatUint(seq, 10) || !h.ReceivedAt.Equal(t0) || h.Digest != w.digest {
			t.Fatalf("record after the ack = %+v, %t, %v; want the message's (seq %d)", h, ok, err, seq)
		}
		// The carrier's retry, at a later time.
		if h2, dup := put(t, st, alice, w, t0.Add(time.Minute)); !dup || h2 != h {
			t.Fatalf("retry after the ack = %+v, %t; want the duplicate %+v", h2, dup, h)
		}
		if got := fetchIDs(t, st, alice); len(got) != 0 {
			t.Fatalf("inbox after the ack and the retry = %v, want empty", got)
		}
	}
}

// The interleaving the record on ack alone does not close: a Put finds no
// record, then — before it publishes — the recipient fetches the message an
// earlier attempt left without a record, and acknowledges it; the Put then
// publishes a second message (the subject is empty again). That message is
// never served: its id's record names the first. The Put answers the
// duplicate and removes it.
func TestFetchAndAckBetweenLookupAndPublish(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	w := newWire("raced")
	var b *jsstore.Store
	var during []string
	var hookErr error
	hooks := &jsstore.Hooks{
		BeforePublish: func(id string) {
			if id != w.id {
				return
			}
			if got := fetchIDs(t, b, alice); !slices.Equal(got, []string{w.id}) {
				hookErr = fmt.Errorf("before the publish the inbox is %v, want the first message", got)
			}
			if n, err := b.Ack(ctx, alice, []string{w.id}); err != nil || n != 1 {
				hookErr = errors.Join(hookErr, fmt.Errorf("ack before the publish = %d, %v", n, err))
			}
		},
		AfterPublish: func(id string) {
			if id == w.id {
				during = fetchIDs(t, b, alice)
			}
		},
	}
	a, nc := openOn(t, s, hooks)
	b, _ = openOn(t, s, nil)
	seq := publishWithoutRecord(t, nc, alice, w, t0)
	h, dup := put(t, a, alice, w, t0.Add(time.Minute))
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	if len(during) != 0 {
		t.Fatalf("between the second publish and its record the inbox is %v: an acknowledged envelope was served again", during)
	}
	if !dup || h.Cursor != strconv.FormatUint(seq, 10) || !h.ReceivedAt.Equal(t0) {
		t.Fatalf("Put = %+v, %t; want the duplicate of the first message (seq %d)", h, dup, seq)
	}
	if got := fetchIDs(t, b, alice); len(got) != 0 {
		t.Fatalf("inbox afterwards = %v", got)
	}
	if st, err := b.Status(ctx, alice); err != nil || st.Count != 0 {
		t.Fatalf("Status = %+v, %v: the second message was left in the stream", st, err)
	}
}

// Two callers at once, many of them: two stores (relay processes) share a
// small set of envelopes, half of them left without records by a failed Put.
// Carriers post every envelope again and again at either store while
// recipients fetch from the start and acknowledge, one id at a time, at
// either. No fetch begun after an ack of an id returned serves that id, every
// envelope is acknowledged once its carriers are done, and each is held as
// one record naming one message.
func TestAcksRacingRetriesServeOnce(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	a, nc := openOn(t, s, nil)
	b, _ := openOn(t, s, nil)
	stores := []*jsstore.Store{a, b}
	dids := []identity.DID{alice, bob}
	const perRecipient = 6
	type item struct {
		to identity.DID
		w  wire
	}
	var items []item
	for i := range 2 * perRecipient {
		it := item{to: dids[i%2], w: newWire(fmt.Sprint("race ", i))}
		if i%4 < 2 {
			publishWithoutRecord(t, nc, it.to, it.w, t0)
		}
		items = append(items, it)
	}
	var acked sync.Map // envelope id → struct{}: an Ack of it returned
	var served, violations atomic.Int64
	gate := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	const rounds = 60
	for k := range 4 { // carriers
		wg.Go(func() {
			<-gate
			for r := range rounds {
				it := items[(k+r)%len(items)]
				if _, _, err := stores[(k+r)%2].Put(ctx, it.to, it.w.id, it.w.digest, it.w.data, t0, t0.Add(time.Hour)); err != nil {
					errs <- fmt.Errorf("Put: %w", err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var recipients sync.WaitGroup
	for k := range 4 { // recipients: two per DID
		recipients.Go(func() {
			<-gate
			to := dids[k%2]
			for r := 0; ; r++ {
				var before []string // acknowledged before this fetch began
				acked.Range(func(id, _ any) bool { before = append(before, id.(string)); return true })
				st := stores[(k+r)%2]
				page, err := st.Fetch(ctx, to, "", 256)
				if err != nil {
					errs <- fmt.Errorf("Fetch: %w", err)
					return
				}
				for _, e := range page.Envelopes {
					served.Add(1)
					if slices.Contains(before, e.EnvelopeID) {
						violations.Add(1)
						errs <- fmt.Errorf("envelope %s served after its ack returned", e.EnvelopeID)
					}
					if _, err := st.Ack(ctx, to, []string{e.EnvelopeID}); err != nil {
						errs <- fmt.Errorf("Ack: %w", err)
						return
					}
					acked.Store(e.EnvelopeID, struct{}{})
				}
				select {
				case <-done:
					if len(page.Envelopes) == 0 {
						return
					}
				default:
				}
			}
		})
	}
	close(gate)
	recipients.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	for _, it := range items {
		if _, ok := acked.Load(it.w.id); !ok {
			t.Errorf("envelope %s never served", it.w.id)
		}
		if _, dup, err := a.Put(ctx, it.to, it.w.id, it.w.digest, it.w.data, t0, t0.Add(time.Hour)); err != nil || !dup {
			t.Errorf("envelope %s again: duplicate %t, %v", it.w.id, dup, err)
		}
	}
	for _, to := range dids {
		if got := fetchIDs(t, b, to); len(got) != 0 {
			t.Errorf("%s's inbox after everything was acknowledged: %v", to, got)
		}
		if st, err := a.Status(ctx, to); err != nil || st.Count != 0 {
			t.Errorf("%s's status: %+v, %v (a message left in the stream)", to, st, err)
		}
	}
	t.Logf("%d envelopes served to recipients that acknowledged each at once, %d after an ack", served.Load(), violations.Load())
}
