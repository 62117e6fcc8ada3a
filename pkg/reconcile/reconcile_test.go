package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/reconcile"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func testOwner(t testing.TB) *identity.Identity {
	t.Helper()
	seed := [32]byte{7, 7, 7}
	id, err := identity.FromSeed(seed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func testPeer(t testing.TB) identity.DID {
	t.Helper()
	seed := [32]byte{99}
	id, err := identity.FromSeed(seed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id.DID()
}

// env is a test store: its directory and local witness under root.
type env struct {
	t    *testing.T
	id   *identity.Identity
	root string
}

func newEnv(t *testing.T) *env {
	e := &env{t: t, id: testOwner(t), root: t.TempDir()}
	if err := os.Mkdir(e.dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) dir() string { return filepath.Join(e.root, "store") }

func (e *env) open() *store.Store {
	e.t.Helper()
	s, err := store.Open(e.id.Signer(), store.Options{Dir: e.dir(), WitnessFile: filepath.Join(e.root, "witness", "head")})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// enqueue accepts n one-envelope messages to relayURL and returns their envelope ids.
func (e *env) enqueue(s *store.Store, relayURL string, n int) []string {
	e.t.Helper()
	var ids []string
	for range n {
		msgID := uuid.NewString()
		now := time.Now()
		en, data, err := envelope.NewMessage(e.id, testPeer(e.t), msgID, []byte("hello"), now.Add(time.Hour), now)
		if err != nil {
			e.t.Fatal(err)
		}
		req := store.SendRequest{MessageID: msgID, PeerOwnerDID: testPeer(e.t), RelayURL: relayURL, DeliveryDeadline: now.Add(time.Hour),
			Envelopes: []store.OutgoingEnvelope{{EnvelopeID: en.ID(), Kind: record.EnvelopeMessage, Envelope: data}}}
		if _, err := s.Enqueue(context.Background(), req); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, en.ID())
	}
	return ids
}

func writeHead(t *testing.T, s *store.Store) int64 {
	t.Helper()
	h, _, err := s.WriteHead(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	return h.Seq
}

func outbox(t *testing.T, s *store.Store, id string) *record.Outbox {
	t.Helper()
	o, err := store.GetAs[*record.Outbox](s, id)
	if err != nil || o == nil {
		t.Fatalf("outbox %s: %v %v", id, o, err)
	}
	return o
}

func states(t *testing.T, s *store.Store, ids []string) []string {
	t.Helper()
	var out []string
	for _, id := range ids {
		out = append(out, outbox(t, s, id).State)
	}
	return out
}

func allIn(ss []string, want string) bool {
	for _, s := range ss {
		if s != want {
			return false
		}
	}
	return true
}

// deliver runs a carrier on s over HTTP until every envelope of ids is relayed.
func deliver(t *testing.T, s *store.Store, id *identity.Identity, ids []string) {
	t.Helper()
	c := carrier.New(s, carrier.NewHTTPTransport(carrier.HTTPOptions{SendTimeout: 10 * time.Second}),
		carrier.Options{Watch: carrier.WatchOff, Identity: id, HolderID: "test:" + uuid.NewString()[:8]})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !allIn(states(t, s, ids), record.StateRelayed) {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not delivered: %v", states(t, s, ids))
		}
		c.Kick()
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("carrier: %v", err)
	}
}

// copyDir copies the store directory src to dst (the backup of a stopped store).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// restore puts the copy at backup in the store's place.
func (e *env) restore(backup string) {
	e.t.Helper()
	if err := os.Rename(e.dir(), e.dir()+".aside"); err != nil {
		e.t.Fatal(err)
	}
	copyDir(e.t, backup, e.dir())
}

// The whole story: a store is copied, delivers more, and is restored from the
// copy. The restored store is rolled back (its local witness is ahead) and
// refuses writes; reconcile brings forward what the relay holds, writes a head
// above the relay's, and ends the state; the carrier then sends only what is new.
// The relay receives every envelope exactly once.
func TestRestoreReconcileCarrierPostsEachEnvelopeOnce(t *testing.T) {
	restoreStory(t, newFakeRelay(t))
}

// testRelay is a relay the story runs against: its URL and how many posts of
// each envelope reached it.
type testRelay interface {
	url() string
	postCounts() map[string]int
}

// witnessedSeq asks relay for the head it witnessed from id (0: none).
func witnessedSeq(t *testing.T, relay testRelay, id *identity.Identity) int64 {
	t.Helper()
	b, err := (&relayproto.Client{BaseURL: relay.url()}).SenderHead(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if b == nil {
		return 0
	}
	h, err := envelope.ParseStoreHead(b)
	if err != nil {
		t.Fatal(err)
	}
	return h.Seq
}

func restoreStory(t *testing.T, relay testRelay) {
	e := newEnv(t)
	s := e.open()
	a := e.enqueue(s, relay.url(), 3)
	writeHead(t, s)
	backup := filepath.Join(e.root, "backup")
	copyDir(t, e.dir(), backup)

	writeHead(t, s)
	deliver(t, s, e.id, a)
	b := e.enqueue(s, relay.url(), 2)
	writeHead(t, s)
	deliver(t, s, e.id, b)
	if _, _, err := s.WriteHead(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	witnessed := witnessedSeq(t, relay, e.id)
	if witnessed < 3 {
		t.Fatalf("the relay witnessed seq %d", witnessed)
	}

	e.restore(backup)
	s = e.open()
	if err := s.RolledBack(); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("the restored store: RolledBack() = %v", err)
	}
	if !allIn(states(t, s, a), record.StatePending) {
		t.Fatalf("restored states %v", states(t, s, a))
	}
	rep, err := reconcile.Run(context.Background(), s, e.id, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.RolledBack == "" || len(rep.Relays) != 1 || rep.Relays[0].WitnessedSeq != witnessed ||
		rep.Relays[0].Asked != 3 || rep.BroughtForward != 3 || rep.LeftPending != 0 {
		t.Fatalf("report %+v", rep)
	}
	if rep.Head == nil || rep.Head.Seq <= witnessed {
		t.Fatalf("the head written: %+v, want above %d", rep.Head, witnessed)
	}
	if err := s.RolledBack(); err != nil {
		t.Fatalf("still rolled back: %v", err)
	}
	if !allIn(states(t, s, a), record.StateRelayed) {
		t.Fatalf("after reconcile: %v", states(t, s, a))
	}
	for _, id := range a {
		m, err := s.Message(outbox(t, s, id).MessageID)
		if err != nil || m.Status != record.StatusRelayed {
			t.Fatalf("message of %s: %+v %v", id, m, err)
		}
	}

	c := e.enqueue(s, relay.url(), 1)
	writeHead(t, s)
	deliver(t, s, e.id, c)
	if err := s.RolledBack(); err != nil {
		t.Fatalf("rolled back after delivering: %v", err)
	}
	counts := relay.postCounts()
	for _, id := range append(append(a, b...), c...) {
		if counts[id] != 1 {
			t.Fatalf("envelope %s reached the relay %d times, want once (all: %v)", id, counts[id], counts)
		}
	}
	if len(counts) != 6 {
		t.Fatalf("%d envelopes posted, want 6", len(counts))
	}
	if s2 := e.open(); s2.RolledBack() != nil {
		t.Fatalf("reopened: %v", s2.RolledBack())
	}
}

// On a store that is not rolled back Run brings forward what relays hold (held,
// acked, and one a dead carrier still leases), leaves what they do not know
// pending, posts nothing, and writes a head above every relay's — also one of a
// relay only opts.Relays names.
func TestReconcileBringsForwardAndLeavesUnknown(t *testing.T) {
	e := newEnv(t)
	relay := newFakeRelay(t)
	other := newFakeRelay(t)
	s := e.open()
	writeHead(t, s)
	sent := e.enqueue(s, relay.url(), 3)
	postLosingAnswers(t, s, relay, sent)
	// A dead carrier's lease on one of them.
	err := s.Transaction(context.Background(), func(tx *store.Tx) error {
		o, err := store.TxGet[*record.Outbox](tx, sent[0])
		if err != nil {
			return err
		}
		o.Lease = &record.Lease{Holder: "carrier:dead", Until: time.Now().Add(time.Hour).UnixMilli()}
		return tx.Put(o)
	})
	if err != nil {
		t.Fatal(err)
	}
	relay.mu.Lock()
	relay.acked[sent[1]] = true
	relay.mu.Unlock()
	unknown := e.enqueue(s, relay.url(), 2)
	other.mu.Lock()
	other.head, other.headSeq = signedHeadOf(t, e.id, 50), 50
	other.mu.Unlock()
	before := relay.postCounts()
	attempts := outbox(t, s, sent[0]).Attempts

	rep, err := reconcile.Run(context.Background(), s, e.id, reconcile.Options{Relays: []string{other.url()}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.RolledBack != "" || rep.BroughtForward != 3 || rep.LeftPending != 2 || len(rep.Relays) != 2 {
		t.Fatalf("report %+v", rep)
	}
	if rep.Head == nil || rep.Head.Seq != 51 {
		t.Fatalf("head %+v, want seq 51", rep.Head)
	}
	if !allIn(states(t, s, sent), record.StateRelayed) || !allIn(states(t, s, unknown), record.StatePending) {
		t.Fatalf("sent %v, unknown %v", states(t, s, sent), states(t, s, unknown))
	}
	if o := outbox(t, s, sent[0]); o.Lease != nil || o.Attempts != attempts+1 {
		t.Fatalf("the leased one: lease %+v, attempts %d", o.Lease, o.Attempts)
	}
	if after := relay.postCounts(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("reconcile posted: %v, was %v", after, before)
	}
}

// lostAnswers posts through HTTP and reports every answer lost (a timeout).
type lostAnswers struct{ *carrier.HTTPTransport }

func (l lostAnswers) Send(ctx context.Context, url string, env []byte) carrier.Result {
	l.HTTPTransport.Send(ctx, url, env)
	return carrier.Result{Outcome: carrier.Failed, Err: errors.New("the answer was lost")}
}

// postLosingAnswers runs a carrier on s until the relay holds every envelope of
// ids, each of whose answers the carrier lost: they stay pending in s.
func postLosingAnswers(t *testing.T, s *store.Store, relay *fakeRelay, ids []string) {
	t.Helper()
	c := carrier.New(s, lostAnswers{carrier.NewHTTPTransport(carrier.HTTPOptions{SendTimeout: 10 * time.Second})},
		carrier.Options{Watch: carrier.WatchOff, HolderID: "test:lost"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		counts, all := relay.postCounts(), true
		for _, id := range ids {
			all = all && counts[id] > 0
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not posted: %v", counts)
		}
		c.Kick()
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
	cancel()
	<-done
	if !allIn(states(t, s, ids), record.StatePending) {
		t.Fatalf("states %v", states(t, s, ids))
	}
}

func signedHeadOf(t *testing.T, id *identity.Identity, seq int64) []byte {
	t.Helper()
	b, err := envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: store.FormatVersion, Seq: seq, Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A relay that cannot be asked fails Run with a hint, and nothing is written:
// the envelopes stay pending, the head and the rolled-back state as they were.
func TestReconcileRelayUnreachableWritesNothing(t *testing.T) {
	for _, how := range []string{"503", "closed"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t)
			relay := newFakeRelay(t)
			s := e.open()
			writeHead(t, s)
			ids := e.enqueue(s, relay.url(), 1)
			deliver(t, s, e.id, ids)
			ids = append(ids, e.enqueue(s, relay.url(), 1)...)
			if err := s.Witness(signedHeadOf(t, e.id, 40), "test"); !errors.Is(err, errcode.StoreRolledBack) {
				t.Fatalf("Witness: %v", err)
			}
			err := s.Transaction(context.Background(), func(tx *store.Tx) error { return nil })
			if !errors.Is(err, errcode.StoreRolledBack) {
				t.Fatalf("a write on the rolled-back store: %v", err)
			}
			headBefore, _ := s.Head()
			if how == "503" {
				relay.setDown(true)
			} else {
				relay.srv.Close()
			}
			rep, err := reconcile.Run(context.Background(), s, e.id, reconcile.Options{Timeout: 5 * time.Second})
			if err == nil {
				t.Fatalf("Run succeeded: %+v", rep)
			}
			if !strings.Contains(err.Error(), relay.url()) || !strings.Contains(errcode.HintOf(err), "nothing was written") {
				t.Fatalf("error %q, hint %q", err, errcode.HintOf(err))
			}
			if h, _ := s.Head(); h.Seq != headBefore.Seq {
				t.Fatalf("head moved from %d to %d", headBefore.Seq, h.Seq)
			}
			if !errors.Is(s.RolledBack(), errcode.StoreRolledBack) {
				t.Fatal("no longer rolled back")
			}
			if got := states(t, s, ids); got[1] != record.StatePending {
				t.Fatalf("states %v", got)
			}
		})
	}
}

// A relay answering a receipt that is not for the store's envelope (another
// digest) fails Run before anything is written.
func TestReconcileWrongReceiptWritesNothing(t *testing.T) {
	e := newEnv(t)
	relay := newFakeRelay(t)
	s := e.open()
	writeHead(t, s)
	ids := e.enqueue(s, relay.url(), 2)
	// The relay holds both, the second under a receipt with another digest.
	relay.mu.Lock()
	for i, id := range ids {
		digest := outbox(t, s, id).EnvelopeDigest
		if i == 1 {
			digest = strings.Repeat("0", 64)
		}
		rc, err := envelope.SignRelayReceipt(relay.id, envelope.RelayReceipt{EnvelopeID: id, EnvelopeDigest: digest, ReceivedAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		relay.receipts[id], relay.senderOf[id] = rc, e.id.DID()
	}
	relay.mu.Unlock()
	headBefore, _ := s.Head()
	if _, err := reconcile.Run(context.Background(), s, e.id, reconcile.Options{}); err == nil || !strings.Contains(err.Error(), ids[1]) {
		t.Fatalf("Run: %v", err)
	}
	if got := states(t, s, ids); !allIn(got, record.StatePending) {
		t.Fatalf("states %v", got)
	}
	if h, _ := s.Head(); h.Seq != headBefore.Seq {
		t.Fatalf("head moved from %d to %d", headBefore.Seq, h.Seq)
	}
}
