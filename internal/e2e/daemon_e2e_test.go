package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// The four commands, built once per test binary into binDir (removed by TestMain).
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// buildCommands builds every command (go build -o DIR/ ./cmd/...) once and returns
// the directory that holds them.
func buildCommands(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sbbin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		cmd := exec.Command(goTool(), "build", "-o", dir+string(filepath.Separator), "./cmd/...")
		cmd.Dir = filepath.Join("..", "..")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/...: %v\n%s", err, b)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// goTool is the go command of the toolchain running the tests, else the one on PATH.
func goTool() string {
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return "go"
}

func buildBinaries(t *testing.T) (sealbridged, relayBin string) {
	t.Helper()
	dir := buildCommands(t)
	return filepath.Join(dir, "sealbridged"), filepath.Join(dir, "sealbridge-relay")
}

// startRelayProcess starts sealbridge-relay on loopback in a fresh home and
// returns its URL.
func startRelayProcess(t *testing.T, bin string) string {
	t.Helper()
	return "http://" + startRelayAt(t, bin, t.TempDir()).addr
}

type daemonProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited; err is then set
	err  error
}

func startDaemonProcess(t *testing.T, bin, home string, c *client.Client) *daemonProc {
	t.Helper()
	cmd := exec.Command(bin, "--home", home, "--log-level", "warn", "--send-timeout", "2s", "--lease-for", "3s")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &daemonProc{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
	})
	deadline := time.Now().Add(60 * time.Second)
	for c.Ready(context.Background()) != nil {
		select {
		case <-p.done:
			t.Fatalf("daemon exited: %v", p.err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("daemon not ready")
		}
	}
	return p
}

// TestDaemonCrashIdempotentResend: 200 messages with
// Idempotency-Keys through the daemon's socket, a SIGKILL in the middle, a restart,
// the same 200 requests again: 200 distinct message ids, all relayed, each envelope
// held by the relay exactly once.
func TestDaemonCrashIdempotentResend(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	const n = 200
	sealbridged, relayBin := buildBinaries(t)
	relayURL := startRelayProcess(t, relayBin)
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
	req := func(i int) client.SendRequest {
		return client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: relayURL, Body: fmt.Appendf(nil, "message %d", i)}
	}
	key := func(i int) string { return fmt.Sprintf("e2e-key-%03d", i) }

	// Phase 1: send, and SIGKILL the daemon after about half were answered.
	p := startDaemonProcess(t, sealbridged, home, c)
	first := make([]string, n)
	var answered atomic.Int32
	killed := make(chan struct{})
	var killOnce sync.Once
	var wg sync.WaitGroup
	next := atomic.Int32{}
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				m, err := c.Send(ctx, req(i), key(i))
				cancel()
				if err == nil {
					first[i] = m.MessageID
					if answered.Add(1) == n/2 {
						killOnce.Do(func() {
							p.cmd.Process.Signal(syscall.SIGKILL)
							close(killed)
						})
					}
				}
			}
		})
	}
	wg.Wait()
	killOnce.Do(func() { p.cmd.Process.Signal(syscall.SIGKILL); close(killed) })
	<-p.done
	t.Logf("before the kill: %d of %d answered", answered.Load(), n)

	// A second daemon while the first runs is refused; checked after the restart.
	p2 := startDaemonProcess(t, sealbridged, home, c)
	out, err := exec.Command(sealbridged, "--home", home).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), fmt.Sprintf("already running (pid %d)", p2.cmd.Process.Pid)) {
		t.Errorf("second daemon: %v: %s", err, out)
	}

	// Phase 2: the same 200 requests with the same keys.
	ids := make([]string, n)
	for i := 0; i < n; i++ {
		deadline := time.Now().Add(60 * time.Second)
		for {
			m, err := c.Send(context.Background(), req(i), key(i))
			if err == nil {
				ids[i] = m.MessageID
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("resend %d: %v", i, err)
			}
			select { // 409 (a lease) or 503: retry shortly
			case <-time.After(20 * time.Millisecond):
			}
		}
		if first[i] != "" && first[i] != ids[i] {
			t.Fatalf("key %d answered %s before the crash and %s after", i, first[i], ids[i])
		}
	}
	distinct := map[string]bool{}
	for _, id := range ids {
		distinct[id] = true
	}
	if len(distinct) != n {
		t.Fatalf("%d distinct message ids, want %d", len(distinct), n)
	}

	// Every one relayed.
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range ids {
		for {
			m, err := c.Message(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if m.Status == "relayed" {
				break
			}
			if m.Status == "closed" || time.Now().After(deadline) {
				// All of it: what the message waits for, and its target's row.
				mj, _ := json.Marshal(m)
				targets, err := c.Targets(context.Background())
				tj, _ := json.Marshal(targets)
				t.Fatalf("message %s is %s (%s)\nmessage: %s\ntargets (%v): %s\nready: %v",
					id, m.Status, m.LastError, mj, err, tj, c.Ready(context.Background()))
			}
			<-time.After(20 * time.Millisecond)
		}
	}

	// The relay holds each envelope exactly once: the recipient's inbox has one
	// envelope per message id, 200 in all.
	rc := &relayproto.Client{BaseURL: relayURL}
	perMessage := map[string]int{}
	total, after := 0, ""
	for {
		page, err := rc.Fetch(context.Background(), peer, after, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Envelopes {
			env, err := envelope.Parse(e.Envelope)
			if err != nil {
				t.Fatal(err)
			}
			perMessage[env.MessageID()]++
			total++
		}
		after = page.Cursor
		if !page.More {
			break
		}
	}
	if total != n || len(perMessage) != n {
		t.Fatalf("relay inbox: %d envelopes for %d messages, want %d each", total, len(perMessage), n)
	}
	for _, id := range ids {
		if perMessage[id] != 1 {
			t.Fatalf("message %s is in the relay inbox %d times", id, perMessage[id])
		}
	}

	// SIGTERM drains and exits 0.
	p2.cmd.Process.Signal(syscall.SIGTERM)
	<-p2.done
	if p2.err != nil {
		t.Fatalf("daemon after SIGTERM: %v", p2.err)
	}
}
