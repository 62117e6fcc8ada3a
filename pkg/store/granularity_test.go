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
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
	"golang.org/x/sys/unix"
)

// sameSecondFS is a file system with 1 s timestamps (fsx.Coarse) on which every change
// happens within the second of the change before it: it reports each file's and
// directory's ctime as its mtime, which the tests set back to the same whole second
// after every change, so a same-size rewrite on the same inode keeps the whole
// fingerprint and a directory change keeps the listing stamp. It counts the opens of
// record files and the directory listings, and calls read (if set) when a record
// file is closed (read(false)) and when a directory has been listed (read(true)).
type sameSecondFS struct {
	*fsx.Coarse
	opens, readDirs *atomic.Int64
	read            func(listing bool)
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
	if strings.HasSuffix(name, ".json") && f.read != nil {
		return sameSecondFile{File: file, closed: func() { f.read(false) }}, nil
	}
	return sameSecondFile{File: file}, nil
}

func (f sameSecondFS) ReadDir(name string) ([]fsx.DirEntry, error) {
	f.readDirs.Add(1)
	ents, err := f.Coarse.ReadDir(name)
	if f.read != nil {
		f.read(true)
	}
	return ents, err
}

type sameSecondFile struct {
	fsx.File
	closed func()
}

func (f sameSecondFile) Close() error {
	err := f.File.Close()
	if f.closed != nil {
		f.closed()
	}
	return err
}

func (f sameSecondFile) Stat() (fsx.Info, error) {
	info, err := f.File.Stat()
	info.CtimeNs = info.MtimeNs
	return info, err
}

// oneSecond is a store on a sameSecondFS with a clock the test sets.
type oneSecond struct {
	s               *store.Store
	now             atomic.Int64 // the store's clock, ns since the epoch
	jumpFile        atomic.Int64 // if not 0, the clock after the next record file read
	jumpListing     atomic.Int64 // if not 0, the clock after the next directory listing
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
			return sameSecondFS{Coarse: fsx.NewCoarse(inner, time.Second), opens: &o.opens, readDirs: &o.readDirs,
				read: func(listing bool) {
					jump := &o.jumpFile
					if listing {
						jump = &o.jumpListing
					}
					if j := jump.Swap(0); j != 0 {
						o.now.Store(j)
					}
				}}
		}})
	return o
}

// at sets the store's clock to d after sameSecond.
func (o *oneSecond) at(d time.Duration) { o.now.Store(sameSecond.Add(d).UnixNano()) }

// jumpDuringFileRead sets the store's clock to d after sameSecond as soon as the next
// record file read is closed, and jumpDuringListing as soon as the next directory
// listing has been read: the read began before that time and ended after it.
func (o *oneSecond) jumpDuringFileRead(d time.Duration) {
	o.jumpFile.Store(sameSecond.Add(d).UnixNano())
}
func (o *oneSecond) jumpDuringListing(d time.Duration) {
	o.jumpListing.Store(sameSecond.Add(d).UnixNano())
}

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
func oneSecondMessage(t *testing.T, dir string) (*record.Message, string, []byte) {
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
func signed(t *testing.T, m *record.Message, attempts int) []byte {
	t.Helper()
	next := *m
	next.Attempts = attempts
	data, err := record.Encode(ownerIdentity(t).Signer(), ownerIdentity(t).DID(), &next)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func getMessage(t *testing.T, s *store.Store, id string) (*record.Message, error) {
	t.Helper()
	return store.GetAs[*record.Message](s, id)
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
		ids, err := o.s.List(record.KindMessages)
		if err != nil || !slices.Equal(ids, want) {
			t.Fatalf("%s: List = %v, %v; want %v", what, ids, err, want)
		}
	}
	list("first listing", want)
	stamp, err := o.s.ListingStamp(record.KindMessages)
	if err != nil {
		t.Fatal(err)
	}

	if err := os.Remove(filepath.Join(kindDir, b.MessageID+".json")); err != nil {
		t.Fatal(err)
	}
	setSameSecond(t, kindDir)
	list("after a same-second removal", []string{a.MessageID})

	c := newMessage(t, time.Now())
	data, err := record.Encode(ownerIdentity(t).Signer(), ownerIdentity(t).DID(), c)
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
	if after, err := o.s.ListingStamp(record.KindMessages); err != nil || after != stamp {
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

// A read is judged racy by the clock read before it began: a read that starts inside
// the racy window and ends after it (the clock jumps to the window's end while the
// file or directory is read) leaves a racy cache entry, listing and index entry, so a
// same-second change that landed after the read is still seen.
func TestOneSecondFSRacyJudgedByClockBeforeRead(t *testing.T) {
	const window = time.Second + 20*time.Millisecond
	t.Run("cache", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "store") // created 0700 by the store
		m, path, _ := oneSecondMessage(t, dir)
		o := openOneSecond(t, dir, 500*time.Millisecond)
		o.jumpDuringFileRead(window)
		if got, err := getMessage(t, o.s, m.MessageID); err != nil || got == nil || got.Attempts != 0 {
			t.Fatalf("first Get = %+v, %v", got, err)
		}
		overwriteSameSecond(t, path, signed(t, m, 1))
		if got, err := getMessage(t, o.s, m.MessageID); err != nil || got == nil || got.Attempts != 1 {
			t.Fatalf("after a same-second rewrite: Get = %+v, %v (the cached old version was served)", got, err)
		}
	})
	t.Run("listing", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "store") // created 0700 by the store
		a := newMessage(t, time.Now())
		w := openStore(t, store.Options{Dir: dir})
		mustPut(t, w, a)
		kindDir := filepath.Join(dir, "messages")
		setSameSecond(t, kindDir)
		o := openOneSecond(t, dir, 500*time.Millisecond)
		o.jumpDuringListing(window)
		if ids, err := o.s.List(record.KindMessages); err != nil || !slices.Equal(ids, []string{a.MessageID}) {
			t.Fatalf("first List = %v, %v", ids, err)
		}
		if err := os.Remove(filepath.Join(kindDir, a.MessageID+".json")); err != nil {
			t.Fatal(err)
		}
		setSameSecond(t, kindDir)
		if ids, err := o.s.List(record.KindMessages); err != nil || len(ids) != 0 {
			t.Fatalf("after a same-second removal: List = %v, %v (the cached listing was served)", ids, err)
		}
	})
	t.Run("index", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "store") // created 0700 by the store
		m, path, _ := oneSecondMessage(t, dir)
		o := openOneSecond(t, dir, 500*time.Millisecond)
		writer := openStore(t, store.Options{Dir: dir})
		o.jumpDuringFileRead(window)
		if e, err := messageSummary(t, o.s, m.MessageID); err != nil || e.Attempts != 0 {
			t.Fatalf("first index read: %+v, %v", e, err)
		}
		publishOther(t, writer, dir)
		overwriteSameSecond(t, path, signed(t, m, 1))
		if e, err := messageSummary(t, o.s, m.MessageID); err != nil || e.Attempts != 1 {
			t.Fatalf("after a same-second rewrite: index entry %+v, %v (the old summary was kept)", e, err)
		}
	})
}
