package crashtest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/crashtest"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// repairConverges reruns repair on dir and checks the store is then clean and still
// holds every record that was valid in the damaged fixture (in place, or moved to
// lost+found by an earlier repair).
func repairConverges(t *testing.T, dir string, valid map[string][]byte) []string {
	ctx := context.Background()
	opts := fsck.Options{Owner: fsfixtures.OwnerDID(), Signer: fsfixtures.Owner().Signer()}
	var bad []string
	if _, err := fsck.Repair(ctx, dir, opts); err != nil {
		return []string{fmt.Sprintf("rerun of repair: %v", err)}
	}
	rep, err := fsck.Check(ctx, dir, opts)
	if err != nil {
		return []string{fmt.Sprintf("fsck after the rerun: %v", err)}
	}
	for _, f := range rep.Findings {
		if f.Severity == fsck.Problem {
			bad = append(bad, fmt.Sprintf("after the rerun fsck still finds %s %s", f.Code, f.Path))
		}
	}
	files := fsfixtures.Files(t, dir)
	moved := fsfixtures.LostFound(t, dir)
	for p, data := range valid {
		if got, ok := files[p]; ok && (string(got) == string(data) || fsfixtures.Replaced(p, data, got)) {
			continue // in place, or rewritten by a state repair as the store would
		}
		found := false
		for _, n := range moved {
			if n.From == p {
				found = true
			}
		}
		if !found {
			bad = append(bad, fmt.Sprintf("valid record %s lost", p))
		}
	}
	return bad
}

// repairFixtures are the damaged stores whose repair is explored crash state by crash
// state: the combined fixture (most kinds of damage at once), then single kinds of
// damage alone, among them those the combined one lacks (a batch missing a member; a
// flipped byte; an oversize record; a wrong id), and the state repairs (records
// rewritten by a store transaction: message-status, held-flags), so every repair
// action — quarantine, the unwinding of a broken batch, mode fixes, lock and temp
// cleanup, state rewrites — is cut at every call on its own as well as among the
// others. (The single-member fixture's half-done single is a note, which repair
// leaves to maintenance: it has no repair to explore.)
var repairFixtures = []string{
	"combined", "wrong-mode", "stale-lock",
	"flipped-byte", "batch-missing-member", "leftover-temps", "oversize-record", "wrong-id",
	"message-status", "held-flags",
}

// Crash states of a repair (mid fsck repair): a rerun converges and loses nothing.
func TestCrashStatesOfRepair(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	total := 0
	for _, name := range repairFixtures {
		n := exploreRepair(t, name)
		if n < 2 {
			t.Errorf("repair of the %s fixture made %d crash states: it repaired nothing", name, n)
		}
		total += n
	}
	t.Logf("repair of %d fixtures: %d crash states explored", len(repairFixtures), total)
}

// exploreRepair repairs the named fixture with every call recorded, then checks that a
// rerun converges from every crash state of that repair; it returns the state count.
func exploreRepair(t *testing.T, name string) int {
	dir := fsfixtures.Build(t, name)
	valid := fsfixtures.ValidRecords(t, dir)
	initial, err := crashtest.Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	var faulty *fsx.Faulty
	opts := fsck.Options{Owner: fsfixtures.OwnerDID(), Signer: fsfixtures.Owner().Signer(), WrapFS: sharedFaulty(&faulty, nil)}
	if _, err := fsck.Repair(context.Background(), dir, opts); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	states, err := crashtest.Explore(initial, faulty.Log())
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	violations := 0
	for i, st := range states {
		sdir := filepath.Join(t.TempDir(), "delivery", filepath.Base(dir))
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := st.Tree.Materialize(sdir); err != nil {
			t.Fatal(err)
		}
		ageTree(t, sdir)
		for _, v := range repairConverges(t, sdir, valid) {
			if violations++; violations <= 10 {
				t.Errorf("%s: state %d (%s): %s", name, i, st.Desc, v)
			}
		}
	}
	t.Logf("repair of the %s fixture: %d crash states explored", name, len(states))
	return len(states)
}

// A fault during recovery itself: every mutating call of a repair fails in turn; the
// repair reports an error (or absorbs a best-effort cleanup), and a rerun with the
// faults off converges without losing anything.
func TestFaultsDuringRepair(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	base := fsfixtures.Build(t, "combined")
	valid := fsfixtures.ValidRecords(t, base)
	snap, err := crashtest.Snapshot(base)
	if err != nil {
		t.Fatal(err)
	}
	var counter *fsx.Faulty
	probe := filepath.Join(t.TempDir(), "delivery", filepath.Base(base))
	os.MkdirAll(probe, 0o700)
	snap.Materialize(probe)
	ageTree(t, probe)
	if _, err := fsck.Repair(context.Background(), probe, fsck.Options{Owner: fsfixtures.OwnerDID(),
		WrapFS: sharedFaulty(&counter, nil)}); err != nil {
		t.Fatal(err)
	}
	calls := counter.Count()
	for n := 1; n <= calls; n++ {
		for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOSPC} {
			dir := filepath.Join(t.TempDir(), "delivery", filepath.Base(base))
			os.MkdirAll(dir, 0o700)
			if err := snap.Materialize(dir); err != nil {
				t.Fatal(err)
			}
			ageTree(t, dir)
			var f *fsx.Faulty
			opts := fsck.Options{Owner: fsfixtures.OwnerDID(), WrapFS: sharedFaulty(&f, fsx.FailNth(n, errno))}
			fsck.Repair(context.Background(), dir, opts) // may fail: that is the point
			for _, v := range repairConverges(t, dir, valid) {
				t.Errorf("repair call %d failing with %v: %s", n, errno, v)
			}
		}
	}
	t.Logf("repair of the combined fixture: %d calls × 2 errnos", calls)
}

// sharedFaulty returns a WrapFS that wraps every file system fsck opens for one store
// in the same recording Faulty (fsck opens several), so calls are numbered across them.
func sharedFaulty(f **fsx.Faulty, inject func(fsx.Op) error) func(fsx.FS) fsx.FS {
	return func(inner fsx.FS) fsx.FS {
		if *f == nil {
			*f = fsx.NewFaulty(inner)
			(*f).Inject = inject
		}
		return *f
	}
}

// A stale lock taken over in place by the next writer (free record, then its own
// details), crashed at every point of the take-over and of the write after it:
// covered by the stale-lock-break workload of TestCrashStates.
func staleLockWorkload() workload {
	return workload{name: "stale-lock-break", remount: true, setup: func(t *testing.T, s *store.Store, c *clock) {
		// A lock left by a process that died: its pid no longer exists.
		lock := fmt.Sprintf(`{"pid":%d,"host":"gone","time":%q}`, 1<<22+7, time.Unix(0, 0).UTC().Format(time.RFC3339Nano))
		if err := os.WriteFile(filepath.Join(s.Dir(), ".lock"), []byte(lock), 0o600); err != nil {
			t.Fatal(err)
		}
		old := time.Unix(86400, 0)
		os.Chtimes(filepath.Join(s.Dir(), ".lock"), old, old)
	}, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
		m := newMessage(c.Now())
		if err := put(context.Background(), s, m); err != nil {
			t.Fatal(err)
		}
		ack(m)
	}}
}
