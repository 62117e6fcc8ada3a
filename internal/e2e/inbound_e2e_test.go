package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// inboundNode is one daemon identity of the inbound test: its home, DID, store
// directory, API client and the flags its daemon runs with.
type inboundNode struct {
	name     string
	home     string
	did      identity.DID
	storeDir string
	c        *client.Client
	args     []string
}

func newInboundNode(t *testing.T, name, relayURL string) *inboundNode {
	t.Helper()
	home := t.TempDir()
	id, err := daemon.InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	root, err := dataroot.Resolve(home)
	if err != nil {
		t.Fatal(err)
	}
	return &inboundNode{
		name: name, home: home, did: id.DID(),
		storeDir: dataroot.StoreDir(root, string(id.DID())),
		c:        client.New(client.SocketPath(root, string(id.DID()))),
		args: []string{"--home", home, "--log-level", "warn", "--send-timeout", "2s", "--lease-for", "3s",
			"--inbox-relay", relayURL, "--poll-every", "50ms"},
	}
}

// start starts the node's daemon and waits until it is ready.
func (n *inboundNode) start(t *testing.T, bin string) *daemonProc {
	t.Helper()
	cmd := exec.Command(bin, n.args...)
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
	ready := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return n.c.Ready(ctx)
	}
	for ready() != nil {
		select {
		case <-p.done:
			t.Fatalf("daemon %s exited: %v", n.name, p.err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon %s not ready", n.name)
		}
	}
	return p
}

