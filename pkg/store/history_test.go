package store_test

import (
	"context"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// lstatCounter counts the Lstat calls of a store on the record directories, and
// passes ReadDirInos through to the file system beneath (os) so that the wrapping
// does not hide it.
type lstatCounter struct {
	fsx.FS
	os     fsx.FS
	lstats *atomic.Int64
}

func (c lstatCounter) Lstat(name string) (fsx.Info, error) {
	if filepath.Dir(name) != "." { // a record, not a kind directory or the generation
		c.lstats.Add(1)
	}
	return c.FS.Lstat(name)
}

func (c lstatCounter) ReadDirInos(name string) ([]fsx.DirInode, error) {
	return c.os.(fsx.InoLister).ReadDirInos(name)
}

// historyStore opens a store on a directory holding n settled messages, its indexes
// prepared, with its record lstats counted and, if inject is set, its file system
// calls passed to inject first (fsx.Faulty).
func historyStore(t *testing.T, dir string, n int, lstats *atomic.Int64, inject func(fsx.Op) error) *store.Store {
	t.Helper()
	s := openStore(t, store.Options{Dir: dir, Limits: historyLimits, WrapFS: func(inner fsx.FS) fsx.FS {
		var fs fsx.FS = inner
		if inject != nil {
			f := fsx.NewFaulty(inner)
			f.Inject = inject
			fs = f
		}
		return lstatCounter{FS: fs, os: inner, lstats: lstats}
	}})
	if err := s.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// A reader of the messages index while one of this Store's publications is in flight
// (between its rename and its generation mark) sees the new record without an lstat
// per stored message: the record lstats of that call do not grow with the history.
func TestIndexReadDuringOwnPublicationDoesNotScanHistory(t *testing.T) {
	store.NoInFlightWaits(t) // the read runs inside the publication: it must not wait for it
	perCall := map[int]int64{}
	for _, n := range []int{10, 1000} {
		dir := filepath.Join(t.TempDir(), "store")
		writeHistory(t, dir, n)
		var lstats atomic.Int64
		var s *store.Store
		var msgID string
		var renamed, checked atomic.Bool
		var during int64
		var status string
		s = historyStore(t, dir, n, &lstats, func(op fsx.Op) error {
			switch {
			case msgID == "":
			case op.Kind == fsx.OpRename && op.Path2 == "messages/"+msgID+".json":
				renamed.Store(true)
			case op.Kind == fsx.OpWrite && op.Path == store.GenerationFile && renamed.Load() && !checked.Swap(true):
				before := lstats.Load()
				sums, err := s.MessageSummaries(context.Background())
				if err != nil {
					t.Error(err)
				}
				during = lstats.Load() - before
				for _, m := range sums {
					if m.MessageID == msgID {
						status = m.Status
					}
				}
			}
			return nil
		})
		_, m := enqueue(t, s, 1)
		msgID = m.MessageID
		err := s.Transaction(context.Background(), func(tx *store.Tx) error {
			m, err := store.TxGet[*record.Message](tx, msgID)
			if err != nil {
				return err
			}
			m.Status, m.UpdatedAt = record.StatusRelayed, m.UpdatedAt+1
			return tx.Put(m)
		})
		if err != nil {
			t.Fatal(err)
		}
		if !checked.Load() || status != record.StatusRelayed {
			t.Fatalf("n=%d: the summaries read during the publication show %q, want %q", n, status, record.StatusRelayed)
		}
		perCall[n] = during
	}
	if perCall[1000] > perCall[10]+4 {
		t.Fatalf("record lstats of one index read during an own publication: %d with 10 messages, %d with 1000", perCall[10], perCall[1000])
	}
}

// Another Store on the same directory (another process) adds, rewrites in place (same
// id, new file) and removes records; the first Store's summaries show each change
// when read after it, and bringing its index up to date costs lstats only for what
// changed, not for the whole history.
func TestIndexFollowsAnotherProcessWithoutScanningHistory(t *testing.T) {
	perRound := map[int]int64{}
	for _, n := range []int{10, 1000} {
		dir := filepath.Join(t.TempDir(), "store")
		writeHistory(t, dir, n)
		var lstats, otherLstats atomic.Int64
		r := historyStore(t, dir, n, &lstats, nil)
		w := historyStore(t, dir, n, &otherLstats, nil)
		ctx := context.Background()
		enqueue(t, w, 1) // creates the generation file: r reconciles fully once
		sums, err := r.MessageSummaries(ctx)
		if err != nil || len(sums) != n+1 {
			t.Fatalf("%d summaries, %v", len(sums), err)
		}
		old := sums[n/2].MessageID
		var worst int64
		for round := range 3 {
			_, added := enqueue(t, w, 1) // a new message
			err := w.Update(ctx, record.KindMessages, old, func(cur record.Record) (record.Record, error) {
				m := cur.(*record.Message)
				m.Attempts++
				m.UpdatedAt++
				return m, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			before := lstats.Load()
			sums, err := r.MessageSummaries(ctx)
			if err != nil {
				t.Fatal(err)
			}
			worst = max(worst, lstats.Load()-before)
			got := map[string]store.MessageSummary{}
			for _, m := range sums {
				got[m.MessageID] = m
			}
			if len(sums) != n+2+round {
				t.Fatalf("round %d: %d summaries, want %d", round, len(sums), n+2+round)
			}
			if _, ok := got[added.MessageID]; !ok {
				t.Fatalf("round %d: the message another process added is not listed", round)
			}
			if got[old].Attempts != round+1 {
				t.Fatalf("round %d: the message another process rewrote shows %d attempts, want %d", round, got[old].Attempts, round+1)
			}
		}
		// A removal by the other process.
		err = w.Transaction(ctx, func(tx *store.Tx) error { return tx.Delete(record.KindMessages, old) })
		if err != nil {
			t.Fatal(err)
		}
		sums, err = r.MessageSummaries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range sums {
			if m.MessageID == old {
				t.Fatal("the message another process removed is still listed")
			}
		}
		perRound[n] = worst
	}
	if perRound[1000] > perRound[10]+8 {
		t.Fatalf("record lstats of an index refresh after another process's writes: %d with 10 messages, %d with 1000", perRound[10], perRound[1000])
	}
}

// The same when every indexed entry is racy (the reader's clock is frozen before the
// files' change times, as on a file system with coarse timestamps or a store whose last
// sends were milliseconds ago): when the generation marks account for every change, a
// refresh reads only the names that changed, not every racy entry again. Two
// publications to one name that restore its inode number leave a mark no change
// explains, so that case still falls back to the full reconcile.
func TestIndexRefreshDoesNotRereadRacyHistory(t *testing.T) {
	perRound := map[int]int64{}
	for _, n := range []int{10, 1000} {
		dir := filepath.Join(t.TempDir(), "store")
		frozen := time.Now() // before every file's change time: every entry stays racy
		writeHistory(t, dir, n)
		var lstats, otherLstats atomic.Int64
		r := openStore(t, store.Options{Dir: dir, Limits: historyLimits, Now: func() time.Time { return frozen },
			WrapFS: func(inner fsx.FS) fsx.FS { return lstatCounter{FS: inner, os: inner, lstats: &lstats} }})
		w := historyStore(t, dir, n, &otherLstats, nil)
		ctx := context.Background()
		enqueue(t, w, 1)
		if sums, err := r.MessageSummaries(ctx); err != nil || len(sums) != n+1 {
			t.Fatalf("%d summaries, %v", len(sums), err)
		}
		var worst int64
		for round := range 3 {
			_, added := enqueue(t, w, 1)
			before := lstats.Load()
			sums, err := r.MessageSummaries(ctx)
			if err != nil {
				t.Fatal(err)
			}
			worst = max(worst, lstats.Load()-before)
			if len(sums) != n+2+round || !slices.ContainsFunc(sums, func(m store.MessageSummary) bool { return m.MessageID == added.MessageID }) {
				t.Fatalf("round %d: %d summaries, the new message listed: %v", round, len(sums),
					slices.ContainsFunc(sums, func(m store.MessageSummary) bool { return m.MessageID == added.MessageID }))
			}
		}
		perRound[n] = worst
	}
	t.Logf("record lstats per refresh: %v", perRound)
	if perRound[1000] > perRound[10]+8 {
		t.Fatalf("record lstats of a refresh with every entry racy: %d with 10 messages, %d with 1000", perRound[10], perRound[1000])
	}
}

// A cached listing is not copied per call: listing 1000 ids allocates far less than
// one word per id.
func TestCachedListDoesNotCopyIDs(t *testing.T) {
	const n = 1000
	dir := filepath.Join(t.TempDir(), "store")
	writeHistory(t, dir, n)
	s := openStore(t, store.Options{Dir: dir, Now: benchLater})
	if ids, err := s.List(record.KindMessages); err != nil || len(ids) != n {
		t.Fatalf("List: %d, %v", len(ids), err)
	}
	const calls = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range calls {
		if _, err := s.List(record.KindMessages); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / calls; per >= n*8 {
		t.Fatalf("a cached List of %d ids allocates %d bytes", n, per)
	}
}
