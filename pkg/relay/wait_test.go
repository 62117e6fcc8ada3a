package relay_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// waitFor polls cond until it holds or 30 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		<-tick.C
	}
}

type fetchResult struct {
	page *relayproto.InboxPage
	err  error
}

// longPoll starts a fetch of id's inbox after cursor with wait, and returns
// where its answer comes; it returns once the relay holds it.
func longPoll(t *testing.T, ctx context.Context, e *env, c *relayproto.Client, id *identity.Identity, after string, wait time.Duration) <-chan fetchResult {
	t.Helper()
	held := e.relay.Waiting()
	ch := make(chan fetchResult, 1)
	go func() {
		p, err := c.FetchWait(ctx, id, after, 0, wait)
		ch <- fetchResult{p, err}
	}()
	waitFor(t, "the fetch is held", func() bool { return e.relay.Waiting() == held+1 })
	return ch
}

// answer is the held fetch's answer; it must come well before its 60 s wait.
func answer(t *testing.T, ch <-chan fetchResult) *relayproto.InboxPage {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.page
	case <-time.After(30 * time.Second):
		t.Fatal("the held fetch did not answer")
		return nil
	}
}

// A held fetch answers as soon as an envelope for its recipient is accepted,
// alone or in a batch; one for another recipient does not wake it.
func TestLongPollWakesOnAccept(t *testing.T) { eachBackend(t, testLongPollWakesOnAccept) }

func testLongPollWakesOnAccept(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob, carol := ident(t, 2), ident(t, 3)
	ctx := context.Background()

	ch := longPoll(t, ctx, e, e.client, bob, "", relayproto.MaxInboxWait)
	_, forCarol := e.message(carol.DID())
	if status, body, _ := e.post(forCarol); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	if n := e.relay.Wakeups(); n != 0 {
		t.Fatalf("an envelope for carol woke %d of bob's fetches", n)
	}
	select {
	case r := <-ch:
		t.Fatalf("bob's fetch answered for carol's envelope: %+v %v", r.page, r.err)
	default:
	}
	en, data := e.message(bob.DID())
	if status, body, _ := e.post(data); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	page := answer(t, ch)
	if len(page.Envelopes) != 1 || page.Envelopes[0].EnvelopeID != en.ID() {
		t.Fatalf("page %+v, want bob's envelope %s", page, en.ID())
	}
	if n := e.relay.Waiting(); n != 0 {
		t.Fatalf("%d fetches still held", n)
	}

	// From bob's cursor, a batch wakes it, with the batch's envelopes for bob.
	ch = longPoll(t, ctx, e, e.client, bob, page.Cursor, relayproto.MaxInboxWait)
	var wires [][]byte
	var want []string
	for i := range 3 {
		to := bob
		if i == 1 {
			to = carol
		}
		en, data := e.message(to.DID())
		wires = append(wires, data)
		if to == bob {
			want = append(want, en.ID())
		}
	}
	res, err := e.client.PostBatch(ctx, wires)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range res {
		if a.Outcome != relayproto.BatchAccepted {
			t.Fatalf("batch envelope %d: %+v", i, a)
		}
	}
	// The batch's envelopes become visible one by one as their writes finish,
	// so the woken fetch may have the first ones only: the next fetch, from its
	// cursor, has the rest at once.
	page = answer(t, ch)
	var got []string
	for {
		for _, ie := range page.Envelopes {
			got = append(got, ie.EnvelopeID)
		}
		if len(page.Envelopes) == 0 || len(got) >= len(want) {
			break
		}
		if page, err = e.client.FetchWait(ctx, bob, page.Cursor, 0, relayproto.MaxInboxWait); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("batch page %v, want %v", got, want)
	}
}

// A held fetch that nothing arrives for answers an empty page at the end of its
// wait; a fetch with something after its cursor answers at once; bad waits are
// refused; the signature covers wait=.
func TestLongPollWaitEnds(t *testing.T) {
	e := newEnv(t)
	bob := ident(t, 2)
	ctx := context.Background()
	page, err := e.client.FetchWait(ctx, bob, "", 0, 50*time.Millisecond)
	if err != nil || len(page.Envelopes) != 0 || page.More || page.Cursor != "0" {
		t.Fatalf("page %+v, %v; want an empty page at cursor 0", page, err)
	}
	if n := e.relay.Waiting(); n != 0 {
		t.Fatalf("%d fetches still held", n)
	}
	en, data := e.message(bob.DID())
	if status, body, _ := e.post(data); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	// Held for an hour (cut to MaxInboxWait) if it did not answer at once.
	page, err = e.client.FetchWait(ctx, bob, "", 0, time.Hour)
	if err != nil || len(page.Envelopes) != 1 || page.Envelopes[0].EnvelopeID != en.ID() {
		t.Fatalf("page %+v, %v; want %s", page, err, en.ID())
	}
	for _, bad := range []string{"-1s", "soon", "1e3"} {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+relayproto.PathInbox+"?wait="+bad, nil)
		if err := relayproto.SignInboxRequest(req, bob, e.clock.Now()); err != nil {
			t.Fatal(err)
		}
		status, body := do(t, req)
		wantCode(t, status, body, 400, relayproto.CodeBadRequest)
	}
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+relayproto.PathInbox+"?wait=1s", nil)
	if err := relayproto.SignInboxRequest(req, bob, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	req.URL.RawQuery = "wait=60s"
	status, body := do(t, req)
	wantCode(t, status, body, 401, relayproto.CodeAuthSignature)
}

