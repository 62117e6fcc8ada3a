package relay_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/natstest"
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
// on every write, saying which setting to change.
func TestJetStreamNotDurableRefused(t *testing.T) {
	s := natstest.Node(t)
	o := jetStreamOptions(t, s)
	o.Identity, o.Logger = ident(t, 9), quiet
	o.JetStreamOptions.SyncAlways = false
	_, err := relay.New(o)
	if !errors.Is(err, jsstore.ErrNotDurable) || !strings.Contains(err.Error(), "sync_interval: always") ||
		!strings.Contains(err.Error(), "replicas") {
		t.Fatalf("New on an unreplicated, unsynced stream: %v", err)
	}
}
