package e2e

import (
	"bufio"
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
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/client"
)

// longHomeName is the last element of the stranger's $HOME: with the temp dir above
// it the home is well over 60 characters, as /home/firstname.lastname-… homes are.
const longHomeName = "firstname.lastname-with-a-rather-long-home-directory-name"

// stranger is a user at a shell: the four installed binaries, a real-length $HOME,
// no --home and no SEALBRIDGE_HOME or XDG_STATE_HOME (so the default data root
// ~/.local/state/sealbridge), and the $XDG_RUNTIME_DIR a systemd login provides.
type stranger struct {
	t       *testing.T
	bin     string // the directory the binaries were built into
	home    string
	runtime string
	env     []string
}

func newStranger(t *testing.T, bin string) *stranger {
	t.Helper()
	base, err := os.MkdirTemp("", "sbu-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	home := filepath.Join(base, longHomeName)
	if len(home) < 60 {
		t.Fatalf("HOME %s is shorter than 60 characters", home)
	}
	if err := os.Mkdir(home, 0o755); err != nil { // a home as useradd makes it
		t.Fatal(err)
	}
	rt, err := os.MkdirTemp("", "sbrt-") // 0700, as pam_systemd makes /run/user/UID
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt) })
	if len(filepath.Join(rt, dataroot.RuntimeSubdir, "0123456789abcdef.sock")) > dataroot.MaxSocketPath {
		t.Skipf("the temp dir %s is too long to hold a runtime directory", os.TempDir())
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "NOTIFY_SOCKET" || strings.HasPrefix(k, "XDG_") || strings.HasPrefix(k, "SEALBRIDGE_") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+home, "XDG_RUNTIME_DIR="+rt)
	return &stranger{t: t, bin: bin, home: home, runtime: rt, env: env}
}

// command returns the binary name run with args in the stranger's environment.
func (u *stranger) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(u.bin, name), args...)
	cmd.Env = u.env
	cmd.Dir = u.home
	return cmd
}

// run runs a command to completion with stdin as its standard input and returns its
// standard output; anything but exit 0 fails the test.
func (u *stranger) run(stdin string, name string, args ...string) string {
	u.t.Helper()
	cmd := u.command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		u.t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// poll runs check every 20 ms until it reports done, for at most a minute.
func poll(t *testing.T, what string, check func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		done, state := check()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60s; last: %s", what, state)
		}
		<-tick.C
	}
}

// plainClient is an HTTP client of a unix socket dialled by its plain path, as curl
// --unix-socket and Python's http.client over socket.AF_UNIX do.
func plainClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}, Timeout: 30 * time.Second}
}

// startStrangerDaemon starts `sealbridged --identity name --inbox-relay relayURL`
// and waits until GET /readyz, dialled at the plain socket path, answers 200.
func (u *stranger) startStrangerDaemon(name, relayURL, sock string) *daemonProc {
	t := u.t
	t.Helper()
	cmd := u.command("sealbridged", "--identity", name, "--inbox-relay", relayURL)
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &daemonProc{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
		if t.Failed() {
			t.Logf("sealbridged --identity %s logged:\n%s", name, logs.String())
		}
	})
	hc := plainClient(sock)
	defer hc.CloseIdleConnections()
	poll(t, "sealbridged --identity "+name+" ready at "+sock, func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("sealbridged --identity %s exited: %v\n%s", name, p.err, logs.String())
		default:
		}
		resp, err := hc.Get("http://sealbridged/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return p
}

// stop sends SIGTERM and expects exit status 0 within a minute.
func (p *daemonProc) stop(t *testing.T, what string) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not exit within 60s of SIGTERM", what)
	}
	if p.err != nil {
		t.Fatalf("%s after SIGTERM: %v (want exit 0)", what, p.err)
	}
}

