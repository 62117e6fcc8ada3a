package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// answer is what the scripted relay does with one posted envelope.
type answer int

const (
	accept   answer = iota // the real relay accepts it
	fail                   // 503
	failLong               // 503 with Retry-After: 3600
	block                  // wait until the test opens the gate, then 503
)

// scriptedRelay is a relay whose answer to each posted envelope the test sets per
// message; it counts the posts per message. It has no batch endpoint, so every
// envelope is a post of its own.
type scriptedRelay struct {
	url   string
	inner http.Handler

	mu      sync.Mutex
	script  map[string]answer // message id → answer (default: the relay's)
	dflt    answer
	posts   map[string]int
	gate    chan struct{}
	arrived chan string // message ids of blocked posts
}

func newScriptedRelay(t *testing.T, addr string, dflt answer) *scriptedRelay {
	t.Helper()
	r, err := relay.New(relay.Options{Identity: ident(t, 9), Home: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedRelay{url: "http://" + ln.Addr().String(), inner: r.Handler(), script: map[string]answer{}, dflt: dflt,
		posts: map[string]int{}, gate: make(chan struct{}), arrived: make(chan string, 16)}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); r.Close() })
	return s
}

func (s *scriptedRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case relayproto.PathEnvelopesBatch:
		http.NotFound(w, r)
		return
	case relayproto.PathEnvelopes:
	default:
		s.inner.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	env, err := envelope.Parse(body)
	if err != nil {
		http.Error(w, `{"code":"BAD_ENVELOPE","message":"unparseable"}`, http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	id := env.MessageID()
	s.posts[id]++
	a, ok := s.script[id]
	if !ok {
		a = s.dflt
	}
	gate := s.gate
	s.mu.Unlock()
	switch a {
	case accept:
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.inner.ServeHTTP(w, r)
		return
	case block:
		s.arrived <- id
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	case failLong:
		w.Header().Set("Retry-After", "3600")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write([]byte(`{"code":"RELAY_BUSY","message":"scripted failure"}`))
}

func (s *scriptedRelay) set(id string, a answer) {
	s.mu.Lock()
	s.script[id] = a
	s.mu.Unlock()
}

func (s *scriptedRelay) setDefault(a answer) {
	s.mu.Lock()
	s.dflt = a
	s.mu.Unlock()
}

func (s *scriptedRelay) postsOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.posts[id]
}

// queueNode is a sealbridged process and its client.
type queueNode struct {
	t    *testing.T
	c    *client.Client
	peer *identity.Identity
	home string
	cli  string // the sealbridge binary
}

// queue runs `sealbridge queue --json` as an operator would and returns the target
// of relayURL in it (nil if the queue lists none).
func (n *queueNode) queue(relayURL string) *client.Target {
	n.t.Helper()
	cmd := exec.Command(n.cli, "queue", "--home", n.home, "--json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		n.t.Fatalf("sealbridge queue --json: %v\n%s", err, stderr.Bytes())
	}
	for line := range strings.Lines(string(out)) { // JSON lines: one target a line
		var tg client.Target
		if err := json.Unmarshal([]byte(line), &tg); err != nil {
			n.t.Fatalf("sealbridge queue --json: %v\n%s", err, out)
		}
		if tg.RelayURL == relayURL {
			return &tg
		}
	}
	return nil
}

func (n *queueNode) send(relayURL string, deadline time.Time) string {
	n.t.Helper()
	req := client.SendRequest{To: client.Recipients{string(n.peer.DID())}, RelayURL: relayURL, Body: []byte("queue e2e")}
	if !deadline.IsZero() {
		req.DeadlineMs = deadline.UnixMilli()
	}
	m, err := n.c.Send(context.Background(), req, "")
	if err != nil {
		n.t.Fatal(err)
	}
	return m.MessageID
}

func (n *queueNode) message(id string) *client.Message {
	n.t.Helper()
	m, err := n.c.Message(context.Background(), id)
	if err != nil {
		n.t.Fatal(err)
	}
	return m
}

// until polls message id until cond holds (bounded).
func (n *queueNode) until(id, what string, cond func(m *client.Message) bool) *client.Message {
	n.t.Helper()
	var m *client.Message
	waitFor(n.t, what, 120*time.Second, func() (bool, string) {
		m = n.message(id)
		return cond(m), fmt.Sprintf("%s attempts %d next %v last error %q", m.Status, m.Attempts, m.NextAttemptAt, m.LastError)
	})
	return m
}

// act runs one action on one message and checks its result.
func (n *queueNode) act(do func(context.Context, client.Selector, string) (client.ActionAnswer, error), sel client.Selector,
	wantChanged int, wantCode string) client.ActionAnswer {
	n.t.Helper()
	ans, err := do(context.Background(), sel, "e2e")
	if err != nil {
		n.t.Fatal(err)
	}
	if len(ans.Results) != 1 || ans.Results[0].Changed != wantChanged || ans.Results[0].Code != wantCode {
		n.t.Fatalf("%s %+v: %+v, want one result with changed %d, code %q", ans.Action, sel, ans.Results, wantChanged, wantCode)
	}
	return ans
}

func startQueueNode(t *testing.T) *queueNode {
	t.Helper()
	sealbridged, _ := buildBinaries(t)
	home := t.TempDir()
	me, err := daemon.InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	peer, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	root, _ := dataroot.Resolve(home)
	c := client.New(client.SocketPath(root, string(me.DID())))
	startDaemonProcess(t, sealbridged, home, c)
	return &queueNode{t: t, c: c, peer: peer, home: home, cli: filepath.Join(filepath.Dir(sealbridged), "sealbridge")}
}

func one(id string) client.Selector { return client.Selector{MessageIDs: []string{id}} }

// The operator's actions against a real daemon and relays that fail, block or are
// down: a held message is not sent while held (although due), and is sent once
// released; a cancelled message is closed/cancelled and never sent afterwards;
// retry makes one attempt at once rather than after the relay's hour of
// Retry-After, and ends an unreachable relay's wait; a held message past its
// deadline closes by deadline.
func TestQueueActionsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	n := startQueueNode(t)

	t.Run("hold then release", func(t *testing.T) {
		n.t = t
		r := newScriptedRelay(t, "127.0.0.1:0", block)
		a := n.send(r.url, time.Time{})
		select {
		case got := <-r.arrived:
			if got != a {
				t.Fatalf("blocked post of %s, want %s", got, a)
			}
		case <-time.After(120 * time.Second):
			t.Fatal("no attempt reached the relay")
		}
		r.setDefault(accept)
		r.set(a, fail)
		// Held while its attempt is in flight; the attempt then fails, which
		// schedules a retry after the backoff.
		n.act(n.c.Hold, one(a), 1, "")
		close(r.gate)
		n.until(a, "the failed attempt settled, then due", func(m *client.Message) bool {
			return m.Attempts == 1 && !m.NextAttemptAt.IsZero() && time.Now().After(m.NextAttemptAt.Add(100*time.Millisecond))
		})
		// The message view and the operator's queue show the hold, and who made it.
		if m := n.message(a); m.Held == nil || m.Held.By != fmt.Sprintf("uid:%d", os.Getuid()) || m.Held.Reason != "e2e" {
			t.Fatalf("held message's view: hold %+v", m.Held)
		}
		if q := n.queue(r.url); q == nil || q.Pending != 1 || q.Held != 1 || q.State != "held" || q.Attempts != 1 {
			t.Fatalf("queue --json while held: %+v, want 1 pending, 1 held, state held, 1 attempt", q)
		}
		// A message sent to the same relay after a was due goes out; a does not.
		r.set(a, accept)
		b := n.send(r.url, time.Time{})
		n.until(b, "b relayed", func(m *client.Message) bool { return m.Status == record.StatusRelayed })
		if got := r.postsOf(a); got != 1 {
			t.Fatalf("held message posted %d times, want only the attempt before the hold", got)
		}
		if m := n.message(a); m.Status != record.StatusQueued || m.Attempts != 1 {
			t.Fatalf("held message: %+v", m)
		}
		n.act(n.c.Release, one(a), 1, "")
		n.until(a, "released message relayed", func(m *client.Message) bool { return m.Status == record.StatusRelayed })
		if got := r.postsOf(a); got != 2 {
			t.Fatalf("released message posted %d times in all, want 2", got)
		}
		n.act(n.c.Hold, one(a), 0, "") // relayed: nothing pending to hold
	})

	t.Run("cancel", func(t *testing.T) {
		n.t = t
		r := newScriptedRelay(t, "127.0.0.1:0", failLong)
		c := n.send(r.url, time.Time{})
		n.until(c, "first attempt failed", func(m *client.Message) bool { return m.Attempts == 1 })
		n.act(n.c.Cancel, one(c), 1, "")
		m := n.message(c)
		if m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByCancelled || !strings.Contains(m.LastError, "cancelled") {
			t.Fatalf("cancelled message: %+v", m)
		}
		n.act(n.c.Cancel, one(c), 0, "") // idempotent
		n.act(n.c.Retry, one(c), 0, errcode.MessageClosed.String())
		// The relay now accepts, and retry of the whole target makes every pending
		// envelope due: a later message goes out, the cancelled one never does.
		r.setDefault(accept)
		d := n.send(r.url, time.Time{})
		ans, err := n.c.Retry(context.Background(), client.Selector{Target: r.url}, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range ans.Results {
			if res.MessageID == c {
				t.Fatalf("retry --target selected the cancelled message: %+v", res)
			}
		}
		n.until(d, "d relayed", func(m *client.Message) bool { return m.Status == record.StatusRelayed })
		if got := r.postsOf(c); got != 1 {
			t.Fatalf("cancelled message posted %d times, want 1 (before the cancel)", got)
		}
		if m := n.message(c); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByCancelled {
			t.Fatalf("cancelled message after the relay came back: %+v", m)
		}
	})

	t.Run("retry skips the backoff", func(t *testing.T) {
		n.t = t
		r := newScriptedRelay(t, "127.0.0.1:0", failLong)
		e := n.send(r.url, time.Time{})
		m := n.until(e, "first attempt failed", func(m *client.Message) bool { return m.Attempts == 1 })
		if !m.NextAttemptAt.After(time.Now().Add(time.Minute)) {
			t.Fatalf("next attempt %v: want the relay's long Retry-After (the backoff the retry skips)", m.NextAttemptAt)
		}
		// What the relay did, as the operator's queue shows it: one failed attempt,
		// its answer, and the relay's Retry-After as the backoff.
		q := n.queue(r.url)
		if q == nil || q.Pending != 1 || q.Held != 0 || q.State != "backing-off" || q.Attempts != 1 ||
			!q.BackoffUntil.Equal(m.NextAttemptAt) || !strings.Contains(q.LastError, "503") {
			t.Fatalf("queue --json after the failed attempt: %+v, want 1 pending backing off until %v after a 503", q, m.NextAttemptAt)
		}
		r.setDefault(accept)
		n.act(n.c.Retry, one(e), 1, "")
		m = n.until(e, "retried message relayed", func(m *client.Message) bool { return m.Status == record.StatusRelayed })
		if got := r.postsOf(e); got != 2 || m.Attempts != 2 {
			t.Fatalf("retried message: %d posts, %d attempts; want one more attempt, 2 in all", got, m.Attempts)
		}
	})

	t.Run("retry ends an unreachable wait", func(t *testing.T) {
		n.t = t
		addr := reservePort(t) // nobody listens yet: connections are refused
		url := "http://" + addr
		f := n.send(url, time.Time{})
		n.until(f, "an unreachable attempt", func(m *client.Message) bool { return m.Attempts >= 1 })
		if tg := n.queue(url); tg == nil || tg.State != "unreachable" {
			t.Fatalf("target %+v: want the unreachable wait", tg)
		}
		r := newScriptedRelay(t, addr, accept)
		ans, err := n.c.Retry(context.Background(), client.Selector{Target: r.url}, "relay is back")
		// The wait's own next probe (1–2 s after the first attempt) may have found the
		// relay back first: then nothing is left to retry.
		if err != nil || len(ans.Results) > 1 || (len(ans.Results) == 1 && (ans.Results[0].MessageID != f || ans.Results[0].Changed != 1)) {
			t.Fatalf("retry --target: %+v %v", ans, err)
		}
		n.until(f, "relayed after the retry", func(m *client.Message) bool { return m.Status == record.StatusRelayed })
		if got := r.postsOf(f); got != 1 {
			t.Fatalf("%d posts to the relay that came back, want 1", got)
		}
	})

	t.Run("held past its deadline closes by deadline", func(t *testing.T) {
		n.t = t
		r := newScriptedRelay(t, "127.0.0.1:0", failLong)
		g := n.send(r.url, time.Now().Add(10*time.Second))
		n.until(g, "first attempt failed", func(m *client.Message) bool { return m.Attempts == 1 })
		n.act(n.c.Hold, one(g), 1, "")
		m := n.until(g, "closed by its deadline", func(m *client.Message) bool { return m.Status == record.StatusClosed })
		if m.ClosedBy != record.ClosedByDeadline {
			t.Fatalf("held message past its deadline: %+v, want closedBy deadline", m)
		}
		if got := r.postsOf(g); got != 1 {
			t.Fatalf("held message posted %d times, want 1 (before the hold)", got)
		}
		n.act(n.c.Release, one(g), 0, errcode.MessageClosed.String())
	})
}
