package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// gatedRelay is a real relay behind a front that can make it look gone (every
// connection closed before an answer) or make its held polls full (503
// RELAY_BUSY to every fetch with wait=), and that records the inbox queries.
type gatedRelay struct {
	r       *relay.Relay
	url     string // the front
	direct  string // the relay itself, for posting while the front is down
	down    atomic.Bool
	busy    atomic.Bool
	mu      sync.Mutex
	queries []string
}

func newGatedRelay(t *testing.T) *gatedRelay {
	t.Helper()
	rid, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Options{Identity: rid, Home: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedRelay{r: r}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if g.down.Load() {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		if req.URL.Path == relayproto.PathInbox {
			g.mu.Lock()
			g.queries = append(g.queries, req.URL.RawQuery)
			g.mu.Unlock()
			if g.busy.Load() && req.URL.Query().Has("wait") {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "5")
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(`{"code":"RELAY_BUSY","message":"too many inbox fetches waiting; fetch without wait or retry later"}` + "\n"))
				return
			}
		}
		r.Handler().ServeHTTP(w, req)
	}))
	direct := httptest.NewServer(r.Handler())
	t.Cleanup(func() { front.Close(); direct.Close(); r.StopWaiting(); r.Close() })
	g.url, g.direct = front.URL, direct.URL
	return g
}

func (g *gatedRelay) inboxQueries() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.queries...)
}

// post puts a fresh message for to in the relay's inbox, past the front.
func (g *gatedRelay) post(t *testing.T, to identity.DID) {
	t.Helper()
	alice, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	_, wire, err := envelope.NewMessage(alice, to, uuid.NewString(), []byte("hello"), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := (&relayproto.Client{BaseURL: g.direct}).Post(context.Background(), wire); err != nil {
		t.Fatal(err)
	}
}

// followWithClock runs d's inbox follower on its fake clock until the test ends,
// and returns a function that hands over the next timer the follower arms.
func followWithClock(t *testing.T, d *Daemon, clk *fakeClock) func() *fakeTimer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.follow(ctx) }()
	t.Cleanup(func() {
		cancel()
		// A fetch may be blocked on a timer the test no longer fires: drain them.
		for {
			select {
			case <-done:
				return
			case tm := <-clk.timers:
				tm.fire()
			}
		}
	})
	return func() *fakeTimer {
		t.Helper()
		select {
		case tm := <-clk.timers:
			return tm
		case <-time.After(60 * time.Second):
			t.Fatal("the follower armed no timer")
			return nil
		}
	}
}

