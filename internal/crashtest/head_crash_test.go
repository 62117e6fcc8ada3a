package crashtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/crashtest"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The head workloads (DESIGN §5, "The head"): commits, then WriteHead (.head
// replaced durably in the store directory, then the local witness in
// <data root>/witness/), then a relay's head witnessed. The store lives in a data
// root and one recorder (homeRecorder) takes the calls of the store's and the
// witness's file systems, so each crash state holds both trees and their order.

// headAck is a head WriteHead (or Reconcile) returned after the first at calls: a
// relay may have seen it, so no crash state may have a lower .head.
type headAck struct {
	at  int
	seq int64
}

type headWorkload struct {
	name  string
	setup func(t *testing.T, s *store.Store, c *clock)
	run   func(t *testing.T, s *store.Store, c *clock, ack func(*envelope.StoreHead))
	// rolledBefore: the store is rolled back when run starts (Reconcile's workload):
	// a state before the first acknowledgement may still be rolled back.
	rolledBefore bool
}

func openHome(t testing.TB, home string, c *clock, wrap func(fsx.FS) fsx.FS) (*store.Store, error) {
	return store.Open(owner(t).Signer(), store.Options{Home: home, Now: c.Now, WrapFS: wrap, WrapWitnessFS: wrap, LockWait: 5 * time.Second})
}