// A client that goes away frees its place and its handler: no waiter, no
// goroutine left behind.
func TestLongPollCancelled(t *testing.T) {
	e := newEnv(t)
	bob := ident(t, 2)
	var active atomic.Int32
	h := e.relay.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		active.Add(1)
		defer active.Add(-1)
		h.ServeHTTP(w, req)
	}))
	defer srv.Close()
	c := &relayproto.Client{BaseURL: srv.URL, Now: e.clock.Now}
	ctx, cancel := context.WithCancel(context.Background())
	ch := longPoll(t, ctx, e, c, bob, "", relayproto.MaxInboxWait)
	cancel()
	if r := <-ch; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %+v %v, want the cancellation", r.page, r.err)
	}
	waitFor(t, "the waiter freed", func() bool { return e.relay.Waiting() == 0 })
	waitFor(t, "the handler returned", func() bool { return active.Load() == 0 })
	if n := e.relay.Wakeups(); n != 0 {
		t.Fatalf("%d wakeups", n)
	}
	// The next envelope finds nobody waiting and is fetched as usual.
	_, data := e.message(bob.DID())
	if status, body, _ := e.post(data); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	if page, err := c.Fetch(context.Background(), bob, "", 0); err != nil || len(page.Envelopes) != 1 {
		t.Fatalf("page %+v, %v", page, err)
	}
}

// Past its bounds (MaxInboxWaiters in all, four per recipient) a waiting fetch
// is refused with 503 RELAY_BUSY and Retry-After; a fetch without wait is not.
func TestLongPollBusy(t *testing.T) {
	e := &env{t: t, home: t.TempDir(), clock: newFakeClock(time.UnixMilli(1_767_225_600_000)), relID: ident(t, 9),
		opts: relay.Options{MaxInboxWaiters: 5}}
	e.start()
	t.Cleanup(e.stop)
	bob, carol, dave := ident(t, 2), ident(t, 3), ident(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		waitFor(t, "the waiters freed", func() bool { return e.relay.Waiting() == 0 })
	}()
	for range 4 {
		longPoll(t, ctx, e, e.client, bob, "", relayproto.MaxInboxWait)
	}
	busy := func(id *identity.Identity) {
		t.Helper()
		_, err := e.client.FetchWait(ctx, id, "", 0, relayproto.MaxInboxWait)
		var re *relayproto.Error
		if !errors.As(err, &re) || re.Status != 503 || re.Code != relayproto.CodeRelayBusy || re.RetryAfter <= 0 {
			t.Fatalf("got %v, want 503 RELAY_BUSY with Retry-After", err)
		}
	}
	busy(bob) // a fifth for bob
	longPoll(t, ctx, e, e.client, carol, "", relayproto.MaxInboxWait)
	busy(dave) // a sixth in all
	if page, err := e.client.Fetch(ctx, dave, "", 0); err != nil || len(page.Envelopes) != 0 {
		t.Fatalf("a fetch without wait: %+v, %v", page, err)
	}
}

// StopWaiting answers the held fetches with empty pages, and later ones at once.
func TestStopWaiting(t *testing.T) {
	e := newEnv(t)
	bob := ident(t, 2)
	ctx := context.Background()
	ch := longPoll(t, ctx, e, e.client, bob, "", relayproto.MaxInboxWait)
	e.relay.StopWaiting()
	if page := answer(t, ch); len(page.Envelopes) != 0 {
		t.Fatalf("page %+v, want empty", page)
	}
	done := make(chan fetchResult, 1)
	go func() {
		p, err := e.client.FetchWait(ctx, bob, "", 0, relayproto.MaxInboxWait)
		done <- fetchResult{p, err}
	}()
	if page := answer(t, done); len(page.Envelopes) != 0 {
		t.Fatalf("page %+v, want empty", page)
	}
}

// A held fetch outlives server read and write timeouts shorter than its wait.
func TestLongPollOutlivesServerTimeouts(t *testing.T) {
	e := newEnv(t)
	bob := ident(t, 2)
	srv := httptest.NewUnstartedServer(e.relay.Handler())
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = 20*time.Millisecond, 20*time.Millisecond
	srv.Start()
	defer srv.Close()
	c := &relayproto.Client{BaseURL: srv.URL, Now: e.clock.Now}
	page, err := c.FetchWait(context.Background(), bob, "", 0, 300*time.Millisecond)
	if err != nil || len(page.Envelopes) != 0 {
		t.Fatalf("page %+v, %v; want an empty page after the wait", page, err)
	}
}

