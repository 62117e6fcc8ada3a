package store_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Retention removes a batch's marker before its members, in a step whose removal is
// durable before the members' step, so no crash leaves a marker with members missing
// (a broken batch). Here the batch is past retention and step 1 cannot finish it (its
// message record is damaged), so retention removes it.
func TestRetentionRemovesTheMarkerBeforeItsMembers(t *testing.T) {
	clock := newTestClock(time.Now())
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{Now: clock.Now, WrapFS: func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		return faulty
	}})
	req := sendRequest(t, 2)
	req.DeliveryDeadline = clock.Now().Add(time.Minute)
	if _, err := s.Enqueue(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	msgFile := filepath.Join(s.Dir(), string(record.KindMessages), req.MessageID+".json")
	if err := os.WriteFile(msgFile, []byte("damaged\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	clock.Advance(8 * 24 * time.Hour)
	faulty.Reset()
	rep, err := s.Maintain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) == 0 {
		t.Fatal("maintenance read the damaged message record without an error")
	}
	markerGone, syncedAfter := false, false
	members := 0
	for _, op := range faulty.Log() {
		switch {
		case op.Kind == fsx.OpRemove && strings.HasPrefix(op.Path, "batches/"):
			markerGone = true
		case op.Kind == fsx.OpSyncDir && op.Path == string(record.KindBatches) && markerGone:
			syncedAfter = true
		case op.Kind == fsx.OpRemove && strings.HasPrefix(op.Path, "outbox/"):
			if !syncedAfter {
				t.Fatalf("member %s unlinked before its marker's removal was durable", op.Path)
			}
			members++
		}
	}
	if !markerGone || members != 2 {
		t.Fatalf("marker removed %v, %d members removed; want the whole batch gone", markerGone, members)
	}
}