// lockedBuffer collects a process's output written from its copying goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestStrangerFirstUse does what a new user does after installing the binaries, with
// no --home anywhere: init two identities, start a relay and both daemons, send from
// alice to bob, follow the message with status, ls, bob's inbox and watch, reach the
// daemon's socket the way curl and Python do, stop the daemons and fsck both stores.
// Every step must exit 0.
func TestStrangerFirstUse(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	start := time.Now()
	bin := buildCommands(t)
	u := newStranger(t, bin)
	t.Logf("HOME=%s (%d characters), XDG_RUNTIME_DIR=%s; binaries ready after %s", u.home, len(u.home), u.runtime, time.Since(start).Round(time.Millisecond))
	root := filepath.Join(u.home, ".local", "state", "sealbridge")

	// init, without --home: the keys land in the default data root.
	dids := map[string]string{}
	for _, name := range []string{"alice", "bob"} {
		did := strings.TrimSpace(u.run("", "sealbridge", "init", "--identity", name))
		if !strings.HasPrefix(did, "did:key:z") {
			t.Fatalf("init --identity %s printed %q", name, did)
		}
		if fi, err := os.Stat(filepath.Join(root, dataroot.IdentitiesDir, name+".key")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s's key in the default data root: %v %v", name, fi, err)
		}
		if got := strings.TrimSpace(u.run("", "sealbridge", "whoami", "--identity", name)); got != did {
			t.Fatalf("whoami --identity %s: %q, init printed %s", name, got, did)
		}
		dids[name] = did
	}
	alice, bob := dids["alice"], dids["bob"]

	// The socket path, as a script gets it (S=$(sealbridge whoami --socket)): under
	// $XDG_RUNTIME_DIR, short whatever the home.
	socks := map[string]string{}
	for _, name := range []string{"alice", "bob"} {
		sock := strings.TrimSuffix(u.run("", "sealbridge", "whoami", "--identity", name, "--socket"), "\n")
		want := filepath.Join(u.runtime, dataroot.RuntimeSubdir, dataroot.ShortID(dids[name])+".sock")
		if sock != want || len(sock) > dataroot.MaxSocketPath {
			t.Fatalf("whoami --identity %s --socket printed %q; want %s (at most %d bytes)", name, sock, want, dataroot.MaxSocketPath)
		}
		socks[name] = sock
	}

	// A relay: a separate service with its own data directory (--home is required
	// there; it is not the user's data root).
	relayURL := startRelayProcess(t, filepath.Join(bin, "sealbridge-relay"))

	pa := u.startStrangerDaemon("alice", relayURL, socks["alice"])
	pb := u.startStrangerDaemon("bob", relayURL, socks["bob"])

	// GET /livez by hand over a plain net.Dial of the printed path.
	livez(t, socks["alice"])

	// send: the body on standard input, the message id on standard output.
	const body = "hello bob, from alice"
	id := strings.TrimSpace(u.run(body, "sealbridge", "send", "--identity", "alice", "--to", bob, "--relay", relayURL))
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`).MatchString(id) {
		t.Fatalf("send printed %q, not a message id", id)
	}

	// status until the relay has it, and until bob's daemon confirmed delivery.
	status := func() client.Message {
		var m client.Message
		out := u.run("", "sealbridge", "status", "--identity", "alice", id, "--json")
		if err := json.Unmarshal([]byte(out), &m); err != nil || m.MessageID != id || m.To != bob {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		return m
	}
	poll(t, "status shows the message relayed", func() (bool, string) {
		m := status()
		return m.Status == "relayed" || m.Status == "delivered", fmt.Sprintf("%+v", m)
	})
	if out := u.run("", "sealbridge", "status", "--identity", "alice", id); !strings.Contains(out, bob) {
		t.Fatalf("status (text) does not name the recipient:\n%s", out)
	}

	// ls: the message, listed with the status that status showed (or a later one);
	// --json writes one object per line.
	var lm client.Message
	if out := u.run("", "sealbridge", "ls", "--identity", "alice", "--json"); strings.Count(out, "\n") != 1 || json.Unmarshal([]byte(out), &lm) != nil ||
		lm.MessageID != id || (lm.Status != "relayed" && lm.Status != "delivered") {
		t.Fatalf("ls --json:\n%s", out)
	}
	if out := u.run("", "sealbridge", "ls", "--identity", "alice"); !strings.HasPrefix(out, "MESSAGE") || !strings.Contains(out, id) {
		t.Fatalf("ls:\n%s", out)
	}

	// bob's inbox, until the message arrives from the relay.
	poll(t, "bob's inbox holds the message", func() (bool, string) {
		var in []client.InboxMessage
		out := u.run("", "sealbridge", "inbox", "--identity", "bob", "--json")
		for line := range strings.Lines(out) { // JSON lines: one message a line
			var m client.InboxMessage
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("inbox --json: %v\n%s", err, out)
			}
			in = append(in, m)
		}
		for _, m := range in {
			if m.MessageID == id {
				if m.From != alice || string(m.Body) != body {
					t.Fatalf("bob's inbox: %s from %s body %q; want from %s body %q", id, m.From, m.Body, alice, body)
				}
				return true, ""
			}
		}
		return false, out
	})
	if out := u.run("", "sealbridge", "inbox", "--identity", "bob"); !strings.Contains(out, id) || !strings.Contains(out, alice) {
		t.Fatalf("inbox:\n%s", out)
	}
	poll(t, "status shows the message delivered", func() (bool, string) {
		m := status()
		return m.Status == "delivered", fmt.Sprintf("%+v", m)
	})
	if out := u.run("", "sealbridge", "ls", "--identity", "alice", "--status", "delivered"); !strings.Contains(out, id) {
		t.Fatalf("ls --status delivered:\n%s", out)
	}

	// watch follows until interrupted: its first line is the reset with the size of
	// the snapshot (the one sent message); Ctrl-C ends it with exit 0.
	watchFirstLine(t, u)

	// Stop both daemons: SIGTERM, exit 0.
	pa.stop(t, "sealbridged --identity alice")
	pb.stop(t, "sealbridged --identity bob")

	// fsck of both stores at the default data root, named as a user names them:
	// by the identity's name, and once by its DID.
	for _, name := range []string{"alice", "bob"} {
		out := u.run("", "sealbridge-fsck", "--identity", name)
		t.Logf("sealbridge-fsck --identity %s:\n%s", name, out)
	}
	u.run("", "sealbridge-fsck", "--identity", dids["alice"])
	t.Logf("the stranger's first use took %s", time.Since(start).Round(time.Millisecond))
}

// livez asks GET /livez over a plain net.Dial("unix", path) with a hand-written
// request, and expects 200.
func livez(t *testing.T, path string) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("net.Dial(\"unix\", %q): %v", path, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: sealbridged\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET /livez over %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /livez over %s: %s %s", path, resp.Status, b)
	}
}

// watchFirstLine runs `sealbridge watch --identity alice --json`, reads its first
// line, interrupts it and expects exit 0.
func watchFirstLine(t *testing.T, u *stranger) {
	t.Helper()
	cmd := u.command("sealbridge", "watch", "--identity", "alice", "--json")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, stdout) // until the process closes it
		exited <- cmd.Wait()
	}()
	var first string
	select {
	case first = <-lines:
	case err := <-exited:
		t.Fatalf("watch exited before printing a line: %v\n%s", err, stderr.String())
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("watch printed nothing within 60s\n%s", stderr.String())
	}
	var reset struct {
		Reset            bool `json:"reset"`
		SnapshotMessages int  `json:"snapshotMessages"`
	}
	if err := json.Unmarshal([]byte(first), &reset); err != nil || !reset.Reset || reset.SnapshotMessages != 1 {
		cmd.Process.Kill()
		t.Fatalf("watch's first line %q: want a reset with a snapshot of 1 message (%v)", first, err)
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("watch after Ctrl-C: %v (want exit 0)\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("watch did not exit within 60s of SIGINT")
	}
}
