package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// BackupOptions tune Backup. The zero value is usable.
type BackupOptions struct {
	// MaxHoldNames bounds the files the final lock hold may find changed since they
	// were copied (default 256): it opens each of them, so this bounds the hold. A
	// larger delta is copied outside the lock first, in another pass.
	MaxHoldNames int
	// MaxPasses bounds the copy passes (default 64). A store that changes faster than
	// the copy keeps up with fails the backup with OUTBOX_STORE_BUSY (nothing left at
	// dest).
	MaxPasses int
	// Workers copies files in parallel (default min(4 × GOMAXPROCS, 32)).
	Workers int
	// Scan finds changes by comparing every file's fingerprint with its copy's
	// instead of by inotify, in every pass and in the final hold (which then grows
	// with the store). Use it for a store on a network file system written from
	// other hosts too, whose changes inotify does not see.
	Scan bool
}

// BackupReport says what Backup copied and what it cost the store's other writers.
type BackupReport struct {
	Dest  string // the absolute path of the copy
	Files int    // files in the copy: records, blobs and the head
	Bytes int64  // their bytes
	// Copies counts file copies made, including files copied again because they
	// changed during the backup.
	Copies int
	Passes int // copy passes made outside the lock
	// Holds is how many times the backup took the store lock; LongestHold is the
	// longest of them (from its acquisition to its release).
	Holds       int
	LongestHold time.Duration
	// Watch is how changes were noticed between passes: "inotify" (events name the
	// changed files; the final hold opens only them) or "scan" (no inotify: every
	// pass, and the final hold, compare every file's fingerprint).
	Watch string
	// Head is the head file copied (nil: the store had none). HeadWritten says
	// that the backup wrote it, in its final hold, so that it counts exactly the
	// state copied; it does not when the store is rolled back (writes are refused),
	// and then the head on disk is copied as it is.
	Head        []byte
	HeadWritten bool
}

// BackupDestError is the cause of the error Backup returns for an unusable
// destination (it exists, its parent is missing or not a private directory of
// ours, it lies inside the store): nothing was read or written.
type BackupDestError struct {
	Dest   string
	Reason string
}

func (e *BackupDestError) Error() string { return e.Dest + ": " + e.Reason }

// backupDirs are the directories of a store that a backup copies: the kind
// directories and blobs/. Nothing else is copied: not .lock or its temps (a lock
// belongs to running processes), not .generation (a restored store has none, so
// every process lists afresh), not lost+found (fsck's evidence, not store state), and
// never a staged temp or a partial blob.
var backupDirs = func() []string {
	d := make([]string, 0, len(record.Kinds)+1)
	for _, k := range record.Kinds {
		d = append(d, string(k))
	}
	return append(d, BlobDir)
}()

