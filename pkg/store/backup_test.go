package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// backupDest returns a destination laid out as a store directory
// (<dir>/delivery/<hex sha256(did)>, whose parent exists), so that fsck checks the copy
// as it checks a store.
func backupDest(t testing.TB, name string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), name)
	dest := dataroot.StoreDir(root, string(ownerIdentity(t).DID()))
	if err := os.MkdirAll(filepath.Dir(dest), 0o700); err != nil {
		t.Fatal(err)
	}
	return dest
}

// checkCopy runs fsck on a copy and fails the test on any problem.
func checkCopy(t testing.TB, dest string) {
	t.Helper()
	rep, err := fsck.Check(context.Background(), dest, fsck.Options{Owner: ownerIdentity(t).DID()})
	if err != nil {
		t.Fatalf("fsck of the copy: %v", err)
	}
	if rep.Problems() > 0 {
		for _, f := range rep.Findings {
			t.Logf("finding: %s %s %s: %s", f.Severity, f.Code, f.Path, f.Explanation)
		}
		t.Fatalf("fsck found %d problems in the copy %s", rep.Problems(), dest)
	}
}

// treeOf maps every file under dir (relative path) to its bytes, checking the modes
// of the copy: directories 0700, files 0600 with one link, nothing else.
func treeOf(t testing.TB, dir string, strict bool) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		switch {
		case info.IsDir():
			if strict && info.Mode().Perm() != 0o700 {
				t.Errorf("%s: mode %o, want 0700", rel, info.Mode().Perm())
			}
			return nil
		case !info.Mode().IsRegular():
			if strict {
				t.Errorf("%s: not a regular file (%v)", rel, info.Mode())
			}
			return nil
		case strict && (info.Mode().Perm() != 0o600 || st.Nlink != 1):
			t.Errorf("%s: mode %o, %d links; want 0600 and 1", rel, info.Mode().Perm(), st.Nlink)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[rel] = data
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// storeFiles is treeOf a store without what a backup never copies.
func storeFiles(t testing.TB, dir string) map[string][]byte {
	files := treeOf(t, dir, false)
	for rel := range files {
		base := filepath.Base(rel)
		if rel == ".lock" || rel == store.GenerationFile || strings.HasPrefix(base, ".") && rel != ".head" {
			delete(files, rel)
		}
	}
	return files
}

func TestBackupCopiesTheStore(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, store.Options{})
	for i := range 5 {
		enqueue(t, s, 1+i%3)
	}
	w, err := s.CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(bytes.Repeat([]byte("sealed "), 10000)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	// Things a backup never copies: a staged temp and a partial blob.
	if err := os.WriteFile(filepath.Join(s.Dir(), "messages", ".11111111-2222-4333-8444-555555555555.tmp"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := s.PartialBlob("0190b6a4-0000-7000-8000-000000000001")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Write([]byte("part")); err != nil {
		t.Fatal(err)
	}
	if err := p.Persist(); err != nil {
		t.Fatal(err)
	}
	p.Close()

	dest := backupDest(t, "copy")
	rep, err := s.Backup(ctx, dest, store.BackupOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := storeFiles(t, s.Dir())
	got := treeOf(t, dest, true)
	if len(got) != len(want) {
		t.Errorf("copy has %d files, store %d", len(got), len(want))
	}
	for rel, data := range want {
		if !bytes.Equal(got[rel], data) {
			t.Errorf("%s: copy differs from the store", rel)
		}
	}
	for rel := range got {
		if _, ok := want[rel]; !ok {
			t.Errorf("%s: in the copy, not in the store", rel)
		}
	}
	if rep.Files != len(got) || rep.Dest != dest || rep.Holds < 1 || rep.LongestHold <= 0 || rep.Bytes < 70000 {
		t.Errorf("report %+v; want %d files at %s, ≥ 1 hold", rep, len(got), dest)
	}
	if rep.Watch != "inotify" {
		t.Logf("watch: %s (inotify unavailable here)", rep.Watch)
	}
	// The head was written in the final hold: the store's and the copy's are one.
	if _, head := s.Head(); !rep.HeadWritten || !bytes.Equal(rep.Head, head) || !bytes.Equal(got[store.HeadFile], head) {
		t.Errorf("head: written %v, reported %q, store %q, copy %q", rep.HeadWritten, rep.Head, head, got[store.HeadFile])
	}
	checkCopy(t, dest)
	// The copy opens as a store and reads the same messages.
	c, err := store.Open(ownerIdentity(t).Signer(), store.Options{Dir: dest})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.List(record.KindMessages)
	b, err := c.List(record.KindMessages)
	if err != nil || !slices.Equal(a, b) || len(b) != 5 {
		t.Fatalf("copy lists %v (%v), store %v", b, err, a)
	}
	if _, err := os.Lstat(filepath.Join(dest, store.GenerationFile)); !os.IsNotExist(err) {
		t.Errorf("the copy has a generation file: %v", err)
	}
	// Nothing is left beside dest.
	ents, _ := os.ReadDir(filepath.Dir(dest))
	if len(ents) != 1 {
		t.Errorf("beside the copy: %v", ents)
	}
}

// A copy restored in place of its store opens as it was; one restored after the
// store committed more (and wrote its head) is caught by the local witness as rolled
// back: the head the backup wrote counts exactly what it copied.
func TestBackupRestoreAndTheWitness(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	dir, wit := filepath.Join(root, "store"), filepath.Join(root, "witness", "w.head")
	open := func() *store.Store {
		t.Helper()
		s, err := store.Open(ownerIdentity(t).Signer(), store.Options{Dir: dir, WitnessFile: wit})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	restore := func(copy string) {
		t.Helper()
		if err := os.Rename(dir, dir+fmt.Sprint(".old", time.Now().UnixNano())); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(copy, dir); err != nil {
			t.Fatal(err)
		}
	}
	s := open()
	enqueue(t, s, 1)
	if _, _, err := s.WriteHead(ctx, false); err != nil {
		t.Fatal(err)
	}
	same := filepath.Join(root, "same")
	rep, err := s.Backup(ctx, same, store.BackupOptions{})
	if err != nil {
		t.Fatal(err)
	}
	behind := filepath.Join(root, "behind")
	if _, err := s.Backup(ctx, behind, store.BackupOptions{}); err != nil {
		t.Fatal(err)
	}
	// Nothing changed since the second copy: restoring the first is restoring a
	// lower head than the witness's (the second backup wrote one more).
	restore(same)
	if err := open().RolledBack(); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("restored a copy older than the last head: RolledBack = %v", err)
	}
	restore(behind)
	s = open()
	if err := s.RolledBack(); err != nil {
		t.Fatalf("restored the latest copy of an unchanged store: %v", err)
	}
	if h, _ := s.Head(); h == nil || h.Seq != 3 || rep.HeadWritten != true {
		t.Fatalf("head after restore: %+v", h)
	}
	again := filepath.Join(root, "again")
	if _, err := s.Backup(ctx, again, store.BackupOptions{}); err != nil {
		t.Fatal(err)
	}
	enqueue(t, s, 1)
	if _, _, err := s.WriteHead(ctx, false); err != nil {
		t.Fatal(err)
	}
	restore(again)
	if err := open().RolledBack(); !errors.Is(err, errcode.StoreRolledBack) {
		t.Fatalf("restored a copy the store committed past: RolledBack = %v", err)
	}
}

func TestBackupRefusesBadDestinations(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, store.Options{})
	enqueue(t, s, 1)
	base := t.TempDir()
	exists := filepath.Join(base, "exists")
	if err := os.Mkdir(exists, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(base, link); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(base, "dangling")
	if err := os.Symlink(filepath.Join(base, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, dest, reason string }{
		{"exists", exists, "it exists"},
		{"dangling symlink", dangling, "it exists"},
		{"parent missing", filepath.Join(base, "no", "copy"), "does not exist"},
		{"parent a symlink", filepath.Join(link, "copy"), "symbolic link"},
		{"parent open to others", filepath.Join(open, "copy"), "writable by group or others"},
		{"inside the store", filepath.Join(s.Dir(), "copy"), "inside the store"},
		{"the store itself", s.Dir(), "inside the store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := treeOf(t, base, false)
			_, err := s.Backup(ctx, tc.dest, store.BackupOptions{})
			var de *store.BackupDestError
			if !errors.As(err, &de) || !strings.Contains(de.Reason, tc.reason) {
				t.Fatalf("err = %v, want a BackupDestError saying %q", err, tc.reason)
			}
			if !errors.Is(err, errcode.OutboxStoreUnwritable) || errcode.HintOf(err) == "" {
				t.Errorf("err = %v (hint %q), want OUTBOX_STORE_UNWRITABLE with a hint", err, errcode.HintOf(err))
			}
			if after := treeOf(t, base, false); len(after) != len(before) {
				t.Errorf("the backup left files: %d before, %d after", len(before), len(after))
			}
		})
	}
}

// TestBackupLeavesNothingOnError: a store file that fails verification fails the
// backup, and nothing is left at dest or beside it.
func TestBackupLeavesNothingOnError(t *testing.T) {
	s := openStore(t, store.Options{})
	_, m := enqueue(t, s, 1)
	for range 20 {
		enqueue(t, s, 1)
	}
	p := filepath.Join(s.Dir(), "messages", m.MessageID+".json")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	dest := backupDest(t, "copy")
	_, err = s.Backup(context.Background(), dest, store.BackupOptions{})
	if !errors.Is(err, errcode.OutboxStoreInvalid) || !strings.Contains(err.Error(), m.MessageID) {
		t.Fatalf("err = %v, want OUTBOX_STORE_INVALID naming the tampered record", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(dest)); len(ents) != 0 {
		t.Fatalf("left after a failed backup: %v", ents)
	}
}

// history is what the senders and the updater of TestBackupUnderConcurrentSenders did,
// on the monotonic clock: per message, when its Enqueue began and when it returned
// nil; per envelope, when each update to attempts = n began and was acknowledged.
type history struct {
	mu       sync.Mutex
	started  map[string]time.Time // message id → Enqueue called
	acked    map[string]time.Time // message id → Enqueue returned nil
	members  map[string][]string  // message id → envelope ids
	upStart  map[string][]time.Time
	upAcked  map[string][]time.Time // envelope id → [n-1]: update to attempts n acknowledged
	envelope []string               // envelopes acknowledged, for the updater
}

func newHistory() *history {
	return &history{started: map[string]time.Time{}, acked: map[string]time.Time{}, members: map[string][]string{},
		upStart: map[string][]time.Time{}, upAcked: map[string][]time.Time{}}
}

// window is a closed-open interval of instants [lo, hi) in which the copy's state can
// have been the store's.
type window struct{ lo, hi time.Time }

func (w *window) atLeast(t time.Time) {
	if t.After(w.lo) {
		w.lo = t
	}
}

func (w *window) before(t time.Time) {
	if w.hi.IsZero() || t.Before(w.hi) {
		w.hi = t
	}
}

// TestBackupUnderConcurrentSenders: 8 senders enqueue (released together by a start
// gate) and an updater rewrites outbox records (as a carrier does, one attempt at a
// time) while backups run, one after another and two at once. Each copy must be
// fsck-clean and a state the store was in. The rule checked: there is one instant T,
// between the backup's start and its return, such that
//   - every message acknowledged before T is in the copy, and every message in the
//     copy had its Enqueue begun before T (so: acknowledged before the backup began ⇒
//     in the copy; in the copy ⇒ acknowledged or in flight during the backup);
//   - every envelope's record in the copy is a version the history held at T: its
//     update to the attempts it shows began before T, and its next update was not
//     acknowledged before T.
//
// The writers use one Store and most backups another Store of the same directory,
// as the daemon and `sealbridge backup` do from two processes (the flock excludes
// them as it does two processes); one backup runs on the writers' Store. The holds
// of the backups' Store are observed with Options.LockHoldObserver.
func TestBackupUnderConcurrentSenders(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := openStore(t, store.Options{})
	var longest atomic.Int64
	bs, err := store.Open(ownerIdentity(t).Signer(), store.Options{Dir: s.Dir(), LockHoldObserver: func(d time.Duration) {
		for {
			cur := longest.Load()
			if int64(d) <= cur || longest.CompareAndSwap(cur, int64(d)) {
				return
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := newHistory()
	// A base of messages before the senders start, so the first pass has work.
	for i := range 200 {
		req := sendRequest(t, 1+i%2)
		h.started[req.MessageID] = time.Now()
		if _, err := s.Enqueue(ctx, req); err != nil {
			t.Fatal(err)
		}
		h.acked[req.MessageID] = time.Now()
		for _, e := range req.Envelopes {
			h.members[req.MessageID] = append(h.members[req.MessageID], e.EnvelopeID)
			h.envelope = append(h.envelope, e.EnvelopeID)
		}
	}

	gate := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for i := 0; ctx.Err() == nil && i < 60; i++ {
				req := sendRequest(t, 1+(w+i)%2)
				var ids []string
				for _, e := range req.Envelopes {
					ids = append(ids, e.EnvelopeID)
				}
				h.mu.Lock()
				h.members[req.MessageID] = ids
				h.started[req.MessageID] = time.Now()
				h.mu.Unlock()
				_, err := s.Enqueue(ctx, req)
				now := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				h.mu.Lock()
				h.acked[req.MessageID] = now
				h.envelope = append(h.envelope, ids...)
				h.mu.Unlock()
			}
		}()
	}
	// The updater: attempts n → n+1 on envelopes taken in turn, one at a time.
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-gate
		for i := 0; ctx.Err() == nil; i++ {
			h.mu.Lock()
			id := h.envelope[(i*7919)%len(h.envelope)]
			h.upStart[id] = append(h.upStart[id], time.Now())
			n := len(h.upStart[id])
			h.mu.Unlock()
			err := s.Update(ctx, record.KindOutbox, id, func(cur record.Record) (record.Record, error) {
				o := record.Clone(cur).(*record.Outbox)
				if o.Attempts != n-1 {
					return nil, fmt.Errorf("envelope %s: attempts %d, want %d", id, o.Attempts, n-1)
				}
				o.Attempts = n
				return o, nil
			})
			now := time.Now()
			if err != nil {
				if ctx.Err() == nil {
					errs <- err
				}
				return
			}
			h.mu.Lock()
			h.upAcked[id] = append(h.upAcked[id], now)
			h.mu.Unlock()
		}
	}()
	close(gate)

	type result struct {
		dest       string
		start, end time.Time
		rep        store.BackupReport
		err        error
	}
	backup := func(s *store.Store, name string, opts store.BackupOptions) result {
		r := result{dest: backupDest(t, name), start: time.Now()}
		r.rep, r.err = s.Backup(ctx, r.dest, opts)
		r.end = time.Now()
		return r
	}
	var results []result
	for i := range 3 {
		results = append(results, backup(bs, fmt.Sprint("seq", i), store.BackupOptions{Scan: i == 2}))
	}
	// Two at once: one on the writers' Store, one on the other with a final hold of
	// at most 4 changed files (so more passes).
	var bw sync.WaitGroup
	two := make([]result, 2)
	for i, on := range []*store.Store{s, bs} {
		bw.Add(1)
		go func() {
			defer bw.Done()
			two[i] = backup(on, fmt.Sprint("par", i), store.BackupOptions{MaxHoldNames: 4 * i})
		}()
	}
	bw.Wait()
	results = append(results, two...)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a writer failed: %v", err)
	}

	for _, r := range results {
		if r.err != nil {
			t.Fatalf("backup to %s: %v", r.dest, r.err)
		}
		t.Logf("%s: %v, %d files, %d copies, %d passes, %d holds, longest %v, watch %s",
			filepath.Base(filepath.Dir(filepath.Dir(r.dest))), r.end.Sub(r.start).Round(time.Millisecond), r.rep.Files, r.rep.Copies, r.rep.Passes, r.rep.Holds, r.rep.LongestHold, r.rep.Watch)
		checkCopy(t, r.dest)
		checkInstant(t, h, r.dest, r.start, r.end)
	}
	// Generous for -race on a loaded machine; the bench measures it (≤ 50 ms target).
	if d := time.Duration(longest.Load()); d > time.Second {
		t.Errorf("the backups' Store held the lock for %v at once", d)
	} else {
		t.Logf("longest store-lock hold of the backups' Store: %v", d)
	}
}

// checkInstant checks the rule of TestBackupUnderConcurrentSenders on one copy.
func checkInstant(t *testing.T, h *history, dest string, start, end time.Time) {
	t.Helper()
	c, err := store.Open(ownerIdentity(t).Signer(), store.Options{Dir: dest})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.List(record.KindMessages)
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]bool{}
	for _, id := range msgs {
		in[id] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	w := window{lo: start}
	w.before(end)
	for id, st := range h.started {
		ack, acked := h.acked[id]
		switch {
		case in[id]:
			w.atLeast(st)
			m, err := c.AcceptedMessage(id)
			if err != nil || m == nil {
				t.Fatalf("%s: message %s in the copy but not accepted there (%v)", dest, id, err)
			}
			for _, e := range h.members[id] {
				o, err := store.GetAs[*record.Outbox](c, e)
				if err != nil || o == nil {
					t.Fatalf("%s: message %s without its envelope %s (%v)", dest, id, e, err)
				}
				n := o.Attempts
				if n > len(h.upStart[e]) {
					t.Fatalf("%s: envelope %s shows attempts %d, only %d updates began", dest, e, n, len(h.upStart[e]))
				}
				if n > 0 {
					w.atLeast(h.upStart[e][n-1])
				}
				if n < len(h.upAcked[e]) {
					w.before(h.upAcked[e][n])
				}
			}
		case acked:
			w.before(ack)
		}
	}
	if !w.lo.Before(w.hi) {
		t.Fatalf("%s: no instant fits the copy: it needs one at or after %v and before %v (backup ran %v .. %v)",
			dest, w.lo.Sub(start), w.hi.Sub(start), time.Duration(0), end.Sub(start))
	}
}

// A backup whose context ends fails with OUTBOX_STORE_BUSY and leaves nothing.
func TestBackupCancelled(t *testing.T) {
	s := openStore(t, store.Options{})
	for range 50 {
		enqueue(t, s, 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dest := backupDest(t, "copy")
	if _, err := s.Backup(ctx, dest, store.BackupOptions{}); !errors.Is(err, errcode.OutboxStoreBusy) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want OUTBOX_STORE_BUSY caused by the context", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(dest)); len(ents) != 0 {
		t.Fatalf("left after a cancelled backup: %v", ents)
	}
}
