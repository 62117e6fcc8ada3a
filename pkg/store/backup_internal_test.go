package store

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// TestBackupFinalHoldReadsTheEvents: a record published after the last pass and
// before the final hold — with the background drain held off, so only the hold's own
// drain of the events can see it — is copied in its new version: the hold learns of
// every publication made before it, whoever made it.
func TestBackupFinalHoldReadsTheEvents(t *testing.T) {
	seed := make([]byte, ed25519.SeedSize)
	owner, err := identity.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	seed[0] = 9
	peer := identity.FormatDID(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey))
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	writer, err := Open(owner.Signer(), Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	var envs []string
	for range 20 {
		id := uuid.NewString()
		env, _ := json.Marshal(map[string]any{"envelopeId": id})
		req := SendRequest{MessageID: uuid.NewString(), PeerOwnerDID: peer, RelayURL: "http://127.0.0.1:9/relay",
			DeliveryDeadline: time.Now().Add(time.Hour), Envelopes: []OutgoingEnvelope{{EnvelopeID: id, Kind: record.EnvelopeMessage, Envelope: env}}}
		if _, err := writer.Enqueue(ctx, req); err != nil {
			t.Fatal(err)
		}
		envs = append(envs, id)
	}
	// The backup runs on its own Store of the directory, as another process would.
	bs, err := Open(owner.Signer(), Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { backupDrainEvery = d }(backupDrainEvery)
	backupDrainEvery = time.Hour
	holds := 0
	backupBeforeFinalHold = func() {
		holds++
		if holds > 1 {
			return
		}
		for _, id := range envs[:3] {
			if err := writer.Update(ctx, record.KindOutbox, id, func(cur record.Record) (record.Record, error) {
				o := record.Clone(cur).(*record.Outbox)
				o.Attempts++
				return o, nil
			}); err != nil {
				t.Error(err)
			}
		}
	}
	defer func() { backupBeforeFinalHold = nil }()
	dest := filepath.Join(t.TempDir(), "copy")
	rep, err := bs.Backup(ctx, dest, BackupOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Watch != "inotify" {
		t.Skipf("watch %s: this test is about the events", rep.Watch)
	}
	for _, id := range envs {
		p := record.Path(record.KindOutbox, id)
		want, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dest, p))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: the copy is not the store's version (%v)", p, err)
		}
	}
}
