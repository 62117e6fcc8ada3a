package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// switchRelay is a reference relay (pkg/relay, in process) on one fixed address
// that can go away (its listener closed: connection refused) and come back.
type switchRelay struct {
	t    *testing.T
	r    *relay.Relay
	h    http.Handler
	addr string
	mu   sync.Mutex
	srv  *http.Server
}

func newSwitchRelay(t *testing.T, opts relay.Options) *switchRelay {
	t.Helper()
	rid, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	opts.Identity, opts.Home, opts.Logger = rid, t.TempDir(), quiet
	r, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &switchRelay{t: t, r: r, h: r.Handler(), addr: ln.Addr().String()}
	s.serve(ln)
	t.Cleanup(func() { s.down(); r.Close() })
	return s
}

func (s *switchRelay) url() string { return "http://" + s.addr }

func (s *switchRelay) serve(ln net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = &http.Server{Handler: s.h, ErrorLog: nil}
	go s.srv.Serve(ln)
}

// down closes the listener and every connection: the relay's address refuses.
func (s *switchRelay) down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		_ = s.srv.Close()
		s.srv = nil
	}
}

// up listens on the same address again (retrying while the port is in use).
func (s *switchRelay) up() {
	s.t.Helper()
	var ln net.Listener
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			s.t.Fatalf("relay back on %s: %v", s.addr, err)
		}
		waitTick()
	}
	s.serve(ln)
}

// waitTick is one step of a poll with a deadline.
func waitTick() {
	t := time.NewTimer(10 * time.Millisecond)
	<-t.C
}

// truthDaemon runs a daemon on a fresh home with the wall clock, no change
// watching, and the carrier options given.
func truthDaemon(t *testing.T, co carrier.Options, so store.Options) (*Daemon, *client.Client) {
	t.Helper()
	co.Watch = carrier.WatchOff
	d, c, _, _ := changeDaemon(t, t.TempDir(), Options{Carrier: co, Store: so, DrainTimeout: 5 * time.Second})
	return d, c
}

func sendTo(t *testing.T, c *client.Client, relayURL string) string {
	t.Helper()
	peer, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Send(context.Background(), client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: relayURL, Body: []byte("x")}, "")
	if err != nil {
		t.Fatal(err)
	}
	return m.MessageID
}