func mustOpenHome(t testing.TB, home string, c *clock, wrap func(fsx.FS) fsx.FS) *store.Store {
	s, err := openHome(t, home, c, wrap)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustEnqueue(t *testing.T, s *store.Store, c *clock) {
	if _, err := s.Enqueue(context.Background(), sendRequest(c.Now(), 1)); err != nil {
		t.Fatal(err)
	}
}

func mustWriteHead(t *testing.T, s *store.Store, force bool) (*envelope.StoreHead, []byte) {
	h, data, err := s.WriteHead(context.Background(), force)
	if err != nil || h == nil {
		t.Fatalf("WriteHead: %+v %v", h, err)
	}
	return h, data
}

func headWorkloads() []headWorkload {
	return []headWorkload{
		{name: "head-first-write", setup: func(t *testing.T, s *store.Store, c *clock) {
			mustEnqueue(t, s, c) // a store from before heads: no .head, no witness/
		}, run: func(t *testing.T, s *store.Store, c *clock, ack func(*envelope.StoreHead)) {
			// Forced: the commit was another Store's (process's).
			h, _ := mustWriteHead(t, s, true)
			ack(h)
		}},
		{name: "head-commits-heads-witness", setup: func(t *testing.T, s *store.Store, c *clock) {
			mustEnqueue(t, s, c)
			mustWriteHead(t, s, false)
		}, run: func(t *testing.T, s *store.Store, c *clock, ack func(*envelope.StoreHead)) {
			mustEnqueue(t, s, c)
			h, data := mustWriteHead(t, s, false)
			ack(h)
			// The relay saw the head just written: nothing to do.
			if err := s.Witness(data, "https://relay.example"); err != nil {
				t.Fatalf("Witness of the current head: %v", err)
			}
			mustEnqueue(t, s, c)
			h, _ = mustWriteHead(t, s, false)
			ack(h)
		}},
		{name: "head-reconcile", rolledBefore: true, setup: func(t *testing.T, s *store.Store, c *clock) {
			mustEnqueue(t, s, c)
			mustWriteHead(t, s, false)
			relayHead, err := envelope.SignStoreHead(owner(t).Signer(), envelope.StoreHead{Owner: owner(t).DID(), Format: store.FormatVersion, Seq: 4, Time: c.Now()})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Witness(relayHead, "https://relay.example"); !errors.Is(err, errcode.StoreRolledBack) {
				t.Fatalf("Witness of a head ahead: %v", err)
			}
		}, run: func(t *testing.T, s *store.Store, c *clock, ack func(*envelope.StoreHead)) {
			if s.RolledBack() == nil {
				t.Fatal("the reconcile workload's store is not rolled back")
			}
			if err := s.Reconcile(context.Background(), 4, func(tx *store.Tx) error { return tx.Put(fixedMessage(c)) }); err != nil {
				t.Fatal(err)
			}
			h, _ := s.Head()
			ack(h)
		}},
	}
}

// exploreHead runs w on a store in a data root recorded as one tree, explores its
// crash states and checks checkHeadState on each. If until is set, it stops once
// there is a violation containing each of its strings (a weakened protocol, caught).
func exploreHead(t *testing.T, w headWorkload, weaken func(rec *homeRecorder, storeRel string), until ...string) result {
	t.Helper()
	c := &clock{}
	c.ns.Store(time.Now().UnixNano())
	home := t.TempDir()
	s := mustOpenHome(t, home, c, nil)
	if w.setup != nil {
		w.setup(t, s, c)
	}
	initial, err := crashtest.Snapshot(home)
	if err != nil {
		t.Fatal(err)
	}
	rec := newHomeRecorder(home)
	storeRel, _ := filepath.Rel(home, s.Dir())
	if weaken != nil {
		weaken(rec, filepath.ToSlash(storeRel))
	}
	s = mustOpenHome(t, home, c, rec.wrap)
	var acks []headAck
	w.run(t, s, c, func(h *envelope.StoreHead) { acks = append(acks, headAck{at: rec.faulty.Count(), seq: h.Seq}) })
	var bounds []int
	for _, a := range acks {
		bounds = append(bounds, a.at)
	}
	states, err := crashtest.Explore(initial, rec.faulty.Log(), bounds...)
	if err != nil {
		t.Fatal(err)
	}
	res := result{states: len(states)}
	for i, st := range states {
		dir := t.TempDir()
		if err := st.Tree.Materialize(dir); err != nil {
			t.Fatal(err)
		}
		ageTree(t, dir)
		bad := checkHeadState(t, dir, c, w, st, acks)
		for _, v := range bad {
			res.violations = append(res.violations, fmt.Sprintf("state %d (%s): %s", i, st.Desc, v))
		}
		os.RemoveAll(dir)
		if len(until) > 0 && !slices.ContainsFunc(until, func(want string) bool {
			return !slices.ContainsFunc(res.violations, func(v string) bool { return strings.Contains(v, want) })
		}) {
			break
		}
	}
	return res
}

// checkHeadState checks the head invariants on the crash state in the data root
// home:
//
//   - the store opens: .head, if there, is a whole head of the owner's (so is the
//     witness);
//   - it is not rolled back (no false positive), unless the workload started rolled
//     back and had acknowledged nothing yet;
//   - every head acknowledged before the crash is at or below .head (a relay may have
//     seen it; a .head below it would be a false rollback at the next post);
//   - the witness is never above .head (the same rule, locally);
//   - fsck finds no problem with the head (head-invalid; store-rolled-back, with the
//     exception above) and none it cannot repair;
//   - the store accepts a commit and a head above every seq acknowledged.
func checkHeadState(t *testing.T, home string, c *clock, w headWorkload, st crashtest.State, acks []headAck) []string {
	var bad []string
	acked := int64(0)
	for _, a := range acks {
		if a.at <= st.Prefix {
			acked = max(acked, a.seq)
		}
	}
	s, err := openHome(t, home, c, nil)
	if err != nil {
		return []string{fmt.Sprintf("the store does not open: %v", err)}
	}
	if err := s.RolledBack(); err != nil && !(w.rolledBefore && acked == 0) {
		bad = append(bad, fmt.Sprintf("reported rolled back: %v", err))
	}
	headSeq := int64(0)
	if h, _ := s.Head(); h != nil {
		headSeq = h.Seq
	}
	if headSeq < acked {
		bad = append(bad, fmt.Sprintf(".head has seq %d, below the acknowledged head %d", headSeq, acked))
	}
	wf := dataroot.WitnessFile(home, string(owner(t).DID()))
	if data, err := os.ReadFile(wf); err == nil {
		wh, err := envelope.ParseStoreHead(data)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("the witness does not parse: %v", err))
		case wh.Seq > headSeq && !(w.rolledBefore && acked == 0):
			bad = append(bad, fmt.Sprintf("the witness (seq %d) is above .head (seq %d)", wh.Seq, headSeq))
		}
	}
	rep, err := fsck.Check(context.Background(), s.Dir(), fsck.Options{Owner: owner(t).DID()})
	if err != nil {
		bad = append(bad, fmt.Sprintf("fsck: %v", err))
	} else {
		mayBeRolledBack := w.rolledBefore && acked == 0
		for _, f := range rep.Findings {
			if f.Code == fsck.CodeStoreRolledBack && mayBeRolledBack {
				continue
			}
			if f.Severity == fsck.Problem && (!f.Repairable || strings.HasPrefix(string(f.Code), "head") || f.Code == fsck.CodeStoreRolledBack) {
				bad = append(bad, fmt.Sprintf("fsck: %s %s: %s", f.Code, f.Path, f.Explanation))
			}
		}
	}
	if len(bad) > 0 || (w.rolledBefore && acked == 0) {
		return bad
	}
	if _, err := s.Enqueue(context.Background(), sendRequest(c.Now(), 1)); err != nil {
		return append(bad, fmt.Sprintf("the store does not accept a commit: %v", err))
	}
	h, _, err := s.WriteHead(context.Background(), false)
	switch {
	case err != nil:
		bad = append(bad, fmt.Sprintf("the store does not write a head: %v", err))
	case h.Seq <= acked:
		bad = append(bad, fmt.Sprintf("the next head has seq %d, not above the acknowledged %d", h.Seq, acked))
	}
	return bad
}

