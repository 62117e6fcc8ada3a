package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// largeBodySize is the body of TestLargeBodyThroughTheBinaries: 64 MiB, or
// $SEALBRIDGE_E2E_BODY bytes (`just large-body` runs it with 1 GiB).
func largeBodySize(t *testing.T) int64 {
	t.Helper()
	s := os.Getenv("SEALBRIDGE_E2E_BODY")
	if s == "" {
		return 64 << 20
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("SEALBRIDGE_E2E_BODY=%q is not a size in bytes", s)
	}
	return n
}

// writeRandomFile writes n pseudo-random bytes to path, streamed, and returns their
// SHA-256.
func writeRandomFile(t *testing.T, path string, n int64) string {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if _, err := io.CopyN(w, rand.NewChaCha8([32]byte{24}), n); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fileSHA256(t *testing.T, path string) (string, int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// procKB reads a "Name:   N kB" line of /proc/<pid>/status.
func procKB(t *testing.T, pid int, name string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status %s: %q", pid, name, l)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, name)
	return 0
}

// startRelayPID is startRelayProcess that also returns the relay's pid.
func startRelayPID(t *testing.T, bin string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--home", t.TempDir(), "--log-level", "warn")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				lines <- u
			}
		}
	}()
	select {
	case u := <-lines:
		return u, cmd.Process.Pid
	case <-time.After(60 * time.Second):
		t.Fatal("relay did not start")
	}
	return "", 0
}

// A large body (64 MiB, or $SEALBRIDGE_E2E_BODY bytes) from alice to bob through the
// real binaries — `sealbridge send --file`, sealbridged, sealbridge-relay, bob's
// sealbridged following its inbox, `sealbridge get --out` — arrives with an equal
// SHA-256, bob's inbox shows its size, alice's message ends delivered, and the
// resident memory of each daemon and of the relay (its peak, VmHWM in /proc, against
// its VmRSS before the send) grows by at most 64 MiB.
func TestLargeBodyThroughTheBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and moves a large body")
	}
	size := largeBodySize(t)
	bin := buildCommands(t)
	sealbridged, relayBin := filepath.Join(bin, "sealbridged"), filepath.Join(bin, "sealbridge-relay")
	relayURL, relayPID := startRelayPID(t, relayBin)
	a := newInboundNode(t, "alice", relayURL)
	b := newInboundNode(t, "bob", relayURL)
	pa, pb := a.start(t, sealbridged), b.start(t, sealbridged)
	pids := map[string]int{"alice's daemon": pa.cmd.Process.Pid, "bob's daemon": pb.cmd.Process.Pid, "the relay": relayPID}

	dir := t.TempDir()
	src := filepath.Join(dir, "body.bin")
	sum := writeRandomFile(t, src, size)
	before := map[string]int64{}
	for name, pid := range pids {
		before[name] = procKB(t, pid, "VmRSS")
	}

	start := time.Now()
	sent := runCLI(t, bin, "", nil, "sealbridge", "send", "--home", a.home, "--to", string(b.did), "--relay", relayURL, "--file", src)
	id := strings.TrimSpace(sent.stdout)
	if sent.code != 0 || id == "" {
		t.Fatalf("send: exit %d\n%s", sent.code, sent.stderr)
	}
	t.Logf("%d MiB accepted by alice's daemon in %s", size>>20, time.Since(start).Round(time.Millisecond))
	ctx := context.Background()
	deadline := time.Now().Add(2*time.Minute + time.Duration(size>>20)*time.Second)
	for {
		m, err := a.c.Message(ctx, id)
		if err == nil && m.Status == "delivered" {
			break
		}
		if err == nil && m.Status == "closed" {
			t.Fatalf("alice's message closed: %s", m.LastError)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered by the deadline: %+v %v", m, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the daemon, bounded above
	}
	t.Logf("delivered in %s", time.Since(start).Round(time.Millisecond))
	l, err := b.c.Inbox(ctx, 0, "")
	if err != nil || len(l.Messages) != 1 || l.Messages[0].MessageID != id || l.Messages[0].BodySize != size || !l.Messages[0].Blob {
		t.Fatalf("bob's inbox: %+v %v; want message %s of %d bytes", l, err, id, size)
	}
	out := filepath.Join(dir, "received.bin")
	got := runCLI(t, bin, "", nil, "sealbridge", "get", id, "--home", b.home, "--out", out)
	if got.code != 0 {
		t.Fatalf("get: exit %d\n%s", got.code, got.stderr)
	}
	if s, n := fileSHA256(t, out); s != sum || n != size {
		t.Fatalf("bob got %d bytes with SHA-256 %s; alice sent %d with %s", n, s, size, sum)
	}
	for name, pid := range pids {
		peak := procKB(t, pid, "VmHWM")
		grew := peak - before[name]
		t.Logf("%s: VmRSS %d MiB before, peak %d MiB (+%d MiB)", name, before[name]>>10, peak>>10, grew>>10)
		if grew > 64<<10 {
			t.Errorf("%s's resident memory grew by %d MiB while %d MiB moved; want at most 64 MiB", name, grew>>10, size>>20)
		}
	}
}