// Backup writes a point-in-time copy of the store to dest, which must not exist and
// whose parent must be an existing directory of ours (not a symbolic link, not
// writable by group or others unless sticky). Other goroutines and processes keep
// writing meanwhile; the copy is made through this Store's lock, so it may be run
// beside a daemon using the store.
//
// The consistency rule: the copy holds exactly the record files and blobs that the
// store directory held at one instant inside the backup's final hold of the store
// lock — the instant that hold read the change events — byte for byte, nothing else,
// and the head written in that same hold (seq one above the store's, counting
// exactly that state). No writer of any process publishes a record during the hold:
// every rename and unlink of a record is made under the lock (DESIGN §6, §9). So
// the copy is a state the store was in between two lock holds of its writers:
// every transaction acknowledged before the backup began is in it whole, every
// other one whole or not at all (a publication that failed midway is as it left
// it, as after a crash), and fsck finds in the copy what it would have found in the
// store then. (A blob is committed outside the lock, before any record may name it;
// one committed during the hold is in the copy or not, and no copied record names
// it.) A later commit makes the store's next head higher than the copy's: a copy
// restored over a store that changed since is seen as rolled back (DESIGN §5).
// While the store is rolled back no head is written: the head on disk is copied.
//
// How: files are copied outside the lock, in passes, into a private directory beside
// dest. Before the first pass the store directory and each kind directory are
// watched with inotify: a change to a name (rename, link, unlink, create, write or
// attribute change) queues an event naming it in the writer's system call, before
// it returns, so once the backup holds the lock every publication made by then is
// among the events. A file copied since its last event is current. Each pass copies
// again the files changed since their copy (and drops those removed); once they are
// at most opts.MaxHoldNames, the final hold (exclusive) drains the events and, if
// the delta is still within that bound, opens each changed file (pinning its inode:
// a record or blob file is never rewritten in place, only replaced), writes the
// head, releases the lock, and copies from the open files. A larger delta releases
// the lock for another pass. So the final hold grows with the files changed since
// the last pass (and the head's fsyncs), not with the store. Where events were lost
// (queue overflow) a pass compares every file's fingerprint with its copy's (the
// racy rule of DESIGN §8 decides equal ones); without inotify, or with opts.Scan
// (a store on a network file system that other hosts write: inotify sees only this
// host's changes), every pass and the final hold do so: correct, but a hold that
// grows with the store.
//
// Every record copied is verified (record.Parse) and every blob hashed against its
// name: a store file that fails fails the backup with OUTBOX_STORE_INVALID (run
// sealbridge-fsck). Blobs are immutable, named by their digest: each is copied once.
// Every file of the copy is created 0600 and fsynced, every directory 0700 and
// fsynced, then the private directory is renamed to dest (never replacing anything)
// and dest's parent fsynced: when Backup returns nil the copy is durable at dest. No
// symbolic link is followed, in the store or at dest. On any error nothing is left
// at dest (the private directory is removed).
//
// Restoring: stop every process using the store, move the store directory aside,
// move the copy to its place (docs/DAEMON.md "Back up and restore").
func (s *Store) Backup(ctx context.Context, dest string, opts BackupOptions) (BackupReport, error) {
	b := &backup{s: s, opts: opts.withDefaults(), copied: map[string]copiedFile{}, dirty: map[string]struct{}{},
		rescan: map[string]bool{}}
	if err := b.checkDest(dest); err != nil {
		return BackupReport{Dest: b.dest}, err
	}
	rep, err := b.run(ctx)
	if err != nil {
		b.removeStaging()
		return BackupReport{Dest: b.dest, Holds: b.rep.Holds, LongestHold: b.rep.LongestHold}, err
	}
	return rep, nil
}

func (o BackupOptions) withDefaults() BackupOptions {
	if o.MaxHoldNames <= 0 {
		o.MaxHoldNames = 256
	}
	if o.MaxPasses <= 0 {
		o.MaxPasses = 64
	}
	if o.Workers <= 0 {
		o.Workers = min(4*runtime.GOMAXPROCS(0), 32)
	}
	return o
}

// backupBeforeFinalHold, if set (by tests only), runs before each final hold.
var backupBeforeFinalHold func()

// copiedFile is the version of a store file that the copy holds.
type copiedFile struct {
	fp   fsx.Fingerprint
	racy bool // its fingerprint was racy when it was copied (DESIGN §8)
}

// backup is one Backup in progress.
type backup struct {
	s    *Store
	opts BackupOptions

	dest, stageName string
	parent          fsx.FS // dest's parent directory
	dst             fsx.FS // the private directory the copy is made in
	dstDirs         fsx.DirsMade
	staged          bool // the private directory exists

	watch *dirWatch // nil: no inotify

	mu       sync.Mutex
	copied   map[string]copiedFile // "dir/name" → the version in the copy
	dirty    map[string]struct{}   // names whose copy may not be current (or that have none yet)
	rescan   map[string]bool       // directories to list again (new, replaced, not watched)
	overflow bool                  // events were lost: every directory is listed again
	degraded bool                  // a watch could not be set: compare fingerprints from now on
	gone     error                 // the store directory itself moved or vanished

	rep BackupReport
}

