package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// logBuf collects log output safely across goroutines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the logged lines that contain every one of subs.
func (l *logBuf) lines(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.b.String(), "\n") {
		ok := line != ""
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// fakeClock is a carrier.Clock under the test's control. Each timer is handed to
// the test on timers; firing it advances the clock by its duration.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers chan *fakeTimer
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), timers: make(chan *fakeTimer, 64)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) NewTimer(d time.Duration) carrier.Timer {
	t := &fakeTimer{c: c, d: d, ch: make(chan time.Time, 1)}
	c.timers <- t
	return t
}

type fakeTimer struct {
	c  *fakeClock
	d  time.Duration
	ch chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }
func (t *fakeTimer) Stop() bool          { return true }
func (t *fakeTimer) fire() {
	t.c.advance(t.d)
	t.ch <- t.c.Now()
}

// healthDaemon is a daemon (not running) on a fresh home, logging into buf, with a
// fake clock.
func healthDaemon(t *testing.T, opts Options) (*Daemon, *logBuf, *fakeClock) {
	t.Helper()
	home := opts.Home
	if home == "" {
		home = t.TempDir()
		if _, err := InitIdentity(home, ""); err != nil {
			t.Fatal(err)
		}
	}
	buf := &logBuf{}
	opts.Home, opts.Logger = home, slog.New(slog.NewTextHandler(buf, nil))
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	clk := newFakeClock()
	d.clock = clk
	return d, buf, clk
}

func get(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, rec.Body.String())
	}
	return rec.Code, body
}

// enqueue stores a message of d's identity to a fresh peer.
func enqueue(t *testing.T, d *Daemon) string {
	t.Helper()
	peer, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	_, body, _, err := d.send(context.Background(), uuid.NewString(), client.SendRequest{To: client.Recipients{string(peer.DID())},
		RelayURL: "http://127.0.0.1:9", Body: []byte("hi")}, time.Now().Add(time.Hour), false)
	if err != nil {
		t.Fatal(err)
	}
	var m client.Message
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	return m.MessageID
}

// A file planted in a kind directory makes /readyz answer 503 naming it, while the
// change detector, polled every 250 ms for three minutes, logs it once a minute at
// most; removed, /readyz is ready again and one "reads again" line is logged.
func TestPlantedRecordNotReadyAndQuiet(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, file string
		data       []byte
	}{
		{"unknown name", "notes.txt", []byte("planted\n")},
		{"invalid record", uuid.NewString() + ".json", []byte("{\"planted\":true}\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d0, _, _ := healthDaemon(t, Options{})
			id := enqueue(t, d0)
			d0.newDetector().poll(ctx)
			if code, body := get(t, d0.handler(), "/readyz"); code != http.StatusOK || body["status"] != "ready" {
				t.Fatalf("before: %d %v", code, body)
			}
			// Planted while the daemon is stopped: the store trusts its own
			// publications, so a running daemon's index would not see it before
			// the next start.
			d0.Close()
			planted := filepath.Join(d0.Store().Dir(), string(record.KindMessages), tc.file)
			if err := os.WriteFile(planted, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			d, logs, clk := healthDaemon(t, Options{Home: d0.opts.Home})
			h := d.handler()
			dt := d.newDetector()
			const polls = 3 * 60 * 4 // three minutes of 250 ms polls
			for range polls {
				dt.poll(ctx)
				clk.advance(defaultChangePollEvery)
			}
			code, body := get(t, h, "/readyz")
			msg, _ := body["message"].(string)
			if code != http.StatusServiceUnavailable || body["code"] != codeNotReady ||
				!strings.Contains(msg, "messages/"+tc.file) || !strings.Contains(msg, "OUTBOX_STORE_INVALID") {
				t.Fatalf("planted: /readyz %d %v\n%s", code, body, strings.Join(logs.lines(), "\n"))
			}
			if code, _ := get(t, h, "/livez"); code != http.StatusOK {
				t.Fatalf("/livez %d", code)
			}
			warns := logs.lines("level=WARN", "change detector", "messages/"+tc.file)
			// At 0, 60 and 120 s; the repeats count the 239 polls they stand for.
			if len(warns) != 3 || !strings.Contains(warns[1], "repeated=239") || !strings.Contains(warns[2], "repeated=239") {
				t.Fatalf("%d warnings in 3 minutes of polls, want 3 with repeat counts:\n%s", len(warns), strings.Join(warns, "\n"))
			}

			// The list fails only where it must: an unknown name refuses the listing;
			// an invalid record is one entry carrying its error, the others are served.
			code, body = get(t, h, "/v1/messages")
			if tc.name == "unknown name" {
				if code != http.StatusInternalServerError {
					t.Fatalf("list with an unknown name: %d %v", code, body)
				}
			} else {
				var l client.MessageList
				raw, _ := json.Marshal(body)
				if err := json.Unmarshal(raw, &l); err != nil || code != http.StatusOK || len(l.Messages) != 2 {
					t.Fatalf("list with an invalid record: %d %v %s", code, err, raw)
				}
				for _, m := range l.Messages {
					bad := m.MessageID == strings.TrimSuffix(tc.file, ".json")
					if bad != (m.Error != nil) || (bad && (m.Status != "" || m.Error.Code != "OUTBOX_STORE_INVALID")) ||
						(!bad && (m.MessageID != id || m.Status != record.StatusQueued)) {
						t.Fatalf("list entry %+v (error %+v)", m, m.Error)
					}
				}
			}

			if err := os.Remove(planted); err != nil {
				t.Fatal(err)
			}
			dt.poll(ctx)
			if code, body := get(t, h, "/readyz"); code != http.StatusOK {
				t.Fatalf("after removal: /readyz %d %v", code, body)
			}
			if got := logs.lines("level=INFO", "change detector", "reads again", "kind=messages"); len(got) != 1 {
				t.Fatalf("%d 'reads again' lines, want 1", len(got))
			}
			if got := logs.lines("level=INFO", "api: the store reads again"); len(got) != 1 {
				t.Fatalf("%d api 'reads again' lines, want 1", len(got))
			}
		})
	}
}

