package store

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// A plan may be made beside a group-commit leader (DESIGN §6, §9) and read what the
// leader published but has not made durable. An answer from such a plan (it writes
// nothing) is given only once the leader's hold is done. Here the leader of an
// Enqueue is held at the fsync of messages/, after the message record that commits
// the envelope was renamed; an Enqueue of the same message, planned meanwhile, finds
// it accepted, and must wait for that fsync before it says so.
func TestAnswerBesideALeaderWaitsForItsHold(t *testing.T) {
	var armed atomic.Bool
	inHold, release := make(chan struct{}), make(chan struct{})
	s, err := Open(ed25519.NewKeyFromSeed(make([]byte, 32)), Options{Home: t.TempDir(), WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if op.Kind == fsx.OpSyncDir && op.Path == string(record.KindMessages) && armed.CompareAndSwap(true, false) {
				close(inHold)
				<-release
			}
			return nil
		}
		return f
	}})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	answerWaits = func() { close(waited) }
	t.Cleanup(func() { answerWaits = nil })
	peer := identity.FormatDID(ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey))
	req := func() SendRequest {
		return SendRequest{MessageID: uuid.NewString(), PeerOwnerDID: peer, RelayURL: "http://127.0.0.1:9/",
			DeliveryDeadline: time.Now().Add(time.Hour),
			Envelopes:        []OutgoingEnvelope{{EnvelopeID: uuid.NewString(), Kind: record.EnvelopeMessage, Envelope: json.RawMessage(`{}`)}}}
	}
	ctx := context.Background()
	if _, err := s.Enqueue(ctx, req()); err != nil { // directories, generation file
		t.Fatal(err)
	}
	r := req()
	armed.Store(true)
	first := make(chan error, 1)
	go func() { _, err := s.Enqueue(ctx, r); first <- err }()
	<-inHold
	again := make(chan error, 1)
	go func() { _, err := s.Enqueue(ctx, r); again <- err }()
	select {
	case err := <-again:
		t.Fatalf("the second Enqueue answered (%v) while the first's message record was not yet durable", err)
	case <-waited:
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-again; err != nil {
		t.Fatal(err)
	}
}

// An answer planned beside a leader that is midway through a publication — one record
// renamed, the next not yet — never reports that torn state: it is validated by the
// next group and planned again. Here the leader closes an envelope and then its
// message, and is held before the message's rename; a read-only plan reads both
// meanwhile (the envelope closed, the message still queued), and must end up
// answering from a state where both are closed. Found by the concurrency explorer: an
// operator's hold answered "nothing pending" for a message the carrier was closing.
func TestAnswerBesideALeaderIsNeverTorn(t *testing.T) {
	var armed atomic.Bool
	var msgPath string
	inHold, release := make(chan struct{}), make(chan struct{})
	s, err := Open(ed25519.NewKeyFromSeed(make([]byte, 32)), Options{Home: t.TempDir(), WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if op.Kind == fsx.OpRename && op.Path2 == msgPath && armed.CompareAndSwap(true, false) {
				close(inHold)
				<-release
			}
			return nil
		}
		return f
	}})
	if err != nil {
		t.Fatal(err)
	}
	peer := identity.FormatDID(ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey))
	req := SendRequest{MessageID: uuid.NewString(), PeerOwnerDID: peer, RelayURL: "http://127.0.0.1:9/",
		DeliveryDeadline: time.Now().Add(time.Hour),
		Envelopes:        []OutgoingEnvelope{{EnvelopeID: uuid.NewString(), Kind: record.EnvelopeMessage, Envelope: json.RawMessage(`{}`)}}}
	ctx := context.Background()
	if _, err := s.Enqueue(ctx, req); err != nil {
		t.Fatal(err)
	}
	msgPath = record.Path(record.KindMessages, req.MessageID)
	armed.Store(true)
	closed := make(chan error, 1)
	go func() { // the envelope first, then its message, as the carrier closes them
		closed <- s.PreparedTransaction(ctx, func(tx *Tx) error {
			o, err := TxGet[*record.Outbox](tx, req.Envelopes[0].EnvelopeID)
			if err != nil {
				return err
			}
			o.State, o.LastError = record.StateClosed, "REFUSED: test"
			m, err := TxGet[*record.Message](tx, req.MessageID)
			if err != nil {
				return err
			}
			tx.EndMessage(m, record.StatusClosed, record.ClosedByRefused, o.LastError, s.nowMs())
			return tx.PutAll(o, m)
		})
	}()
	<-inHold
	var envState, msgStatus string
	planned := make(chan struct{}, 8)
	answered := make(chan error, 1)
	go func() {
		answered <- s.PreparedTransaction(ctx, func(tx *Tx) error {
			o, err := TxGet[*record.Outbox](tx, req.Envelopes[0].EnvelopeID)
			if err != nil {
				return err
			}
			m, err := TxGet[*record.Message](tx, req.MessageID)
			if err != nil {
				return err
			}
			envState, msgStatus = o.State, m.Status
			planned <- struct{}{}
			return nil
		})
	}()
	<-planned // planned once beside the held leader: the torn state
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	if envState != record.StateClosed || msgStatus != record.StatusClosed {
		t.Fatalf("the answer read the envelope %s and its message %s: a publication half done", envState, msgStatus)
	}
}