// A relay that goes away for a long time (40 failed fetches) and comes back: the
// follower's waits start at 1 s and double to 5 s, never more, so the mail that
// reached the relay meanwhile is stored at the first fetch after its return, at
// most 5 s (on the daemon's clock) after it. Success resets the backoff; the
// failure is logged once a minute at most, its end once.
// (Before: 2 s doubling to 300 s, and ~20 s of stall after a short outage.)
func TestInboxBackoffRelayComesBack(t *testing.T) {
	g := newGatedRelay(t)
	g.down.Store(true)
	d, logs, clk := healthDaemon(t, Options{InboxRelay: g.url, PollEvery: time.Second})
	d.jitter = func() float64 { return 0.5 } // a jitter factor of exactly 1
	next := followWithClock(t, d, clk)

	s := time.Second
	want := []time.Duration{0, 1 * s, 2 * s, 4 * s, 5 * s}
	const fails = 40
	start := clk.Now()
	for i := 0; i <= fails; i++ {
		tm := next()
		w := 5 * s
		if i < len(want) {
			w = want[i]
		}
		if tm.d != w {
			t.Fatalf("wait %d: %s, want %s", i, tm.d, w)
		}
		if i == fails/2 {
			g.post(t, d.DID()) // mail arrives while the follower cannot reach the relay
		}
		if i == fails {
			g.down.Store(false) // back, while the follower waits
			back := clk.Now()
			tm.fire()
			eventually(t, 30*time.Second, "the mail stored", func() (bool, string) {
				n := countKind(t, d, record.KindObservations)
				return n == 1, fmt.Sprintf("%d observations", n)
			})
			if lag := clk.Now().Sub(back); lag > inboxBackoffMax {
				t.Fatalf("the mail moved %s after the relay came back, want at most %s", lag, inboxBackoffMax)
			}
			break
		}
		tm.fire()
	}
	outage := clk.Now().Sub(start)
	// After the page with the envelope: at once again, then the poll period.
	if tm := next(); tm.d != 0 {
		t.Fatalf("after a page with mail: %s, want 0", tm.d)
	} else {
		tm.fire()
	}
	tm := next()
	if tm.d > time.Second {
		t.Fatalf("after a success: %s, want at most the poll period 1s", tm.d)
	}
	g.down.Store(true)
	tm.fire()
	if tm := next(); tm.d != time.Second {
		t.Fatalf("after a new failure: %s, want 1s (the backoff was reset)", tm.d)
	}
	warns := logs.lines("level=WARN", "inbox: the relay cannot be fetched from")
	// The outage's warnings (at most one a minute) and the new failure's.
	if maxWarns := 1 + int(outage/time.Minute) + 1; len(warns) < 2 || len(warns) > maxWarns {
		t.Fatalf("%d warnings for %d failures over %s, want 2..%d:\n%s", len(warns), fails+1, outage, maxWarns, strings.Join(warns, "\n"))
	}
	if got := logs.lines("level=INFO", "inbox: the relay answers again"); len(got) != 1 {
		t.Fatalf("%d 'answers again' lines, want 1", len(got))
	}
}

// A relay answering a failed fetch with Retry-After holds the follower back that
// long (up to inboxRetryAfterMax), not just the backoff.
func TestInboxBackoffHonoursRetryAfter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"code":"INBOX_UNREADABLE","message":"down"}` + "\n"))
	}))
	defer srv.Close()
	d, _, clk := healthDaemon(t, Options{InboxRelay: srv.URL, PollEvery: time.Second})
	next := followWithClock(t, d, clk)
	next().fire()
	if tm := next(); tm.d != 30*time.Second {
		t.Fatalf("after a 503 with Retry-After: 30: %s, want 30s", tm.d)
	}
}

// A long poll answered 503 RELAY_BUSY (the relay's held-poll slots are full) is
// followed at once by a plain fetch, which brings the mail; it is no failure:
// no backoff, no warning, and the next fetch tries a long poll again after the
// poll period. (Before: a failure, backing off 2 s doubling to 300 s.)
func TestInboxRelayBusyFallsBackToPlainFetch(t *testing.T) {
	g := newGatedRelay(t)
	g.busy.Store(true)
	d, logs, clk := healthDaemon(t, Options{InboxRelay: g.url, PollEvery: time.Second})
	g.post(t, d.DID())
	next := followWithClock(t, d, clk)
	next().fire() // the first fetch
	eventually(t, 30*time.Second, "the mail stored", func() (bool, string) {
		n := countKind(t, d, record.KindObservations)
		return n == 1, fmt.Sprintf("%d observations", n)
	})
	if tm := next(); tm.d != 0 { // a page with mail: fetch again at once
		t.Fatalf("after a page with mail: %s, want 0", tm.d)
	} else {
		tm.fire()
	}
	if tm := next(); tm.d != time.Second {
		t.Fatalf("after an empty plain fetch: %s, want the poll period 1s", tm.d)
	}
	// Long polls (25 s, or the poll period while a receipt is pending), each
	// refused and followed by a plain fetch.
	got := g.inboxQueries()
	ok := len(got) == 4
	for i, q := range got {
		ok = ok && strings.HasPrefix(q, "limit=100&wait=") == (i%2 == 0) && (i%2 == 0 || q == "limit=100")
	}
	if !ok {
		t.Fatalf("queries %q, want a long poll then a plain fetch, twice", got)
	}
	if got := logs.lines("level=WARN", "inbox: the relay cannot be fetched from"); len(got) != 0 {
		t.Fatalf("RELAY_BUSY to a long poll was taken for a failure: %v", got)
	}
}