// The condition logger: a warning when a condition appears or changes, repeats at
// most once a minute with the count suppressed, one info line when it clears.
func TestCondLog(t *testing.T) {
	buf := &logBuf{}
	clk := newFakeClock()
	c := newCondLog(slog.New(slog.NewTextHandler(buf, nil)), clk.Now)
	if c.clear("k", "cleared") {
		t.Fatal("cleared a condition that never held")
	}
	logged := 0
	for range 110 { // 110 s, every second
		if c.warn("k", "A", "broken") {
			logged++
		}
		clk.advance(time.Second)
	}
	if logged != 2 {
		t.Fatalf("logged %d times in 110 s, want 2 (at 0 and 60 s)", logged)
	}
	if !c.warn("k", "B", "broken otherwise") {
		t.Fatal("a new code was suppressed")
	}
	if c.warn("k", "A", "broken") {
		t.Fatal("code A again within its minute was logged")
	}
	if !c.clear("k", "cleared") || c.clear("k", "cleared") {
		t.Fatal("clear")
	}
	if got := buf.lines("level=WARN", "repeated=59"); len(got) != 1 {
		t.Fatalf("repeat lines: %q", buf.lines("level=WARN"))
	}
	if got := buf.lines("level=INFO", "cleared", "repeated=50"); len(got) != 1 {
		t.Fatalf("clear lines: %q", buf.lines("level=INFO"))
	}
}

func TestInboxRelayValidated(t *testing.T) {
	for _, u := range []string{"ftp://x", "x", "/v1", "http://", "http:///path", "https://user:secret@relay.example",
		"http://relay.example/#frag", "http://relay.example/?q=1", "http://relay.example:8470 x", "mailto:a@b"} {
		_, err := New(Options{Home: t.TempDir(), InboxRelay: u})
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Option != "--inbox-relay" {
			t.Errorf("--inbox-relay %q: %v, want an OptionError", u, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("--inbox-relay %q: the error shows the credentials: %v", u, err)
		}
	}
	d, _, _ := healthDaemon(t, Options{InboxRelay: "http://127.0.0.1:8470/base"})
	if d.opts.InboxRelay == "" {
		t.Fatal("a valid relay URL was dropped")
	}
}

// scripted is a carrier transport that fails its first `fails` sends, and every
// send while stuck; it accepts the others.
type scripted struct {
	mu    sync.Mutex
	fail  carrier.Result
	fails int
	stuck bool
}

func (s *scripted) Send(_ context.Context, _ string, _ []byte) carrier.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stuck || s.fails > 0 {
		s.fails--
		return s.fail
	}
	return carrier.Result{Outcome: carrier.Accepted, Status: http.StatusOK}
}