func statusOfMsg(t *testing.T, c *client.Client, id string) *client.Message {
	t.Helper()
	m, err := c.Message(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func allStatus(t *testing.T, c *client.Client, ids []string, status string) (bool, string) {
	t.Helper()
	for _, id := range ids {
		if m := statusOfMsg(t, c, id); m.Status != status {
			return false, id + " is " + m.Status
		}
	}
	return true, ""
}

// With the relay gone and 20 messages sent, every message — not only the one that
// was tried — shows its target's wait in the message view and in the list (next
// attempt = the target's next probe, the target's last error, waiting for
// "target"), and the target view suggests retry --target. retry of one message
// attempts it at once as its target's probe and says so; retry --target answers
// "attempting" for every message; once the relay is back, the retry of one
// message is the probe whose answer sends all the others at once.
func TestQueueShowsTargetWaitAndRetryAttempts(t *testing.T) {
	ctx := context.Background()
	rl := newSwitchRelay(t, relay.Options{})
	rl.down()
	// No probe comes by itself within the test: every attempt is a retry's.
	_, c := truthDaemon(t, carrier.Options{ProbeMin: time.Hour, ProbeEvery: time.Hour}, store.Options{})
	var ids []string
	for range 20 {
		ids = append(ids, sendTo(t, c, rl.url()))
	}
	var tg client.Target
	eventually(t, 30*time.Second, "the target waits", func() (bool, string) {
		l, err := c.Targets(ctx)
		if err != nil || len(l.Targets) != 1 {
			return false, "targets"
		}
		tg = l.Targets[0]
		return tg.State == carrier.TargetUnreachable && tg.Pending == 20 && tg.InFlight == 0, tg.State
	})
	if tg.NextProbeAt.Sub(time.Now()) < 30*time.Minute || !strings.Contains(tg.LastError, "unreachable") ||
		tg.Hint != "probe it now: sealbridge retry --target "+rl.url() {
		t.Fatalf("target %+v", tg)
	}
	check := func(m *client.Message, where string) {
		t.Helper()
		if m.Status != record.StatusQueued || m.WaitingFor != carrier.WaitTarget || !m.NextAttemptAt.Equal(tg.NextProbeAt) ||
			!strings.Contains(m.LastError, "unreachable") {
			t.Fatalf("%s: message %s does not show its target's wait: waiting for %q, next %v (probe %v), last error %q",
				where, m.MessageID, m.WaitingFor, m.NextAttemptAt, tg.NextProbeAt, m.LastError)
		}
	}
	for _, id := range ids {
		check(statusOfMsg(t, c, id), "status")
	}
	l, err := c.Messages(ctx, record.StatusQueued, 100, "")
	if err != nil || len(l.Messages) != 20 {
		t.Fatalf("ls: %v %v", l, err)
	}
	for i := range l.Messages {
		check(&l.Messages[i], "ls")
	}

	// retry of one message (not the one that was tried): an attempt at once, as the
	// target's probe; the relay still refuses, so the target keeps waiting.
	var tried string
	for _, id := range ids {
		if statusOfMsg(t, c, id).Attempts == 1 {
			tried = id
		}
	}
	pick := ids[7]
	if pick == tried {
		pick = ids[8]
	}
	ans, err := c.Retry(ctx, client.Selector{MessageIDs: []string{pick}}, "")
	if err != nil || len(ans.Results) != 1 || ans.Results[0].Effect != carrier.EffectProbing ||
		!strings.Contains(ans.Results[0].Message, "probing") {
		t.Fatalf("retry: %+v %v", ans, err)
	}
	eventually(t, 30*time.Second, "the retried message attempted", func() (bool, string) {
		m := statusOfMsg(t, c, pick)
		return m.Attempts == 1 && m.WaitingFor == carrier.WaitTarget, m.WaitingFor
	})
	for _, id := range ids {
		if m := statusOfMsg(t, c, id); id != pick && id != tried && m.Attempts != 0 {
			t.Fatalf("message %s attempted too: %+v", id, m)
		}
	}

	// retry --target: every message is attempted now, and the answer says so.
	ans, err = c.Retry(ctx, client.Selector{Target: rl.url() + "/"}, "")
	if err != nil || len(ans.Results) != 20 {
		t.Fatalf("retry --target: %+v %v", ans, err)
	}
	for _, r := range ans.Results {
		if r.Effect != carrier.EffectAttempting && r.Effect != carrier.EffectInFlight || r.Code != "" {
			t.Fatalf("retry --target result %+v", r)
		}
	}
	eventually(t, 30*time.Second, "the target waits again", func() (bool, string) {
		l, err := c.Targets(ctx)
		if err != nil || len(l.Targets) != 1 {
			return false, "targets"
		}
		return l.Targets[0].State == carrier.TargetUnreachable && l.Targets[0].InFlight == 0, l.Targets[0].State
	})

	// The relay comes back: one message's retry is the probe, and its answer sends
	// every other message at once (their next probe is an hour away).
	rl.up()
	pick = ids[3]
	ans, err = c.Retry(ctx, client.Selector{MessageIDs: []string{pick}}, "")
	if err != nil || len(ans.Results) != 1 || ans.Results[0].Effect != carrier.EffectProbing {
		t.Fatalf("retry: %+v %v", ans, err)
	}
	eventually(t, 60*time.Second, "every message relayed", func() (bool, string) { return allStatus(t, c, ids, record.StatusRelayed) })
}

// Probes of a relay that went away start after a moment and back off: a relay that
// is away for a while and comes back gets its messages within seconds, without a
// retry (with the old 300 s probe interval this waited five minutes).
func TestRelayBackDeliversWithoutRetry(t *testing.T) {
	ctx := context.Background()
	rl := newSwitchRelay(t, relay.Options{})
	rl.down()
	// The first probe 50–100 ms after the relay stopped answering (1–2 s by default).
	_, c := truthDaemon(t, carrier.Options{ProbeMin: 50 * time.Millisecond}, store.Options{})
	var ids []string
	for range 5 {
		ids = append(ids, sendTo(t, c, rl.url()))
	}
	var first client.Target
	eventually(t, 30*time.Second, "the target waits", func() (bool, string) {
		l, err := c.Targets(ctx)
		if err != nil || len(l.Targets) != 1 {
			return false, "targets"
		}
		first = l.Targets[0]
		return first.State == carrier.TargetUnreachable, first.State
	})
	if gap := first.NextProbeAt.Sub(first.UnreachableSince); gap > time.Minute {
		t.Fatalf("first probe %v after the wait began", gap)
	}
	// A later probe comes later than the first (backing off).
	eventually(t, 30*time.Second, "a second probe", func() (bool, string) {
		l, err := c.Targets(ctx)
		if err != nil || len(l.Targets) != 1 {
			return false, "targets"
		}
		tg := l.Targets[0]
		return tg.Attempts >= 2 && tg.NextProbeAt.After(first.NextProbeAt), tg.State
	})
	rl.up()
	// The next probe is at most about three times the wait's length so far away
	// (seconds here); the old fixed interval was 300 s.
	eventually(t, 120*time.Second, "every message relayed", func() (bool, string) { return allStatus(t, c, ids, record.StatusRelayed) })
}

// A daemon that died with an envelope in flight left its lease (180 s) on it. The
// message view says that the lease is what the message waits for; the next daemon,
// whose pid lock proves the old one dead, takes the lease back at start and the
// message is delivered without waiting out the lease.
func TestDeadDaemonLeaseTakenOverAtStart(t *testing.T) {
	ctx := context.Background()
	rl := newSwitchRelay(t, relay.Options{})
	home := t.TempDir()
	if _, err := InitIdentity(home, ""); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Home: home, Logger: quiet, Carrier: carrier.Options{Watch: carrier.WatchOff}})
	if err != nil {
		t.Fatal(err)
	}
	h := d.handler()
	// A message enqueued and leased by a carrier that is gone (as a SIGKILL leaves it).
	peer, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	if _, _, _, err := d.send(ctx, id, client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: rl.url(), Body: []byte("x")},
		time.Now().Add(time.Hour), false); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(180 * time.Second).UnixMilli()
	update(t, d, id, func(o *record.Outbox) {
		o.Lease = &record.Lease{Holder: "carrier:999999:deadbeef", Until: until}
	}, func(*record.Message) {})
	cm, _ := getTyped[client.Message](t, h, "/v1/messages/"+id)
	if cm.WaitingFor != carrier.WaitLease || !cm.LeaseUntil.Equal(time.UnixMilli(until)) || !cm.NextAttemptAt.Equal(time.UnixMilli(until)) {
		t.Fatalf("status of a leased message: waiting for %q, lease until %v, next %v", cm.WaitingFor, cm.LeaseUntil, cm.NextAttemptAt)
	}
	run(t, d)
	c := client.New(d.SocketPath())
	eventually(t, 30*time.Second, "the message relayed", func() (bool, string) { return allStatus(t, c, []string{id}, record.StatusRelayed) })
}

