package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

type env struct {
	home   string
	d      *daemon.Daemon
	c      *client.Client
	relay  *relay.Relay
	url    string
	peer   *identity.Identity
	cancel context.CancelFunc
	done   chan error
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newRelay(t *testing.T) (*relay.Relay, string) {
	t.Helper()
	rid, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Options{Identity: rid, Home: t.TempDir(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(func() { srv.Close(); r.Close() })
	return r, srv.URL
}

func start(t *testing.T, home string) (*daemon.Daemon, context.CancelFunc, chan error) {
	t.Helper()
	d, err := daemon.New(daemon.Options{Home: home, Logger: quietLogger(), DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("daemon stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("daemon not ready")
	}
	return d, cancel, done
}

func stop(t *testing.T, cancel context.CancelFunc, done chan error) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Error("daemon did not stop")
	}
}

func setup(t *testing.T) *env {
	t.Helper()
	e := &env{home: t.TempDir()}
	if _, err := daemon.InitIdentity(e.home, ""); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.peer, err = identity.Generate(); err != nil {
		t.Fatal(err)
	}
	e.relay, e.url = newRelay(t)
	e.d, e.cancel, e.done = start(t, e.home)
	t.Cleanup(func() { stop(t, e.cancel, e.done) })
	e.c = client.New(e.d.SocketPath())
	return e
}

func (e *env) req(body string) client.SendRequest {
	return client.SendRequest{To: client.Recipients{string(e.peer.DID())}, RelayURL: e.url, Body: []byte(body)}
}

func waitStatus(t *testing.T, c *client.Client, id, status string) *client.Message {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		m, err := c.Message(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if m.Status == status {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %s is %s, want %s", id, m.Status, status)
		}
		<-tick.C
	}
}

func TestSocketPath(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "")
	p := client.SocketPath("/data", "did:key:z6Mk")
	if !strings.HasPrefix(p, "/data/run/") || !strings.HasSuffix(p, ".sock") || len(p) != len("/data/run/")+16+len(".sock") {
		t.Fatalf("SocketPath = %s", p)
	}
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	if q := client.SocketPath("/data", "did:key:z6Mk"); q != "/run/user/1000/sealbridge/"+strings.TrimPrefix(p, "/data/run/") {
		t.Fatalf("SocketPath with XDG_RUNTIME_DIR = %s", q)
	}
}

func TestSendRelayed(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if err := e.c.Live(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := e.c.Send(ctx, e.req("hello"), "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Status != "queued" && m.Status != "relayed" || m.To != string(e.peer.DID()) || m.RelayURL != e.url {
		t.Fatalf("send answered %+v", m)
	}
	waitStatus(t, e.c, m.MessageID, "relayed")
	if got := e.relay.Stats().Accepted; got != 1 {
		t.Fatalf("relay accepted %d", got)
	}
	list, err := e.c.Messages(ctx, "relayed", 10, "")
	if err != nil || len(list.Messages) != 1 || list.Messages[0].MessageID != m.MessageID {
		t.Fatalf("Messages = %+v, %v", list, err)
	}
	if _, err := e.c.Message(ctx, "00000000-0000-0000-0000-000000000000"); !isStatus(err, 404) {
		t.Fatalf("missing message: %v", err)
	}
}

func isStatus(err error, status int) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == status
}

func TestMessagesPaging(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	ids := map[string]bool{}
	for i := 0; i < 5; i++ {
		m, err := e.c.Send(ctx, e.req("m"), "")
		if err != nil {
			t.Fatal(err)
		}
		ids[m.MessageID] = true
	}
	seen, after := map[string]bool{}, ""
	for pages := 0; ; pages++ {
		l, err := e.c.Messages(ctx, "", 2, after)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range l.Messages {
			if m.MessageID <= after || seen[m.MessageID] {
				t.Fatalf("page out of order: %s after %s", m.MessageID, after)
			}
			seen[m.MessageID] = true
		}
		if l.Next == "" {
			break
		}
		after = l.Next
		if pages > 5 {
			t.Fatal("too many pages")
		}
	}
	if len(seen) != 5 {
		t.Fatalf("listed %d of 5", len(seen))
	}
	if _, err := e.c.Messages(ctx, "bogus", 0, ""); !isStatus(err, 400) {
		t.Fatalf("bad status: %v", err)
	}
}

func TestIdempotency(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	first, err := e.c.Send(ctx, e.req("one"), "key-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.c.Send(ctx, e.req("one"), "key-1")
	if err != nil {
		t.Fatal(err)
	}
	if *again != *first {
		t.Fatalf("same key, same request: %+v then %+v", first, again)
	}
	_, err = e.c.Send(ctx, e.req("two"), "key-1")
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusUnprocessableEntity || ce.Code != "IDEMPOTENCY_KEY_REUSED" ||
		!errors.Is(err, errcode.IdempotencyKeyReused) {
		t.Fatalf("same key, other body: %v", err)
	}
	// In flight: the operation begun but not completed.
	r := e.req("three")
	canonical, _ := json.Marshal(r)
	if _, err := e.d.Store().BeginOperation(ctx, "key-2", canonical); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Send(ctx, r, "key-2")
	if !errors.As(err, &ce) || ce.Status != http.StatusConflict || !errors.Is(err, errcode.IdempotencyInProgress) {
		t.Fatalf("in flight: %v", err)
	}
	// A different key makes a different message.
	other, err := e.c.Send(ctx, e.req("one"), "key-3")
	if err != nil || other.MessageID == first.MessageID {
		t.Fatalf("other key: %+v, %v", other, err)
	}
	waitStatus(t, e.c, first.MessageID, "relayed")
	waitStatus(t, e.c, other.MessageID, "relayed")
	if got := e.relay.Stats().Accepted; got != 2 {
		t.Fatalf("relay accepted %d, want 2", got)
	}
}

func TestBadRequests(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	cases := map[string]client.SendRequest{
		"bad did":      {To: client.Recipients{"did:key:nope"}, RelayURL: e.url, Body: []byte("x")},
		"bad relay":    {To: client.Recipients{string(e.peer.DID())}, RelayURL: "ftp://x", Body: []byte("x")},
		"past":         {To: client.Recipients{string(e.peer.DID())}, RelayURL: e.url, Body: []byte("x"), DeadlineMs: time.Now().Add(-time.Hour).UnixMilli()},
		"body too big": {To: client.Recipients{string(e.peer.DID())}, RelayURL: e.url, Body: make([]byte, 200<<10)},
	}
	for name, r := range cases {
		if _, err := e.c.Send(ctx, r, ""); !isStatus(err, 400) && !isStatus(err, 413) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Unknown fields and non-JSON are refused.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", e.d.SocketPath())
	}}}
	resp, err := hc.Post("http://x/v1/messages", "application/json", strings.NewReader(`{"to":"a","extra":1}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ Code, Message string }
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != 400 || body.Code != "BAD_REQUEST" {
		t.Fatalf("unknown field: %d %+v", resp.StatusCode, body)
	}
	resp, err = hc.Get("http://x/metrics")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, fam := range []string{"sealbridge_outbox_envelopes", "sealbridge_messages", "sealbridge_outbox_oldest_pending_age_seconds",
		"sealbridge_carrier_targets_waiting", "sealbridge_api_requests_total", "sealbridge_enqueue_duration_seconds",
		"sealbridge_build_info", "sealbridge_store_lock_wait_seconds_total"} {
		if !strings.Contains(string(data), fam) {
			t.Errorf("/metrics lacks %s", fam)
		}
	}

}

func TestSecondDaemonRefused(t *testing.T) {
	e := setup(t)
	_, err := daemon.New(daemon.Options{Home: e.home, Logger: quietLogger()})
	if err == nil || !strings.Contains(err.Error(), "already running (pid ") ||
		!strings.Contains(err.Error(), "(pid "+itoa(os.Getpid())+")") {
		t.Fatalf("second daemon: %v", err)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestNotRunning(t *testing.T) {
	c := client.New(t.TempDir() + "/none.sock")
	err := c.Live(context.Background())
	if err == nil || !client.IsNotRunning(err) {
		t.Fatalf("no daemon: %v", err)
	}
}
