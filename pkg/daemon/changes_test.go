package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// changeDaemon starts a daemon on home (creating its identity if needed).
func changeDaemon(t *testing.T, home string, opts Options) (*Daemon, *client.Client, context.CancelFunc, chan error) {
	t.Helper()
	if _, err := LoadIdentity(home, DefaultIdentity); err != nil {
		if _, err := InitIdentity(home, ""); err != nil {
			t.Fatal(err)
		}
	}
	opts.Home, opts.Logger = home, quiet
	if opts.ChangePollEvery == 0 {
		opts.ChangePollEvery = 20 * time.Millisecond
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done := run(t, d)
	return d, client.New(d.SocketPath()), cancel, done
}

// stop stops a daemon started by run and puts its result back for run's cleanup.
func stop(t *testing.T, cancel context.CancelFunc, done chan error) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("daemon did not stop")
	}
}

// firstCursor answers the reset of an empty cursor and returns the current cursor.
func firstCursor(t *testing.T, c *client.Client) string {
	t.Helper()
	p, err := c.Changes(context.Background(), "", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Reset || p.Reason != resetNoCursor || p.Cursor == "" || len(p.Changes) != 0 {
		t.Fatalf("empty cursor: %+v", p)
	}
	return p.Cursor
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtimeYield()
	}
}

func runtimeYield() { <-time.After(time.Millisecond) }

// No change is lost across 10,000 writes read concurrently with long polls: the
// sequence is contiguous and every id is seen once, in order.
func TestChangeFeedNoLossUnderLongPolls(t *testing.T) {
	const n = 10_000
	f := newChangeFeed(0)
	close(f.baselined)
	got := make(chan []client.Change, 1)
	go func() {
		var all []client.Change
		var after uint64
		for len(all) < n {
			p := f.next(context.Background(), after, nil, 5*time.Second)
			if p.reset != "" {
				t.Errorf("reset %q after %d", p.reset, after)
				break
			}
			all = append(all, p.changes...)
			after = p.next
		}
		got <- all
	}()
	topics := client.Topics
	for i := range n {
		f.record(topics[i%len(topics)], fmt.Sprintf("id-%05d", i), "s")
	}
	var all []client.Change
	select {
	case all = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("reader did not finish")
	}
	if len(all) != n {
		t.Fatalf("read %d changes, want %d", len(all), n)
	}
	for i, c := range all {
		if c.Seq != uint64(i+1) || c.ID != fmt.Sprintf("id-%05d", i) || c.Topic != topics[i%len(topics)] {
			t.Fatalf("change %d: %+v", i, c)
		}
	}
}

// The reader's filter and paging: pages of at most maxChangePage, the cursor past
// skipped changes of other topics.
func TestChangeFeedPagingAndFilter(t *testing.T) {
	f := newChangeFeed(1000)
	for i := range 600 {
		topic := client.TopicOutbox
		if i%3 == 0 {
			topic = client.TopicMessages
		}
		f.record(topic, fmt.Sprint(i), "s")
	}
	p := f.next(context.Background(), 0, nil, 0)
	if len(p.changes) != maxChangePage || p.next != maxChangePage {
		t.Fatalf("page: %d changes, next %d", len(p.changes), p.next)
	}
	p = f.next(context.Background(), 0, map[string]bool{client.TopicMessages: true}, 0)
	if len(p.changes) != 200 || p.next != 600 {
		t.Fatalf("filtered: %d changes, next %d", len(p.changes), p.next)
	}
	for _, c := range p.changes {
		if c.Topic != client.TopicMessages {
			t.Fatalf("filtered page has %+v", c)
		}
	}
}