// A store failure while settling (here EIO on the settlement's writes, as a stale
// .lock's OUTBOX_STORE_BUSY did) is not the relay's: the target is not put into a
// 300 s wait, the carrier tries again within seconds, and once the failure cleared
// the message is delivered.
func TestStoreFailureWhileSettlingRetriedSoon(t *testing.T) {
	var failing atomic.Bool
	var failures atomic.Int32
	so := store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if failing.Load() && op.Kind == fsx.OpCreate && strings.HasPrefix(op.Path, "outbox/") {
				if failures.Add(1) >= 2 {
					failing.Store(false) // the failure clears
				}
				return syscall.EIO
			}
			return nil
		}
		return f
	}}
	var accepted atomic.Int32
	rl := newSwitchRelay(t, relay.Options{OnAccept: func(string, string, bool) {
		if accepted.Add(1) == 1 {
			failing.Store(true) // the store breaks while the first send is out
		}
	}})
	_, c := truthDaemon(t, carrier.Options{StoreRetryMin: 50 * time.Millisecond}, so)
	id := sendTo(t, c, rl.url())
	eventually(t, 30*time.Second, "the message relayed", func() (bool, string) { return allStatus(t, c, []string{id}, record.StatusRelayed) })
	if failures.Load() < 1 {
		t.Fatal("no store failure was injected")
	}
}

