package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// inboxCounter counts the inbox requests a relay sees: fetches (in all and
// outstanding, with the wait= of the last) and acknowledgements.
type inboxCounter struct {
	mu                  sync.Mutex
	fetches, open, acks int
	lastWait            string
	next                http.Handler
}

func (c *inboxCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	fetch := r.URL.Path == relayproto.PathInbox
	if fetch {
		c.fetches++
		c.open++
		c.lastWait = r.URL.Query().Get("wait")
	}
	if r.URL.Path == relayproto.PathInboxAck {
		c.acks++
	}
	c.mu.Unlock()
	c.next.ServeHTTP(w, r)
	if fetch {
		c.mu.Lock()
		c.open--
		c.mu.Unlock()
	}
}

func (c *inboxCounter) snapshot() (fetches, open, acks int, wait string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fetches, c.open, c.acks, c.lastWait
}

// With a relay that holds fetches, the follower keeps one long poll open while
// idle and nothing else, and a message arriving at the relay is stored at once:
// its poll period (an hour here) never elapses.
func TestFollowerLongPoll(t *testing.T) {
	rid, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	r, err := relay.New(relay.Options{Identity: rid, Home: t.TempDir(), Logger: quiet,
		OnAccept: func(id, _ string, dup bool) {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := arrived[id]; !ok {
				arrived[id] = time.Now()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	counter := &inboxCounter{next: r.Handler()}
	srv := httptest.NewServer(counter)
	t.Cleanup(func() { srv.Close(); r.Close() })

	home := t.TempDir()
	if _, err := InitIdentity(home, "bob"); err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Home: home, Identity: "bob", Logger: quiet, DrainTimeout: 5 * time.Second,
		InboxRelay: srv.URL, PollEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	run(t, b)

	idle := func(wantFetches, wantAcks int) {
		t.Helper()
		eventually(t, 10*time.Second, "one fetch held at the relay", func() (bool, string) {
			f, open, acks, wait := counter.snapshot()
			held := r.Waiting()
			return open == 1 && held == 1 && f == wantFetches && acks == wantAcks && wait == inboxLongPoll.String(),
				fmt.Sprintf("%d fetches (%d open, %d held, wait=%q), %d acks; want %d fetches, %d acks",
					f, open, held, wait, acks, wantFetches, wantAcks)
		})
	}
	idle(1, 0)

	alice, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	en, wire, err := envelope.NewMessage(alice, b.DID(), uuid.NewString(), []byte("hello"), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := (&relayproto.Client{BaseURL: srv.URL}).Post(context.Background(), wire); err != nil {
		t.Fatal(err)
	}
	// Well before the poll period and the long poll's own wait (25 s) end.
	eventually(t, 10*time.Second, "the message stored", func() (bool, string) {
		n := countKind(t, b, record.KindObservations)
		return n == 1, fmt.Sprintf("%d observations", n)
	})
	mu.Lock()
	t.Logf("stored %v after its arrival at the relay", time.Since(arrived[en.ID()]).Round(time.Millisecond))
	mu.Unlock()
	// Acknowledged, then straight back to one held fetch.
	idle(2, 1)
}

// A relay that refuses wait= (an older one) is polled without it every
// PollEvery, not hammered and not counted as failing.
func TestFollowerOldRelay(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != relayproto.PathInbox {
			http.NotFound(w, r) // an older relay: no witness, no retained statuses
			return
		}
		mu.Lock()
		queries = append(queries, r.URL.RawQuery)
		mu.Unlock()
		if r.URL.Query().Has("wait") {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"code":"BAD_REQUEST","message":"unknown query parameter \"wait\""}`))
			return
		}
		w.Write([]byte(`{"envelopes":[],"cursor":"0","more":false}`))
	}))
	defer srv.Close()
	d, logs, clk := healthDaemon(t, Options{InboxRelay: srv.URL, PollEvery: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.follow(ctx) }()
	defer func() { cancel(); <-done }()
	for i, want := range []time.Duration{0, time.Second, time.Second} {
		select {
		case tm := <-clk.timers:
			if tm.d != want {
				t.Fatalf("wait %d: %s, want %s", i, tm.d, want)
			}
			tm.fire()
		case <-time.After(60 * time.Second):
			t.Fatal("the follower armed no timer")
		}
	}
	select {
	case <-clk.timers: // the fourth wait: three fetch cycles are done
	case <-time.After(60 * time.Second):
		t.Fatal("the follower armed no timer")
	}
	mu.Lock()
	defer mu.Unlock()
	wait := "limit=100&wait=" + inboxLongPoll.String()
	want := []string{wait, "limit=100", "limit=100", "limit=100"}
	if fmt.Sprint(queries) != fmt.Sprint(want) {
		t.Fatalf("queries %q, want %q", queries, want)
	}
	if got := logs.lines("level=WARN", "inbox: the relay cannot be fetched from"); len(got) != 0 {
		t.Fatalf("the refusal of wait= was taken for a failure: %v", got)
	}
}