// checkDest applies the rules for dest and opens its parent.
func (b *backup) checkDest(dest string) error {
	destErr := func(reason, hint string) error {
		return errcode.WithHint(errcode.New(errcode.OutboxStoreUnwritable, "backup destination",
			&BackupDestError{Dest: b.dest, Reason: reason}), hint)
	}
	if dest == "" {
		return destErr("no destination given", "name a directory that does not exist yet")
	}
	abs, err := filepath.Abs(dest)
	if err != nil {
		return destErr(err.Error(), "name the destination by an absolute path")
	}
	b.dest = abs
	parentDir, base := filepath.Dir(abs), filepath.Base(abs)
	if base == "/" || base == "." || base == ".." {
		return destErr("not a directory name", "name a directory that does not exist yet")
	}
	if abs == b.s.dir || strings.HasPrefix(abs, b.s.dir+"/") || strings.HasPrefix(b.s.dir, abs+"/") {
		return destErr("inside the store directory "+b.s.dir+" (or containing it)", "put the copy outside the store directory")
	}
	b.parent = fsx.NewOS(parentDir)
	info, err := b.parent.Lstat(".")
	switch {
	case fsx.IsNotExist(err):
		return destErr("its parent directory "+parentDir+" does not exist", "create it first (mkdir -p -m 700 "+parentDir+") or choose another destination")
	case err != nil:
		return destErr(err.Error(), "choose a destination in a directory of yours")
	case info.IsSymlink():
		return destErr("its parent "+parentDir+" is a symbolic link, which a backup never follows", "name the destination by its real path")
	case !info.IsDir():
		return destErr("its parent "+parentDir+" is not a directory", "choose a destination in a directory of yours")
	case int(info.Uid) != syscall.Geteuid():
		return destErr(fmt.Sprintf("its parent %s belongs to uid %d, not to you (uid %d)", parentDir, info.Uid, syscall.Geteuid()),
			"run the backup as the store's owner, into a directory of that user")
	case info.Perm()&0o022 != 0 && info.Mode&syscall.S_ISVTX == 0:
		return destErr(fmt.Sprintf("its parent %s is writable by group or others (mode %04o)", parentDir, info.Perm()),
			"choose a directory only you can write (chmod go-w "+parentDir+"), or a sticky one such as /tmp")
	}
	if _, err := b.parent.Lstat(base); err == nil {
		return destErr("it exists", "a backup never replaces anything: choose a new name, or remove the old copy first")
	} else if !fsx.IsNotExist(err) {
		return destErr(err.Error(), "choose a destination in a directory of yours")
	}
	return nil
}

// run makes the copy in a private directory beside dest and renames it to dest.
func (b *backup) run(ctx context.Context) (BackupReport, error) {
	b.stageName = fsx.TempName()
	if _, err := fsx.MkdirPrivate(b.parent, b.stageName); err != nil {
		return BackupReport{}, unwritable(b.dest, err)
	}
	b.staged = true
	b.dst = fsx.NewOS(path.Join(b.parent.Root(), b.stageName))

	b.rep.Watch = "scan"
	if !b.opts.Scan {
		if w, err := newDirWatch(); err == nil {
			b.watch = w
			defer w.close()
			b.rep.Watch = "inotify"
			if err := b.watchDir("."); err != nil && !errors.Is(err, errNoWatch) {
				return BackupReport{}, err
			}
		}
	}
	for _, d := range backupDirs {
		b.rescan[d] = true
	}
	stop := b.drainInBackground()
	defer stop()

	for pass := 0; ; pass++ {
		if pass == b.opts.MaxPasses {
			return BackupReport{}, errcode.New(errcode.OutboxStoreBusy, b.s.dir,
				fmt.Errorf("the store changed faster than the backup could copy it (%d passes)", pass))
		}
		if err := b.pass(ctx); err != nil {
			return BackupReport{}, err
		}
		b.rep.Passes++
		if b.pending() > b.opts.MaxHoldNames {
			continue
		}
		if backupBeforeFinalHold != nil {
			backupBeforeFinalHold()
		}
		done, err := b.finalHold(ctx)
		if err != nil {
			return BackupReport{}, err
		}
		if done {
			break
		}
	}
	if err := b.finish(); err != nil {
		return BackupReport{}, err
	}
	return b.rep, nil
}

// pending is how many names are known to need copying.
func (b *backup) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.dirty)
	if b.overflow || len(b.rescan) > 0 {
		n = b.opts.MaxHoldNames + 1
	}
	return n
}

