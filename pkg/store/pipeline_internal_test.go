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