// A cursor from another daemon instance (a restart on the same home) answers reset.
func TestChangesCursorFromRestartedDaemon(t *testing.T) {
	home := t.TempDir()
	_, c, cancel, done := changeDaemon(t, home, Options{})
	cur := firstCursor(t, c)
	stop(t, cancel, done)
	_, c2, _, _ := changeDaemon(t, home, Options{})
	p, err := c2.Changes(context.Background(), cur, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Reset || p.Reason != resetRestarted || p.Cursor == "" || p.Cursor == cur || len(p.Changes) != 0 {
		t.Fatalf("restarted: %+v", p)
	}
	// The new cursor continues.
	if p, err = c2.Changes(context.Background(), p.Cursor, nil, 0); err != nil || p.Reset {
		t.Fatalf("continue: %+v %v", p, err)
	}
	// A malformed cursor is a bad request.
	if _, err := c2.Changes(context.Background(), "!!", nil, 0); err == nil {
		t.Fatal("malformed cursor accepted")
	}
}

// A cursor older than the retained window answers reset; one inside it continues.
func TestChangesCursorPastWindow(t *testing.T) {
	d, c, _, _ := changeDaemon(t, t.TempDir(), Options{ChangeWindow: 10})
	old := firstCursor(t, c)
	for i := range 25 {
		d.recordChange(client.TopicMessages, fmt.Sprint(i), "queued")
	}
	p, err := c.Changes(context.Background(), old, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Reset || p.Reason != resetPastWindow || len(p.Changes) != 0 {
		t.Fatalf("past the window: %+v", p)
	}
	p, err = c.Changes(context.Background(), d.changes.cursor(20), nil, 0)
	if err != nil || p.Reset || len(p.Changes) != 5 || p.Changes[0].Seq != 21 || p.Cursor != d.changes.cursor(25) {
		t.Fatalf("inside the window: %+v %v", p, err)
	}
}

// topics filters; an unknown topic is refused; a send through the API is a change.
func TestChangesTopicsFilter(t *testing.T) {
	d, c, _, _ := changeDaemon(t, t.TempDir(), Options{})
	cur := firstCursor(t, c)
	d.recordChange(client.TopicReceipts, "r1", "persisted")
	d.recordChange(client.TopicObservations, "o1", "observed")
	d.recordChange(client.TopicReceipts, "r2", "processed")
	p, err := c.Changes(context.Background(), cur, []string{client.TopicReceipts}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ch := range p.Changes {
		ids = append(ids, ch.Topic+"/"+ch.ID+"/"+ch.State)
	}
	if !slices.Equal(ids, []string{"receipts/r1/persisted", "receipts/r2/processed"}) {
		t.Fatalf("receipts: %v", ids)
	}
	if _, err := c.Changes(context.Background(), cur, []string{"nope"}, 0); err == nil {
		t.Fatal("unknown topic accepted")
	}
	peer, _ := identity.Generate()
	m, err := c.Send(context.Background(), client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: "http://127.0.0.1:9", Body: []byte("hi")}, "")
	if err != nil {
		t.Fatal(err)
	}
	p, err = c.Changes(context.Background(), p.Cursor, []string{client.TopicMessages}, 60*time.Second)
	if err != nil || len(p.Changes) == 0 || p.Changes[0].ID != m.MessageID || p.Changes[0].State != record.StatusQueued {
		t.Fatalf("send: %+v %v", p, err)
	}
}

// A long poll wakes on a new change, and returns at once when the daemon drains.
func TestChangesLongPollWakesAndDrains(t *testing.T) {
	d, c, cancel, done := changeDaemon(t, t.TempDir(), Options{ChangePollEvery: time.Hour})
	cur := firstCursor(t, c)
	type result struct {
		p   *client.ChangePage
		err error
	}
	poll := func(after string) chan result {
		ch := make(chan result, 1)
		go func() {
			p, err := c.Changes(context.Background(), after, nil, time.Minute)
			ch <- result{p, err}
		}()
		waitFor(t, "the long poll to wait", func() bool { return d.changes.waiting.Load() == 1 })
		return ch
	}
	ch := poll(cur)
	d.recordChange(client.TopicOutbox, "e1", "relayed")
	var r result
	select {
	case r = <-ch:
	case <-time.After(60 * time.Second):
		t.Fatal("the long poll did not wake")
	}
	if r.err != nil || len(r.p.Changes) != 1 || r.p.Changes[0].ID != "e1" {
		t.Fatalf("woken: %+v %v", r.p, r.err)
	}
	ch = poll(r.p.Cursor)
	start := time.Now()
	cancel()
	select {
	case r = <-ch:
	case <-time.After(60 * time.Second):
		t.Fatal("the long poll did not return at drain")
	}
	if r.err != nil || len(r.p.Changes) != 0 || r.p.Reset {
		t.Fatalf("drained: %+v %v", r.p, r.err)
	}
	stop(t, func() {}, done)
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("drain took %v", el)
	}
}

// The detector reports a write made by another store instance on the same directory.
func TestChangesDetectsOtherWriters(t *testing.T) {
	home := t.TempDir()
	d, c, _, _ := changeDaemon(t, home, Options{})
	cur := firstCursor(t, c)
	id, err := LoadIdentity(home, DefaultIdentity)
	if err != nil {
		t.Fatal(err)
	}
	other, err := store.Open(id.Signer(), store.Options{Home: d.root})
	if err != nil {
		t.Fatal(err)
	}
	peer, _ := identity.Generate()
	msgID := uuid.NewString()
	deadline := time.Now().Add(time.Hour)
	env, wire, err := envelope.NewMessage(id, peer.DID(), msgID, []byte("hi"), deadline, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Enqueue(context.Background(), store.SendRequest{MessageID: msgID, PeerOwnerDID: peer.DID(),
		RelayURL: "http://127.0.0.1:9", DeliveryDeadline: deadline,
		Envelopes: []store.OutgoingEnvelope{{EnvelopeID: env.ID(), Kind: record.EnvelopeMessage, Envelope: wire}}}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	deadlineAt := time.Now().Add(60 * time.Second)
	for !(seen["messages/"+msgID] && seen["outbox/"+env.ID()]) {
		if time.Now().After(deadlineAt) {
			t.Fatalf("not detected; seen %v", seen)
		}
		p, err := c.Changes(context.Background(), cur, nil, 2*time.Second)
		if err != nil || p.Reset {
			t.Fatalf("%+v %v", p, err)
		}
		for _, ch := range p.Changes {
			seen[ch.Topic+"/"+ch.ID] = true
		}
		cur = p.Cursor
	}
}

// A long poll outlives the server's read and write timeouts (60 s in the daemon, as
// long as the longest wait): a passing read deadline would cancel the request.
func TestChangesLongPollOutlivesServerTimeouts(t *testing.T) {
	d, c, _, _ := changeDaemon(t, t.TempDir(), Options{ChangePollEvery: time.Hour})
	cur := firstCursor(t, c)
	srv := httptest.NewUnstartedServer(d.handler())
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = 20*time.Millisecond, 20*time.Millisecond
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/changes?after=" + url.QueryEscape(cur) + "&wait=300ms")
	if err != nil {
		t.Fatalf("a wait longer than the server's timeouts: %v", err)
	}
	defer resp.Body.Close()
	var p client.ChangePage
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || resp.StatusCode != http.StatusOK || len(p.Changes) != 0 || p.Reset {
		t.Fatalf("a wait longer than the server's timeouts: %d %+v %v; want an empty page", resp.StatusCode, p, err)
	}
}
