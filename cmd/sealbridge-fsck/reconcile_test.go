package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// witnessRelay answers the two requests --reconcile makes: the head it witnessed
// (head, or 404) and what it holds of the sender's envelopes (held: the receipts
// it keeps). Any post fails the test: reconcile never sends.
type witnessRelay struct {
	t    *testing.T
	srv  *httptest.Server
	mu   sync.Mutex
	head []byte
	held map[string][]byte
}

func newWitnessRelay(t *testing.T) *witnessRelay {
	r := &witnessRelay{t: t, held: map[string][]byte{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if _, e := relayproto.VerifyInboxRequest(req, body, time.Now(), time.Time{}); e != nil {
			w.WriteHeader(e.Status)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		switch req.URL.Path {
		case relayproto.PathSenderHead:
			if r.head == nil {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			w.Write(r.head)
		case relayproto.PathSenderReceipts:
			var q relayproto.SenderReceiptsRequest
			if err := json.Unmarshal(body, &q); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			var ans relayproto.SenderReceiptsAnswer
			for _, id := range q.EnvelopeIDs {
				sr := relayproto.SenderReceipt{EnvelopeID: id, State: relayproto.SenderReceiptUnknown}
				if rc, ok := r.held[id]; ok {
					sr.State, sr.Receipt = relayproto.SenderReceiptHeld, rc
				}
				ans.Receipts = append(ans.Receipts, sr)
			}
			json.NewEncoder(w).Encode(ans)
		default:
			r.t.Errorf("reconcile asked the relay %s %s", req.Method, req.URL.Path)
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// reconcileRoot makes a data root with identity alice's key and a store of two
// pending envelopes for relay, of which the relay holds the first and has
// witnessed a head of seq 10 (the store's is lower): the store is rolled back,
// as a store restored from an old copy is. It returns the root, the store
// directory and the envelope ids.
func reconcileRoot(t *testing.T, relay *witnessRelay) (root, dir string, ids []string) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	id := fsfixtures.Owner()
	if err := os.MkdirAll(filepath.Join(root, dataroot.IdentitiesDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := identity.WriteKeyFile(dataroot.KeyFile(root, "alice"), id); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(id.Signer(), store.Options{Home: root})
	if err != nil {
		t.Fatal(err)
	}
	peer := fsfixtures.Foreign().DID()
	for range 2 {
		msgID := uuid.NewString()
		now := time.Now()
		en, data, err := envelope.NewMessage(id, peer, msgID, []byte("hi"), now.Add(time.Hour), now)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Enqueue(context.Background(), store.SendRequest{MessageID: msgID, PeerOwnerDID: peer, RelayURL: relay.srv.URL,
			DeliveryDeadline: now.Add(time.Hour), Envelopes: []store.OutgoingEnvelope{{EnvelopeID: en.ID(), Kind: record.EnvelopeMessage, Envelope: data}}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, en.ID())
		if len(ids) == 1 {
			rc, err := envelope.SignRelayReceipt(fsfixtures.Foreign(), envelope.RelayReceipt{EnvelopeID: en.ID(), EnvelopeDigest: en.Digest(), ReceivedAt: now})
			if err != nil {
				t.Fatal(err)
			}
			relay.held[en.ID()] = rc
		}
	}
	if _, _, err := s.WriteHead(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	head, err := envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: store.FormatVersion, Seq: 10, Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	relay.head = head
	if err := s.Witness(head, relay.srv.URL); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("Witness: %v", err)
	}
	return root, s.Dir(), ids
}

func reopen(t *testing.T, root string) *store.Store {
	t.Helper()
	s, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Home: root})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func stateOf(t *testing.T, s *store.Store, id string) string {
	t.Helper()
	o, err := store.GetAs[*record.Outbox](s, id)
	if err != nil || o == nil {
		t.Fatalf("outbox %s: %v", id, err)
	}
	return o.State
}

// TestReconcile: --reconcile of a rolled-back store brings forward what the relay
// holds, leaves the rest pending, writes a head above the relay's, prints what it
// did, checks the store (exit 0) and leaves it writable. Run again (JSON) it finds
// nothing more to bring forward and writes the next head.
func TestReconcile(t *testing.T) {
	relay := newWitnessRelay(t)
	root, dir, ids := reconcileRoot(t, relay)
	// A check first: the problem, and the command that ends it (--reconcile,
	// not --repair, which never touches it).
	r := runArgs(t, "--home", root, "--identity", "alice")
	want := "bring it forward first: sealbridge-fsck --reconcile --home " + shellQuote(root) + " --identity alice\n"
	if r.code != exitProblems || !strings.Contains(r.stdout, "store-rolled-back") || !strings.Contains(r.stdout, want) ||
		strings.Contains(r.stdout, "--repair") {
		t.Fatalf("check of a rolled-back store: exit %d, stdout lacks %q or names --repair:\n%s", r.code, want, r.stdout)
	}
	r = runArgs(t, "--reconcile", "--home", root, "--identity", "alice")
	if r.code != exitClean {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"reconcile: the store was rolled back: ",
		"reconcile: relay " + relay.srv.URL + ": witnessed head seq 10; 2 pending envelopes asked about: 1 brought forward (relayed), 1 left pending",
		"reconcile: wrote head seq 11; 1 envelope brought forward, 1 left pending",
		"sealbridge-fsck: " + dir + ": ",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	s := reopen(t, root)
	if err := s.RolledBack(); err != nil {
		t.Fatalf("still rolled back: %v", err)
	}
	if a, b := stateOf(t, s, ids[0]), stateOf(t, s, ids[1]); a != record.StateRelayed || b != record.StatePending {
		t.Fatalf("states %s %s", a, b)
	}

	r = runArgs(t, "--reconcile", "--json", "--home", root, "--identity", "alice", "--relay", relay.srv.URL+"/")
	d := doc(t, r)
	if r.code != exitClean || d.Mode != "reconcile" || d.Reconcile == nil || d.Reconcile.HeadSeq != 12 ||
		d.Reconcile.BroughtForward != 0 || d.Reconcile.LeftPending != 1 || len(d.Reconcile.Relays) != 1 || d.Reconcile.RolledBack != "" {
		t.Fatalf("exit %d, document %+v %+v\n%s", r.code, d, d.Reconcile, r.stderr)
	}
}

// TestReconcileRelayUnreachable: a relay that cannot be asked fails --reconcile
// with exit 8 and a hint, and nothing in the store changes (the store stays
// rolled back).
func TestReconcileRelayUnreachable(t *testing.T) {
	relay := newWitnessRelay(t)
	root, dir, _ := reconcileRoot(t, relay)
	relay.srv.Close()
	hash := fsfixtures.HashTree(t, dir)
	r := runArgs(t, "--reconcile", "--home", root, "--identity", "alice")
	refusal(t, r, "nothing was written")
	if !strings.Contains(r.stderr, relay.srv.URL) {
		t.Fatalf("stderr does not name the relay:\n%s", r.stderr)
	}
	if fsfixtures.HashTree(t, dir) != hash {
		t.Fatal("the store changed")
	}
	if err := reopen(t, root).RolledBack(); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("RolledBack() = %v", err)
	}
	r = runArgs(t, "--reconcile", "--json", "--home", root, "--identity", "alice")
	if d := doc(t, r); r.code != exitOperational || d.Mode != "reconcile" || d.Reconcile != nil || !strings.Contains(d.Error, relay.srv.URL) {
		t.Fatalf("exit %d, document %+v", r.code, d)
	}
}

// TestReconcileRefusesLiveDaemon: --reconcile while the store's daemon holds its
// pid-file flock exits 8 and changes nothing; once the daemon is gone it runs.
func TestReconcileRefusesLiveDaemon(t *testing.T) {
	relay := newWitnessRelay(t)
	root, dir, _ := reconcileRoot(t, relay)
	release := holdFlock(t, dataroot.PIDFile(root, string(fsfixtures.OwnerDID())))
	hash := fsfixtures.HashTree(t, dir)
	r := runArgs(t, "--reconcile", "--home", root, "--identity", "alice")
	refusal(t, r, "stop the daemon")
	if !strings.Contains(r.stderr, "pid 4242") || fsfixtures.HashTree(t, dir) != hash {
		t.Fatalf("stderr %s; or the store changed", r.stderr)
	}
	release()
	if r := runArgs(t, "--reconcile", dir, "--identity", "alice"); r.code != exitClean {
		t.Fatalf("after the daemon: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestReconcileUsage: the combinations --reconcile refuses are usage errors (16).
func TestReconcileUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--reconcile", "--repair"},
		{"--relay", "http://relay.example"},
		{"--reconcile", "--identity", string(fsfixtures.OwnerDID())},
		{"--reconcile", "--relay", ""},
		{"--reconcile", "/tmp/delivery/" + strings.Repeat("0", 64)},
	} {
		if r := runArgs(t, args...); r.code != exitUsage {
			t.Errorf("%q: exit %d, want %d\n%s", args, r.code, exitUsage, r.stderr)
		}
	}
}
