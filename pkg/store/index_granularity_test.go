package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// publishOther makes another store handle publish a new message, so that the
// messages and outbox listing stamps move and a reader's next index read reconciles;
// the new record file's mtime is set to sameSecond like the others'.
func publishOther(t *testing.T, writer *store.Store, dir string) {
	t.Helper()
	_, m := enqueue(t, writer, 1)
	setSameSecond(t, filepath.Join(dir, "messages", m.MessageID+".json"))
}

func messageSummary(t *testing.T, s *store.Store, id string) (store.MessageSummary, error) {
	t.Helper()
	sums, err := s.MessageSummaries(context.Background())
	if err != nil {
		return store.MessageSummary{}, err
	}
	for _, e := range sums {
		if e.MessageID == id {
			return e, nil
		}
	}
	t.Fatalf("message %s is not in the index", id)
	return store.MessageSummary{}, nil
}

func outboxSummary(t *testing.T, s *store.Store, id string) (store.OutboxSummary, error) {
	t.Helper()
	sums, err := s.OutboxSummaries(context.Background())
	if err != nil {
		return store.OutboxSummary{}, err
	}
	for _, e := range sums {
		if e.EnvelopeID == id {
			return e, nil
		}
	}
	t.Fatalf("envelope %s is not in the index", id)
	return store.OutboxSummary{}, nil
}

// oneSecondEnvelope enqueues a one-envelope message with the plain store and returns
// its outbox record, the record's file and the file's bytes (mtime set to sameSecond).
func oneSecondEnvelope(t *testing.T, dir string) (*record.Outbox, string, []byte) {
	t.Helper()
	s := openStore(t, store.Options{Dir: dir})
	req, _ := enqueue(t, s, 1)
	o, err := store.GetAs[*record.Outbox](s, req.Envelopes[0].EnvelopeID)
	if err != nil || o == nil {
		t.Fatal(o, err)
	}
	path := filepath.Join(dir, "outbox", o.EnvelopeID+".json")
	setSameSecond(t, path)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return o, path, data
}

func signedRecord(t *testing.T, r record.Record) []byte {
	t.Helper()
	data, err := record.Encode(ownerIdentity(t).Signer(), ownerIdentity(t).DID(), r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// On a file system with 1 s timestamps, a message indexed half a second after its
// file's timestamp and then rewritten in place within that second (same size, inode,
// mtime and ctime: the same fingerprint) by a valid newer version is seen by the next
// index read that reconciles the index (another handle's publication moved the
// listing stamp): the messages index never keeps the old summary.
func TestOneSecondFSMessagesIndexSeesSameSecondRewrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store") // created 0700 by the store
	m, path, _ := oneSecondMessage(t, dir)
	o := openOneSecond(t, dir, 500*time.Millisecond)
	writer := openStore(t, store.Options{Dir: dir})
	for attempts := 1; attempts <= 3; attempts++ {
		if e, err := messageSummary(t, o.s, m.MessageID); err != nil || e.Attempts != attempts-1 || e.Status != record.StatusQueued {
			t.Fatalf("index before rewrite %d: %+v, %v; want attempts %d", attempts, e, err, attempts-1)
		}
		publishOther(t, writer, dir)
		overwriteSameSecond(t, path, signed(t, m, attempts))
		if e, err := messageSummary(t, o.s, m.MessageID); err != nil || e.Attempts != attempts {
			t.Fatalf("after a same-second rewrite to attempts %d: index entry %+v, %v (the old summary was kept)", attempts, e, err)
		}
	}
}

// The same for the outbox index: an envelope rewritten in place within the second
// from pending to relayed (the same size) is seen as relayed, so neither `ls` nor the
// carrier's plan works from the old state.
func TestOneSecondFSOutboxIndexSeesSameSecondRewrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store") // created 0700 by the store
	env, path, _ := oneSecondEnvelope(t, dir)
	o := openOneSecond(t, dir, 500*time.Millisecond)
	writer := openStore(t, store.Options{Dir: dir})
	if e, err := outboxSummary(t, o.s, env.EnvelopeID); err != nil || e.State != record.StatePending || e.Attempts != 0 {
		t.Fatalf("index before the rewrite: %+v, %v", e, err)
	}
	next := *env
	next.State, next.Attempts = record.StateRelayed, 1
	publishOther(t, writer, dir)
	overwriteSameSecond(t, path, signedRecord(t, &next))
	if e, err := outboxSummary(t, o.s, env.EnvelopeID); err != nil || e.State != record.StateRelayed || e.Attempts != 1 {
		t.Fatalf("after a same-second rewrite to relayed: index entry %+v, %v (the old summary was kept)", e, err)
	}
}

