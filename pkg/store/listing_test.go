package store_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
	"golang.org/x/sys/unix"
)

// frozenFS reports every directory's mtime and ctime as fixed values, and (with
// files set) every file's ctime too: a file system whose timestamp tick never
// advances, so only the inode, the size and the generation file can reveal a change.
type frozenFS struct {
	fsx.FS
	at    int64
	files bool
}

func (f frozenFS) Lstat(name string) (fsx.Info, error) {
	info, err := f.FS.Lstat(name)
	if err == nil && info.IsDir() {
		info.MtimeNs, info.CtimeNs = f.at, f.at
	}
	if err == nil && f.files && info.IsRegular() {
		info.CtimeNs = f.at
	}
	return info, err
}

func newMessage(t *testing.T, now time.Time) *record.Message {
	t.Helper()
	return &record.Message{MessageID: uuid.NewString(), Status: record.StatusQueued, PeerOwnerDID: string(peerDID(t)),
		RelayURL: "http://127.0.0.1:9/", EnvelopeDigest: envelope.Digest([]byte("m")), DeliveryDeadline: ms(now.Add(time.Hour)),
		CreatedAt: ms(now), UpdatedAt: ms(now), RetainUntil: ms(now.Add(2 * time.Hour))}
}

// Two publications inside one timestamp tick leave the directory stamp unchanged;
// the generation file must still invalidate another instance's cached listing.
func TestListingSeesTwoChangesInOneTick(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	tick := time.Now().Add(-time.Hour).UnixNano() // old enough not to be racy
	frozen := func(inner fsx.FS) fsx.FS { return frozenFS{FS: inner, at: tick} }
	writer := openStore(t, store.Options{Dir: dir, WrapFS: frozen})
	reader := openStore(t, store.Options{Dir: dir, WrapFS: frozen})

	now := time.Now()
	first := newMessage(t, now)
	mustPut(t, writer, first)
	ids, err := reader.List(record.KindMessages)
	if err != nil || !slices.Equal(ids, []string{first.MessageID}) {
		t.Fatalf("first listing %v %v", ids, err)
	}
	stampBefore, _ := reader.ListingStamp(record.KindMessages)

	second, third := newMessage(t, now), newMessage(t, now)
	mustPut(t, writer, second)
	mustPut(t, writer, third)
	stampAfter, _ := reader.ListingStamp(record.KindMessages)
	if stampAfter.Dir != stampBefore.Dir {
		t.Fatalf("the frozen file system let the directory stamp move: %+v → %+v", stampBefore.Dir, stampAfter.Dir)
	}
	ids, err = reader.List(record.KindMessages)
	want := []string{first.MessageID, second.MessageID, third.MessageID}
	slices.Sort(want)
	if err != nil || !slices.Equal(ids, want) {
		t.Fatalf("cached listing missed changes made in one tick: got %v want %v (%v)", ids, want, err)
	}

	// And a removal in the same tick.
	if err := writer.Transaction(context.Background(), func(tx *store.Tx) error {
		return tx.Delete(record.KindMessages, second.MessageID)
	}); err != nil {
		t.Fatal(err)
	}
	ids, _ = reader.List(record.KindMessages)
	if slices.Contains(ids, second.MessageID) || len(ids) != 2 {
		t.Fatalf("removal in the same tick not seen: %v", ids)
	}
}

// The same, with real timestamps forced equal by utimes after each change.
func TestListingWithMtimeForcedEqual(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	writer := openStore(t, store.Options{Dir: dir})
	reader := openStore(t, store.Options{Dir: dir, Now: func() time.Time { return time.Now().Add(time.Hour) }})
	now := time.Now()
	mustPut(t, writer, newMessage(t, now))
	kindDir := filepath.Join(dir, "messages")
	fixed := []unix.Timespec{unix.NsecToTimespec(now.Add(-time.Minute).UnixNano()), unix.NsecToTimespec(now.Add(-time.Minute).UnixNano())}
	if err := unix.UtimesNano(kindDir, fixed); err != nil {
		t.Fatal(err)
	}
	before, _ := reader.List(record.KindMessages)
	for i := 0; i < 2; i++ {
		mustPut(t, writer, newMessage(t, now))
		if err := unix.UtimesNano(kindDir, fixed); err != nil {
			t.Fatal(err)
		}
	}
	after, _ := reader.List(record.KindMessages)
	if len(before) != 1 || len(after) != 3 {
		t.Fatalf("listing before %d after %d, want 1 and 3", len(before), len(after))
	}
}