// pass brings the copy up to date outside the lock: it lists the directories that
// need it (every one without inotify), then copies every name found changed.
func (b *backup) pass(ctx context.Context) error {
	b.drain()
	scan := b.scanning()
	b.mu.Lock()
	if b.gone != nil {
		b.mu.Unlock()
		return b.gone
	}
	all := b.overflow || scan
	b.overflow = false
	var dirs []string
	for _, d := range backupDirs {
		if all || b.rescan[d] {
			dirs = append(dirs, d)
			delete(b.rescan, d)
		}
	}
	b.mu.Unlock()
	for _, d := range dirs {
		if err := b.scanDir(d); err != nil {
			return err
		}
	}
	return b.copyDirty(ctx)
}

// scanDir (re)watches directory d, lists it and marks dirty every name whose copy
// may not be current: not copied yet, copied from another file (fingerprint) or from
// one whose fingerprint was racy, or copied and gone. Blobs are immutable: a blob
// copied and still present is current.
func (b *backup) scanDir(d string) error {
	if err := b.watchDir(d); err != nil && !errors.Is(err, errNoWatch) {
		return err
	}
	ents, err := b.s.fs.ReadDir(d)
	if err != nil && !fsx.IsNotExist(err) {
		return invalidAt(d, err)
	}
	listed := make(map[string]bool, len(ents))
	for _, e := range ents {
		skip, err := skipName(d, e.Name)
		if err != nil {
			return err
		}
		if skip {
			continue
		}
		key := d + "/" + e.Name
		listed[key] = true
		b.mu.Lock()
		c, had := b.copied[key]
		b.mu.Unlock()
		if had && d != BlobDir {
			info, err := b.s.fs.Lstat(key)
			had = err == nil && info.Fingerprint() == c.fp && !c.racy
		}
		if !had {
			b.markDirty(key)
		}
	}
	b.mu.Lock()
	for key := range b.copied {
		if dir, _ := path.Split(key); dir == d+"/" && !listed[key] {
			b.dirty[key] = struct{}{}
		}
	}
	b.mu.Unlock()
	return nil
}

// skipName reports whether name, in store directory d, is no file of the copy (a
// staged temp, a partial blob), and refuses a name the store never makes there.
func skipName(d, name string) (bool, error) {
	if fsx.IsTempName(name) {
		return true, nil
	}
	if d == BlobDir {
		if _, ok := BlobPartEnvelope(name); ok {
			return true, nil
		}
		if ValidBlobDigest(name) {
			return false, nil
		}
	} else if id, ok := strings.CutSuffix(name, ".json"); ok && record.ValidID(record.Kind(d), id) {
		return false, nil
	}
	return false, errcode.WithHint(invalidAt(d+"/"+name, errors.New("unknown file in a store directory")),
		"run sealbridge-fsck on the store, then back it up again")
}

func (b *backup) markDirty(key string) {
	b.mu.Lock()
	b.dirty[key] = struct{}{}
	b.mu.Unlock()
}

// copyDirty copies every dirty name, on opts.Workers goroutines.
func (b *backup) copyDirty(ctx context.Context) error {
	b.mu.Lock()
	keys := make([]string, 0, len(b.dirty))
	for k := range b.dirty {
		keys = append(keys, k)
	}
	b.mu.Unlock()
	slices.Sort(keys)
	return b.parallel(ctx, len(keys), func(i int) error { return b.copyOne(ctx, keys[i]) })
}

