package store_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/store"
	"golang.org/x/sys/unix"
)

// sameSecondFS is a file system with 1 s timestamps (fsx.Coarse) on which every change
// happens within the second of the change before it: it reports each file's and
// directory's ctime as its mtime, which the tests set back to the same whole second
// after every change, so a same-size rewrite on the same inode keeps the whole
// fingerprint and a directory change keeps the listing stamp. It counts the opens of
// record files and the directory listings.
type sameSecondFS struct {
	*fsx.Coarse
	opens, readDirs *atomic.Int64
}

func (f sameSecondFS) Lstat(name string) (fsx.Info, error) {
	info, err := f.Coarse.Lstat(name)
	info.CtimeNs = info.MtimeNs
	return info, err
}

func (f sameSecondFS) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	if strings.HasSuffix(name, ".json") {
		f.opens.Add(1)
	}
	file, err := f.Coarse.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return sameSecondFile{file}, nil
}

func (f sameSecondFS) ReadDir(name string) ([]fsx.DirEntry, error) {
	f.readDirs.Add(1)
	return f.Coarse.ReadDir(name)
}

type sameSecondFile struct{ fsx.File }

func (f sameSecondFile) Stat() (fsx.Info, error) {
	info, err := f.File.Stat()
	info.CtimeNs = info.MtimeNs
	return info, err
}

// oneSecond is a store on a sameSecondFS with a clock the test sets.
type oneSecond struct {
	s               *store.Store
	now             atomic.Int64 // the store's clock, ns since the epoch
	opens, readDirs atomic.Int64
}

// sameSecond is the whole second every test file's mtime is set to.
var sameSecond = time.Unix(1_700_000_000, 0)

func openOneSecond(t *testing.T, dir string, at time.Duration) *oneSecond {
	t.Helper()
	o := &oneSecond{}
	o.at(at)
	o.s = openStore(t, store.Options{Dir: dir,
		Now: func() time.Time { return time.Unix(0, o.now.Load()) },
		WrapFS: func(inner fsx.FS) fsx.FS {
			return sameSecondFS{Coarse: fsx.NewCoarse(inner, time.Second), opens: &o.opens, readDirs: &o.readDirs}
		}})
	return o
}

// at sets the store's clock to d after sameSecond.
func (o *oneSecond) at(d time.Duration) { o.now.Store(sameSecond.Add(d).UnixNano()) }

// setSameSecond sets path's mtime to sameSecond.
func setSameSecond(t *testing.T, path string) {
	t.Helper()
	ts := unix.NsecToTimespec(sameSecond.UnixNano())
	if err := unix.UtimesNano(path, []unix.Timespec{ts, ts}); err != nil {
		t.Fatal(err)
	}
}