func TestCrashStatesOfHead(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	total := 0
	for _, w := range headWorkloads() {
		t.Run(w.name, func(t *testing.T) {
			total += report(t, w.name, exploreHead(t, w, nil))
		})
	}
	t.Logf("%d crash states explored in all", total)
}

// The test of the test: without the fsync of .head's temp, or without the fsync of
// the store directory after its rename, some crash state must break an invariant (a
// torn or empty .head that does not parse; a .head that went back below the
// acknowledged head and the witness: a false rollback).
func TestCrashExplorerCatchesWeakenedHeadProtocol(t *testing.T) {
	t.Parallel()
	isHeadTemp := func(storeRel string, op fsx.Op) bool {
		return path.Dir(op.Path) == storeRel && fsx.IsTempName(path.Base(op.Path))
	}
	for _, c := range []struct {
		name   string
		weaken func(rec *homeRecorder, storeRel string)
		want   []string
	}{
		{"no-head-file-fsync", func(rec *homeRecorder, storeRel string) {
			rec.faulty.DropIf = func(op fsx.Op) bool { return op.Kind == fsx.OpSync && isHeadTemp(storeRel, op) }
		}, []string{"does not open"}},
		{"no-store-dir-fsync", func(rec *homeRecorder, storeRel string) {
			rec.faulty.DropIf = func(op fsx.Op) bool { return op.Kind == fsx.OpSyncDir && op.Path == storeRel }
		}, []string{"rolled back", "below the acknowledged head"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, w := range headWorkloads()[:2] {
				res := exploreHead(t, w, c.weaken, c.want...)
				if len(res.violations) == 0 {
					t.Errorf("%s: %d states explored and no violation found: the explorer is too weak", w.name, res.states)
					continue
				}
				for _, want := range c.want {
					if !slices.ContainsFunc(res.violations, func(v string) bool { return strings.Contains(v, want) }) {
						t.Errorf("%s: no violation says %q; e.g. %s", w.name, want, res.violations[0])
					}
				}
				t.Logf("%s: caught (%d violations), e.g. %s", w.name, len(res.violations), res.violations[0])
			}
		})
	}
}
