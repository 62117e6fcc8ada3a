package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// fixedTransport answers every attempt with one outcome.
type fixedTransport carrier.Outcome

func (t fixedTransport) Send(context.Context, string, []byte) carrier.Result {
	if carrier.Outcome(t) == carrier.Accepted {
		return carrier.Result{Outcome: carrier.Accepted, Status: 200}
	}
	return carrier.Result{Outcome: carrier.Outcome(t), Err: errors.New("test: the relay is down")}
}

// stopDaemon stops a daemon run started and waits for it, leaving its result for
// run's cleanup.
func stopDaemon(t *testing.T, cancel context.CancelFunc, done chan error) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("daemon did not stop")
	}
}

// receiptOf reads the receipt of inbound envelope envelopeID.
func receiptOf(t *testing.T, st *store.Store, envelopeID string) *record.Receipt {
	t.Helper()
	r, err := store.GetAs[*record.Receipt](st, record.ReceiptID(envelopeID))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// outboxOf returns the outbox summaries of message id.
func outboxOf(t *testing.T, st *store.Store, id string) []store.OutboxSummary {
	t.Helper()
	sums, err := st.OutboxSummaries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []store.OutboxSummary
	for _, s := range sums {
		if s.MessageID == id {
			out = append(out, s)
		}
	}
	return out
}

// An inbound message's receipt is finished after a restart even when maintenance has
// already removed its confirmation's settled envelope: bob's daemon stores alice's
// message and enqueues the confirmation, which cannot be sent; it stops; the
// confirmation is relayed and maintenance removes its envelope; bob's daemon starts
// again and must raise the receipt to terminal (CONFIRMATION_RELAYED) from the
// confirmation's message record, without enqueueing a second confirmation.
func TestConfirmationFinishedAfterMaintenanceAndRestart(t *testing.T) {
	ctx := context.Background()
	relayURL := newTestRelay(t)
	home := t.TempDir()
	bob, err := InitIdentity(home, "bob")
	if err != nil {
		t.Fatal(err)
	}
	alice, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	env, wire, err := envelope.NewMessage(alice, bob.DID(), uuid.NewString(), []byte("hello bob"), time.Now().Add(time.Hour), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := (&relayproto.Client{BaseURL: relayURL}).Post(ctx, wire); err != nil {
		t.Fatal(err)
	}
	start := func(tr carrier.Transport) (*Daemon, context.CancelFunc, chan error) {
		d, err := New(Options{Home: home, Identity: "bob", Logger: quiet, DrainTimeout: 5 * time.Second,
			InboxRelay: relayURL, PollEvery: 20 * time.Millisecond, Transport: tr})
		if err != nil {
			t.Fatal(err)
		}
		cancel, done := run(t, d)
		return d, cancel, done
	}
	cid := confirmationID(env.ID())

	// 1. The message is stored, acknowledged, its confirmation enqueued and tried once,
	// in vain.
	d, cancel, done := start(fixedTransport(carrier.Failed))
	eventually(t, 60*time.Second, "the confirmation enqueued and tried", func() (bool, string) {
		r := receiptOf(t, d.Store(), env.ID())
		if r == nil {
			return false, "no receipt"
		}
		sums := outboxOf(t, d.Store(), cid)
		return r.State == record.ReceiptProcessed && len(sums) == 1 && sums[0].Attempts >= 1, r.State + " " + fmt.Sprint(sums)
	})
	stopDaemon(t, cancel, done)

	// 2. With the daemon stopped, a carrier relays the confirmation and maintenance
	// removes its settled envelope; the receipt is still processed.
	st, err := store.Open(bob.Signer(), store.Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := carrier.Apply(ctx, st, carrier.Selector{MessageIDs: []string{cid}},
		record.Action{Op: record.ActionRetry, By: "test", At: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	c := carrier.New(st, fixedTransport(carrier.Accepted), carrier.Options{Logger: quiet})
	cctx, stopCarrier := context.WithCancel(ctx)
	carDone := make(chan error, 1)
	go func() { carDone <- c.Run(cctx) }()
	eventually(t, 60*time.Second, "the confirmation relayed", func() (bool, string) {
		sums := outboxOf(t, st, cid)
		return len(sums) == 1 && sums[0].State == record.StateRelayed, fmt.Sprint(sums)
	})
	stopCarrier()
	if err := <-carDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if _, err := st.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if sums := outboxOf(t, st, cid); len(sums) != 0 {
		t.Fatalf("maintenance left the settled confirmation: %v", sums)
	}
	if r := receiptOf(t, st, env.ID()); r.State != record.ReceiptProcessed {
		t.Fatalf("receipt %s before the restart, want processed", r.State)
	}

	// 3. The restarted follower finishes the receipt from the message record.
	d, _, _ = start(nil)
	eventually(t, 60*time.Second, "the receipt finished", func() (bool, string) {
		r := receiptOf(t, d.Store(), env.ID())
		return r.State == record.ReceiptTerminal, r.State + " " + r.OutcomeCode
	})
	if r := receiptOf(t, d.Store(), env.ID()); r.OutcomeCode != outcomeConfirmed {
		t.Fatalf("receipt outcome %q, want %s", r.OutcomeCode, outcomeConfirmed)
	}
	if n, sums := countKind(t, d, record.KindMessages), outboxOf(t, d.Store(), cid); n != 1 || len(sums) != 0 {
		t.Fatalf("%d message records and %d envelopes of the confirmation: enqueued again", n, len(sums))
	}
	m, err := client.New(d.SocketPath()).Message(ctx, cid)
	if err != nil || m.Kind != client.KindConfirmation || m.Status != record.StatusRelayed || m.Attempts < 2 {
		t.Fatalf("the confirmation as listed: %+v %v; want a relayed confirmation, its failed and its accepted attempts counted", m, err)
	}
}

// newFollower returns a daemon that is not running (its store, carrier and metrics
// only) and a follower of a relay it never reaches.
func newFollower(t *testing.T) (*Daemon, *follower) {
	t.Helper()
	home := t.TempDir()
	if _, err := InitIdentity(home, "bob"); err != nil {
		t.Fatal(err)
	}
	const relayURL = "http://127.0.0.1:9"
	d, err := New(Options{Home: home, Identity: "bob", Logger: quiet, InboxRelay: relayURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, &follower{d: d, url: relayURL, kick: make(chan struct{}, 1), pending: map[string]*pendingReceipt{},
		rc: &relayproto.Client{BaseURL: relayURL}}
}

// processedReceipt writes the receipt of a new inbound message, processed (stored
// and acknowledged, its confirmation owed), and returns its pending work.
func processedReceipt(t *testing.T, d *Daemon, sender identity.DID) *pendingReceipt {
	t.Helper()
	eid := uuid.NewString()
	digest := envelope.Digest([]byte(eid))
	now := time.Now().UnixMilli()
	rc := &record.Receipt{EnvelopeID: eid, SenderDID: string(sender), EnvelopeDigest: digest, State: record.ReceiptProcessed,
		ReceivedAt: now, RetainUntil: now + inboundRetain.Milliseconds()}
	if err := d.Store().PreparedTransaction(context.Background(), func(tx *store.Tx) error { return tx.Put(rc) }); err != nil {
		t.Fatal(err)
	}
	return &pendingReceipt{envelopeID: eid, state: record.ReceiptProcessed, messageID: uuid.NewString(), digest: digest, sender: sender}
}

// settle ends confirmation cid as the carrier would: its envelope and its message
// record moved to state in one transaction.
func settle(t *testing.T, d *Daemon, cid, state string) {
	t.Helper()
	err := d.Store().PreparedTransaction(context.Background(), func(tx *store.Tx) error {
		for _, s := range outboxOf(t, d.Store(), cid) {
			o, err := store.TxGet[*record.Outbox](tx, s.EnvelopeID)
			if err != nil {
				return err
			}
			o.State, o.Attempts = state, 1
			if state == record.StateClosed {
				o.LastError = record.RefusedPrefix + "test"
			}
			if err := tx.Put(o); err != nil {
				return err
			}
		}
		m, err := store.TxGet[*record.Message](tx, cid)
		if err != nil {
			return err
		}
		if state == record.StateClosed {
			tx.EndMessage(m, record.StatusClosed, record.ClosedByRefused, record.RefusedPrefix+"test", time.Now().UnixMilli())
		} else {
			m.Status = record.StatusRelayed
		}
		m.Attempts = 1
		return tx.Put(m)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The follower finishes a receipt from whatever of its confirmation is left: the
// envelope while it is there, else its message record (relayed or closed; queued,
// as a store written before confirmations' messages were moved leaves it); and only
// when neither exists does it enqueue the confirmation — once. A receipt whose
// follower knew the envelope id (before a restart) and one whose follower did not
// (after it) end the same.
func TestConfirmationOutcome(t *testing.T) {
	ctx := context.Background()
	d, f := newFollower(t)
	alice, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		state       string // how the confirmation ends: relayed, closed, or "" (left queued, as the old carrier left it)
		forgetEnv   bool   // the follower restarted: it knows no envelope id
		wantOutcome string
	}{
		{"relayed", record.StateRelayed, false, outcomeConfirmed},
		{"relayed, after a restart", record.StateRelayed, true, outcomeConfirmed},
		{"closed", record.StateClosed, false, outcomeConfClose},
		{"closed, after a restart", record.StateClosed, true, outcomeConfClose},
		{"old store: queued, its envelope removed", "", true, outcomeConfirmed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := processedReceipt(t, d, alice.DID())
			cid := confirmationID(p.envelopeID)
			f.advance(ctx, p, true) // enqueues it: neither its envelope nor its message exists
			sums := outboxOf(t, d.Store(), cid)
			if p.state != record.ReceiptProcessed || len(sums) != 1 || sums[0].EnvelopeKind != record.EnvelopeDeliveryStatus {
				t.Fatalf("after the first advance: receipt %s, envelopes %v", p.state, sums)
			}
			f.advance(ctx, p, true) // pending: it waits
			if p.state != record.ReceiptProcessed || len(outboxOf(t, d.Store(), cid)) != 1 {
				t.Fatalf("a pending confirmation: receipt %s", p.state)
			}
			if tc.state != "" {
				settle(t, d, cid, tc.state)
			} else {
				// The old carrier settled the envelope and left its message queued.
				if err := d.Store().PreparedTransaction(ctx, func(tx *store.Tx) error {
					o, err := store.TxGet[*record.Outbox](tx, sums[0].EnvelopeID)
					if err != nil {
						return err
					}
					o.State = record.StateRelayed
					return tx.Put(o)
				}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := d.Store().Maintain(ctx); err != nil {
				t.Fatal(err)
			}
			if sums := outboxOf(t, d.Store(), cid); len(sums) != 0 {
				t.Fatalf("maintenance left the settled confirmation: %v", sums)
			}
			if tc.forgetEnv {
				p.confEnv = ""
			}
			f.advance(ctx, p, true)
			r := receiptOf(t, d.Store(), p.envelopeID)
			if p.state != record.ReceiptTerminal || r.State != record.ReceiptTerminal || r.OutcomeCode != tc.wantOutcome {
				t.Fatalf("receipt %s %s (pending %s), want terminal %s", r.State, r.OutcomeCode, p.state, tc.wantOutcome)
			}
			if sums := outboxOf(t, d.Store(), cid); len(sums) != 0 {
				t.Fatalf("the confirmation was enqueued again: %v", sums)
			}
		})
	}
}

// The follower finishing receipts and maintenance removing their confirmations'
// settled envelopes, at once, many times: whichever comes first, every receipt ends
// terminal and confirmed, and no confirmation is enqueued twice.
func TestConfirmationFinishedWhileMaintaining(t *testing.T) {
	ctx := context.Background()
	d, f := newFollower(t)
	alice, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	trials := 30
	if testing.Short() {
		trials = 10
	}
	for trial := range trials {
		// A few receipts a trial, half of them as after a restart.
		var ps []*pendingReceipt
		for i := range 4 {
			p := processedReceipt(t, d, alice.DID())
			f.advance(ctx, p, true)
			cid := confirmationID(p.envelopeID)
			settle(t, d, cid, record.StateRelayed)
			if i%2 == 1 {
				p.confEnv = ""
			}
			ps = append(ps, p)
		}
		gate := make(chan struct{})
		var wg sync.WaitGroup
		var maintErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-gate
			_, maintErr = d.Store().Maintain(ctx)
		}()
		go func() {
			defer wg.Done()
			<-gate
			for _, p := range ps {
				f.advance(ctx, p, true)
			}
		}()
		close(gate)
		wg.Wait()
		if maintErr != nil {
			t.Fatal(maintErr)
		}
		for i, p := range ps {
			r := receiptOf(t, d.Store(), p.envelopeID)
			if p.state != record.ReceiptTerminal || r.State != record.ReceiptTerminal || r.OutcomeCode != outcomeConfirmed {
				t.Fatalf("trial %d, receipt %d: %s %s (pending %s), want terminal %s", trial, i, r.State, r.OutcomeCode, p.state, outcomeConfirmed)
			}
			m, err := store.GetAs[*record.Message](d.Store(), confirmationID(p.envelopeID))
			if err != nil || m == nil || m.Status != record.StatusRelayed {
				t.Fatalf("trial %d: confirmation message %+v %v", trial, m, err)
			}
		}
	}
	if _, err := d.Store().Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if n, sums := countKind(t, d, record.KindMessages), countKind(t, d, record.KindOutbox); n != 4*trials || sums != 0 {
		t.Fatalf("%d confirmation messages for %d receipts, %d envelopes left: one was enqueued twice", n, 4*trials, sums)
	}
}
