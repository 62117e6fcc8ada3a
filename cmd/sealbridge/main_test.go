package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

// shortHome returns a fresh data root with a short path: the daemon's socket
// lives under it and unix socket paths are limited to 107 bytes.
func shortHome(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// sb runs the command line in process and returns its exit code and output.
func sb(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runContext(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrorsAndExitCodes(t *testing.T) {
	home := shortHome(t)
	did := "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // substring
		stderr string // substring
	}{
		{"no command", nil, exitUsage, "", "usage: sealbridge COMMAND"},
		{"unknown command", []string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"`},
		{"help", []string{"--help"}, exitOK, "Exit status:", ""},
		{"command help", []string{"send", "-h"}, exitOK, "usage: sealbridge", ""},
		{"version", []string{"--version"}, exitOK, "sealbridge ", ""},
		{"unknown flag", []string{"whoami", "--nope"}, exitUsage, "", "whoami: unknown flag: --nope"},
		{"init argument", []string{"init", "--home", home, "extra"}, exitUsage, "", `unexpected argument "extra"`},
		{"bad identity name", []string{"init", "--home", home, "--identity", "../x"}, exitUsage, "", "is not an identity name"},
		{"send no --to", []string{"send", "--relay", "http://127.0.0.1:1"}, exitUsage, "", "--to DID is required"},
		{"send no --relay", []string{"send", "--to", did}, exitUsage, "", "--relay URL is required"},
		{"send bad DID", []string{"send", "--to", "did:key:nope", "--relay", "http://127.0.0.1:1"}, exitUsage, "", "not a valid did:key"},
		{"send bad URL", []string{"send", "--to", did, "--relay", "ftp://x"}, exitUsage, "", "relay URL: not an http or https URL"},
		{"send negative deadline", []string{"send", "--to", did, "--relay", "http://x", "--deadline", "-1h"}, exitUsage, "", "--deadline must be in the future"},
		{"send past deadline", []string{"send", "--to", did, "--relay", "http://x", "--deadline", "2001-01-01T00:00:00Z"}, exitUsage, "", "--deadline must be in the future"},
		{"send bad deadline", []string{"send", "--to", did, "--relay", "http://x", "--deadline", "soon"}, exitUsage, "", "neither a duration"},
		{"status no id", []string{"status", "--home", home}, exitUsage, "", "exactly one message ID"},
		{"status two ids", []string{"status", "a", "b"}, exitUsage, "", "exactly one message ID"},
		{"ls negative limit", []string{"ls", "--limit", "-1"}, exitUsage, "", "--limit must not be negative"},
		{"demo zero messages", []string{"demo", "--messages", "0"}, exitUsage, "", "--messages must be between"},
		{"relay bad level", []string{"relay", "--log-level", "loud"}, exitUsage, "", "--log-level"},
		{"whoami without identity", []string{"whoami", "--home", home}, exitFailure, "", "hint: create it with: sealbridge init --home"},
		{"status without identity", []string{"status", "--home", home, "0190b6a4-0000-7000-8000-000000000000"}, exitFailure, "", "hint: create it with: sealbridge init"},
		{"status not an id", []string{"status", "--home", home, "not-a-uuid"}, exitUsage, "", `status: "not-a-uuid" is not a message id`},
		{"ls bad status", []string{"ls", "--home", home, "--status", "bogus"}, exitUsage, "", `ls: --status "bogus" is not a status; give one of queued, relayed, delivered, closed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := sb(t, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errs, tc.stderr) {
				t.Fatalf("exit %d (want %d)\nstdout: %s\nstderr: %s", code, tc.code, out, errs)
			}
			if code != exitOK && !strings.HasPrefix(errs, "sealbridge: error: ") && tc.args != nil {
				t.Fatalf("stderr does not start with 'sealbridge: error:': %q", errs)
			}
		})
	}
}

func TestExitCodeSwitch(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{errors.New("boom"), 1},
		{usageErrorf("bad"), 2},
		{withHint(usageErrorf("bad"), "h"), 2},
		{&noDaemonError{did: "did:key:z", home: "/h", name: "n"}, 3},
		{withHint(&noDaemonError{}, "h"), 3},
		{&daemon.OptionError{Option: "--inbox-relay", Err: errors.New("bad")}, 2},
	} {
		if got := exitCode(tc.err); got != tc.code {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

func TestInitWhoami(t *testing.T) {
	home := shortHome(t)
	code, out, errs := sb(t, "init", "--home", home, "--identity", "alice")
	if code != 0 {
		t.Fatalf("init: %d %s", code, errs)
	}
	did := strings.TrimSpace(out)
	if _, err := identity.ParseDID(did); err != nil {
		t.Fatalf("init printed %q: %v", out, err)
	}
	if fi, err := os.Stat(daemon.IdentityPath(home, "alice")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	code, out, errs = sb(t, "whoami", "--home", home, "--identity", "alice")
	if code != 0 || strings.TrimSpace(out) != did {
		t.Fatalf("whoami: %d %q %s (want %s)", code, out, errs, did)
	}
	// Flags after positional arguments are parsed too; SEALBRIDGE_HOME is the default home.
	t.Setenv("SEALBRIDGE_HOME", home)
	code, out, _ = sb(t, "whoami", "--identity", "alice")
	if code != 0 || strings.TrimSpace(out) != did {
		t.Fatalf("whoami via SEALBRIDGE_HOME: %d %q", code, out)
	}
	code, _, errs = sb(t, "init", "--home", home, "--identity", "alice")
	if code != exitFailure || !strings.Contains(errs, "already exists") || !strings.Contains(errs, "hint: print its DID with: sealbridge whoami") {
		t.Fatalf("second init: %d %s", code, errs)
	}
	// The default identity is separate.
	code, out2, _ := sb(t, "init", "--home", home)
	if code != 0 || strings.TrimSpace(out2) == did {
		t.Fatalf("init default: %d %q", code, out2)
	}
}

func TestNoDaemonRunning(t *testing.T) {
	home := shortHome(t)
	_, out, _ := sb(t, "init", "--home", home, "--identity", "alice")
	did := strings.TrimSpace(out)
	want := "sealbridge: error: no daemon is running for " + did + "\nsealbridge: hint: start one with: sealbridged --home " + home + " --identity alice\n"
	stdin = strings.NewReader("hello")
	t.Cleanup(func() { stdin = os.Stdin })
	for _, args := range [][]string{
		{"status", "0190b6a4-0000-7000-8000-000000000000"},
		{"ls", "--status", "queued"},
		{"send", "--to", did, "--relay", "http://127.0.0.1:1"},
	} {
		args = append(args, "--home", home, "--identity", "alice")
		code, out, errs := sb(t, args...)
		if code != exitNoDaemon || errs != want || out != "" {
			t.Fatalf("%v: exit %d\nstdout %q\nstderr %q\nwant   %q", args, code, out, errs, want)
		}
	}
	// A stale socket (its daemon crashed) reads the same.
	sock := client.SocketPath(home, did)
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := sb(t, "ls", "--home", home, "--identity", "alice"); code != exitNoDaemon {
		t.Fatalf("stale socket: %d %s", code, errs)
	}
}

// startDaemon runs identity name's daemon in process until the test ends.
func startDaemon(t *testing.T, home, name string) *daemon.Daemon {
	t.Helper()
	return runDaemon(t, daemon.Options{Home: home, Identity: name})
}

// runDaemon runs a daemon with opts in process until the test ends, once it is ready.
func runDaemon(t *testing.T, opts daemon.Options) *daemon.Daemon {
	t.Helper()
	d, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("daemon: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("daemon did not stop")
		}
	})
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("daemon stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("daemon not ready")
	}
	return d
}

// startRelay serves a reference relay on httptest until the test ends.
func startRelay(t *testing.T) (*relay.Relay, string) {
	t.Helper()
	id, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Options{Identity: id, Home: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(func() { srv.Close(); r.Close() })
	return r, srv.URL
}

func TestSendStatusLs(t *testing.T) {
	home := shortHome(t)
	_, out, _ := sb(t, "init", "--home", home, "--identity", "alice")
	_ = strings.TrimSpace(out)
	_, out, _ = sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	rel, relayURL := startRelay(t)
	startDaemon(t, home, "alice")
	as := []string{"--home", home, "--identity", "alice"}

	// Body from standard input.
	stdin = strings.NewReader("hello bob")
	t.Cleanup(func() { stdin = os.Stdin })
	code, out, errs := sb(t, append([]string{"send", "--to", bob, "--relay", relayURL, "--idempotency-key", "k1"}, as...)...)
	if code != 0 {
		t.Fatalf("send: %d %s", code, errs)
	}
	id := strings.TrimSpace(out)
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("send printed %q", out)
	}
	// The same request with the same key: the same message.
	stdin = strings.NewReader("hello bob")
	if code, out, errs := sb(t, append([]string{"send", "--to", bob, "--relay", relayURL, "--idempotency-key", "k1"}, as...)...); code != 0 || strings.TrimSpace(out) != id {
		t.Fatalf("resend: %d %q %s (want %s)", code, out, errs, id)
	}
	// The same key with another body: refused, with a hint.
	stdin = strings.NewReader("another body")
	if code, _, errs := sb(t, append([]string{"send", "--to", bob, "--relay", relayURL, "--idempotency-key", "k1"}, as...)...); code != exitFailure ||
		!strings.Contains(errs, "IDEMPOTENCY_KEY_REUSED") || !strings.Contains(errs, "hint: ") {
		t.Fatalf("key reuse: %d %s", code, errs)
	}
	// Body from a file.
	f := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(f, []byte("from a file"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = sb(t, append([]string{"send", "--to", bob, "--relay", relayURL, "--file", f, "--deadline", "1h"}, as...)...)
	if code != 0 {
		t.Fatalf("send --file: %d %s", code, errs)
	}
	id2 := strings.TrimSpace(out)

	// status --json until relayed (flags after the ID).
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for _, mid := range []string{id, id2} {
		for {
			code, out, errs := sb(t, append([]string{"status", mid, "--json"}, as...)...)
			if code != 0 {
				t.Fatalf("status: %d %s", code, errs)
			}
			var m client.Message
			if err := json.Unmarshal([]byte(out), &m); err != nil {
				t.Fatalf("status --json: %v\n%s", err, out)
			}
			if m.MessageID != mid || m.To != bob || m.RelayURL != relayURL {
				t.Fatalf("status: %+v", m)
			}
			if m.Status == "relayed" {
				break
			}
			select {
			case <-tick.C:
			case <-deadline.C:
				t.Fatalf("message %s not relayed: %+v", mid, m)
			}
		}
	}
	if got := rel.Stats().Accepted; got != 2 {
		t.Fatalf("relay accepted %d envelopes, want 2", got)
	}
	code, out, _ = sb(t, append([]string{"status", id}, as...)...)
	if code != 0 || field(out, "status") != "relayed" || field(out, "kind") != "message" || field(out, "to") != bob || field(out, "attempts") != "1" {
		t.Fatalf("status text: %d\n%s", code, out)
	}
	code, out, _ = sb(t, append([]string{"ls"}, as...)...)
	if code != 0 || !strings.HasPrefix(out, "MESSAGE") || !strings.Contains(out, id) || !strings.Contains(out, id2) {
		t.Fatalf("ls: %d\n%s", code, out)
	}
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if i == 0 && (len(f) < 3 || f[1] != "KIND" || f[2] != "STATUS") || i > 0 && (len(f) < 3 || f[1] != "message" || f[2] != "relayed") {
			t.Fatalf("ls line %d: %q; want the kind column before the status", i, line)
		}
	}
	code, out, errs = sb(t, append([]string{"ls", "--json", "--status", "relayed", "--limit", "1"}, as...)...)
	if l := jsonLines(t, out); code != 0 || len(l) != 1 || !strings.Contains(errs, "more: ") {
		t.Fatalf("ls --json --limit 1: %d %v\n%s", code, errs, out)
	}
	code, out, _ = sb(t, append([]string{"ls", "--json", "--status", "queued"}, as...)...)
	if code != 0 || out != "" {
		t.Fatalf("ls --status queued: %d\n%s", code, out)
	}
	// An unknown id: exit 1 with a hint.
	code, _, errs = sb(t, append([]string{"status", "00000000-0000-4000-8000-000000000000"}, as...)...)
	if code != exitFailure || !strings.Contains(errs, "hint: list sent messages with: sealbridge ls") {
		t.Fatalf("unknown id: %d %s", code, errs)
	}
}

func TestRelayCommand(t *testing.T) {
	home := shortHome(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := runContext(ctx, []string{"relay", "--listen", "127.0.0.1:0", "--home", home, "--log-level", "warn"}, pw, io.Discard)
		pw.Close()
		done <- code
	}()
	sc := bufio.NewScanner(pr)
	var lines []string
	for len(lines) < 2 && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	go io.Copy(io.Discard, pr)
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "listening http://127.0.0.1:") || !strings.HasPrefix(lines[1], "relay did:key:") {
		t.Fatalf("relay printed %q", lines)
	}
	url := strings.TrimPrefix(lines[0], "listening ")
	resp, err := http.Post(url+"/v1/envelopes", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 || resp.StatusCode > 499 {
		t.Fatalf("a bad envelope: %d", resp.StatusCode)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("relay exited %d", code)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("relay did not stop")
	}
	// The relay's key is kept: the same DID next time.
	if _, err := identity.LoadKeyFile(filepath.Join(home, relay.DefaultKeyFile)); err != nil {
		t.Fatal(err)
	}
}

func TestDemo(t *testing.T) {
	code, out, errs := sb(t, "demo", "--messages", "10")
	if code != 0 || !strings.Contains(out, "\nrelayed 10/10\n") || !strings.Contains(out, "\ndelivered 10/10\n") || !strings.Contains(out, "\nfsck: clean\n") {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	// The temp home is removed without --keep.
	for _, line := range strings.Split(out, "\n") {
		if dir, ok := strings.CutPrefix(line, "home     "); ok {
			dir, _, _ = strings.Cut(dir, " ")
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("demo home %s left behind: %v", dir, err)
			}
		}
	}
}

func TestDemoKeep(t *testing.T) {
	code, out, errs := sb(t, "demo", "--messages", "3", "--keep")
	var kept string
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "kept "); ok {
			kept, _, _ = strings.Cut(rest, " ")
		}
	}
	if kept != "" {
		t.Cleanup(func() { os.RemoveAll(kept) })
	}
	if code != 0 || kept == "" {
		t.Fatalf("demo --keep: %d\n%s\n%s", code, out, errs)
	}
	if _, err := os.Stat(filepath.Join(kept, "logs", "alice.log")); err != nil {
		t.Fatal(err)
	}
}

// TestBinaryDemo builds the command and runs its demo as a user would.
func TestBinaryDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		if goTool, err = exec.LookPath("go"); err != nil {
			t.Skip("no go tool")
		}
	}
	bin := filepath.Join(t.TempDir(), "sealbridge")
	build := exec.Command(goTool, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "sealbridge ") {
		t.Fatalf("--version: %v %q", err, out)
	}
	cmd := exec.Command(bin, "demo", "--messages", "5")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sealbridge demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "\nrelayed 5/5\n") || !strings.Contains(stdout.String(), "\nfsck: clean\n") {
		t.Fatalf("sealbridge demo output:\n%s", stdout.String())
	}
}

// field returns the value of a "key  value" line of status's output.
func field(out, key string) string {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, key+" "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// A message whose relay refuses connections: status and ls show its last error and
// its next attempt.
func TestStatusShowsLastErrorAndNextAttempt(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	startDaemon(t, home, "alice")
	as := []string{"--home", home, "--identity", "alice"}
	// A relay that is gone: connections to its port are refused.
	srv := httptest.NewServer(http.NotFoundHandler())
	dead := srv.URL
	srv.Close()
	stdin = strings.NewReader("hello")
	t.Cleanup(func() { stdin = os.Stdin })
	code, out, errs := sb(t, append([]string{"send", "--to", bob, "--relay", dead}, as...)...)
	if code != 0 {
		t.Fatalf("send: %d %s", code, errs)
	}
	id := strings.TrimSpace(out)
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var m client.Message
	for m.Attempts == 0 {
		code, out, errs := sb(t, append([]string{"status", id, "--json"}, as...)...)
		if code != 0 || json.Unmarshal([]byte(out), &m) != nil {
			t.Fatalf("status --json: %d %s %s", code, out, errs)
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("no attempt: %+v", m)
		}
	}
	if m.Status != "queued" || !strings.Contains(m.LastError, "connection refused") || !m.NextAttemptAt.After(time.Now()) {
		t.Fatalf("status --json: %+v", m)
	}
	code, out, _ = sb(t, append([]string{"status", id}, as...)...)
	if code != 0 || !strings.Contains(field(out, "last error"), "connection refused") ||
		!strings.Contains(field(out, "next attempt"), "(in ") || field(out, "attempts") != "1" {
		t.Fatalf("status text: %d\n%s", code, out)
	}
	code, out, _ = sb(t, append([]string{"ls"}, as...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "NEXT ATTEMPT") || !strings.Contains(lines[0], "LAST ERROR") ||
		!strings.Contains(lines[1], id) || !strings.Contains(lines[1], "connection refused") || !strings.Contains(lines[1], "(in ") {
		t.Fatalf("ls: %d\n%s", code, out)
	}
}
