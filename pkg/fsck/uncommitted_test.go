package fsck_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// interruptedSend enqueues a message of n envelopes through the store itself and
// fails it at its commit — the publication of its marker (n > 1) or of the message
// record that commits its single (n = 1) — as a send stopped there (a SIGTERM, a
// crash, a full disk) leaves it: never acknowledged.
func interruptedSend(t *testing.T, s *store.Store, f *fsx.Faulty, n int) {
	t.Helper()
	commit := string(record.KindBatches) + "/"
	if n == 1 {
		commit = string(record.KindMessages) + "/"
	}
	f.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, commit) {
			return syscall.EIO
		}
		return nil
	}
	defer func() { f.Inject = nil }()
	peer := fsfixtures.OwnerDID() // any valid did:key
	req := store.SendRequest{MessageID: uuid.NewString(), PeerOwnerDID: peer, RelayURL: "http://127.0.0.1:9/",
		DeliveryDeadline: time.Now().Add(time.Hour)}
	for i := range n {
		id := uuid.NewString()
		env, _ := json.Marshal(map[string]any{"envelopeId": id})
		kind := record.EnvelopeMessage
		if i > 0 {
			kind = record.EnvelopeDeliveryStatus
		}
		req.Envelopes = append(req.Envelopes, store.OutgoingEnvelope{EnvelopeID: id, Kind: kind, Envelope: env})
	}
	if _, err := s.Enqueue(ctx, req); !errors.Is(err, syscall.EIO) {
		t.Fatalf("the interrupted send: %v, want the injected EIO", err)
	}
}

// Sends interrupted before they committed (never acknowledged) leave outbox records
// that nothing commits. That is a normal state, which maintenance clears: fsck lists
// each as a note and finds no problem (exit 0), so that a problem (exit 4) means
// damage. On the code before, each was an orphan-outbox problem.
func TestInterruptedSendsAreNotes(t *testing.T) {
	var f *fsx.Faulty
	s, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Home: t.TempDir(), WrapFS: func(inner fsx.FS) fsx.FS {
		f = fsx.NewFaulty(inner)
		return f
	}})
	if err != nil {
		t.Fatal(err)
	}
	interruptedSend(t, s, f, 3) // members and message, no marker
	interruptedSend(t, s, f, 1) // a single, without the message record that commits it
	opts := fsck.Options{Owner: fsfixtures.OwnerDID()}
	rep := check(t, s.Dir(), opts)
	if rep.Problems() != 0 {
		t.Fatalf("interrupted sends reported as problems: %+v", rep.Findings)
	}
	n := 0
	for _, f := range rep.Findings {
		if f.Code == fsck.CodeOutboxUncommitted {
			n++
			if f.Severity != fsck.Note || f.Repairable {
				t.Errorf("%+v: want a note", f)
			}
		}
	}
	if n != 4 {
		t.Fatalf("%d outbox-uncommitted notes, want 4 (3 members, 1 single): %+v", n, rep.Findings)
	}
	if _, err := s.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range check(t, s.Dir(), opts).Findings {
		if f.Code == fsck.CodeOutboxUncommitted {
			t.Errorf("after maintenance: %+v", f)
		}
	}
}

// Damage is still a problem: the present members of a batch whose marker lists a
// missing member (the batch can never be delivered whole) are orphan-outbox
// problems, unwound with their marker — never notes.
func TestOrphanOfABrokenBatchIsAProblem(t *testing.T) {
	dir := fsfixtures.Build(t, "batch-missing-member")
	rep := check(t, dir, fsck.Options{Owner: fsfixtures.OwnerDID()})
	found := false
	for _, f := range rep.Findings {
		if f.Code == fsck.CodeOrphanOutbox {
			found = true
			if f.Severity != fsck.Problem || !f.Repairable {
				t.Errorf("%+v: want a repairable problem", f)
			}
		}
		if f.Code == fsck.CodeOutboxUncommitted {
			t.Errorf("a member of a broken batch reported as a normal state: %+v", f)
		}
	}
	if !found {
		t.Fatalf("no orphan-outbox problem for the broken batch's members: %+v", rep.Findings)
	}
}

// A repair interrupted between a broken batch's marker and its members (markers move
// first) leaves members without a marker, like an interrupted send — but their marker
// is in lost+found: they are still orphan-outbox problems, and the next repair moves
// them after it, instead of leaving them for maintenance to delete.
func TestInterruptedUnwindingStaysAProblem(t *testing.T) {
	dir := fsfixtures.Build(t, "batch-missing-member")
	opts := fsck.Options{Owner: fsfixtures.OwnerDID()}
	members := 0
	for _, f := range check(t, dir, opts).Findings {
		if f.Code == fsck.CodeOrphanOutbox {
			members++
		}
	}
	if members == 0 {
		t.Fatal("the fixture has no member to unwind")
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	io := opts
	io.OnRepair = func(a fsck.ActionResult) {
		if a.Code == fsck.CodeBatchMissingMember && a.Result == fsck.ResultDone {
			cancel() // the marker is in lost+found; stop before its members
		}
	}
	if _, err := fsck.Repair(cctx, dir, io); !errors.Is(err, context.Canceled) {
		t.Fatalf("the interrupted repair: %v", err)
	}
	rep := check(t, dir, opts)
	n := 0
	for _, f := range rep.Findings {
		switch f.Code {
		case fsck.CodeOrphanOutbox:
			n++
			if !strings.Contains(f.Explanation, "moved to lost+found by an earlier repair") || !f.Repairable {
				t.Errorf("%+v", f)
			}
		case fsck.CodeOutboxUncommitted:
			t.Errorf("a member of a batch being unwound reported as a normal state: %+v", f)
		}
	}
	if n != members {
		t.Fatalf("%d orphan-outbox problems after the interrupted repair, want %d: %+v", n, members, rep.Findings)
	}
	rr := repair(t, dir, opts)
	if rr.After.Problems() != 0 || len(rr.Actions) != members {
		t.Fatalf("the next repair: %d actions, %+v left", len(rr.Actions), rr.After.Findings)
	}
}