func (s *scripted) setStuck() {
	s.mu.Lock()
	s.stuck = true
	s.mu.Unlock()
}

// A queued message shows its last error and next attempt (GET one and the list);
// failed deliveries are logged per target with the reason, once while repeating,
// and the recovery is logged.
func TestQueuedMessageShowsLastErrorAndNextAttempt(t *testing.T) {
	ctx := context.Background()
	tr := &scripted{fails: 3, fail: carrier.Result{Outcome: carrier.Failed, Status: http.StatusServiceUnavailable,
		Err: errors.New("HTTP 503 RELAY_BUSY")}}
	d, logs, _ := healthDaemon(t, Options{Transport: tr, Carrier: carrier.Options{BackoffMin: 5 * time.Millisecond,
		BackoffMax: 10 * time.Millisecond, Watch: carrier.WatchOff}})
	run(t, d)
	c := client.New(d.SocketPath())
	peer, _ := identity.Generate()
	const relayURL = "http://relay.test:8470"
	m, err := c.Send(ctx, client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: relayURL, Body: []byte("x")}, "")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "relayed after three failures", func() (bool, string) {
		got, err := c.Message(ctx, m.MessageID)
		if err != nil {
			return false, err.Error()
		}
		return got.Status == record.StatusRelayed, got.Status
	})
	// The next message stays queued.
	tr.setStuck()
	m2, err := c.Send(ctx, client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: relayURL, Body: []byte("y")}, "")
	if err != nil {
		t.Fatal(err)
	}
	var got *client.Message
	eventually(t, 30*time.Second, "an attempt recorded", func() (bool, string) {
		got, err = c.Message(ctx, m2.MessageID)
		if err != nil {
			return false, err.Error()
		}
		return got.Attempts >= 1 && got.LastError != "", fmt.Sprintf("%+v", got)
	})
	if got.Status != record.StatusQueued || !strings.Contains(got.LastError, "RELAY_BUSY") || got.NextAttemptAt.IsZero() {
		t.Fatalf("queued message: %+v", got)
	}
	l, err := c.Messages(ctx, record.StatusQueued, 0, "")
	if err != nil || len(l.Messages) != 1 {
		t.Fatalf("list: %+v %v", l, err)
	}
	if e := l.Messages[0]; e.MessageID != m2.MessageID || !strings.Contains(e.LastError, "RELAY_BUSY") ||
		e.NextAttemptAt.IsZero() || e.Attempts < 1 {
		t.Fatalf("list entry: %+v", e)
	}
	if l, err := c.Messages(ctx, record.StatusRelayed, 0, ""); err != nil || len(l.Messages) != 1 || l.Messages[0].Attempts != 4 {
		t.Fatalf("relayed list entry (attempts from the index): %+v %v", l, err)
	}
	// The daemon's clock stands still: one warning for the three failures of the
	// first message, one line for its recovery, one warning for the second's.
	// (An attempt's event follows its settlement: wait for the lines.)
	eventually(t, 30*time.Second, "the second message's failure logged", func() (bool, string) {
		n := len(logs.lines("level=WARN", "delivery: attempt failed", "target="+relayURL, "envelope="+envelopeOf(t, d, m2.MessageID)))
		return n > 0, fmt.Sprint(n, " lines")
	})
	warns := logs.lines("level=WARN", "delivery: attempt failed", "target="+relayURL, "RELAY_BUSY")
	if len(warns) != 2 {
		t.Fatalf("%d failure warnings, want 2:\n%s", len(warns), strings.Join(warns, "\n"))
	}
	if got := logs.lines("level=INFO", "delivery: the relay accepts again", "target="+relayURL); len(got) != 1 {
		t.Fatalf("%d recovery lines, want 1", len(got))
	}
}

// envelopeOf returns the envelope id of message id.
func envelopeOf(t *testing.T, d *Daemon, id string) string {
	t.Helper()
	sums, err := d.Store().OutboxSummaries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sums {
		if s.MessageID == id {
			return s.EnvelopeID
		}
	}
	t.Fatalf("no envelope of message %s", id)
	return ""
}
