package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/crashtest"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The crash states of one group commit of conflicting and independent plans
// (DESIGN §9, §16). Six plans are published together, as the group-commit leader
// publishes plans queued at one moment:
//
//	0-2  BeginOperation with key "k" (one request): 0 wins, 1 and 2 read the binding 0
//	     writes last and are stale;
//	3    BeginOperation with key "k2": independent;
//	4-5  one-envelope Enqueues of one message id with different envelopes: 4 wins, 5
//	     read the message record 4 writes last and is stale.
//
// Every crash state of that hold is rebuilt and checked: every record it acknowledged
// is there (once the hold returned), nothing that reads is a record never written, no
// record of a stale plan was published (one key, one operation; one message id, one
// set of envelopes), every marker's batch is whole, fsck repairs what it finds and
// then finds nothing, and the store takes a new write.
func TestCrashStatesOfConflictingGroup(t *testing.T) {
	for _, weak := range []struct {
		name   string
		weaken func(*fsx.Faulty)
	}{{"", nil}, {"no-directory-fsync", func(f *fsx.Faulty) { f.DropSyncDir = true }}} {
		states, violations := exploreConflictingGroup(t, weak.weaken, weak.weaken != nil)
		switch {
		case weak.weaken == nil && len(violations) > 0:
			t.Errorf("%d of %d states violate an invariant, e.g.:\n%s", len(violations), states, strings.Join(violations[:min(5, len(violations))], "\n"))
		case weak.weaken == nil:
			t.Logf("%d crash states of a group of 6 plans (3 conflicting on one key, 2 on one message id)", states)
		case len(violations) == 0:
			t.Errorf("%s: %d states and no violation: the checks cannot fail", weak.name, states)
		}
	}
}

