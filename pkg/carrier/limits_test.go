package carrier

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// peerIdentity is the identity of peer(), the recipient of the test messages.
func peerIdentity(t testing.TB) *identity.Identity {
	seed := ownerSeed
	seed[0] = 99
	id, err := identity.FromSeed(seed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// limitedRelay runs a reference relay with limits l on clock (the carrier's), its
// batch endpoint answering 404 unless batch.
type limitedRelay struct {
	relay   *relay.Relay
	srv     *httptest.Server
	batches atomic.Int64 // batch requests served
}

// limitCases are the relays the limit tests run against: each storage backend
// (the file one; JetStream on an in-process node), each with and without the
// batch endpoint.
var limitCases = []struct {
	name             string
	jetstream, batch bool
}{{"file/single", false, false}, {"file/batch", false, true}, {"jetstream/single", true, false}, {"jetstream/batch", true, true}}

func newLimitedRelay(t *testing.T, l relay.Limits, clock *fakeClock, jetstream, batch bool) *limitedRelay {
	t.Helper()
	opts := relay.Options{Identity: relayIdentity(t), Home: t.TempDir(), Now: clock.Now,
		Logger: slog.New(slog.DiscardHandler), Limits: l}
	if jetstream {
		opts.JetStream = natstest.Connect(t, natstest.Node(t).ClientURL())
		opts.JetStreamOptions = jsstore.Options{Replicas: 1, SyncAlways: true}
	}
	r, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	h := r.Handler()
	lr := &limitedRelay{relay: r}
	lr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == relayproto.PathEnvelopesBatch {
			if !batch {
				io.Copy(io.Discard, req.Body)
				w.WriteHeader(http.StatusNotFound)
				return
			}
			lr.batches.Add(1)
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(func() { lr.srv.Close(); r.Close() })
	return lr
}

// limitRun is a carrier on a fake clock delivering to a limited relay.
type limitRun struct {
	t     *testing.T
	clock *fakeClock
	s     *store.Store
	c     *Carrier
	lr    *limitedRelay
}

func startLimitRun(t *testing.T, l relay.Limits, jetstream, batch bool) *limitRun {
	clock := newFakeClock()
	run := &limitRun{t: t, clock: clock, s: openStore(t, t.TempDir(), store.Options{Now: clock.Now})}
	run.lr = newLimitedRelay(t, l, clock, jetstream, batch)
	run.c = New(run.s, NewHTTPTransport(HTTPOptions{}), Options{Clock: clock, Watch: WatchOff, Jitter: func() float64 { return 0.5 }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { run.c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return run
}

// enqueue sends a message of n envelopes through the relay and returns their ids
// in order (the carrier sends a target's backlog in that order, in one batch when
// the relay takes batches).
func (run *limitRun) enqueue(n int) []string {
	req := wireRequest(run.t, run.lr.srv.URL, n)
	if _, err := run.s.Enqueue(context.Background(), req); err != nil {
		run.t.Fatal(err)
	}
	run.c.Kick()
	var ids []string
	for _, e := range req.Envelopes {
		ids = append(ids, e.EnvelopeID)
	}
	return ids
}

func (run *limitRun) outbox(id string) *record.Outbox {
	o, err := store.GetAs[*record.Outbox](run.s, id)
	if err != nil || o == nil {
		run.t.Fatalf("outbox %s: %v %v", id, o, err)
	}
	return o
}

// backoffThenDeliver: the second envelope over the limit is retried no sooner than
// the relay's Retry-After, with the code in lastError, then delivered once room is
// made (free) and its attempt is due.
func backoffThenDeliver(t *testing.T, l relay.Limits, jetstream, batch bool, code string, retry time.Duration,
	free func(run *limitRun, first string)) {
	run := startLimitRun(t, l, jetstream, batch)
	ids := run.enqueue(2)
	first, second := ids[0], ids[1]
	waitFor(t, "the first envelope relayed, the second refused for now", func() bool {
		return run.outbox(first).State == record.StateRelayed && run.outbox(second).Attempts == 1 && run.c.quiet(0, 0)
	})
	o := run.outbox(second)
	if o.State != record.StatePending || !strings.Contains(o.LastError, code) {
		t.Fatalf("second envelope: state %s, lastError %q, want pending with %s", o.State, o.LastError, code)
	}
	if wait := time.UnixMilli(o.NextAttemptAt).Sub(run.clock.Now()); wait < retry {
		t.Fatalf("next attempt in %v, want at least the Retry-After %v (the backoff alone is 2 s)", wait, retry)
	}
	free(run, first)
	run.clock.set(time.UnixMilli(o.NextAttemptAt))
	waitFor(t, "the second envelope relayed", func() bool { return run.outbox(second).State == record.StateRelayed })
	if o := run.outbox(second); o.Attempts != 2 {
		t.Fatalf("second envelope relayed after %d attempts, want 2", o.Attempts)
	}
	if st := run.lr.relay.Stats(); st.Accepted != 2 || st.Duplicates != 0 {
		t.Fatalf("relay stats %+v", st)
	}
	if got := run.lr.batches.Load() > 0; got != batch {
		t.Fatalf("batches sent: %v, want %v", got, batch)
	}
}

func TestCarrierBacksOffOnRelayQuota(t *testing.T) {
	for _, c := range limitCases {
		t.Run(c.name, func(t *testing.T) {
			backoffThenDeliver(t, relay.Limits{QuotaEnvelopes: 1}, c.jetstream, c.batch, relayproto.CodeRelayQuota,
				relay.QuotaRetryAfter*time.Second, func(run *limitRun, first string) {
					// The recipient fetches and acknowledges the first: room for the second.
					if n, err := run.lr.relay.Ack(context.Background(), peer(), []string{first}); err != nil || n != 1 {
						t.Fatalf("ack: %d %v", n, err)
					}
				})
		})
	}
}

func TestCarrierBacksOffOnSenderRate(t *testing.T) {
	for _, c := range limitCases {
		t.Run(c.name, func(t *testing.T) {
			// One envelope per 100 s: the second waits for its token (the clock
			// moving to the next attempt brings it).
			backoffThenDeliver(t, relay.Limits{SenderRate: 0.01, SenderBurst: 1}, c.jetstream, c.batch, relayproto.CodeRelayRateLimited,
				100*time.Second, func(*limitRun, string) {})
		})
	}
}

func TestCarrierClosesOnRecipientNotAllowed(t *testing.T) {
	for _, c := range limitCases {
		t.Run(c.name, func(t *testing.T) {
			run := startLimitRun(t, relay.Limits{AllowList: true}, c.jetstream, c.batch)
			refused := run.enqueue(1)[0]
			waitFor(t, "the envelope closed", func() bool { return run.outbox(refused).State == record.StateClosed })
			if o := run.outbox(refused); o.Attempts != 1 || !strings.Contains(o.LastError, relayproto.CodeRecipientNotAllowed) {
				t.Fatalf("closed after %d attempts with %q, want 1 and %s", o.Attempts, o.LastError, relayproto.CodeRecipientNotAllowed)
			}
			// Once the recipient registered, its messages are delivered.
			cl := &relayproto.Client{BaseURL: run.lr.srv.URL, Now: run.clock.Now}
			if err := cl.Register(context.Background(), peerIdentity(t)); err != nil {
				t.Fatal(err)
			}
			ok := run.enqueue(1)[0]
			waitFor(t, "the envelope relayed", func() bool { return run.outbox(ok).State == record.StateRelayed })
			if st := run.lr.relay.Stats(); st.Accepted != 1 || st.NotAllowed != 1 {
				t.Fatalf("relay stats %+v", st)
			}
		})
	}
}
