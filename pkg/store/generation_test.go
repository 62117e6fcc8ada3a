package store_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// genBound is the size at which the generation file is compacted (docs/FORMAT.md §7).
const genBound = 64 << 10

// genFile reads the store's generation file: its header line (without "\n"), its
// marks and its inode.
func genFile(t *testing.T, dir string) (header string, marks []byte, ino uint64) {
	t.Helper()
	p := filepath.Join(dir, store.GenerationFile)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	h, m, _ := genHeaderOf(t, data)
	return h, m, info.Sys().(*syscall.Stat_t).Ino
}

// growGeneration appends observation marks to the generation file until it is size
// bytes long: the state tens of thousands of publications leave it in.
func growGeneration(t *testing.T, dir string, size int64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, store.GenerationFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if info.Size() > size {
		t.Fatalf(".generation is %d bytes, more than %d", info.Size(), size)
	}
	if _, err := f.Write(bytes.Repeat([]byte{'o'}, int(size-info.Size()))); err != nil {
		t.Fatal(err)
	}
}

// genHeaderOf splits the bytes of a generation file into its header and marks.
func genHeaderOf(t *testing.T, data []byte) (header string, marks []byte, ok bool) {
	t.Helper()
	h, m, ok := bytes.Cut(data, []byte("\n"))
	if !ok || !strings.HasPrefix(string(h), "sealbridge-generation ") || len(h) != len("sealbridge-generation ")+32 {
		t.Fatalf(".generation does not start with its header: %.80q", data)
	}
	return string(h), m, true
}

func genSize(t *testing.T, dir string) int64 {
	t.Helper()
	info, err := os.Lstat(filepath.Join(dir, store.GenerationFile))
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

func testMessage(t *testing.T) *record.Message {
	now := time.Now()
	return &record.Message{MessageID: uuid.NewString(), Status: record.StatusQueued, PeerOwnerDID: string(peerDID(t)),
		RelayURL: "http://127.0.0.1:9/relay", EnvelopeDigest: envelope.Digest([]byte("m")), DeliveryDeadline: now.Add(time.Hour).UnixMilli(),
		CreatedAt: now.UnixMilli(), UpdatedAt: now.UnixMilli(), RetainUntil: now.Add(2 * time.Hour).UnixMilli()}
}

func putMessage(t *testing.T, s *store.Store, m *record.Message) {
	t.Helper()
	if err := s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(m) }); err != nil {
		t.Fatal(err)
	}
}

// The generation file stays bounded: the publication that finds it at the bound
// replaces it, durably, by a new header (a new epoch, a new inode) and its own mark,
// and leaves no temp behind.
func TestGenerationCompactsAtBound(t *testing.T) {
	s := openStore(t, store.Options{})
	dir := s.Dir()
	putMessage(t, s, testMessage(t))
	first, err := os.ReadFile(filepath.Join(dir, store.GenerationFile))
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Lstat(filepath.Join(dir, store.GenerationFile))
	if err != nil {
		t.Fatal(err)
	}
	ino1 := info.Sys().(*syscall.Stat_t).Ino
	growGeneration(t, dir, genBound-1)
	putMessage(t, s, testMessage(t)) // reaches the bound: appended, not compacted
	if got := genSize(t, dir); got != genBound {
		t.Fatalf(".generation is %d bytes, want %d (one mark appended below the bound)", got, genBound)
	}
	if err := s.Transaction(context.Background(), func(tx *store.Tx) error {
		return tx.Delete(record.KindMessages, uuid.NewString()) // absent: no publication
	}); err != nil {
		t.Fatal(err)
	}
	if got := genSize(t, dir); got != genBound {
		t.Fatalf("a transaction that published nothing changed .generation to %d bytes", got)
	}
	_, _ = enqueue(t, s, 1) // outbox member, then the message record: the first compacts
	if got := genSize(t, dir); got >= genBound {
		t.Fatalf(".generation is %d bytes after a publication found it at the %d-byte bound: not compacted", got, genBound)
	}
	h1, _, _ := genHeaderOf(t, first)
	h2, marks, ino2 := genFile(t, dir)
	if string(marks) != "xm" {
		t.Errorf("marks after the compacting enqueue = %q, want \"xm\"", marks)
	}
	if h2 == h1 {
		t.Errorf("the compacted file kept the epoch %q", h1)
	}
	if ino2 == ino1 {
		t.Errorf("the compacted file kept the inode %d", ino1)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if fsx.IsTempName(e.Name()) {
			t.Errorf("compaction left the temp %s", e.Name())
		}
	}
	// A fresh store reads it back.
	if _, err := openStore(t, store.Options{Dir: dir, CacheEntries: -1}).List(record.KindMessages); err != nil {
		t.Fatal(err)
	}
}

