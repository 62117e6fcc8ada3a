package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func run(t *testing.T, d *Daemon) (context.CancelFunc, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("not ready")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Error("daemon did not stop")
		}
	})
	return cancel, done
}

func TestIdentityInitLoad(t *testing.T) {
	home := t.TempDir()
	id, err := InitIdentity(home, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InitIdentity(home, "alice"); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("second init: %v", err)
	}
	got, err := LoadIdentity(home, "alice")
	if err != nil || got.DID() != id.DID() {
		t.Fatalf("load: %v %v", got, err)
	}
	fi, err := os.Stat(IdentityPath(home, "alice"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	if _, err := InitIdentity(home, "../x"); err == nil {
		t.Fatal("bad name accepted")
	}
}

func TestStaleSocketReplacedLiveRefusedAndMode(t *testing.T) {
	home := t.TempDir()
	id, err := InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	// A stale socket: bound then its listener closed without unlinking.
	sock := client.SocketPath(home, string(id.DID()))
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	d, err := New(Options{Home: home, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	fi, err := os.Lstat(d.SocketPath())
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket: %v %v", fi, err)
	}
	if err := client.New(d.SocketPath()).Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A live socket is not replaced (a daemon whose pid lock was bypassed).
	d2 := &Daemon{socket: d.SocketPath(), log: quiet}
	if _, err := d2.listen(); err == nil || !strings.Contains(err.Error(), "live") {
		t.Fatalf("live socket: %v", err)
	}
}

// homeWithStore makes a data root with the default identity and opens its store
// (as a daemon that ran before would have left it).
func homeWithStore(t *testing.T) (string, *identity.Identity, *store.Store) {
	t.Helper()
	home := t.TempDir()
	id, err := InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(id.Signer(), store.Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	return home, id, st
}

// Operations a crashed daemon left in flight are taken over at once by a retry to
// the next daemon, which finishes the same message.
func TestCrashedOperationTakenOver(t *testing.T) {
	home, _, st := homeWithStore(t)
	peer, _ := identity.Generate()
	req := client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: "http://127.0.0.1:9", Body: []byte("hi")}
	canonical, _ := json.Marshal(req)
	op, err := st.BeginOperation(context.Background(), "k", canonical)
	if err != nil {
		t.Fatal(err)
	}
	for time.Now().UnixMilli() <= op.Operation.CreatedAt { // the next millisecond
	}
	d, err := New(Options{Home: home, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	m, err := client.New(d.SocketPath()).Send(context.Background(), req, "k")
	if err != nil {
		t.Fatal(err)
	}
	if m.MessageID != op.Operation.OperationID {
		t.Fatalf("message %s, want the operation id %s", m.MessageID, op.Operation.OperationID)
	}
}

func TestSdNotify(t *testing.T) {
	dir := t.TempDir()
	addr := dir + "/notify"
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Skip(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", addr)
	if err := sdNotify("READY=1"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("got %q %v", buf[:n], err)
	}
}

// A message left behind its envelope — the envelope relayed, the message record
// still queued, as a crash between the two renames of the carrier's settlement
// leaves it — is brought forward right after the next start, not at the first
// maintenance period (10 minutes later).
func TestMessageBehindItsEnvelopeBroughtForwardAtStart(t *testing.T) {
	home, id, st := homeWithStore(t)
	peer, _ := identity.Generate()
	ctx := context.Background()
	msgID := uuid.NewString()
	env, wire, err := envelope.NewMessage(id, peer.DID(), msgID, []byte("hi"), time.Now().Add(time.Hour), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Enqueue(ctx, store.SendRequest{MessageID: msgID, PeerOwnerDID: peer.DID(), RelayURL: "http://127.0.0.1:9",
		DeliveryDeadline: time.Now().Add(time.Hour), Envelopes: []store.OutgoingEnvelope{
			{EnvelopeID: env.ID(), Kind: record.EnvelopeMessage, Envelope: wire}}}); err != nil {
		t.Fatal(err)
	}
	// The settlement's first rename only: the envelope relayed, its message not.
	if err := st.Transaction(ctx, func(tx *store.Tx) error {
		o, err := store.TxGet[*record.Outbox](tx, env.ID())
		if err != nil || o == nil {
			return fmt.Errorf("outbox: %v %v", o, err)
		}
		o.State, o.Attempts = record.StateRelayed, 1
		return tx.Put(o)
	}); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Home: home, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	c := client.New(d.SocketPath())
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := c.Message(ctx, msgID)
		if err != nil {
			t.Fatal(err)
		}
		if m.Status == record.StatusRelayed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the message is still %s 30 s after the start, its envelope relayed", m.Status)
		}
		<-time.After(10 * time.Millisecond)
	}
}
