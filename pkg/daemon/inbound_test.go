package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func newTestRelay(t *testing.T) string {
	t.Helper()
	rid, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Options{Identity: rid, Home: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(func() { srv.Close(); r.Close() })
	return srv.URL
}

func startInbound(t *testing.T, home, name, relayURL string) *Daemon {
	t.Helper()
	if _, err := InitIdentity(home, name); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Home: home, Identity: name, Logger: quiet, DrainTimeout: 5 * time.Second,
		InboxRelay: relayURL, PollEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	return d
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("%s: not within %s (%s)", what, within, state)
		case <-tick.C:
		}
	}
}

func countKind(t *testing.T, d *Daemon, k record.Kind) int {
	t.Helper()
	ids, err := d.Store().List(k)
	if err != nil {
		t.Fatal(err)
	}
	return len(ids)
}

func TestInboundDeliveredAndDuplicates(t *testing.T) {
	ctx := context.Background()
	relayURL := newTestRelay(t)
	home := t.TempDir()
	a := startInbound(t, home, "alice", relayURL)
	b := startInbound(t, home, "bob", relayURL)
	ca, cb := client.New(a.SocketPath()), client.New(b.SocketPath())
	const n = 20
	ids := map[string]string{}
	for i := range n {
		body := fmt.Sprintf("hello %d", i)
		m, err := ca.Send(ctx, client.SendRequest{To: client.Recipients{string(b.DID())}, RelayURL: relayURL, Body: []byte(body)}, "")
		if err != nil {
			t.Fatal(err)
		}
		ids[m.MessageID] = body
	}
	eventually(t, 60*time.Second, "all delivered", func() (bool, string) {
		l, err := ca.Messages(ctx, record.StatusDelivered, 1000, "")
		if err != nil {
			return false, err.Error()
		}
		return len(l.Messages) == n, fmt.Sprintf("%d delivered", len(l.Messages))
	})
	if got := countKind(t, b, record.KindObservations); got != n {
		t.Fatalf("bob holds %d observations, want %d", got, n)
	}
	// Bob's receipts become terminal once his confirmations are relayed.
	eventually(t, 60*time.Second, "bob's receipts terminal", func() (bool, string) {
		terminal := 0
		_ = b.Store().Scan(ctx, record.KindReceipts, func(r record.Record) error {
			if r.(*record.Receipt).State == record.ReceiptTerminal {
				terminal++
			}
			return nil
		})
		return terminal == n, fmt.Sprintf("%d terminal", terminal)
	})
	// Bob's confirmations are listed as what they are, relayed once relayed (not
	// queued, 0 attempts); alice's messages as messages.
	bl, err := cb.Messages(ctx, "", 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(bl.Messages) != n {
		t.Fatalf("bob lists %d messages, want his %d confirmations", len(bl.Messages), n)
	}
	for _, m := range bl.Messages {
		if m.Kind != client.KindConfirmation || m.Status != record.StatusRelayed || m.Attempts != 1 || m.To != string(a.DID()) {
			t.Fatalf("bob's confirmation as listed: %+v; want a relayed confirmation to alice, 1 attempt", m)
		}
	}
	al, err := ca.Messages(ctx, "", 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range al.Messages {
		if m.Kind != client.KindMessage {
			t.Fatalf("alice's message as listed: %+v; want kind message", m)
		}
	}
	// Alice's receipts (of the delivery statuses) are terminal too.
	eventually(t, 60*time.Second, "alice's receipts terminal", func() (bool, string) {
		terminal := 0
		_ = a.Store().Scan(ctx, record.KindReceipts, func(r record.Record) error {
			if rc := r.(*record.Receipt); rc.State == record.ReceiptTerminal && rc.OutcomeCode == outcomeApplied {
				terminal++
			}
			return nil
		})
		return terminal == n, fmt.Sprintf("%d terminal", terminal)
	})

	// The inbox API: every message, bodies opened, paged.
	var got []client.InboxMessage
	after := ""
	for {
		l, err := cb.Inbox(ctx, 7, after)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l.Messages...)
		if l.Next == "" {
			break
		}
		after = l.Next
	}
	if len(got) != n {
		t.Fatalf("inbox lists %d messages, want %d", len(got), n)
	}
	for _, m := range got {
		if ids[m.MessageID] != string(m.Body) || m.From != string(a.DID()) || m.ReceivedAt.IsZero() {
			t.Fatalf("inbox message %+v, want body %q from %s", m, ids[m.MessageID], a.DID())
		}
	}

	// A duplicate envelope: posted to the relay again (the relay answers with
	// the same receipt and does not queue it again) and handed to bob's
	// follower directly: acknowledged, nothing stored twice.
	sums, err := a.Store().OutboxSummaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var dup *record.Outbox
	for _, s := range sums {
		if s.EnvelopeKind == record.EnvelopeMessage {
			if dup, err = store.GetAs[*record.Outbox](a.Store(), s.EnvelopeID); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if dup == nil {
		t.Fatal("no message envelope in alice's outbox")
	}
	rc := &relayproto.Client{BaseURL: relayURL}
	if _, _, err := rc.Post(ctx, dup.Envelope); err != nil {
		t.Fatalf("posting the envelope again: %v", err)
	}
	receipts := countKind(t, b, record.KindReceipts)
	f := b.inbound()
	if f == nil {
		t.Fatal("bob has no follower")
	}
	p, ack, err := f.processEnvelope(ctx, relayproto.InboxEnvelope{EnvelopeID: dup.EnvelopeID, Envelope: dup.Envelope})
	if err != nil || !ack || p != nil {
		t.Fatalf("duplicate: pending %v, ack %v, err %v", p, ack, err)
	}
	b.kickInbox()
	if got := countKind(t, b, record.KindObservations); got != n {
		t.Fatalf("after the duplicate bob holds %d observations, want %d", got, n)
	}
	if got := countKind(t, b, record.KindReceipts); got != receipts {
		t.Fatalf("after the duplicate bob holds %d receipts, want %d", got, receipts)
	}
}

func TestForgedDeliveryStatusLeavesRelayed(t *testing.T) {
	ctx := context.Background()
	relayURL := newTestRelay(t)
	home := t.TempDir()
	a := startInbound(t, home, "alice", relayURL)
	ca := client.New(a.SocketPath())
	// Dave never fetches his inbox: the message stays relayed.
	dave, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	m, err := ca.Send(ctx, client.SendRequest{To: client.Recipients{string(dave.DID())}, RelayURL: relayURL, Body: []byte("for dave")}, "")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "relayed", func() (bool, string) {
		got, err := ca.Message(ctx, m.MessageID)
		if err != nil {
			return false, err.Error()
		}
		return got.Status == record.StatusRelayed, got.Status
	})
	rec, err := a.Store().Message(m.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	// Mallory (a third identity) confirms it, for the right digest; and dave
	// confirms another digest.
	mallory, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	forged, wire, err := envelope.NewDeliveryStatus(mallory, a.DID(),
		envelope.Confirmation{MessageID: m.MessageID, EnvelopeDigest: rec.EnvelopeDigest}, now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	wrong, wire2, err := envelope.NewDeliveryStatus(dave, a.DID(),
		envelope.Confirmation{MessageID: m.MessageID, EnvelopeDigest: envelope.Digest([]byte("other"))}, now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	rc := &relayproto.Client{BaseURL: relayURL}
	for _, w := range [][]byte{wire, wire2} {
		if _, _, err := rc.Post(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	a.kickInbox()
	for _, env := range []*envelope.Envelope{forged, wrong} {
		eventually(t, 60*time.Second, "forged status processed", func() (bool, string) {
			r, err := store.GetAs[*record.Receipt](a.Store(), record.ReceiptID(env.ID()))
			if err != nil || r == nil {
				return false, fmt.Sprint(err)
			}
			return r.State == record.ReceiptTerminal && r.OutcomeCode == outcomeRefused, r.State + " " + r.OutcomeCode
		})
	}
	got, err := ca.Message(ctx, m.MessageID)
	if err != nil || got.Status != record.StatusRelayed {
		t.Fatalf("after forged statuses: %+v %v, want relayed", got, err)
	}
	// The genuine one from dave is applied.
	_, wire3, err := envelope.NewDeliveryStatus(dave, a.DID(),
		envelope.Confirmation{MessageID: m.MessageID, EnvelopeDigest: rec.EnvelopeDigest}, now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rc.Post(ctx, wire3); err != nil {
		t.Fatal(err)
	}
	a.kickInbox()
	eventually(t, 60*time.Second, "delivered", func() (bool, string) {
		got, err := ca.Message(ctx, m.MessageID)
		if err != nil {
			return false, err.Error()
		}
		return got.Status == record.StatusDelivered, got.Status
	})
}

// A relay's refusal is logged under its HTTP status, however it is worded and
// wrapped, so a relay that keeps refusing is one condition, not one per message.
func TestRelayRefusalClassedByStatus(t *testing.T) {
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, `{"code":"RELAY_BUSY","message":"busy %d"}`, n.Add(1))
	}))
	defer srv.Close()
	rc := &relayproto.Client{BaseURL: srv.URL}
	_, fetchErr := rc.Fetch(context.Background(), id, "", inboxPageSize)
	_, ackErr := rc.Ack(context.Background(), id, []string{"x"})
	for _, err := range []error{fetchErr, fmt.Errorf("acknowledging: %w", ackErr)} {
		if got := errClass(err); got != "HTTP 503" {
			t.Errorf("errClass(%v) = %q, want \"HTTP 503\"", err, got)
		}
	}
}