// A generation file without a header (as older versions, or an fsck repair that
// found none, leave it) is replaced by the next publication, keeping nothing of it.
func TestGenerationHeaderlessReplaced(t *testing.T) {
	s := openStore(t, store.Options{})
	dir := s.Dir()
	putMessage(t, s, testMessage(t))
	if err := os.WriteFile(filepath.Join(dir, store.GenerationFile), []byte("mmxb\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	putMessage(t, s, testMessage(t))
	if _, marks, _ := genFile(t, dir); string(marks) != "m" {
		t.Errorf("marks = %q, want \"m\" after a new header", marks)
	}
}

// Readers holding listings and indexes across a compaction, or across the removal of
// the generation file, re-list: after a compaction the file has exactly the length
// they remember, so a reader that compared lengths (or trusted the marks past its
// remembered length) would keep a listing and an index without the new records.
func TestGenerationCompactionReadersRelist(t *testing.T) {
	for _, how := range []string{"compaction", "removal"} {
		t.Run(how, func(t *testing.T) {
			w := openStore(t, store.Options{})
			dir := w.Dir()
			r := openStore(t, store.Options{Dir: dir})
			_, m1 := enqueue(t, w, 1)
			_, before, _ := genFile(t, dir)
			if string(before) != "xm" {
				t.Fatalf("marks = %q", before)
			}
			sums, err := r.OutboxSummaries(context.Background())
			if err != nil || len(sums) != 1 {
				t.Fatalf("reader's first summaries: %v %v", sums, err)
			}
			msgs, err := r.List(record.KindMessages)
			if err != nil || !slices.Equal(msgs, []string{m1.MessageID}) {
				t.Fatalf("reader's first listing: %v %v", msgs, err)
			}
			stamp, err := r.ListingStamp(record.KindMessages)
			if err != nil {
				t.Fatal(err)
			}
			switch how {
			case "compaction":
				growGeneration(t, dir, genBound)
			case "removal": // as sealbridge-fsck --repair moves an invalid one away
				if err := os.Remove(filepath.Join(dir, store.GenerationFile)); err != nil {
					t.Fatal(err)
				}
			}
			req2, m2 := enqueue(t, w, 1)
			if _, after, _ := genFile(t, dir); string(after) != "xm" || genSize(t, dir) != int64(len(before))+55 {
				t.Fatalf("after the %s the file should have the length readers remember: marks %q", how, after)
			}
			if st, err := r.ListingStamp(record.KindMessages); err != nil || st == stamp {
				t.Errorf("the messages stamp is unchanged across the %s (%v)", how, err)
			}
			msgs, err = r.List(record.KindMessages)
			want := []string{m1.MessageID, m2.MessageID}
			slices.Sort(want)
			if err != nil || !slices.Equal(msgs, want) {
				t.Errorf("reader lists %v (%v), want %v: a stale listing", msgs, err, want)
			}
			sums, err = r.OutboxSummaries(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, s := range sums {
				ids = append(ids, s.EnvelopeID)
			}
			if !slices.Contains(ids, req2.Envelopes[0].EnvelopeID) {
				t.Errorf("reader's outbox summaries %v miss %s: a stale index", ids, req2.Envelopes[0].EnvelopeID)
			}
		})
	}
}

// A prepared transaction planned before a compaction and published after it is
// re-planned: here the compacting write changed the record the plan read, and the
// compacted file is exactly as long as the plan remembers, so a plan check that
// compared lengths would publish the stale plan and lose that write.
func TestGenerationCompactionReplansPreparedTransaction(t *testing.T) {
	w := openStore(t, store.Options{})
	dir := w.Dir()
	m := testMessage(t)
	putMessage(t, w, m)
	staging, resume := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	p := openStore(t, store.Options{Dir: dir, WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			// Hold the first round's staging (outside the lock) until the other
			// writer has compacted.
			if op.Kind == fsx.OpCreate && strings.HasPrefix(op.Path, "messages/") && held.CompareAndSwap(false, true) {
				close(staging)
				<-resume
			}
			return nil
		}
		return f
	}})
	var rounds atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- p.Update(context.Background(), record.KindMessages, m.MessageID, func(cur record.Record) (record.Record, error) {
			rounds.Add(1)
			next := *cur.(*record.Message)
			next.Attempts++
			return &next, nil
		})
	}()
	select {
	case <-staging:
	case err := <-done:
		t.Fatalf("the update finished before staging: %v", err)
	}
	growGeneration(t, dir, genBound)
	if err := w.Update(context.Background(), record.KindMessages, m.MessageID, func(cur record.Record) (record.Record, error) {
		next := *cur.(*record.Message)
		next.Attempts += 10
		return &next, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, marks, _ := genFile(t, dir); string(marks) != "m" {
		t.Fatalf("the writer's update did not compact to the plan's length: marks %q", marks)
	}
	close(resume)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, err := store.GetAs[*record.Message](openStore(t, store.Options{Dir: dir, CacheEntries: -1}), m.MessageID)
	if err != nil || got == nil {
		t.Fatal(got, err)
	}
	if got.Attempts != 11 {
		t.Errorf("attempts = %d, want 11: the plan made before the compaction was published (a lost update)", got.Attempts)
	}
	if n := rounds.Load(); n != 2 {
		t.Errorf("the prepared transaction planned %d times, want 2", n)
	}
}

// Another process compacts: the child helper enqueues one message into a store whose
// generation file is at the bound, and this process's listing and index, taken before,
// are not reused.
func TestGenerationCompactionByAnotherProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	r := openStore(t, store.Options{Dir: dir, LockWait: concLockWait})
	_, m1 := enqueue(t, r, 1)
	_, before, _ := genFile(t, dir)
	if _, err := r.OutboxSummaries(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.List(record.KindMessages); err != nil {
		t.Fatal(err)
	}
	growGeneration(t, dir, genBound)

	var order concOrder
	c := concStartChild(t, "child", dir, 1, &order) // one message of one envelope
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	concWait(t, c.ready, 60*time.Second, "the child to be ready")
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.stdin.Close()
	concWait(t, c.done, 60*time.Second, "the child to finish")
	if err := c.cmd.Wait(); err != nil || len(c.acks) != 1 {
		t.Fatalf("child: %v, %d acks\nstderr:\n%s", err, len(c.acks), c.stderr.String())
	}
	if _, after, _ := genFile(t, dir); !bytes.Equal(after, before) {
		t.Fatalf("the child's enqueue did not compact to the length this process remembers: marks %q", after)
	}
	msgs, err := r.List(record.KindMessages)
	want := []string{m1.MessageID, c.acks[0].msgID}
	slices.Sort(want)
	if err != nil || !slices.Equal(msgs, want) {
		t.Errorf("this process lists %v (%v), want %v: a stale listing", msgs, err, want)
	}
	sums, err := r.OutboxSummaries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range sums {
		found = found || s.EnvelopeID == c.acks[0].envelopes[0]
	}
	if !found {
		t.Errorf("this process's outbox summaries miss the child's envelope: a stale index")
	}
}