// A cancel of a message whose envelope is in a send under way answers that the
// send may still deliver it; the cancel stands (the send is not recalled).
func TestCancelInFlightSaysSo(t *testing.T) {
	ctx := context.Background()
	var accepted atomic.Bool
	rl := newSwitchRelay(t, relay.Options{OnAccept: func(string, string, bool) { accepted.Store(true) }})
	gate, arrived := make(chan struct{}), make(chan struct{}, 1)
	inner := rl.h
	rl.down()
	rl.h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-gate
		inner.ServeHTTP(w, r)
	})
	rl.up()
	d, c := truthDaemon(t, carrier.Options{}, store.Options{})
	id := sendTo(t, c, rl.url())
	select {
	case <-arrived:
	case <-time.After(60 * time.Second):
		t.Fatal("no send arrived")
	}
	ans, err := c.Cancel(ctx, client.Selector{MessageIDs: []string{id}}, "")
	close(gate)
	if err != nil || len(ans.Results) != 1 {
		t.Fatalf("cancel: %+v %v", ans, err)
	}
	if r := ans.Results[0]; r.Code != "" || r.Changed != 1 || r.InFlight != 1 || !strings.Contains(r.Message, "may still be delivered") {
		t.Fatalf("cancel of an envelope in flight: %+v", r)
	}
	eventually(t, 30*time.Second, "the send accepted and settled", func() (bool, string) {
		return accepted.Load() && d.car.Stats().InFlight == 0, "in flight"
	})
	if m := statusOfMsg(t, c, id); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByCancelled {
		t.Fatalf("after the send: %+v", m)
	}
}

// Relay URLs have one form: a message sent to http://127.0.0.1:9/ is kept as
// http://127.0.0.1:9, and hold --target finds it in any spelling of that URL, as
// it finds a record kept in another spelling before.
func TestTargetURLCanonical(t *testing.T) {
	ctx := context.Background()
	d, c := truthDaemon(t, carrier.Options{BackoffMin: time.Hour, BackoffMax: time.Hour, ProbeMin: time.Hour, ProbeEvery: time.Hour},
		store.Options{})
	id := sendTo(t, c, "HTTP://127.0.0.1:9/")
	if m := statusOfMsg(t, c, id); m.RelayURL != "http://127.0.0.1:9" {
		t.Fatalf("relay URL kept as %q", m.RelayURL)
	}
	ans, err := c.Hold(ctx, client.Selector{Target: "http://127.0.0.1:9/"}, "")
	if err != nil || len(ans.Results) != 1 || ans.Results[0].MessageID != id || ans.Results[0].Changed != 1 {
		t.Fatalf("hold --target http://127.0.0.1:9/: %+v %v", ans, err)
	}
	// A record kept with a trailing slash (before URLs were canonical) is found too.
	old := uuid.NewString()
	if _, _, _, err := d.send(ctx, old, client.SendRequest{To: client.Recipients{string(d.DID())}, RelayURL: "http://Relay.test:8470/", Body: []byte("x")},
		time.Now().Add(time.Hour), false); err != nil {
		t.Fatal(err)
	}
	ans, err = c.Hold(ctx, client.Selector{Target: "http://relay.test:8470"}, "")
	if err != nil || len(ans.Results) != 1 || ans.Results[0].MessageID != old {
		t.Fatalf("hold --target of a record in another spelling: %+v %v", ans, err)
	}
	// A URL with no canonical form is refused with a stable code and the form to use.
	_, err = c.Hold(ctx, client.Selector{Target: "http://relay.test:8470/?x=1"}, "")
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != "RELAY_URL_INVALID" || ce.Hint != "use http://relay.test:8470" {
		t.Fatalf("hold --target with a query: %v", err)
	}
	_, err = c.Send(ctx, client.SendRequest{To: client.Recipients{string(d.DID())}, RelayURL: "https://u:p@relay.test/", Body: []byte("x")}, "")
	if !errors.As(err, &ce) || ce.Code != "RELAY_URL_INVALID" || ce.Hint != "use https://relay.test" || strings.Contains(ce.Message, "u:p") {
		t.Fatalf("send with user information: %v", err)
	}
}
