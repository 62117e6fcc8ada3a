package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// A large body from a file whose first attempt's commit fails its directory fsync
// (503, outcome unknown) is streamed again from the file's start with the same key:
// the retry finds the message, and there is exactly one message, one operation and
// one envelope naming a blob.
func TestSendLargeFileRetriesAnUnknownOutcome(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	var fail atomic.Bool
	d := startFaultyDaemon(t, home, "alice", &fail)
	waits := noSleep(t)
	sendRetries.sleep = func(_ context.Context, w time.Duration) error {
		fail.Store(false)
		*waits = append(*waits, w)
		return nil
	}
	body := writeTemp(t, "big", randomBytes(5, 500<<10))
	fail.Store(true)
	code, out, errs := sb(t, "send", "--home", home, "--identity", "alice", "--to", bob, "--relay", "http://127.0.0.1:9", "--file", body)
	if code != exitOK {
		t.Fatalf("send: %d %s", code, errs)
	}
	ids := storedMessages(t, d)
	if len(ids) != 1 || strings.TrimSpace(out) != ids[0] || len(*waits) != 1 {
		t.Fatalf("send printed %q after %d retries; messages stored: %v", out, len(*waits), ids)
	}
	if ops, err := d.Store().List(record.KindOperations); err != nil || len(ops) != 1 || ops[0] != ids[0] {
		t.Fatalf("operations %v %v, want the message's", ops, err)
	}
	if _, ok := blobOfMessage(t, d, ids[0]); !ok {
		t.Fatal("the message's envelope names no blob")
	}
}

// A large body from a pipe cannot be read again: when its one attempt's outcome is
// unknown, send exits 4 at once with the key and the command that finishes it; that
// command, given the same body on its standard input, answers the message the first
// attempt made, and there is exactly one.
func TestSendLargePipeUnknownOutcome(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	var fail atomic.Bool
	d := startFaultyDaemon(t, home, "alice", &fail)
	waits := noSleep(t)
	t.Cleanup(func() { stdin = os.Stdin })
	body := randomBytes(6, 400<<10)

	fail.Store(true)
	stdin = bytes.NewReader(body)
	code, out, errs := sb(t, "send", "--home", home, "--identity", "alice", "--to", bob, "--relay", "http://127.0.0.1:9")
	if code != exitUnknown || out != "" || len(*waits) != 1 {
		t.Fatalf("send: exit %d (want %d) after %d waits\nstdout %q\nstderr %s", code, exitUnknown, len(*waits), out, errs)
	}
	m := regexp.MustCompile(`after 1 attempts with Idempotency-Key ([0-9a-f-]{36}); the message may have been accepted as message ([0-9a-f-]{36}):`).FindStringSubmatch(errs)
	_, rest, ok := strings.Cut(errs, "sealbridge: hint: finish it without sending it twice by piping the same body to: ")
	cmdline, _, ok2 := strings.Cut(rest, " (another body is refused with IDEMPOTENCY_KEY_REUSED)\n")
	if m == nil || !ok || !ok2 || !strings.Contains(cmdline, " --idempotency-key "+m[1]) {
		t.Fatalf("stderr names no key, message and command:\n%s", errs)
	}
	fail.Store(false)
	stdin = bytes.NewReader(body)
	code, out, errs = sb(t, strings.Fields(cmdline)[1:]...)
	if code != exitOK || strings.TrimSpace(out) != m[2] {
		t.Fatalf("the printed command: exit %d, printed %q (want %s)\n%s", code, out, m[2], errs)
	}
	if ids := storedMessages(t, d); len(ids) != 1 {
		t.Fatalf("messages: %v, want one", ids)
	}
}

// send's retries of a large body from a file stream it again from the start of the
// body (not of the file: here it starts 1000 bytes in, as standard input redirected
// from a file read that far): after a connection dropped mid-body, and a 409
// IDEMPOTENCY_IN_PROGRESS, the attempt that is answered carries the whole body,
// every attempt the same key; a body from a pipe is sent once.
func TestSendLargeBodyRetryRewinds(t *testing.T) {
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
	var keys []string
	var bodies [][]byte
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := len(keys)
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		switch n {
		case 0: // half the body, then the connection drops
			b := make([]byte, 200<<10)
			io.ReadFull(r.Body, b)
			c, _, _ := http.NewResponseController(w).Hijack()
			c.Close()
			return
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"code":"IDEMPOTENCY_IN_PROGRESS","message":"in flight"}`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"messageId":"m1","status":"queued"}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	content := randomBytes(7, 1000+600<<10)
	f, err := os.Open(writeTemp(t, "big", content))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(1000, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	saved := stdin
	t.Cleanup(func() { stdin = saved })
	stdin = f
	body, err := openBody("-")
	if err != nil || !body.large() || body.size != 600<<10 {
		t.Fatalf("openBody: large %v, size %d, %v", body.large(), body.size, err)
	}
	p := retryPolicy{attempts: 5, backoff: time.Millisecond, maxWait: time.Second, sleep: func(context.Context, time.Duration) error { return nil }}
	req := client.SendStreamRequest{To: "did:key:z6Mk", RelayURL: "http://127.0.0.1:9", Key: "the-key"}
	ms, err := p.stream(context.Background(), client.New(sock), req, body)
	if err != nil || len(ms) != 1 || ms[0].MessageID != "m1" {
		t.Fatalf("stream: %v %v", ms, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 3 || keys[0] != "the-key" || keys[1] != "the-key" || keys[2] != "the-key" {
		t.Fatalf("attempts with keys %q, want 3 with the-key", keys)
	}
	if len(bodies) != 1 || !bytes.Equal(bodies[0], content[1000:]) {
		t.Fatalf("the answered attempt carried %d bytes, want the %d of the body", len(bodies[0]), len(content)-1000)
	}

	keys = nil
	mu.Unlock()
	stdin = bytes.NewReader(content)
	body, err = openBody("")
	if err != nil || !body.large() || body.size != -1 {
		t.Fatalf("openBody of a pipe: large %v, size %d, %v", body.large(), body.size, err)
	}
	_, err = p.stream(context.Background(), client.New(sock), req, body)
	mu.Lock()
	var is *incompleteSend
	if !errors.As(err, &is) || !is.unknown || is.attempts != 1 || len(keys) != 1 {
		t.Fatalf("a pipe's dropped attempt: %v after %d attempts; want one attempt, outcome unknown", err, len(keys))
	}
}
