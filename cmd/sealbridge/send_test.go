package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// startFaultyDaemon is startDaemon with the store's file system failing every
// fsync of the messages directory while fail is set: a one-envelope send's last
// step, after its message record (the commit, DESIGN §7) was renamed into place.
func startFaultyDaemon(t *testing.T, home, name string, fail *atomic.Bool) *daemon.Daemon {
	t.Helper()
	return runDaemon(t, daemon.Options{Home: home, Identity: name, Store: store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if op.Kind == fsx.OpSyncDir && op.Path == string(record.KindMessages) && fail.Load() {
				return syscall.EIO
			}
			return nil
		}
		return f
	}}})
}

// noSleep makes send's retries wait for nothing and records the waits asked for.
func noSleep(t *testing.T) *[]time.Duration {
	var waits []time.Duration
	saved := sendRetries
	sendRetries.sleep = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	t.Cleanup(func() { sendRetries = saved })
	return &waits
}

func storedMessages(t *testing.T, d *daemon.Daemon) []string {
	t.Helper()
	ids, err := d.Store().List(record.KindMessages)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// A send whose first attempt's commit fails its directory fsync after the rename
// (503, the message may be accepted) is retried with the same key and the same
// request: the retry finds the message, and there is exactly one.
func TestSendRetriesAnUnknownOutcome(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	var fail atomic.Bool
	d := startFaultyDaemon(t, home, "alice", &fail)
	waits := noSleep(t)
	body := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(body, []byte("hello bob"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Fail the first attempt's commit fsync only.
	sendRetries.sleep = func(_ context.Context, w time.Duration) error {
		fail.Store(false)
		*waits = append(*waits, w)
		return nil
	}
	fail.Store(true)
	code, out, errs := sb(t, "send", "--home", home, "--identity", "alice", "--to", bob, "--relay", "http://127.0.0.1:9",
		"--file", body, "--deadline", "1h")
	if code != exitOK {
		t.Fatalf("send: %d %s", code, errs)
	}
	ids := storedMessages(t, d)
	if len(ids) != 1 || strings.TrimSpace(out) != ids[0] {
		t.Fatalf("send printed %q; messages stored: %v", out, ids)
	}
	if len(*waits) != 1 {
		t.Fatalf("%d retries, want 1 (waits %v)", len(*waits), *waits)
	}
	// One operation: every attempt used one key.
	if ops, err := d.Store().List(record.KindOperations); err != nil || len(ops) != 1 || ops[0] != ids[0] {
		t.Fatalf("operations %v %v, want the message's", ops, err)
	}
}

// A send that never learns its outcome exits 4 and prints its key and the command
// that finishes it; that command, run once the store works again, answers the
// message the failed send may have made, and there is exactly one.
func TestSendUnknownOutcomeFinishedByPrintedCommand(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	var fail atomic.Bool
	d := startFaultyDaemon(t, home, "alice", &fail)
	waits := noSleep(t)
	t.Cleanup(func() { stdin = os.Stdin })

	fail.Store(true)
	stdin = strings.NewReader("hello bob")
	// A duration deadline: the printed command must carry the instant computed once.
	code, out, errs := sb(t, "send", "--home", home, "--identity", "alice", "--to", bob, "--relay", "http://127.0.0.1:9", "--deadline", "1h")
	if code != exitUnknown || out != "" {
		t.Fatalf("send: exit %d (want %d)\nstdout %q\nstderr %s", code, exitUnknown, out, errs)
	}
	if len(*waits) != sendRetries.attempts-1 {
		t.Fatalf("%d retries, want %d", len(*waits), sendRetries.attempts-1)
	}
	m := regexp.MustCompile(`Idempotency-Key ([0-9a-f-]{36}); the message may have been accepted as message ([0-9a-f-]{36}):`).FindStringSubmatch(errs)
	if m == nil {
		t.Fatalf("stderr names no key and message:\n%s", errs)
	}
	key, id := m[1], m[2]
	_, rest, ok := strings.Cut(errs, "sealbridge: hint: finish it without sending it twice by piping the same body to: ")
	cmdline, _, ok2 := strings.Cut(rest, " (another body is refused with IDEMPOTENCY_KEY_REUSED)\n")
	if !ok || !ok2 || strings.ContainsAny(cmdline, `'"\`) {
		t.Fatalf("no command in the hint:\n%s", errs)
	}
	args := strings.Fields(cmdline)
	if args[0] != "sealbridge" || !strings.Contains(cmdline, " --idempotency-key "+key) || !strings.Contains(cmdline, " --deadline ") {
		t.Fatalf("printed command %q", cmdline)
	}
	if ids := storedMessages(t, d); len(ids) != 1 || ids[0] != id {
		t.Fatalf("messages stored while failing: %v (want %s)", ids, id)
	}

	fail.Store(false)
	stdin = strings.NewReader("hello bob")
	code, out, errs = sb(t, args[1:]...)
	if code != exitOK || strings.TrimSpace(out) != id {
		t.Fatalf("the printed command: exit %d, printed %q (want %s)\n%s", code, out, id, errs)
	}
	if ids := storedMessages(t, d); len(ids) != 1 {
		t.Fatalf("messages after finishing: %v, want one", ids)
	}
	// The message is accepted for real now: it reads back, queued or further.
	code, out, errs = sb(t, "status", id, "--home", home, "--identity", "alice")
	if code != exitOK || field(out, "message") != id {
		t.Fatalf("status: %d %s %s", code, out, errs)
	}
}

// send's retry policy against a daemon that drops the connection, answers 409
// IDEMPOTENCY_IN_PROGRESS and 503, then 201: every attempt carries the same key and
// the same bytes, and waits the backoff or the Retry-After if longer. A 4xx is
// final at once; the wait budget bounds the retries.
func TestSendRetryPolicy(t *testing.T) {
	dir, err := os.MkdirTemp("", "sbr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var keys, bodies []string
	script := []func(w http.ResponseWriter){}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		keys, bodies = append(keys, r.Header.Get("Idempotency-Key")), append(bodies, string(b))
		step := script[min(len(keys), len(script))-1]
		mu.Unlock()
		step(w)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	answer := func(status int, retryAfter, body string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(status)
			io.WriteString(w, body)
		}
	}
	drop := func(w http.ResponseWriter) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	}
	req := client.SendRequest{To: client.Recipients{"did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"}, RelayURL: "http://127.0.0.1:9", Body: []byte("hi")}
	// sent holds the keys and bodies the last run sent (read under mu: the
	// handler's goroutine wrote them).
	var sentKeys, sentBodies []string
	run := func(p retryPolicy, steps ...func(http.ResponseWriter)) (*client.Message, error, []time.Duration) {
		mu.Lock()
		keys, bodies, script = nil, nil, steps
		mu.Unlock()
		var waits []time.Duration
		p.sleep = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
		c := client.New(sock)
		ms, err := p.send(context.Background(), c, req, "the-key")
		mu.Lock()
		sentKeys, sentBodies = slices.Clone(keys), slices.Clone(bodies)
		mu.Unlock()
		if len(ms) == 0 {
			return nil, err, waits
		}
		return &ms[0], err, waits
	}
	p := retryPolicy{attempts: 5, backoff: 100 * time.Millisecond, maxWait: 10 * time.Second}

	m, err, waits := run(p, drop,
		answer(409, "2", `{"code":"IDEMPOTENCY_IN_PROGRESS","message":"in flight"}`),
		answer(503, "1", `{"code":"OUTBOX_STORE_UNWRITABLE","message":"fsync","outcome":"unknown","messageId":"m1"}`),
		answer(201, "", `{"messageId":"m1","status":"queued"}`))
	if err != nil || m.MessageID != "m1" {
		t.Fatalf("send: %v %v", m, err)
	}
	if want := []time.Duration{100 * time.Millisecond, 2 * time.Second, time.Second}; !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	if len(sentKeys) != 4 || !slices.Equal(sentKeys, []string{"the-key", "the-key", "the-key", "the-key"}) ||
		slices.IndexFunc(sentBodies, func(b string) bool { return b != sentBodies[0] }) >= 0 {
		t.Fatalf("attempts sent keys %q and bodies %q", sentKeys, sentBodies)
	}

	// A refusal is final at once.
	_, err, waits = run(p, answer(400, "", `{"code":"BAD_REQUEST","message":"no"}`))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 400 || len(waits) != 0 || len(sentKeys) != 1 {
		t.Fatalf("400: %v, waits %v, %d attempts", err, waits, len(sentKeys))
	}

	// A 5xx whose outcome is known and that gives no Retry-After (a full disk) is
	// final at once: a retry would fail the same way.
	_, err, waits = run(p, answer(503, "", `{"code":"OUTBOX_STORE_UNWRITABLE","message":"the disk holding /x is full (ENOSPC: no space left on device)","hint":"free space"}`))
	if !errors.As(err, &ce) || ce.Status != 503 || len(waits) != 0 || len(sentKeys) != 1 {
		t.Fatalf("503 without Retry-After: %v, waits %v, %d attempts", err, waits, len(sentKeys))
	}

	// The wait budget ends the retries; a 503 without outcome is "not accepted".
	p.maxWait = 150 * time.Millisecond
	_, err, waits = run(p, answer(503, "1", `{"code":"OUTBOX_STORE_BUSY","message":"busy"}`))
	var is *incompleteSend
	if !errors.As(err, &is) || is.unknown || exitCode(err) != exitFailure || len(sentKeys) != 2 ||
		!slices.Equal(waits, []time.Duration{150 * time.Millisecond}) {
		t.Fatalf("budget: %v, waits %v, %d attempts", err, waits, len(sentKeys))
	}
	// A dropped connection leaves the outcome unknown: exit 4.
	p.attempts = 2
	_, err, _ = run(p, drop)
	if !errors.As(err, &is) || !is.unknown || exitCode(err) != exitUnknown {
		t.Fatalf("dropped: %v", err)
	}
}