// exploreConflictingGroup returns how many states it explored and the violations it
// found, stopping at the first if firstOnly.
func exploreConflictingGroup(t *testing.T, weaken func(*fsx.Faulty), firstOnly bool) (int, []string) {
	t.Helper()
	clock := newTestClock(time.Now())
	dir := dataroot.StoreDir(t.TempDir(), string(ownerIdentity(t).DID()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	open := func(dir string, wrap func(fsx.FS) fsx.FS) *store.Store {
		return openStore(t, store.Options{Dir: dir, Now: clock.Now, WrapFS: wrap})
	}
	warmUp(t, open(dir, nil)) // directories and the generation file exist
	initial, err := crashtest.Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	var faulty *fsx.Faulty
	s := open(dir, func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		if weaken != nil {
			weaken(faulty)
		}
		return faulty
	})
	single := sendRequest(t, 1)
	rival := single
	rival.Envelopes = []store.OutgoingEnvelope{{EnvelopeID: uuid.NewString(), Kind: record.EnvelopeMessage,
		Envelope: json.RawMessage(`{"rival":true}`)}}
	errs := s.CommitAsOneGroup(context.Background(),
		s.PlanBegin("k", []byte(`{}`)), s.PlanBegin("k", []byte(`{}`)), s.PlanBegin("k", []byte(`{}`)),
		s.PlanBegin("k2", []byte(`{}`)),
		s.PlanEnqueue(single), s.PlanEnqueue(rival))
	for i, want := range []error{nil, store.ErrStalePlan, store.ErrStalePlan, nil, nil, store.ErrStalePlan} {
		if !errors.Is(errs[i], want) && errs[i] != want {
			t.Fatalf("plan %d of the group: %v, want %v (all: %v)", i, errs[i], want, errs)
		}
	}
	acked := faulty.Count() // every record of the accepted plans is acknowledged from here
	log := faulty.Log()

	// What the accepted plans wrote, read back from the live store.
	var live []record.Record
	for _, k := range record.Kinds {
		ids, _ := s.List(k)
		for _, id := range ids {
			if r, err := s.Get(k, id); err == nil && r != nil {
				live = append(live, r)
			}
		}
	}
	written := writtenVersions(t, initial, log)
	states, err := crashtest.Explore(initial, log, acked)
	if err != nil {
		t.Fatal(err)
	}
	var violations []string
	for i, st := range states {
		sdir := dataroot.StoreDir(t.TempDir(), string(ownerIdentity(t).DID()))
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := st.Tree.Materialize(sdir); err != nil {
			t.Fatal(err)
		}
		for _, v := range checkGroupState(t, open(sdir, nil), sdir, st.Prefix >= acked, live, written, rival) {
			violations = append(violations, fmt.Sprintf("state %d (%s): %s", i, st.Desc, v))
		}
		os.RemoveAll(sdir)
		if firstOnly && len(violations) > 0 {
			break
		}
	}
	return len(states), violations
}

// writtenVersions parses every record the initial tree holds and the log wrote (temps
// included), by record path: the only records a crash state may show.
func writtenVersions(t *testing.T, initial *crashtest.Tree, log []fsx.Op) map[string][]record.Record {
	t.Helper()
	id := ownerIdentity(t)
	out := map[string][]record.Record{}
	parse := func(path string, data []byte) {
		kind, _, ok := strings.Cut(path, "/")
		var h struct {
			ID string `json:"id"`
		}
		if !ok || !record.Kind(kind).Valid() || json.Unmarshal(data, &h) != nil {
			return
		}
		if r, err := record.Parse(record.Kind(kind), h.ID, data, id.DID(), id.Public()); err == nil {
			p := record.Path(record.Kind(kind), h.ID)
			out[p] = append(out[p], r)
		}
	}
	for _, n := range initial.Files() {
		parse(n, initial.Inodes[initial.Names[n]])
	}
	for _, op := range log {
		if op.Kind == fsx.OpWrite && op.Offset == 0 {
			parse(op.Path, op.Data)
		}
	}
	return out
}

// checkGroupState checks one crash state of the group (see
// TestCrashStatesOfConflictingGroup).
func checkGroupState(t *testing.T, s *store.Store, dir string, acked bool, live []record.Record, written map[string][]record.Record, rival store.SendRequest) []string {
	t.Helper()
	var bad []string
	ops := 0
	for _, k := range record.Kinds {
		ids, err := s.List(k)
		if err != nil {
			bad = append(bad, fmt.Sprintf("list %s: %v", k, err))
			continue
		}
		for _, id := range ids {
			r, err := s.Get(k, id)
			if err != nil {
				if !errors.Is(err, errcode.OutboxStoreInvalid) {
					bad = append(bad, fmt.Sprintf("%s/%s: %v", k, id, err))
				}
				continue
			}
			if r == nil {
				continue
			}
			p := record.Path(k, id)
			if !slices.ContainsFunc(written[p], func(w record.Record) bool { return reflect.DeepEqual(w, r) }) {
				bad = append(bad, fmt.Sprintf("%s reads as a record never written", p))
			}
			if k == record.KindOperations {
				ops++
			}
		}
	}
	// The warm-up's operation, and one per key of the group: a stale plan published
	// nothing.
	if ops > 3 {
		bad = append(bad, fmt.Sprintf("%d operation records: a stale plan's operation was published", ops))
	}
	if r, _ := s.Get(record.KindOutbox, rival.Envelopes[0].EnvelopeID); r != nil {
		bad = append(bad, "the stale rival enqueue's envelope was published")
	}
	if m, _ := store.GetAs[*record.Message](s, rival.MessageID); m != nil && m.EnvelopeDigest == envelope.Digest(rival.Envelopes[0].Envelope) {
		bad = append(bad, "the message record is the stale rival's")
	}
	// Once the hold returned, everything it acknowledged is there.
	if acked {
		for _, want := range live {
			got, err := s.Get(want.Kind(), want.RecordID())
			if err != nil || !reflect.DeepEqual(got, want) {
				bad = append(bad, fmt.Sprintf("acknowledged %s/%s lost (%v)", want.Kind(), want.RecordID(), err))
			}
		}
	}
	batches, _ := s.List(record.KindBatches)
	for _, b := range batches {
		if _, err := s.Committed(b); err != nil {
			bad = append(bad, fmt.Sprintf("batch %s broken: %v", b, err))
		}
	}
	// fsck repairs what it finds, then finds nothing, and the store takes a write.
	opts := fsck.Options{Owner: ownerIdentity(t).DID(), Signer: ownerIdentity(t).Signer()}
	rep, err := fsck.Check(context.Background(), dir, opts)
	if err != nil {
		return append(bad, fmt.Sprintf("fsck: %v", err))
	}
	if rep.Problems() > 0 {
		if _, err := fsck.Repair(context.Background(), dir, opts); err != nil {
			return append(bad, fmt.Sprintf("fsck repair: %v", err))
		}
		again, err := fsck.Check(context.Background(), dir, opts)
		if err != nil || again.Problems() > 0 {
			bad = append(bad, fmt.Sprintf("fsck after repair: %v, %d problems", err, again.Problems()))
		}
	}
	if _, err := s.Enqueue(context.Background(), sendRequest(t, 1)); err != nil {
		bad = append(bad, fmt.Sprintf("the store takes no new write: %v", err))
	}
	return bad
}