// observations counts the node's observation records on disk.
func (n *inboundNode) observations(t *testing.T) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(n.storeDir, string(record.KindObservations), "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// TestInboundDeliveredAcrossReceiverCrashes: A sends 100
// messages to B through one relay; B's daemon is SIGKILLed twice while receiving
// and restarted; at the end B holds exactly 100 observations (no duplicates), A
// shows all 100 delivered, and fsck is clean on both stores.
func TestInboundDeliveredAcrossReceiverCrashes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	const n = 100
	start := time.Now()
	sealbridged, relayBin := buildBinaries(t)
	relayURL := startRelayProcess(t, relayBin)
	t.Logf("built and relay started in %s", time.Since(start).Round(time.Millisecond))

	a := newInboundNode(t, "A", relayURL)
	b := newInboundNode(t, "B", relayURL)
	pa := a.start(t, sealbridged)
	pb := b.start(t, sealbridged)

	// A sends from 8 goroutines (retrying, each with its Idempotency-Key) while the
	// test goroutine SIGKILLs and restarts B.
	body := func(i int) []byte { return fmt.Appendf(nil, "inbound message %03d", i) }
	key := func(i int) string { return fmt.Sprintf("inbound-key-%03d", i) }
	ids := make([]string, n)
	var sendErr atomic.Value
	var wg sync.WaitGroup
	var next atomic.Int32
	sendStart := time.Now()
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				deadline := time.Now().Add(60 * time.Second)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					m, err := a.c.Send(ctx, client.SendRequest{To: client.Recipients{string(b.did)}, RelayURL: relayURL, Body: body(i)}, key(i))
					cancel()
					if err == nil {
						ids[i] = m.MessageID
						break
					}
					if time.Now().After(deadline) {
						sendErr.Store(fmt.Errorf("send %d: %w", i, err))
						return
					}
					<-time.After(20 * time.Millisecond)
				}
			}
		})
	}
	sent := make(chan struct{})
	go func() { wg.Wait(); close(sent) }()

	// B is SIGKILLed and restarted when its observations on disk pass 20 and again 60.
	var killedAt []int
	for _, threshold := range []int{20, 60} {
		deadline := time.Now().Add(60 * time.Second)
		for b.observations(t) <= threshold {
			if time.Now().After(deadline) {
				t.Fatalf("B's observations did not pass %d within 60s (have %d)", threshold, b.observations(t))
			}
			<-time.After(5 * time.Millisecond)
		}
		pb.cmd.Process.Signal(syscall.SIGKILL)
		<-pb.done
		got := b.observations(t)
		killedAt = append(killedAt, got)
		t.Logf("SIGKILLed B with %d observations on disk (%s after the first send)", got, time.Since(sendStart).Round(time.Millisecond))
		if got >= n {
			t.Logf("warning: B already had all %d observations at this kill", n)
		}
		pb = b.start(t, sealbridged)
	}
	<-sent
	if err, _ := sendErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	t.Logf("all %d sends answered %s after the first", n, time.Since(sendStart).Round(time.Millisecond))
	distinct := map[string]int{}
	for i, id := range ids {
		distinct[id] = i
	}
	if len(distinct) != n {
		t.Fatalf("%d distinct message ids, want %d", len(distinct), n)
	}

	// Wait (60 s at most) for B to hold 100 observations and A to show 100 delivered.
	deadline := time.Now().Add(60 * time.Second)
	statuses := func() map[string]string {
		st := map[string]string{}
		after := ""
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			l, err := a.c.Messages(ctx, "", 0, after)
			cancel()
			if err != nil {
				t.Fatalf("A's messages: %v", err)
			}
			for _, m := range l.Messages {
				st[m.MessageID] = m.Status
			}
			if l.Next == "" || len(l.Messages) == 0 {
				return st
			}
			after = l.Next
		}
	}
	for {
		obs := b.observations(t)
		if obs > n {
			t.Fatalf("B holds %d observations, more than the %d messages sent: duplicates", obs, n)
		}
		st := statuses()
		delivered := 0
		for _, id := range ids {
			if st[id] == "delivered" {
				delivered++
			}
		}
		if obs == n && delivered == n {
			t.Logf("B holds %d observations and A shows %d delivered %s after the first send", obs, delivered, time.Since(sendStart).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			hist := map[string]int{}
			for _, id := range ids {
				hist[st[id]]++
			}
			t.Fatalf("after 60s: B holds %d observations, A's statuses %v", obs, hist)
		}
		<-time.After(50 * time.Millisecond)
	}

	// B's inbox through its API: exactly the 100 messages A sent, each once, with
	// A as sender and the bodies A sent.
	seen := map[string]int{}
	after := ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		l, err := b.c.Inbox(ctx, 0, after)
		cancel()
		if err != nil {
			t.Fatalf("B's inbox: %v", err)
		}
		for _, m := range l.Messages {
			seen[m.MessageID]++
			i, ok := distinct[m.MessageID]
			if !ok {
				t.Fatalf("B's inbox holds %s, which A did not send", m.MessageID)
			}
			if m.From != string(a.did) || string(m.Body) != string(body(i)) {
				t.Fatalf("B's inbox %s: from %s body %q, want from %s body %q", m.MessageID, m.From, m.Body, a.did, body(i))
			}
		}
		if l.Next == "" || len(l.Messages) == 0 {
			break
		}
		after = l.Next
	}
	if len(seen) != n {
		t.Fatalf("B's inbox lists %d messages, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("B's inbox lists %s %d times", id, k)
		}
	}

	// SIGTERM both daemons: each exits 0; then B still holds exactly 100
	// observations and fsck finds no problem in either store.
	pa.cmd.Process.Signal(syscall.SIGTERM)
	pb.cmd.Process.Signal(syscall.SIGTERM)
	<-pa.done
	<-pb.done
	if pa.err != nil || pb.err != nil {
		t.Fatalf("after SIGTERM: A %v, B %v", pa.err, pb.err)
	}
	if obs := b.observations(t); obs != n {
		t.Fatalf("after shutdown B holds %d observations, want %d", obs, n)
	}
	t.Logf("A holds %d observation records (its received delivery-status envelopes)", a.observations(t))
	for _, node := range []*inboundNode{a, b} {
		rep, err := fsck.Check(context.Background(), node.storeDir, fsck.Options{Owner: node.did})
		if err != nil {
			t.Fatalf("fsck %s: %v", node.name, err)
		}
		t.Logf("fsck %s: %d records, %d valid, %d problems, lock %s", node.name, rep.Records, rep.Valid, rep.Problems(), rep.Lock)
		if rep.Problems() != 0 {
			for _, f := range rep.Findings {
				if f.Severity == fsck.Problem {
					t.Errorf("fsck %s: %s %s: %s", node.name, f.Code, f.Path, f.Explanation)
				}
			}
		}
	}
	t.Logf("kills at %v observations; total %s", killedAt, time.Since(start).Round(time.Millisecond))
}