// overwriteSameSecond writes data over path in place (same inode; data has the file's
// size) and sets its mtime back to sameSecond.
func overwriteSameSecond(t *testing.T, path string, data []byte) {
	t.Helper()
	if info, err := os.Lstat(path); err != nil || info.Size() != int64(len(data)) {
		t.Fatalf("rewrite of %s must keep its size: %v %v", path, info, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	setSameSecond(t, path)
}

// oneSecondMessage writes a message with the plain store and returns it, its file and
// the file's bytes (mtime set to sameSecond).
func oneSecondMessage(t *testing.T, dir string) (*store.Message, string, []byte) {
	t.Helper()
	m := newMessage(t, time.Now())
	mustPut(t, openStore(t, store.Options{Dir: dir}), m)
	path := filepath.Join(dir, "messages", m.MessageID+".json")
	setSameSecond(t, path)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return m, path, data
}

// signed returns m with the given attempts, encoded and signed by the owner.
func signed(t *testing.T, m *store.Message, attempts int) []byte {
	t.Helper()
	next := *m
	next.Attempts = attempts
	data, err := store.EncodeRecord(ownerIdentity(t).Signer(), ownerIdentity(t).DID(), &next)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func getMessage(t *testing.T, s *store.Store, id string) (*store.Message, error) {
	t.Helper()
	return store.GetAs[*store.Message](s, id)
}

// On a file system with 1 s timestamps, a record cached half a second after its
// file's timestamp and then rewritten in place within that second (same size, inode,
// mtime and ctime) by a valid newer version is never served from the cache: the newer
// version is returned.
func TestOneSecondFSNewerVersionNeverHiddenByCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	m, path, _ := oneSecondMessage(t, dir)
	o := openOneSecond(t, dir, 500*time.Millisecond)
	for attempts := 1; attempts <= 3; attempts++ {
		if got, err := getMessage(t, o.s, m.MessageID); err != nil || got == nil || got.Attempts != attempts-1 {
			t.Fatalf("Get before rewrite %d = %+v, %v; want attempts %d", attempts, got, err, attempts-1)
		}
		overwriteSameSecond(t, path, signed(t, m, attempts))
		if got, err := getMessage(t, o.s, m.MessageID); err != nil || got == nil || got.Attempts != attempts {
			t.Fatalf("after a same-second rewrite to attempts %d: Get = %+v, %v (the cached old version was served)", attempts, got, err)
		}
	}
}

// The same for a tampered rewrite (one byte flipped, in the signature or the
// payload): it is refused with OUTBOX_STORE_INVALID, never answered with the cached
// valid record.
func TestOneSecondFSTamperedRewriteNeverServedFromCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	m, path, orig := oneSecondMessage(t, dir)
	o := openOneSecond(t, dir, 500*time.Millisecond)
	sig := bytes.LastIndex(orig, []byte(`"sig":"`)) + len(`"sig":"`)
	for _, i := range []int{sig, sig + 20, len(orig) / 2} {
		if got, err := getMessage(t, o.s, m.MessageID); err != nil || got == nil {
			t.Fatalf("Get before the tampering = %+v, %v", got, err)
		}
		bad := bytes.Clone(orig)
		bad[i] ^= 0x01
		overwriteSameSecond(t, path, bad)
		if got, err := getMessage(t, o.s, m.MessageID); !errors.Is(err, errcode.OutboxStoreInvalid) || got != nil {
			t.Fatalf("byte %d flipped within the same second: Get = %+v, %v; want OUTBOX_STORE_INVALID", i, got, err)
		}
		overwriteSameSecond(t, path, orig)
		if got, err := getMessage(t, o.s, m.MessageID); err != nil || got == nil || got.Attempts != m.Attempts {
			t.Fatalf("control: restored record = %+v, %v", got, err)
		}
	}
}

// A record cached once the racy window (1 s + 20 ms on this file system) had passed
// since its file's timestamp is a cache hit: its next reads open no file. Cached a
// nanosecond earlier, every hit re-reads and compares the bytes until the window has
// passed, and then hits stop opening the file.
func TestOneSecondFSRecordCachedLongAgoIsHit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	m, _, _ := oneSecondMessage(t, dir)
	const window = time.Second + 20*time.Millisecond

	old := openOneSecond(t, dir, window)
	for i := range 3 {
		if got, err := getMessage(t, old.s, m.MessageID); err != nil || got == nil {
			t.Fatal(got, err)
		}
		if n := old.opens.Load(); n != 1 {
			t.Fatalf("read %d of a record cached %v after its timestamp opened the file %d times; want 1 (the first read)", i+1, window, n)
		}
	}

	racy := openOneSecond(t, dir, window-time.Nanosecond)
	for i := range 3 {
		if got, err := getMessage(t, racy.s, m.MessageID); err != nil || got == nil {
			t.Fatal(got, err)
		}
		if n := racy.opens.Load(); n != int64(i+1) {
			t.Fatalf("read %d within the racy window opened the file %d times; want %d (every hit compares the bytes)", i+1, n, i+1)
		}
	}
	racy.at(window)
	for range 3 {
		if got, err := getMessage(t, racy.s, m.MessageID); err != nil || got == nil {
			t.Fatal(got, err)
		}
	}
	if n := racy.opens.Load(); n != 4 {
		t.Fatalf("after the window passed, 3 reads opened the file %d more times; want 1 (one last comparison)", n-3)
	}
}

// On a file system with 1 s timestamps, a listing cached half a second after its
// directory's timestamp never hides a change to the directory within that second
// (records removed or planted by something other than the store: the generation file
// does not move, nor, on this file system, the directory's stamp). A listing taken
// once the window had passed is reused without reading the directory.
func TestOneSecondFSListingChangeNeverHidden(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	w := openStore(t, store.Options{Dir: dir})
	a, b := newMessage(t, time.Now()), newMessage(t, time.Now())
	mustPut(t, w, a, b)
	kindDir := filepath.Join(dir, "messages")
	setSameSecond(t, kindDir)
	o := openOneSecond(t, dir, 500*time.Millisecond)
	want := []string{a.MessageID, b.MessageID}
	slices.Sort(want)
	list := func(what string, want []string) {
		t.Helper()
		ids, err := o.s.List(store.KindMessages)
		if err != nil || !slices.Equal(ids, want) {
			t.Fatalf("%s: List = %v, %v; want %v", what, ids, err, want)
		}
	}
	list("first listing", want)
	stamp, err := o.s.ListingStamp(store.KindMessages)
	if err != nil {
		t.Fatal(err)
	}

	if err := os.Remove(filepath.Join(kindDir, b.MessageID+".json")); err != nil {
		t.Fatal(err)
	}
	setSameSecond(t, kindDir)
	list("after a same-second removal", []string{a.MessageID})

	c := newMessage(t, time.Now())
	data, err := store.EncodeRecord(ownerIdentity(t).Signer(), ownerIdentity(t).DID(), c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kindDir, c.MessageID+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	setSameSecond(t, kindDir)
	want = []string{a.MessageID, c.MessageID}
	slices.Sort(want)
	list("after a same-second planted record", want)
	if after, err := o.s.ListingStamp(store.KindMessages); err != nil || after != stamp {
		t.Fatalf("the stamp moved (%+v → %+v, %v): the test does not test a hidden change", stamp, after, err)
	}

	o.at(time.Second + 20*time.Millisecond)
	list("once the window passed", want)
	n := o.readDirs.Load()
	for range 3 {
		list("cached listing", want)
	}
	if got := o.readDirs.Load(); got != n {
		t.Fatalf("a listing taken after the racy window read the directory %d more times; want 0", got-n)
	}
}
