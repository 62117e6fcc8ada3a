package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// second starts another relay process of e's identity on e's JetStream, with
// its own connection, HTTP server and client.
func (e *env) second() (*relay.Relay, *env) {
	e.t.Helper()
	o := jetStreamOptions(e.t, e.nats)
	o.Identity, o.Now, o.Logger, o.Limits = e.relID, e.clock.Now, quiet, e.limits
	r, err := relay.New(o)
	if err != nil {
		e.t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	e.t.Cleanup(func() { srv.Close(); r.Close() })
	return r, &env{t: e.t, clock: e.clock, relay: r, srv: srv, relID: e.relID,
		client: &relayproto.Client{BaseURL: srv.URL, Now: e.clock.Now}}
}

// Two relay processes on one JetStream answer the same envelope with the same
// receipt bytes, either one refuses a same-id other-digest envelope with 409,
// and a recipient fetches and acknowledges at either what the other accepted.
func TestTwoRelaysShareJetStream(t *testing.T) {
	a := newEnvOn(t, jetStreamBackend, relay.Limits{})
	_, b := a.second()
	bob := ident(t, 2)
	en, data := a.message(bob.DID())
	status, receipt, _ := a.post(data)
	if status != 200 {
		t.Fatalf("accept at a: %d %s", status, receipt)
	}
	a.clock.Add(time.Minute)
	status, again, _ := b.post(data)
	if status != 200 || !bytes.Equal(again, receipt) {
		t.Fatalf("the same envelope at b: %d, same receipt bytes %v", status, bytes.Equal(again, receipt))
	}
	other := forgeSameID(t, en, ident(t, 3), bob.DID(), a.clock.Now())
	for _, e := range []*env{a, b} {
		status, body, _ := e.post(other)
		wantCode(t, status, body, 409, relayproto.CodeEnvelopeConflict)
	}
	ctx := context.Background()
	page, err := b.client.Fetch(ctx, bob, "", 0)
	if err != nil || len(page.Envelopes) != 1 || page.Envelopes[0].EnvelopeID != en.ID() {
		t.Fatalf("fetch at b: %v %+v", err, page)
	}
	if n, err := b.client.Ack(ctx, bob, []string{en.ID()}); err != nil || n != 1 {
		t.Fatalf("ack at b: %d %v", n, err)
	}
	if page, err := a.client.Fetch(ctx, bob, "", 0); err != nil || len(page.Envelopes) != 0 {
		t.Fatalf("fetch at a after the ack at b: %v %+v", err, page)
	}
	// Acknowledged: still the same receipt, and it does not re-enter the inbox.
	if status, again, _ := a.post(data); status != 200 || !bytes.Equal(again, receipt) {
		t.Fatalf("after the ack: %d, same receipt %v", status, bytes.Equal(again, receipt))
	}
	if st, err := b.relay.Status(ctx, bob.DID()); err != nil || st.Count != 0 {
		t.Fatalf("status after the ack and a re-post: %+v %v", st, err)
	}
}

// A fetch held at one relay process answers when another accepts for its
// recipient; an accept for someone else does not wake it.
func TestLongPollWakesOnAcceptAtAnotherRelay(t *testing.T) {
	a := newEnvOn(t, jetStreamBackend, relay.Limits{})
	_, b := a.second()
	bob, carol := ident(t, 2), ident(t, 3)
	ctx := context.Background()
	held := longPoll(t, ctx, b, b.client, bob, "", relayproto.MaxInboxWait)
	woken := b.relay.Wakeups()
	_, forCarol := a.message(carol.DID())
	if status, body, _ := a.post(forCarol); status != 200 {
		t.Fatalf("accept for carol: %d %s", status, body)
	}
	en, data := a.message(bob.DID())
	if status, body, _ := a.post(data); status != 200 {
		t.Fatalf("accept for bob: %d %s", status, body)
	}
	page := answer(t, held)
	if len(page.Envelopes) != 1 || page.Envelopes[0].EnvelopeID != en.ID() {
		t.Fatalf("held fetch answered %+v", page)
	}
	if got := b.relay.Wakeups() - woken; got != 1 {
		t.Fatalf("%d wakeups, want 1 (carol's envelope must not wake bob's fetch)", got)
	}
}

// Each storage takes a cursor of the other's format as the start, so a
// recipient whose relay changed backend is served its inbox; a malformed
// cursor is refused on both.
func TestForeignCursorIsTheStart(t *testing.T) {
	foreign := map[string]string{fileBackend: "j42", jetStreamBackend: "7268412000000000"}
	eachBackend(t, func(t *testing.T, backend string) {
		e := newEnvOn(t, backend, relay.Limits{})
		bob := ident(t, 2)
		en, data := e.message(bob.DID())
		if status, body, _ := e.post(data); status != 200 {
			t.Fatalf("accept: %d %s", status, body)
		}
		ctx := context.Background()
		page, err := e.client.Fetch(ctx, bob, foreign[backend], 0)
		if err != nil || len(page.Envelopes) != 1 || page.Envelopes[0].EnvelopeID != en.ID() {
			t.Fatalf("fetch after the other storage's cursor %s: %v %+v", foreign[backend], err, page)
		}
		// Its own cursors go on from there.
		if page, err = e.client.Fetch(ctx, bob, page.Cursor, 0); err != nil || len(page.Envelopes) != 0 {
			t.Fatalf("fetch after its own cursor: %v %+v", err, page)
		}
		for _, bad := range []string{"x", "j", "j-1", "jx"} {
			_, err := e.client.Fetch(ctx, bob, bad, 0)
			var pe *relayproto.Error
			if !errors.As(err, &pe) || pe.Status != http.StatusBadRequest {
				t.Fatalf("cursor %q: %v, want 400", bad, err)
			}
		}
	})
}

// The relay refuses a JetStream stream neither replicated nor declared synced
// on every write, and one a single server cannot keep, before it creates
// anything; the error's hint names the flags that fix that case (and no Go
// field, and no "nats stream edit --replicas 3" for a server that cannot keep
// 3).
func TestJetStreamNotDurableRefused(t *testing.T) {
	s := natstest.Node(t)
	for _, tc := range []struct {
		name       string
		opts       jsstore.Options
		wantInHint []string
	}{
		{"R1 undeclared, one server", jsstore.Options{Replicas: 1}, []string{"--jetstream-replicas 1 --jetstream-sync-always", "sync_interval: always"}},
		{"R3 declared, one server", jsstore.Options{SyncAlways: true}, []string{"--jetstream-replicas 1 --jetstream-sync-always", "sync_interval: always", `"Single-node JetStream"`}},
		{"R3 undeclared, one server", jsstore.Options{}, []string{"--jetstream-replicas 1 --jetstream-sync-always"}},
	} {
		o := jetStreamOptions(t, s)
		o.Identity, o.Logger, o.JetStreamOptions = ident(t, 9), quiet, tc.opts
		_, err := relay.New(o)
		hint := errcode.HintOf(err)
		if !errors.Is(err, jsstore.ErrNotDurable) || hint == "" {
			t.Fatalf("%s: %v (hint %q), want refused with a hint", tc.name, err, hint)
		}
		for _, w := range tc.wantInHint {
			if !strings.Contains(hint, w) {
				t.Errorf("%s: hint %q does not say %q", tc.name, hint, w)
			}
		}
		if strings.Contains(hint, "Options.") || strings.Contains(err.Error(), "Options.SyncAlways") ||
			strings.Contains(hint, "nats stream edit") {
			t.Errorf("%s: %v; hint %q: names a Go field or a fix one server cannot take", tc.name, err, hint)
		}
		if st, _ := s.Jsz(nil); st.Streams != 0 {
			t.Fatalf("%s: the refused relay created %d streams", tc.name, st.Streams)
		}
	}
	// The single-node way works, and its stream, found again undeclared, is
	// refused with the same recipe.
	o := jetStreamOptions(t, s)
	o.Identity, o.Logger = ident(t, 9), quiet
	r, err := relay.New(o)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	o.JetStreamOptions = jsstore.Options{}
	_, err = relay.New(o)
	if h := errcode.HintOf(err); !errors.Is(err, jsstore.ErrNotDurable) || !strings.Contains(h, "--jetstream-replicas 1 --jetstream-sync-always") {
		t.Fatalf("the existing R1 stream undeclared: %v (hint %q)", err, h)
	}
}

// On a cluster an existing under-replicated stream's hint is the nats command
// that fixes that stream (a cluster is not started for it: the hint is a
// function of the refusal).
func TestJetStreamHintOnACluster(t *testing.T) {
	err := fmt.Errorf("relay: %w", &jsstore.NotDurableError{Resource: "bucket SEALBRIDGE_RECEIPTS", Stream: "KV_SEALBRIDGE_RECEIPTS", Replicas: 1, Existing: true})
	if h := relay.JetStreamHint(err); !strings.Contains(h, "nats stream edit KV_SEALBRIDGE_RECEIPTS --replicas 3") || !strings.Contains(h, "--jetstream-sync-always") {
		t.Fatalf("hint %q", h)
	}
	if h := relay.JetStreamHint(errors.New("other")); h != "" {
		t.Fatalf("hint of another error: %q", h)
	}
}

// The chaos run on an in-process three-node cluster (R3): the cluster
// loses quorum (two nodes stopped) between an accept's publish and its record.
// The accept answers 503 RELAY_STORAGE_UNAVAILABLE within the store's timeout
// (not 30 s); quorum comes back; the recipient fetches the envelope and
// acknowledges it; the carrier's retry of the same envelope is answered with
// the receipt of the first attempt (its receivedAt); and the recipient never
// sees the envelope again.
func TestQuorumLossMidAcceptServedOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster, stopped and restarted: several seconds")
	}
	c := natstest.Cluster(t, 3)
	c.WaitReady()
	var target atomic.Pointer[string] // the envelope whose accept loses quorum
	var once sync.Once
	lost := make(chan time.Time, 1)
	hooks := &jsstore.Hooks{AfterPublish: func(id string) {
		if p := target.Load(); p != nil && *p == id {
			once.Do(func() {
				c.Stop(1)
				c.Stop(2)
				lost <- time.Now()
			})
		}
	}}
	const timeout = time.Second
	e := &env{t: t, home: t.TempDir(), clock: newFakeClock(time.UnixMilli(1_767_225_600_000)), relID: ident(t, 9),
		backend: jetStreamBackend}
	o := relay.Options{Identity: e.relID, Home: e.home, Now: e.clock.Now, Logger: quiet,
		JetStream:        natstest.Connect(t, c.URLs(0)),
		JetStreamOptions: jsstore.Options{Timeout: timeout, Hooks: hooks}}
	until(t, "the relay opens on the cluster", func() bool {
		r, err := relay.New(o)
		if err == nil {
			e.relay = r
		}
		return err == nil
	})
	e.srv = httptest.NewServer(e.relay.Handler())
	t.Cleanup(func() { e.srv.Close(); e.relay.Close() })
	e.client = &relayproto.Client{BaseURL: e.srv.URL, Now: e.clock.Now}
	bob := ident(t, 2)
	ctx := context.Background()
	_, warm := e.message(bob.DID()) // the stream and buckets have leaders
	until(t, "a first accept", func() bool { s, _, _ := e.post(warm); return s == 200 })

	en, data := e.message(bob.DID())
	target.Store(new(en.ID()))
	acceptedAt := e.clock.Now()
	var status int
	var body []byte
	var lostAt time.Time
	until(t, "the accept gets past its publish", func() bool {
		status, body, _ = e.post(data)
		select {
		case lostAt = <-lost:
			return true
		default:
			return false // failed before its publish (a slow cluster): the carrier retries
		}
	})
	answered := time.Since(lostAt)
	wantCode(t, status, body, 503, relayproto.CodeRelayStorageUnavailable)
	t.Logf("503 %v after quorum was lost mid-accept (store timeout %v)", answered.Round(time.Millisecond), timeout)
	if answered > 10*timeout {
		t.Fatalf("the accept answered %v after quorum was lost; its record write must be bounded by the store's timeout %v", answered, timeout)
	}
	// Quorum comes back without node 0: a record write node 0 took as a leader
	// of the records (a stepping-down node hands its leadership over) and
	// could not commit would be committed once the others are back; nodes 1
	// and 2 alone elect a leader that has not got it, so it never is, as when
	// the leader is the node killed. The message, committed on two nodes, is
	// on one of them.
	c.Stop(0)
	c.Start(1)
	c.Start(2)
	// What the issue saw: the message is stored, its record is not.
	var st *jsstore.Store
	until(t, "a store opens on the cluster again", func() bool {
		var err error
		st, err = jsstore.Open(ctx, natstest.Connect(t, c.URLs(1)), jsstore.Options{Timeout: timeout})
		return err == nil
	})
	var recorded bool
	until(t, "the record is read", func() bool {
		_, ok, err := st.Lookup(ctx, en.ID())
		recorded = ok
		return err == nil
	})
	if recorded {
		t.Fatal("the accept's record was written after all; the test did not fail it")
	}

	// The recipient fetches from the start until the envelope shows, and acks it.
	fetched := 0 // how many times a page served the envelope
	fetch := func() bool {
		page, err := e.client.Fetch(ctx, bob, "", 0)
		if err != nil {
			return false
		}
		for _, pe := range page.Envelopes {
			if pe.EnvelopeID == en.ID() {
				fetched++
			}
		}
		return true
	}
	until(t, "the recipient fetches the envelope", func() bool { return fetch() && fetched > 0 })
	until(t, "the recipient acknowledges it", func() bool {
		_, err := e.client.Ack(ctx, bob, []string{en.ID()})
		return err == nil // 0 removed when a failed attempt was applied after all
	})

	// The carrier's retry, later: the receipt of the first attempt.
	e.clock.Add(time.Minute)
	var receipt []byte
	until(t, "the carrier's retry is answered", func() bool {
		status, receipt, _ = e.post(data)
		return status == 200
	})
	until(t, "a fetch after the retry", fetch)
	if fetched != 1 {
		t.Fatalf("the recipient fetched the envelope %d times, want once", fetched)
	}
	rc, err := envelope.ParseRelayReceipt(receipt)
	if err != nil || !rc.Matches(en.ID(), en.Digest()) || !rc.ReceivedAt.Equal(acceptedAt) {
		t.Fatalf("receipt of the retry: %+v, %v; want receivedAt %v, the first attempt's", rc, err, acceptedAt)
	}
	if d := e.relay.Stats().Duplicates; d != 1 {
		t.Fatalf("%d duplicates, want the retry's", d)
	}
}

// until polls cond until it holds, failing the test after a minute; for a
// cluster electing its leaders (not a wait for an event of the test's own).
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		<-tick.C
	}
}