// parallel runs fn(0..n-1) on at most opts.Workers goroutines and returns the first
// error; after one, no further call starts.
func (b *backup) parallel(ctx context.Context, n int, fn func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	for range min(b.opts.Workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if first != nil || next == n {
					mu.Unlock()
					return
				}
				i := next
				next++
				mu.Unlock()
				err := ctx.Err()
				if err == nil {
					err = fn(i)
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil && ctx.Err() != nil {
		return errcode.New(errcode.OutboxStoreBusy, b.s.dir, ctx.Err())
	}
	return first
}

// copyOne copies the file at key as it is now (or drops its copy if it is gone).
// It clears the name's dirty mark before it opens the file: an event from any change
// after the open marks it again.
func (b *backup) copyOne(ctx context.Context, key string) error {
	d, name, _ := strings.Cut(key, "/")
	if skip, err := skipName(d, name); err != nil || skip {
		return err
	}
	b.mu.Lock()
	delete(b.dirty, key)
	_, had := b.copied[key]
	b.mu.Unlock()
	if had && strings.HasPrefix(key, BlobDir+"/") {
		_, err := b.s.fs.Lstat(key)
		if fsx.IsNotExist(err) {
			return b.drop(key)
		}
		return nil // immutable: the copy is current while the blob is there
	}
	f, info, at, err := b.open(key)
	if err != nil {
		return err
	}
	if f == nil {
		return b.drop(key)
	}
	defer f.Close()
	return b.store(ctx, key, f, info, at)
}

// open opens the store file at key for copying (nil if it does not exist) and
// applies the store's file rules to it. at is the clock reading before the open.
func (b *backup) open(key string) (fsx.File, fsx.Info, time.Time, error) {
	at := b.s.now()
	max := int64(-1)
	if d, _, _ := strings.Cut(key, "/"); d != BlobDir {
		max = b.s.limits.MaxBytes(record.Kind(d))
	}
	f, info, err := fsx.OpenRegular(b.s.fs, key, max)
	if fsx.IsNotExist(err) {
		return nil, fsx.Info{}, at, nil
	}
	if err == nil {
		if err = fsx.CheckPrivateFile(key, info); err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, fsx.Info{}, at, errcode.WithHint(invalidAt(key, err), "run sealbridge-fsck on the store, then back it up again")
	}
	return f, info, at, nil
}

// store writes the contents of f (the store file at key, described by info) to the
// copy: a record verified, a blob hashed against its name, fsynced in a temp and
// renamed over the name in the private directory.
func (b *backup) store(ctx context.Context, key string, f fsx.File, info fsx.Info, at time.Time) error {
	d, name, _ := strings.Cut(key, "/")
	if err := b.dstDirs.Ensure(b.dst, d); err != nil {
		return unwritable(b.dest+"/"+d, err)
	}
	var st *fsx.Staged
	if d == BlobDir {
		w, err := fsx.StageStream(b.dst, d)
		if err != nil {
			return unwritable(b.dest+"/"+d, err)
		}
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(w, h), ctxReader{ctx, f})
		if err != nil {
			_ = w.Abort()
			if ctx.Err() != nil {
				return errcode.New(errcode.OutboxStoreBusy, b.s.dir, ctx.Err())
			}
			return unwritable(b.dest+"/"+key, err)
		}
		if n != info.Size || hex.EncodeToString(h.Sum(nil)) != name {
			_ = w.Abort()
			return errcode.WithHint(invalidAt(key, errors.New("the blob's bytes do not match its name")),
				"run sealbridge-fsck on the store, then back it up again")
		}
		if st, err = w.Finish(); err != nil {
			return unwritable(b.dest+"/"+key, err)
		}
	} else {
		data := make([]byte, info.Size+1)
		n, err := io.ReadFull(f, data)
		if err != io.ErrUnexpectedEOF && err != io.EOF {
			if err == nil {
				err = errors.New("the file grew while it was read")
			}
			return invalidAt(key, err)
		}
		data = data[:n]
		id := strings.TrimSuffix(name, ".json")
		if _, err := record.Parse(record.Kind(d), id, data, b.s.owner, b.s.ownerKey); err != nil {
			return errcode.WithHint(invalidAt(key, err), "run sealbridge-fsck on the store, then back it up again")
		}
		if st, err = fsx.Stage(b.dst, d, data); err != nil {
			return unwritable(b.dest+"/"+key, err)
		}
	}
	if err := st.Publish(name); err != nil {
		_ = st.Cleanup()
		return unwritable(b.dest+"/"+key, err)
	}
	b.mu.Lock()
	b.copied[key] = copiedFile{fp: info.Fingerprint(), racy: b.s.racyAt(at, info.CtimeNs)}
	b.rep.Copies++
	b.mu.Unlock()
	return nil
}

// drop removes the copy of a file the store no longer has.
func (b *backup) drop(key string) error {
	b.mu.Lock()
	_, had := b.copied[key]
	delete(b.copied, key)
	b.mu.Unlock()
	if !had {
		return nil
	}
	if err := b.dst.Remove(key); err != nil && !fsx.IsNotExist(err) {
		return unwritable(b.dest+"/"+key, err)
	}
	return nil
}

// ctxReader stops a long blob copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// pinned is a changed file the final hold opened (f nil: it was gone).
type pinned struct {
	key  string
	f    fsx.File
	info fsx.Info
	at   time.Time
}

// finalHold takes the store lock (exclusive), decides whether the changes since the
// last pass fit in it and, if so, opens every changed file and reads the head, so that
// the copy becomes the store as of this hold. done false: the lock was released for
// another pass.
func (b *backup) finalHold(ctx context.Context) (done bool, err error) {
	unlock, _, err := b.s.lockStore(ctx, exclusive)
	if err != nil {
		return false, err
	}
	start := time.Now()
	var pins []pinned
	release := func() error {
		err := unlock()
		held := time.Since(start)
		b.rep.Holds++
		b.rep.LongestHold = max(b.rep.LongestHold, held)
		return err
	}
	closePins := func() {
		for _, p := range pins {
			if p.f != nil {
				p.f.Close()
			}
		}
	}
	ready, err := b.delta()
	if err == nil && ready {
		pins, err = b.pin()
	}
	var head []byte
	var headWritten bool
	if err == nil && ready {
		head, headWritten, err = b.headLocked()
	}
	if uerr := release(); err == nil && uerr != nil {
		err = uerr
	}
	if err != nil || !ready {
		closePins()
		return false, err
	}
	defer closePins()
	if err := b.parallel(ctx, len(pins), func(i int) error {
		p := pins[i]
		if p.f == nil {
			return b.drop(p.key)
		}
		return b.store(ctx, p.key, p.f, p.info, p.at)
	}); err != nil {
		return false, err
	}
	b.rep.Head, b.rep.HeadWritten = head, headWritten
	return true, nil
}

// delta, under the lock, brings the dirty set up to the store as it is now: with
// inotify by draining the events (every publication before this hold queued its
// event) and checking that every directory is the one watched; without, by listing
// every directory and comparing fingerprints. ready false: too much changed (or a
// directory needs listing) for this hold.
func (b *backup) delta() (ready bool, err error) {
	if b.scanning() {
		for _, d := range backupDirs {
			if err := b.scanDir(d); err != nil {
				return false, err
			}
		}
		return b.pending() <= b.opts.MaxHoldNames, nil
	}
	b.drain()
	b.mu.Lock()
	gone := b.gone
	b.mu.Unlock()
	if gone != nil {
		return false, gone
	}
	for _, d := range backupDirs {
		info, err := b.s.fs.Lstat(d)
		exists := err == nil
		if err != nil && !fsx.IsNotExist(err) {
			return false, invalidAt(d, err)
		}
		if !b.watch.current(d, info, exists) {
			b.mu.Lock()
			b.rescan[d] = true
			b.mu.Unlock()
		}
	}
	return b.pending() <= b.opts.MaxHoldNames, nil
}

// pin opens, under the lock, every dirty file (a blob already copied only needs to be
// still there), and clears the dirty set.
func (b *backup) pin() ([]pinned, error) {
	b.mu.Lock()
	keys := make([]string, 0, len(b.dirty))
	for k := range b.dirty {
		keys = append(keys, k)
	}
	b.dirty = map[string]struct{}{}
	b.mu.Unlock()
	slices.Sort(keys)
	pins := make([]pinned, 0, len(keys))
	for _, key := range keys {
		b.mu.Lock()
		_, had := b.copied[key]
		b.mu.Unlock()
		if had && strings.HasPrefix(key, BlobDir+"/") {
			if _, err := b.s.fs.Lstat(key); fsx.IsNotExist(err) {
				pins = append(pins, pinned{key: key})
			}
			continue
		}
		f, info, at, err := b.open(key)
		if err != nil {
			for _, p := range pins {
				if p.f != nil {
					p.f.Close()
				}
			}
			return nil, err
		}
		pins = append(pins, pinned{key: key, f: f, info: info, at: at})
	}
	return pins, nil
}

// headLocked returns the head the copy gets, under the final hold: a head written
// now, forced (as WriteHead does, under this same hold), so that it counts exactly
// the state copied and a later commit makes the store's next head higher than the
// copy's; or, while the store is rolled back (no write is allowed), the head on
// disk as it is.
func (b *backup) headLocked() (data []byte, written bool, err error) {
	s := b.s
	if s.RolledBack() == nil {
		// Under the exclusive hold no publication of this process runs: the head
		// written now counts every one before it.
		s.headDirty.Store(false)
		h, err := s.writeHeadLocked(false, 0)
		if err == nil {
			return h.data, true, nil
		}
		s.headDirty.Store(true)
		if !errors.Is(err, errcode.StoreRolledBack) {
			return nil, false, err
		}
	}
	data, _, err = fsx.ReadFile(s.fs, HeadFile, envelope.MaxHeadSize)
	if fsx.IsNotExist(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, invalidAt(HeadFile, err)
	}
	return data, false, nil
}

// finish writes the head, fsyncs every directory of the copy and renames it to dest.
func (b *backup) finish() error {
	if b.rep.Head != nil {
		if err := fsx.WriteFile(b.dst, ".", HeadFile, b.rep.Head); err != nil {
			return unwritable(b.dest+"/"+HeadFile, err)
		}
	}
	b.mu.Lock()
	files := len(b.copied)
	keys := make([]string, 0, files)
	for k := range b.copied {
		keys = append(keys, k)
	}
	b.mu.Unlock()
	var bytes int64
	for _, k := range keys {
		info, err := b.dst.Lstat(k)
		if err != nil {
			return unwritable(b.dest+"/"+k, err)
		}
		bytes += info.Size
	}
	for _, d := range backupDirs {
		if _, err := b.dst.Lstat(d); fsx.IsNotExist(err) {
			continue
		}
		if err := b.dst.SyncDir(d); err != nil {
			return unwritable(b.dest+"/"+d, err)
		}
	}
	if err := b.dst.SyncDir("."); err != nil {
		return unwritable(b.dest, err)
	}
	nr, ok := b.parent.(interface {
		RenameNoReplace(oldname, newname string) error
	})
	if !ok {
		return unwritable(b.dest, errors.New("the file system cannot rename without replacing"))
	}
	base := filepath.Base(b.dest)
	if err := nr.RenameNoReplace(b.stageName, base); err != nil {
		if fsx.IsExist(err) {
			return errcode.WithHint(errcode.New(errcode.OutboxStoreUnwritable, "backup destination",
				&BackupDestError{Dest: b.dest, Reason: "it was created while the backup ran"}), "choose a new name")
		}
		return unwritable(b.dest, err)
	}
	b.stageName = base // from now on, a failure removes dest itself
	if err := b.parent.SyncDir("."); err != nil {
		return unwritable(filepath.Dir(b.dest), err)
	}
	b.staged = false
	b.rep.Dest, b.rep.Files, b.rep.Bytes = b.dest, files, bytes
	if b.rep.Head != nil {
		b.rep.Files++
		b.rep.Bytes += int64(len(b.rep.Head))
	}
	return nil
}

// removeStaging removes the private directory (or dest, once renamed) and what is in
// it, through fsx, without following a link: only files this backup made are there.
func (b *backup) removeStaging() {
	if !b.staged {
		return
	}
	root := fsx.NewOS(path.Join(b.parent.Root(), b.stageName))
	for _, d := range append(slices.Clone(backupDirs), ".") {
		ents, err := root.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.Type.IsDir() {
				continue
			}
			_ = root.Remove(path.Join(d, e.Name))
		}
		if d != "." {
			_ = root.RemoveDir(d)
		}
	}
	_ = b.parent.RemoveDir(b.stageName)
	_ = b.parent.SyncDir(".")
	b.staged = false
}