// GET /v1/inbox/status: the caller's visible envelopes, their bytes, the oldest
// and newest receivedAt; signed, no query.
func TestInboxStatus(t *testing.T) { eachBackend(t, testInboxStatus) }

func testInboxStatus(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob, carol := ident(t, 2), ident(t, 3)
	ctx := context.Background()
	st, err := e.client.Status(ctx, bob)
	if err != nil || *st != (relayproto.InboxStatus{}) {
		t.Fatalf("empty inbox: %+v, %v", st, err)
	}
	first := e.clock.Now().UnixMilli()
	var bytes int64
	for range 3 {
		_, data := e.message(bob.DID())
		if status, body, _ := e.post(data); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		bytes += int64(len(data))
		e.clock.Add(time.Second)
	}
	_, data := e.message(carol.DID())
	if status, body, _ := e.post(data); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	st, err = e.client.Status(ctx, bob)
	want := relayproto.InboxStatus{Count: 3, Bytes: bytes, OldestReceivedAt: first, NewestReceivedAt: first + 2000}
	if err != nil || *st != want {
		t.Fatalf("status %+v, %v; want %+v", st, err, want)
	}
	page, err := e.client.Fetch(ctx, bob, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Ack(ctx, bob, []string{page.Envelopes[0].EnvelopeID}); err != nil {
		t.Fatal(err)
	}
	if st, err = e.client.Status(ctx, bob); err != nil || st.Count != 2 || st.OldestReceivedAt != first+1000 {
		t.Fatalf("after an ack: %+v, %v", st, err)
	}
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+relayproto.PathInboxStatus, nil)
	status, body := do(t, req)
	wantCode(t, status, body, 401, relayproto.CodeAuthMissing)
	req, _ = http.NewRequest(http.MethodGet, e.srv.URL+relayproto.PathInboxStatus+"?x=1", nil)
	if err := relayproto.SignInboxRequest(req, bob, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	status, body = do(t, req)
	wantCode(t, status, body, 400, relayproto.CodeBadRequest)
}

// One client address cannot take every held-fetch place, however many
// identities it makes: with HeldPollsPerAddress 8, 40 fetches of 40 recipients
// from 127.0.0.1, all started at once, hold exactly 8 and the other 32 get 503
// RELAY_BUSY with Retry-After; another address still gets a place.
func TestHeldPollsPerAddress(t *testing.T) {
	const n, bound = 40, 8
	e := newLimitedEnv(t, relay.Limits{HeldPollsPerAddress: bound})
	ctx, cancel := context.WithCancel(context.Background())
	results := make(chan error, n)
	gate := make(chan struct{})
	for i := range n {
		id := ident(t, byte(20+i))
		go func() {
			<-gate
			_, err := e.client.FetchWait(ctx, id, "", 0, relayproto.MaxInboxWait)
			results <- err
		}()
	}
	defer func() {
		cancel()
		waitFor(t, "the waiters freed", func() bool { return e.relay.Waiting() == 0 })
	}()
	close(gate)
	busy := 0
	waitFor(t, "every fetch held or refused", func() bool {
		for {
			select {
			case err := <-results:
				var re *relayproto.Error
				if !errors.As(err, &re) || re.Status != 503 || re.Code != relayproto.CodeRelayBusy || re.RetryAfter <= 0 {
					t.Fatalf("got %v, want 503 RELAY_BUSY with Retry-After", err)
				}
				busy++
			default:
				return e.relay.Waiting()+busy == n
			}
		}
	})
	if held := e.relay.Waiting(); held != bound || busy != n-bound {
		t.Fatalf("%d held and %d refused, want %d held (the bound per address) and %d refused", held, busy, bound, n-bound)
	}

	// Another address (127.0.0.2 is loopback too on Linux) is held.
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	other := &relayproto.Client{BaseURL: e.srv.URL, Now: e.clock.Now, HTTP: &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}}
	if conn, err := d.Dial("tcp", e.srv.Listener.Addr().String()); err != nil {
		t.Logf("no second loopback address (%v): that part is skipped", err)
		return
	} else {
		conn.Close()
	}
	longPoll(t, ctx, e, other, ident(t, 200), "", relayproto.MaxInboxWait)
}

// The per-address key: an IPv4 address, or the IPv6 /64 (a host commonly has
// a whole /64).
func TestAddressKey(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:5000":             "127.0.0.1",
		"[::ffff:10.1.2.3]:80":       "10.1.2.3",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:443": "2001:db8:1:2::/64",
		"[fe80::1%eth0]:1":           "fe80::/64",
		"not an address":             "not an address",
	} {
		if got := relay.AddressKey(in); got != want {
			t.Errorf("addressKey(%q) = %q, want %q", in, got, want)
		}
	}
	if relay.AddressKey("[2001:db8:1:2::1]:1") == relay.AddressKey("[2001:db8:1:3::1]:1") {
		t.Error("two /64s share a key")
	}
}
