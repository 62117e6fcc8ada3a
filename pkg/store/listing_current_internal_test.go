package store

import (
	"context"
	"crypto/ed25519"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// lstatGate calls hook on every Lstat, before it runs.
type lstatGate struct {
	fsx.FS
	hook func(name string)
}

func (g lstatGate) Lstat(name string) (fsx.Info, error) {
	g.hook(name)
	return g.FS.Lstat(name)
}

// A listing is current as of the call even when a slower reader of the same Store
// installs, while the call is answered, a scan it began before a publication: that
// scan's stamp is older than the publication, so it is honest, but the call had already
// found the index current with the publication patched in and must answer from that
// index, not from whatever is installed by the time it reads. On a file system with
// 2 s timestamps, so the directory's times do not move.
//
// The interleaving, held in place by hooks: a publication P of message a (queued →
// relayed) is held at its rename; a reader R' then scans (P is in flight), reads a as
// queued and is held before its next record; P finishes and patches the index; the
// reader R finds the index current, and just before it reads its answer R' finishes
// (and, before this was fixed, installed its stale scan). This is how the daemon's `status` could show a message relayed
// that a following `ls --status relayed` did not list: the daemon's change detector
// is such a second reader.
func TestListingAnswersFromTheIndexItFoundCurrent(t *testing.T) {
	// A reader that meets a publication in flight waits for it (indexRound) unless it
	// has waited its fill: here it must scan around it at once.
	waits := maxInFlightWaits
	maxInFlightWaits = 0
	t.Cleanup(func() { maxInFlightWaits = waits })
	const a, b = "00000000-0000-4000-8000-000000000001", "ffffffff-ffff-4fff-bfff-ffffffffffff" // a sorts first
	var armRename, armR, armAnswer atomic.Bool
	renameHeld, releaseRename := make(chan struct{}), make(chan struct{})
	rAtB, releaseR := make(chan struct{}), make(chan struct{})
	rDone := make(chan error, 1)
	indexAnswered = func(k record.Kind) {
		if k == record.KindMessages && armAnswer.CompareAndSwap(true, false) {
			close(releaseR)
			if err := <-rDone; err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(func() { indexAnswered = nil })
	s, err := Open(ed25519.NewKeyFromSeed(make([]byte, 32)), Options{Home: t.TempDir(), WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if op.Kind == fsx.OpRename && op.Path2 == record.Path(record.KindMessages, a) && armRename.CompareAndSwap(true, false) {
				close(renameHeld)
				<-releaseRename
			}
			return nil
		}
		return lstatGate{FS: fsx.NewCoarse(f, 2*time.Second), hook: func(name string) {
			if name == record.Path(record.KindMessages, b) && armR.CompareAndSwap(true, false) {
				close(rAtB)
				<-releaseR
			}
		}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	peer := identity.FormatDID(ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey))
	now := time.Now()
	for _, id := range []string{a, b} {
		m := &record.Message{MessageID: id, Status: record.StatusQueued, PeerOwnerDID: string(peer), RelayURL: "http://127.0.0.1:9/",
			EnvelopeDigest: envelope.Digest([]byte(id)), DeliveryDeadline: now.Add(time.Hour).UnixMilli(),
			CreatedAt: now.UnixMilli(), UpdatedAt: now.UnixMilli(), RetainUntil: now.Add(2 * time.Hour).UnixMilli()}
		if err := s.Transaction(ctx, func(tx *Tx) error { return tx.Put(m) }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.MessageSummaries(ctx); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	built := s.indexes[record.KindMessages]
	s.mu.Unlock()

	armRename.Store(true)
	pDone := make(chan error, 1)
	go func() {
		pDone <- s.Update(ctx, record.KindMessages, a, func(cur record.Record) (record.Record, error) {
			m := cur.(*record.Message)
			m.Status, m.UpdatedAt = record.StatusRelayed, m.UpdatedAt+1
			return m, nil
		})
	}()
	<-renameHeld
	armR.Store(true)
	go func() { _, err := s.MessageSummaries(ctx); rDone <- err }()
	<-rAtB
	close(releaseRename)
	if err := <-pDone; err != nil {
		t.Fatal(err)
	}
	if m, err := s.Message(a); err != nil || m == nil || m.Status != record.StatusRelayed {
		t.Fatalf("record.Message(a) after the publication: %+v %v", m, err)
	}
	armAnswer.Store(true)
	sums, err := s.MessageSummaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if armAnswer.Load() {
		t.Fatal("the reader was not answered through indexAnswered")
	}
	// The slower reader's scan, begun before the publication, must not replace the
	// patched index it started from (its round is repeated instead); if it were
	// installed it would hold a as queued.
	s.mu.Lock()
	installed := s.indexes[record.KindMessages]
	stale := installed != built && installed.messages[a].Status != record.StatusRelayed
	s.mu.Unlock()
	if stale {
		t.Fatal("the slower reader installed a scan older than the publication it raced")
	}
	status := func(sums []MessageSummary) string {
		for _, e := range sums {
			if e.MessageID == a {
				return e.Status
			}
		}
		return "absent"
	}
	if got := status(sums); got != record.StatusRelayed {
		t.Fatalf("record.Message answered relayed, then MessageSummaries %s", got)
	}
	// The slower reader's scan is not trusted by later calls either.
	if sums, err := s.MessageSummaries(ctx); err != nil || status(sums) != record.StatusRelayed {
		t.Fatalf("the next MessageSummaries: %s %v", status(sums), err)
	}
}