// A tampered in-place rewrite within the second (one byte flipped) is refused by the
// next reconciling index read with OUTBOX_STORE_INVALID, never summarized from the
// valid version indexed before; restored, the record is indexed again.
func TestOneSecondFSIndexRefusesTamperedSameSecondRewrite(t *testing.T) {
	for _, kind := range []record.Kind{record.KindMessages, record.KindOutbox} {
		t.Run(string(kind), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store") // created 0700 by the store
			var path string
			var orig []byte
			var read func(s *store.Store) error
			if kind == record.KindMessages {
				var m *record.Message
				m, path, orig = oneSecondMessage(t, dir)
				read = func(s *store.Store) error { _, err := messageSummary(t, s, m.MessageID); return err }
			} else {
				var env *record.Outbox
				env, path, orig = oneSecondEnvelope(t, dir)
				read = func(s *store.Store) error { _, err := outboxSummary(t, s, env.EnvelopeID); return err }
			}
			o := openOneSecond(t, dir, 500*time.Millisecond)
			writer := openStore(t, store.Options{Dir: dir})
			sig := bytes.LastIndex(orig, []byte(`"sig":"`)) + len(`"sig":"`)
			for _, i := range []int{sig, sig + 20, len(orig) / 2} {
				if err := read(o.s); err != nil {
					t.Fatalf("index before the tampering: %v", err)
				}
				bad := bytes.Clone(orig)
				bad[i] ^= 0x01
				publishOther(t, writer, dir)
				overwriteSameSecond(t, path, bad)
				if err := read(o.s); !errors.Is(err, errcode.OutboxStoreInvalid) {
					t.Fatalf("byte %d flipped within the same second: index read = %v; want OUTBOX_STORE_INVALID", i, err)
				}
				overwriteSameSecond(t, path, orig)
				if err := read(o.s); err != nil {
					t.Fatalf("control: index read of the restored record = %v", err)
				}
			}
		})
	}
}

// The racy rule costs nothing once the window has passed: messages indexed when the
// racy window (1 s + 20 ms here) had passed since their files' timestamps are not
// read again when another handle's publication makes the index reconcile — only the
// new record is opened. Indexed a nanosecond earlier, every reconcile re-reads them
// until one runs after the window, and from then on they are trusted.
func TestOneSecondFSIndexEntryIndexedLongAgoNotReread(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store") // created 0700 by the store
	const n = 3
	for range n {
		oneSecondMessage(t, dir)
	}
	const window = time.Second + 20*time.Millisecond
	writer := openStore(t, store.Options{Dir: dir})
	// reconcile publishes one message with the writer and reads the reader's messages
	// index, returning the record files it opened.
	reconcile := func(o *oneSecond, entries int) int64 {
		t.Helper()
		publishOther(t, writer, dir)
		before := o.opens.Load()
		sums, err := o.s.MessageSummaries(context.Background())
		if err != nil || len(sums) != entries {
			t.Fatalf("index: %d entries, %v; want %d", len(sums), err, entries)
		}
		return o.opens.Load() - before
	}

	old := openOneSecond(t, dir, window)
	if _, err := old.s.MessageSummaries(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := old.opens.Load(); got != n {
		t.Fatalf("building the index opened %d files, want %d", got, n)
	}
	entries := n
	for range 3 {
		entries++
		if got := reconcile(old, entries); got != 1 {
			t.Fatalf("a reconcile of entries indexed %v after their timestamps opened %d files; want 1 (the new record)", window, got)
		}
	}

	racy := openOneSecond(t, dir, window-time.Nanosecond)
	if _, err := racy.s.MessageSummaries(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		entries++
		if got := reconcile(racy, entries); got != int64(entries) {
			t.Fatalf("a reconcile within the racy window opened %d files; want %d (every racy entry and the new record)", got, entries)
		}
	}
	racy.at(window)
	entries++
	if got := reconcile(racy, entries); got != int64(entries) {
		t.Fatalf("the first reconcile after the window opened %d files; want %d (one last read of each racy entry)", got, entries)
	}
	for range 2 {
		entries++
		if got := reconcile(racy, entries); got != 1 {
			t.Fatalf("a reconcile after the racy entries were read past the window opened %d files; want 1 (the new record)", got)
		}
	}
}
