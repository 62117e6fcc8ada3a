package store

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// Publications queued at the same moment are published in one lock hold with one
// fsync per directory: three one-envelope enqueues → 2 directory fsyncs (outbox after
// the members, messages after the message records that commit them), not 6.
func TestGroupCommitOneHold(t *testing.T) {
	var faulty *fsx.Faulty
	s, err := Open(ed25519.NewKeyFromSeed(make([]byte, 32)), Options{Home: t.TempDir(), WrapFS: func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		return faulty
	}})
	if err != nil {
		t.Fatal(err)
	}
	peer := identity.FormatDID(ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey))
	ctx := context.Background()
	var pubs []*publication
	for i := 0; i < 4; i++ {
		env := json.RawMessage(`{"n":` + string(rune('0'+i)) + `}`)
		req := SendRequest{MessageID: uuid.NewString(), PeerOwnerDID: peer, RelayURL: "http://127.0.0.1:9/",
			DeliveryDeadline: time.Now().Add(time.Hour),
			Envelopes:        []OutgoingEnvelope{{EnvelopeID: uuid.NewString(), Kind: record.EnvelopeMessage, Envelope: env}}}
		plan, _, err := s.plan(ctx, func(tx *Tx) error { _, err := s.planEnqueue(tx, req); return err })
		if err != nil {
			t.Fatal(err)
		}
		if err := s.stage(ctx, plan.writes); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// The first publishes alone (it also creates the directories).
			if err := s.commit(ctx, &publication{plan: plan}); err != nil {
				t.Fatal(err)
			}
			faulty.Reset()
			continue
		}
		pubs = append(pubs, &publication{plan: plan, done: make(chan struct{}), lead: make(chan struct{})})
	}
	s.pubQueue, s.pubLeader = pubs, true
	s.leadGroup(ctx)
	syncDirs, renames := 0, 0
	for _, op := range faulty.Log() {
		switch op.Kind {
		case fsx.OpSyncDir:
			syncDirs++
		case fsx.OpRename:
			renames++
		}
	}
	for _, p := range pubs {
		if p.err != nil {
			t.Fatal(p.err)
		}
	}
	if renames != 6 || syncDirs != 2 {
		t.Fatalf("3 enqueues in one hold: %d renames (want 6), %d directory fsyncs (want 2)", renames, syncDirs)
	}
	// and the message records, which commit the members, were renamed after the
	// members' directory was fsynced
	log := faulty.Log()
	lastMemberSync, firstCommit := -1, -1
	for i, op := range log {
		if op.Kind == fsx.OpSyncDir && op.Path == "outbox" {
			lastMemberSync = i
		}
		if op.Kind == fsx.OpRename && firstCommit < 0 && len(op.Path2) > 9 && op.Path2[:9] == "messages/" {
			firstCommit = i
		}
	}
	if lastMemberSync < 0 || firstCommit < lastMemberSync {
		t.Fatalf("a message record was renamed (op %d) before its member was durable (op %d)", firstCommit, lastMemberSync)
	}
}