// A listing taken within the timestamp granularity of its directory's mtime is racy:
// a change that bypasses the generation file (another tool) in the same tick must
// still be seen.
func TestRacyListingIsNotTrusted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	tick := time.Now().UnixNano()
	clock := func() time.Time { return time.Unix(0, tick).Add(time.Millisecond) }
	frozen := func(inner fsx.FS) fsx.FS { return frozenFS{FS: inner, at: tick} }
	s := openStore(t, store.Options{Dir: dir, WrapFS: frozen, Now: clock})
	m := newMessage(t, time.Now())
	mustPut(t, s, m)
	reader := openStore(t, store.Options{Dir: dir, WrapFS: frozen, Now: clock})
	if ids, _ := reader.List(record.KindMessages); len(ids) != 1 {
		t.Fatalf("want 1 id, got %v", ids)
	}
	// Another tool copies a record in without touching the generation file.
	src := filepath.Join(dir, "messages", m.MessageID+".json")
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	other := uuid.NewString()
	if err := os.WriteFile(filepath.Join(dir, "messages", other+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if ids, _ := reader.List(record.KindMessages); len(ids) != 2 {
		t.Fatalf("a racy cached listing was trusted: %v", ids)
	}
}

// A cached record rewritten in place, with size and mtime restored, must not be
// served from the cache: its ctime (or inode) changed.
func TestCachedRecordRewrittenInPlaceIsReread(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	later := func() time.Time { return time.Now().Add(time.Hour) } // nothing is racy
	s := openStore(t, store.Options{Dir: dir, Now: later})
	m := newMessage(t, time.Now())
	m.Attempts = 1
	mustPut(t, s, m)
	if got, _ := store.GetAs[*record.Message](s, m.MessageID); got == nil || got.Attempts != 1 {
		t.Fatal("first read")
	}
	rewriteInPlace(t, filepath.Join(dir, "messages", m.MessageID+".json"), m, 2)
	got, err := store.GetAs[*record.Message](s, m.MessageID)
	if err != nil || got == nil || got.Attempts != 2 {
		t.Fatalf("stale cache served after an in-place rewrite: %+v %v", got, err)
	}
}

// When the fingerprint cannot tell (ctime hidden, same inode, size and mtime), an
// entry cached within the timestamp granularity is racy: its next hit compares bytes.
func TestRacyCacheEntryComparesBytes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	tick := time.Now().UnixNano()
	clock := func() time.Time { return time.Unix(0, tick).Add(time.Millisecond) }
	s := openStore(t, store.Options{Dir: dir, Now: clock, WrapFS: func(inner fsx.FS) fsx.FS {
		return frozenFS{FS: inner, at: tick, files: true}
	}})
	m := newMessage(t, time.Now())
	m.Attempts = 1
	mustPut(t, s, m)
	if got, _ := store.GetAs[*record.Message](s, m.MessageID); got.Attempts != 1 {
		t.Fatal("first read")
	}
	rewriteInPlace(t, filepath.Join(dir, "messages", m.MessageID+".json"), m, 2)
	got, err := store.GetAs[*record.Message](s, m.MessageID)
	if err != nil || got == nil || got.Attempts != 2 {
		t.Fatalf("racy cache entry trusted: %+v %v", got, err)
	}
}

// rewriteInPlace overwrites path (same inode) with m re-signed with the given
// attempts (same length), then restores the file's mtime.
func rewriteInPlace(t *testing.T, path string, m *record.Message, attempts int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	next := *m
	next.Attempts = attempts
	data, err := record.Encode(ownerIdentity(t).Signer(), ownerIdentity(t).DID(), &next)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) != st.Size {
		t.Fatalf("rewrite changes the size: %d vs %d", len(data), st.Size)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := unix.UtimesNano(path, []unix.Timespec{st.Atim, st.Mtim}); err != nil {
		t.Fatal(err)
	}
	var after unix.Stat_t
	unix.Lstat(path, &after)
	if after.Ino != st.Ino || after.Size != st.Size || after.Mtim != st.Mtim {
		t.Fatal("rewrite did not keep inode, size and mtime")
	}
}
