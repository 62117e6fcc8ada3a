package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/reconcile"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// countingRelay is an in-process relay that counts, per envelope id, the posts it
// received (single and batch), and that can refuse posts (down) as an unreachable
// relay would, without counting them.
type countingRelay struct {
	URL  string
	down atomic.Bool
	mu   sync.Mutex
	got  map[string]int
}

func newCountingRelay(t *testing.T) *countingRelay {
	t.Helper()
	rid, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Options{Identity: rid, Home: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := &countingRelay{got: map[string]int{}}
	h := r.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		post := req.Method == http.MethodPost && (req.URL.Path == relayproto.PathEnvelopes || req.URL.Path == relayproto.PathEnvelopesBatch)
		if post && c.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if post {
			body, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(body))
			c.count(req.URL.Path, body)
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(func() { srv.Close(); r.Close() })
	c.URL = srv.URL
	return c
}

func (c *countingRelay) count(path string, body []byte) {
	wires := [][]byte{body}
	if path == relayproto.PathEnvelopesBatch {
		var b relayproto.BatchRequest
		if json.Unmarshal(body, &b) != nil {
			return
		}
		wires = wires[:0]
		for _, w := range b.Envelopes {
			wires = append(wires, w)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range wires {
		if env, err := envelope.Parse(w); err == nil {
			c.got[env.ID()]++
		}
	}
}

// twice returns the envelope ids posted more than once.
func (c *countingRelay) twice() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id, n := range c.got {
		if n > 1 {
			ids = append(ids, fmt.Sprintf("%s×%d", id, n))
		}
	}
	return ids
}

// copyTree copies the directory tree src to dst byte for byte, modes kept, as `cp -a`
// would (the test's "byte copy" of a stopped store).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		info, err := de.Info()
		if err != nil {
			return err
		}
		if de.IsDir() {
			return os.MkdirAll(to, info.Mode().Perm())
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// statuses lists every message of the daemon's API with its status.
func statuses(t *testing.T, c *client.Client) map[string]string {
	t.Helper()
	l, err := c.Messages(context.Background(), "", 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, msg := range l.Messages {
		if msg.Kind == client.KindMessage {
			m[msg.MessageID] = msg.Status
		}
	}
	return m
}

// A store restored from a byte copy made 1, 10 and 100 messages earlier — with the
// relay taking deliveries in between, and with the relay down all that time — is
// refused at start (STORE_ROLLED_BACK), and after reconcile every message the copy
// holds has the status it had before the restore, while the relay receives no
// envelope twice. The copy holds messages delivered and messages still queued.
func TestRestoredCopyDetectedAndReconciled(t *testing.T) {
	for _, between := range []int{1, 10, 100} {
		for _, deliveries := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d-later/deliveries=%v", between, deliveries), func(t *testing.T) {
				testRestore(t, between, deliveries)
			})
		}
	}
}

func testRestore(t *testing.T, between int, deliveries bool) {
	ctx := context.Background()
	rl := newCountingRelay(t)
	home := t.TempDir()
	for _, name := range []string{"alice", "bob"} {
		if _, err := InitIdentity(home, name); err != nil {
			t.Fatal(err)
		}
	}
	start := func(name string) (*Daemon, context.CancelFunc, chan error) {
		d, err := New(Options{Home: home, Identity: name, Logger: quiet, DrainTimeout: 5 * time.Second,
			InboxRelay: rl.URL, PollEvery: 20 * time.Millisecond, HeadEvery: 10 * time.Millisecond})
		if err != nil {
			t.Fatalf("starting %s: %v", name, err)
		}
		cancel, done := run(t, d)
		return d, cancel, done
	}
	b, _, _ := start("bob")
	a, stopA, doneA := start("alice")
	ca := client.New(a.SocketPath())
	send := func(n int) []string {
		var ids []string
		for i := range n {
			m, err := ca.Send(ctx, client.SendRequest{To: client.Recipients{string(b.DID())}, RelayURL: rl.URL,
				Body: []byte(fmt.Sprintf("hello %d", i))}, "")
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, m.MessageID)
		}
		return ids
	}
	waitStatus := func(c *client.Client, ids []string, want string) {
		eventually(t, 60*time.Second, "messages "+want, func() (bool, string) {
			st := statuses(t, c)
			n := 0
			for _, id := range ids {
				if st[id] == want {
					n++
				}
			}
			return n == len(ids), fmt.Sprintf("%d of %d %s", n, len(ids), want)
		})
	}
	waitHead := func(d *Daemon, above int64) int64 {
		var seq int64
		eventually(t, 60*time.Second, "a head over the commits", func() (bool, string) {
			if h, _ := d.Store().Head(); h != nil {
				seq = h.Seq
			}
			return seq > above, fmt.Sprintf("head seq %d", seq)
		})
		return seq
	}

	// Before the copy: delivered messages and queued ones (the relay was down).
	delivered := send(3)
	waitStatus(ca, delivered, record.StatusDelivered)
	rl.down.Store(true)
	queued := send(2)
	stopDaemon(t, stopA, doneA)
	storeDir := dataroot.StoreDir(home, string(a.DID()))
	copyDir := filepath.Join(t.TempDir(), "copy")
	copyTree(t, storeDir, copyDir)
	copyHead := headSeq(t, copyDir)

	// Between the copy and the restore.
	rl.down.Store(!deliveries)
	a, stopA, doneA = start("alice")
	ca = client.New(a.SocketPath())
	later := send(between)
	if deliveries {
		waitStatus(ca, append(append([]string{}, queued...), later...), record.StatusDelivered)
	}
	waitHead(a, copyHead)
	before := statuses(t, ca)
	stopDaemon(t, stopA, doneA)

	// The restore: the copy in place of the store directory.
	if err := os.RemoveAll(storeDir); err != nil {
		t.Fatal(err)
	}
	copyTree(t, copyDir, storeDir)
	if _, err := New(Options{Home: home, Identity: "alice", Logger: quiet, InboxRelay: rl.URL}); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("the restored store started: %v, want STORE_ROLLED_BACK", err)
	} else if errcode.HintOf(err) == "" {
		t.Fatalf("STORE_ROLLED_BACK without a hint: %v", err)
	}

	// Reconcile, with the daemon stopped, then start again.
	id, err := LoadIdentity(home, "alice")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(id.Signer(), store.Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := reconcile.Run(ctx, st, id, reconcile.Options{})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	t.Logf("reconcile: %+v", rep)
	rl.down.Store(false)
	a, _, _ = start("alice")
	ca = client.New(a.SocketPath())
	copied := append(append([]string{}, delivered...), queued...)
	if deliveries {
		// Every message of the copy is delivered again, as before the restore.
		waitStatus(ca, copied, record.StatusDelivered)
	} else {
		// The copy's queued messages were never relayed: they are sent now, once.
		for _, id := range delivered {
			if before[id] != record.StatusDelivered {
				t.Fatalf("message %s was %s before the restore", id, before[id])
			}
		}
		waitStatus(ca, copied, record.StatusDelivered)
	}
	now := statuses(t, ca)
	for _, id := range copied {
		if deliveries && now[id] != before[id] {
			t.Fatalf("message %s is %s after reconcile, was %s before the restore", id, now[id], before[id])
		}
	}
	// Bob's confirmations of the copy's messages are relayed too; then nothing was
	// posted twice.
	cb := client.New(b.SocketPath())
	eventually(t, 60*time.Second, "bob's confirmations relayed", func() (bool, string) {
		l, err := cb.Messages(ctx, "", 1000, "")
		if err != nil {
			return false, err.Error()
		}
		relayed := 0
		for _, m := range l.Messages {
			if m.Kind == client.KindConfirmation && m.Status == record.StatusRelayed {
				relayed++
			}
		}
		return relayed == len(l.Messages), fmt.Sprintf("%d of %d relayed", relayed, len(l.Messages))
	})
	if twice := rl.twice(); len(twice) > 0 {
		t.Fatalf("the relay received envelopes more than once: %v", twice)
	}
}

// headSeq reads the seq of the head in store directory dir.
func headSeq(t *testing.T, dir string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, store.HeadFile))
	if err != nil {
		t.Fatal(err)
	}
	h, err := envelope.ParseStoreHead(data)
	if err != nil {
		t.Fatal(err)
	}
	return h.Seq
}
