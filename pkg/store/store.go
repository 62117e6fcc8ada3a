package store

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/internal/lru"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// Limits are the capacity limits of DESIGN §5, enforced under the lock.
type Limits struct {
	RecordBytes       int64 // one record file (default 256 KiB)
	OperationBytes    int64 // one operations record (default 64 KiB)
	WireBytes         int64 // one wire envelope (default 128 KiB)
	PendingEnvelopes  int   // pending outbox records (default 10,000)
	EnvelopeBytes     int64 // all outbox envelopes (default 256 MiB)
	Messages          int   // message records (default 100,000)
	Receipts          int   // receipt records (default 100,000)
	Operations        int   // operation records (default 10,000)
	CachedResultBytes int64 // operation responses (default 64 MiB)
	// BlobGrace is how old (by mtime, on the store's clock) an unreferenced blob or a
	// leftover staged or partial blob must be before maintenance removes it (default
	// DefaultBlobGrace, 1 h).
	BlobGrace time.Duration
}

// DefaultLimits returns the limits of DESIGN §5.
func DefaultLimits() Limits {
	return Limits{
		RecordBytes: 256 << 10, OperationBytes: 64 << 10, WireBytes: 128 << 10,
		PendingEnvelopes: 10_000, EnvelopeBytes: 256 << 20, Messages: 100_000,
		Receipts: 100_000, Operations: 10_000, CachedResultBytes: 64 << 20, BlobGrace: DefaultBlobGrace,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	pick := func(v, def int64) int64 {
		if v > 0 {
			return v
		}
		return def
	}
	pickInt := func(v, def int) int {
		if v > 0 {
			return v
		}
		return def
	}
	return Limits{
		RecordBytes: pick(l.RecordBytes, d.RecordBytes), OperationBytes: pick(l.OperationBytes, d.OperationBytes),
		WireBytes: pick(l.WireBytes, d.WireBytes), PendingEnvelopes: pickInt(l.PendingEnvelopes, d.PendingEnvelopes),
		EnvelopeBytes: pick(l.EnvelopeBytes, d.EnvelopeBytes), Messages: pickInt(l.Messages, d.Messages),
		Receipts: pickInt(l.Receipts, d.Receipts), Operations: pickInt(l.Operations, d.Operations),
		CachedResultBytes: pick(l.CachedResultBytes, d.CachedResultBytes),
		BlobGrace:         time.Duration(pick(int64(l.BlobGrace), int64(d.BlobGrace))),
	}
}

// MaxBytes returns the file size limit of kind k.
func (l Limits) MaxBytes(k record.Kind) int64 {
	if k == record.KindOperations {
		return l.OperationBytes
	}
	return l.RecordBytes
}

// Options configure a Store. The zero value is usable.
type Options struct {
	// Home is the data root; empty means the default data root (DESIGN §5).
	Home string
	// Dir, if set, is the store directory itself (overrides Home).
	Dir    string
	Limits Limits
	// CacheEntries and CacheBytes bound the verified-record LRU (defaults 256 and
	// 4 MiB); a negative CacheEntries disables it.
	CacheEntries int
	CacheBytes   int64
	// Now is the clock (default time.Now). It dates records and also judges whether a
	// file-system timestamp is "racy" (within the file system's timestamp granularity
	// of now), so outside tests it must follow the wall clock.
	Now func() time.Time
	// LockWait and LockStale are the lock's bounds (defaults 2 s and 30 s).
	LockWait, LockStale time.Duration
	// Retention is how long settled records are kept (default 7 days).
	Retention time.Duration
	// DeliveredRetention and ClosedRetention are how long a message record is kept
	// after its message ended: delivered (default 24 h after its delivery) or closed
	// (deadline, refused, expired, cancelled; default 7 days after it closed). See
	// Tx.EndMessage.
	DeliveredRetention, ClosedRetention time.Duration
	// OptimisticOnly makes prepared transactions give up with OUTBOX_STORE_BUSY after
	// their bounded optimistic rounds instead of running their last round locked. Only
	// tests set it, to reach the bound of the optimistic rounds (OUTBOX_STORE_BUSY).
	OptimisticOnly bool
	// OperationLease is the lease of an in-flight idempotent operation (default 120 s).
	OperationLease time.Duration
	// WrapFS, if set, wraps the store's file system (fault injection in tests).
	WrapFS func(fsx.FS) fsx.FS
	// LockHoldObserver, if set, is called after every release of the store lock with
	// how long this Store held it (from the acquisition to the end of the release).
	// It runs on the releasing goroutine once the lock is free (to this process's
	// other goroutines too) and must be safe for concurrent use. Benchmarks use it to
	// measure lock holds.
	LockHoldObserver func(time.Duration)
	// WitnessFile, if set, is the local witness of the store's head (DESIGN §5, "The
	// head"), instead of dataroot.WitnessFile(data root, owner). With Dir and no
	// WitnessFile the store has no local witness.
	WitnessFile string
}

// A file-system timestamp is "racy" (git's rule) while now is less than the racy
// window after it: a fingerprint or listing stamp taken then may be followed by a
// change with the very same timestamp. The window is the file system's timestamp
// granularity, measured once per Store (fsx.ProbeGranularity), plus racyFloor: the
// kernel stamps times from a clock that advances once a tick (up to 10 ms), behind
// the clock the store reads. Where the probe cannot run, the granularity is taken to
// be unknownGranularity, the coarsest in common use (FAT).
const (
	racyFloor          = 20 * time.Millisecond
	unknownGranularity = 2 * time.Second
)

// Store is one identity's outbox store. It is safe for concurrent use by many
// goroutines and, through the lock file, by many processes.
type Store struct {
	owner    identity.DID
	ownerKey identity.PublicKey
	signer   crypto.Signer
	dataRoot string // "" when opened with Options.Dir
	dir      string
	fs       fsx.FS
	limits   Limits
	now      func() time.Time
	lockOpts lockfile.Options
	retain   time.Duration
	opLease  time.Duration
	// keepDelivered and keepClosed are Options.DeliveredRetention and ClosedRetention.
	keepDelivered, keepClosed time.Duration

	optimisticOnly bool

	lk storeLock // this process's holders of the store lock (lock.go)

	storeDirMade atomic.Bool  // ensureStoreDir made the directory chain durable
	kindDirs     fsx.DirsMade // the kind directories made durable through s.fs

	// staging counts this process's record writes between the start of their staging
	// and their publication or removal: while it is above zero, maintenance leaves
	// every record temp alone, old-looking or not (a clock step must not remove a temp
	// a transaction is about to rename).
	staging atomic.Int64

	lockHolds atomic.Int64 // lock acquisitions
	lockWait  atomic.Int64 // nanoseconds spent waiting for them

	lockHeld func(time.Duration) // Options.LockHoldObserver, nil if unset

	pubMu     sync.Mutex     // guards the group-commit queue
	pubQueue  []*publication // prepared publications waiting for a lock hold
	pubLeader bool           // a goroutine is taking the lock for the queue

	granMu   sync.Mutex   // serializes the granularity probe
	racyNs   atomic.Int64 // the racy window once measured, 0 before
	mu       sync.Mutex   // guards the fields below
	listings map[record.Kind]*listing
	indexes  map[record.Kind]*index
	cache    *lru.Cache[string, *cached]
	// inFlight holds, per kind, the id of this process's publication between its
	// rename (or unlink) and its adoption: meanwhile the directory has changed but no
	// stamp says so yet (DESIGN §8). unmarkedKinds holds the kinds with a publication
	// whose generation mark failed and could not be made up for (markFailed).
	inFlight      map[record.Kind]string
	unmarkedKinds map[record.Kind]bool
	published     chan struct{} // closed (and replaced) when a publication in flight ends

	headFields // the head, the witness and the rolled-back state (head.go)
}

// Open returns the store of the identity whose key signer holds. It has no side
// effects on disk: directories are created by the first write. It refuses, with
// OUTBOX_STORE_INVALID, a data root or store directory that breaks the data-root
// rules (internal/dataroot): the error names the path and carries the fix as its
// hint (errcode.HintOf). It reads the head (.head) and the local witness: a head or
// witness that is not a private regular file holding a head signed by the owner is
// OUTBOX_STORE_INVALID; a head of a newer format than FormatVersion is
// STORE_FORMAT_NEWER (nothing is changed); a witness ahead of the head leaves the
// Store rolled back (RolledBack), refusing every write until Reconcile.
func Open(signer crypto.Signer, opts Options) (*Store, error) {
	pub, ok := signer.Public().(ed25519.PublicKey)
	if !ok {
		return nil, errcode.New(errcode.OutboxStoreInvalid, "owner", errors.New("signer does not hold an Ed25519 key"))
	}
	owner := identity.FormatDID(pub)
	key, err := identity.ParseDID(string(owner))
	if err != nil {
		return nil, errcode.New(errcode.OutboxStoreInvalid, "owner", err)
	}
	s := &Store{owner: owner, ownerKey: key, signer: signer, limits: opts.Limits.withDefaults(),
		now: opts.Now, retain: opts.Retention, listings: map[record.Kind]*listing{}, indexes: map[record.Kind]*index{}}
	if s.now == nil {
		s.now = time.Now
	}
	if s.retain <= 0 {
		s.retain = 7 * 24 * time.Hour
	}
	s.keepDelivered, s.keepClosed = opts.DeliveredRetention, opts.ClosedRetention
	if s.keepDelivered <= 0 {
		s.keepDelivered = DefaultDeliveredRetention
	}
	if s.keepClosed <= 0 {
		s.keepClosed = DefaultClosedRetention
	}
	s.optimisticOnly = opts.OptimisticOnly
	s.lockHeld = opts.LockHoldObserver
	s.opLease = opts.OperationLease
	if s.opLease <= 0 {
		s.opLease = defaultOperationLease
	}
	if opts.Dir != "" {
		s.dir, err = filepath.Abs(opts.Dir)
	} else {
		s.dataRoot, err = dataroot.Resolve(opts.Home)
		s.dir = dataroot.StoreDir(s.dataRoot, string(owner))
	}
	if err != nil {
		return nil, errcode.New(errcode.OutboxStoreUnwritable, "data root", err)
	}
	if err := s.checkDirs(); err != nil {
		return nil, err
	}
	var fsys fsx.FS = fsx.NewOS(s.dir)
	if opts.WrapFS != nil {
		fsys = opts.WrapFS(fsys)
	}
	s.fs = fsys
	entries, bytesMax := opts.CacheEntries, opts.CacheBytes
	if entries == 0 {
		entries = 256
	}
	if bytesMax <= 0 {
		bytesMax = 4 << 20
	}
	s.cache = lru.New[string, *cached](entries, bytesMax)
	s.lockOpts = lockfile.Options{Wait: opts.LockWait, Stale: opts.LockStale, Now: s.now}
	if err := s.initHead(opts); err != nil {
		return nil, err
	}
	return s, nil
}

// LockStats returns how many times this Store took the store lock and the total time
// it waited for it (behind this process's other holders and other processes).
func (s *Store) LockStats() (acquisitions int64, waited time.Duration) {
	return s.lockHolds.Load(), time.Duration(s.lockWait.Load())
}

// Dir returns the store directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) nowMs() int64 { return s.now().UnixMilli() }

// checkDirs applies the data-root rules to what exists of the data root (when the
// store was opened by it) and of the store directory and its kind directories.
func (s *Store) checkDirs() error {
	if s.dataRoot != "" {
		if err := dataroot.CheckRoot(s.dataRoot); err != nil {
			return invalidAt("", err)
		}
	}
	kinds := make([]string, len(record.Kinds), len(record.Kinds)+1)
	for i, k := range record.Kinds {
		kinds[i] = string(k)
	}
	kinds = append(kinds, BlobDir) // held to the kind directories' rules
	if err := dataroot.CheckStore(s.dir, kinds); err != nil {
		return invalidAt("", err)
	}
	return nil
}

// ensureStoreDir makes the private directory chain down to the store directory exist
// and be durable. The first call of each Store runs the chain even if the store
// directory exists (its creator may have crashed before a parent's fsync:
// fsx.MkdirPrivate fsyncs the parent of a directory it finds, too); later calls only
// check that it is still there.
func (s *Store) ensureStoreDir() error {
	if s.storeDirMade.Load() {
		if _, err := s.fs.Lstat("."); err == nil {
			return nil
		}
	}
	base := s.dataRoot
	rel := ""
	if base == "" {
		base, rel = filepath.Dir(s.dir), filepath.Base(s.dir)
	} else {
		rel = dataroot.DeliveryDir + "/" + filepath.Base(s.dir)
	}
	if err := ensureDataRoot(base); err != nil {
		return err
	}
	rootFS := fsx.NewOS(base)
	parts := strings.Split(rel, "/")
	for i := range parts {
		if _, err := fsx.MkdirPrivate(rootFS, strings.Join(parts[:i+1], "/")); err != nil {
			return writeError(base, err)
		}
	}
	s.storeDirMade.Store(true)
	return nil
}

// ensureDataRoot creates the data root (0700, with any missing parents) or checks an
// existing one by the data-root rules (dataroot.CheckDir): a real directory (not a
// symlink), owned by us, not writable by group or others. Everything beneath it that
// the store creates is 0700.
func ensureDataRoot(base string) error {
	if err := os.MkdirAll(filepath.Dir(base), 0o700); err != nil {
		return unwritable(base, err)
	}
	parent := fsx.NewOS(filepath.Dir(base))
	name := filepath.Base(base)
	_, err := parent.Lstat(name)
	if fsx.IsNotExist(err) {
		_, err = fsx.MkdirPrivate(parent, name)
		if err != nil {
			return unwritable(base, err)
		}
		return nil
	}
	if err != nil {
		return unwritable(base, err)
	}
	if err := dataroot.CheckDir(base, "the data root"); err != nil {
		return invalidAt("", err)
	}
	return nil
}

// ensureKindDir makes the kind's directory exist, private and durable (created 0700,
// the store directory fsynced once per Store: fsx.DirsMade).
func (s *Store) ensureKindDir(k record.Kind) error {
	if err := s.kindDirs.Ensure(s.fs, string(k)); err != nil {
		return writeError(string(k), err)
	}
	return nil
}

// cached is one verified record in the LRU.
type cached struct {
	fp   fsx.Fingerprint
	data []byte
	rec  record.Record
	racy bool // cached within the racy window of the file's ctime
}

func (s *Store) isRacy(tsNs int64) bool { return s.racyAt(s.now(), tsNs) }

// racyAt reports whether the file-system timestamp tsNs is racy as of now. What is
// read is judged by the clock read before the read began: a change that lands
// between the read and a later clock reading could still keep the timestamp.
func (s *Store) racyAt(now time.Time, tsNs int64) bool {
	return now.UnixNano()-tsNs < int64(s.racyWindow())
}

// racyWindow returns this store's racy window, probing the file system's timestamp
// granularity in the store directory on first use (Open touches no disk). The probe
// leaves no trace; a store directory that does not exist yet is probed again later.
func (s *Store) racyWindow() time.Duration {
	if w := s.racyNs.Load(); w != 0 {
		return time.Duration(w)
	}
	s.granMu.Lock()
	defer s.granMu.Unlock()
	if w := s.racyNs.Load(); w != 0 {
		return time.Duration(w)
	}
	g, err := fsx.ProbeGranularity(s.fs, ".")
	if err != nil {
		g = unknownGranularity
	}
	w := racyFloor + g
	if !fsx.IsNotExist(err) {
		s.racyNs.Store(int64(w))
	}
	return w
}

// remember caches rec, read (or written) as data from the file with fingerprint fp,
// judged racy or not as of now, a clock reading taken before the file was read.
func (s *Store) remember(path string, data []byte, fp fsx.Fingerprint, rec record.Record, now time.Time) {
	s.cache.Add(path, &cached{fp: fp, data: data, rec: rec, racy: s.racyAt(now, fp.CtimeNs)}, int64(len(data)))
}

// read returns the verified record at kind/id, or nil if absent. Any failure evicts
// the cache entry and returns OUTBOX_STORE_INVALID.
func (s *Store) read(k record.Kind, id string) (record.Record, error) {
	r, _, err := s.readFP(k, id)
	return r, err
}

// readFP is read that also returns the fingerprint of the file the record came from
// (the zero Fingerprint when absent). The record is shared: callers must not modify it.
func (s *Store) readFP(k record.Kind, id string) (record.Record, fsx.Fingerprint, error) {
	for attempt := 1; ; attempt++ {
		r, fp, err := s.readFPOnce(k, id)
		if !errors.Is(err, errReplacedWhileRead) {
			return r, fp, err
		}
		if attempt == maxReplacedReads {
			return nil, fsx.Fingerprint{}, errcode.New(errcode.OutboxStoreBusy, record.Path(k, id), err)
		}
		// Retrying at once can land in the same slow replacement every time (a
		// -race run met 8 in a row): wait a little longer each time (2 µs
		// doubling to 2 ms, 8 ms in all).
		time.Sleep(min(time.Microsecond<<attempt, 2*time.Millisecond))
	}
}

// errReplacedWhileRead: the file a read opened lost its last link before the read's
// fstat — another writer renamed a newer version over it or removed it. That is no
// damage: the read starts again from the path.
var errReplacedWhileRead = errors.New("the record was replaced while it was read")

// maxReplacedReads bounds the reads of a record that keeps being replaced under them.
const maxReplacedReads = 14

// readFPOnce is one attempt of readFP.
func (s *Store) readFPOnce(k record.Kind, id string) (record.Record, fsx.Fingerprint, error) {
	if err := record.CheckKindID(k, id); err != nil {
		return nil, fsx.Fingerprint{}, invalidAt(string(k)+"/"+id, err)
	}
	path := record.Path(k, id)
	info, err := s.fs.Lstat(path)
	if err != nil {
		s.cache.Remove(path)
		if fsx.IsNotExist(err) {
			return nil, fsx.Fingerprint{}, nil
		}
		return nil, fsx.Fingerprint{}, invalidAt(path, err)
	}
	if info.Nlink == 0 && info.IsRegular() {
		s.cache.Remove(path)
		return nil, fsx.Fingerprint{}, errReplacedWhileRead // lstat resolves, then stats: replaced between
	}
	if err := fsx.CheckPrivateFile(path, info); err != nil {
		s.cache.Remove(path)
		return nil, fsx.Fingerprint{}, invalidAt(path, err)
	}
	fp := info.Fingerprint()
	if c, ok := s.cache.Get(path); ok && c.fp == fp {
		if !c.racy {
			return c.rec, fp, nil
		}
		// A racy entry: the inode may have been rewritten within the same tick.
		// Compare the bytes instead of trusting the fingerprint alone.
		now := s.now()
		data, rinfo, err := fsx.ReadFile(s.fs, path, s.limits.MaxBytes(k))
		if err == nil && rinfo.Fingerprint() == fp && bytes.Equal(data, c.data) {
			if !s.racyAt(now, fp.CtimeNs) {
				s.cache.Add(path, &cached{fp: fp, data: c.data, rec: c.rec}, int64(len(c.data)))
			}
			return c.rec, fp, nil
		}
	}
	s.cache.Remove(path)
	now := s.now()
	data, rinfo, err := fsx.ReadFile(s.fs, path, s.limits.MaxBytes(k))
	if err != nil {
		if fsx.IsNotExist(err) {
			return nil, fsx.Fingerprint{}, nil
		}
		return nil, fsx.Fingerprint{}, invalidAt(path, err)
	}
	if rinfo.Nlink == 0 && rinfo.IsRegular() {
		return nil, fsx.Fingerprint{}, errReplacedWhileRead
	}
	if err := fsx.CheckPrivateFile(path, rinfo); err != nil {
		return nil, fsx.Fingerprint{}, invalidAt(path, err)
	}
	rec, err := record.Parse(k, id, data, s.owner, s.ownerKey)
	if err != nil {
		return nil, fsx.Fingerprint{}, invalidAt(path, err)
	}
	// Cache only if the path still names the file we read, unchanged.
	if after, err := s.fs.Lstat(path); err == nil && after.Fingerprint() == rinfo.Fingerprint() {
		s.remember(path, data, rinfo.Fingerprint(), rec, now)
	}
	return rec, rinfo.Fingerprint(), nil
}

// Get returns a copy of the verified record kind/id, or (nil, nil) if it is absent.
func (s *Store) Get(k record.Kind, id string) (record.Record, error) {
	r, err := s.read(k, id)
	if r == nil || err != nil {
		return nil, err
	}
	return record.Clone(r), nil
}

// GetAs returns a copy of the record kind/id as its concrete type T, or the zero T
// (a nil pointer) if absent.
func GetAs[T record.Record](s *Store, id string) (T, error) {
	var zero T
	return typed[T](s.Get(zero.Kind(), id))
}

// typed converts the result of a Get to the record type T (the zero T when absent).
func typed[T record.Record](r record.Record, err error) (T, error) {
	var zero T
	if r == nil || err != nil {
		return zero, err
	}
	t, ok := r.(T)
	if !ok {
		return zero, invalidAt(r.RecordID(), errors.New("record has an unexpected type"))
	}
	return t, nil
}

// Stamp is a kind's listing stamp: its directory's dev, ino, mtime and ctime, and the
// state of the generation file (its dev, ino, epoch and size; DESIGN §8). Two stamps
// are equal only if nothing the store publishes changed between them; after a
// compaction of the generation file no earlier stamp equals a later one.
type Stamp struct {
	Dir    fsx.DirStamp
	absent bool // the kind directory does not exist
	gen    generation
}

// generationName is the generation file, grown by one mark byte at every publication.
const generationName = GenerationFile

// ListingStamp returns the current stamp of kind k.
func (s *Store) ListingStamp(k record.Kind) (Stamp, error) {
	gen, err := s.generation()
	if err != nil {
		return Stamp{}, err
	}
	return s.stampWith(k, gen)
}

// stampWith returns k's stamp with the directory as it is now and generation state
// gen, read by the caller (a publisher under the lock knows it without reading it).
func (s *Store) stampWith(k record.Kind, gen generation) (Stamp, error) {
	info, err := s.fs.Lstat(string(k))
	if fsx.IsNotExist(err) {
		return Stamp{absent: true, gen: gen}, nil
	}
	if err != nil {
		return Stamp{}, invalidAt(string(k), err)
	}
	if err := fsx.CheckPrivateDir(string(k), info); err != nil {
		return Stamp{}, invalidAt(string(k), err)
	}
	return Stamp{Dir: info.DirStamp(), gen: gen}, nil
}

// StampRacy reports whether the listing stamp st, just taken, is racy: a later change
// to the kind's directory within the same timestamp tick may leave the stamp as it
// is. A caller that detects changes by comparing stamps must not take an equal stamp
// for "unchanged" if the earlier one was racy when taken (the store's cached listings
// follow the same rule). Ask before reading what the stamp stands for.
func (s *Store) StampRacy(st Stamp) bool { return s.stampRacyAt(s.now(), st) }

// stampRacyAt reports whether the listing stamp st is racy as of now: within the racy
// window of its directory's mtime or ctime, so that a later change to the directory
// may leave the stamp as it is.
func (s *Store) stampRacyAt(now time.Time, st Stamp) bool {
	return !st.absent && (s.racyAt(now, st.Dir.MtimeNs) || s.racyAt(now, st.Dir.CtimeNs))
}

// listing is a cached sorted id list of one kind.
type listing struct {
	stamp Stamp
	racy  bool
	ids   []string
}

// List returns the sorted ids of kind k. Staged temps are skipped; any other name
// that is not "<valid id>.json" makes the listing fail with OUTBOX_STORE_INVALID (run
// sealbridge-fsck). A cached listing is reused while the stamp is unchanged and was not
// racy when taken.
//
// The slice is shared with the store's cache and with other callers, and is never
// changed once returned: callers must not modify it (slices.Clone it first).
func (s *Store) List(k record.Kind) ([]string, error) {
	ids, _, err := s.list(k)
	return ids, err
}

// list returns the (shared, read-only) ids and the stamp they belong to.
func (s *Store) list(k record.Kind) ([]string, Stamp, error) {
	if !k.Valid() {
		return nil, Stamp{}, invalidAt(string(k), errors.New("unknown kind"))
	}
	st, err := s.ListingStamp(k)
	if err != nil {
		return nil, st, err
	}
	s.mu.Lock()
	c := s.listings[k] // listing values are immutable once stored
	s.mu.Unlock()
	if c != nil && c.stamp == st && !c.racy {
		return c.ids, st, nil
	}
	if st.absent {
		return nil, st, nil
	}
	now := s.now()
	ids, err := s.readDirIDs(k)
	if err != nil {
		return nil, st, err
	}
	racy := s.stampRacyAt(now, st)
	s.mu.Lock()
	s.listings[k] = &listing{stamp: st, racy: racy, ids: ids}
	s.mu.Unlock()
	return ids, st, nil
}

func (s *Store) readDirIDs(k record.Kind) ([]string, error) {
	ents, err := s.fs.ReadDir(string(k))
	if err != nil {
		if fsx.IsNotExist(err) {
			return nil, nil
		}
		return nil, invalidAt(string(k), err)
	}
	ids := make([]string, 0, len(ents))
	for _, e := range ents {
		if fsx.IsTempName(e.Name) {
			continue
		}
		id, ok := strings.CutSuffix(e.Name, ".json")
		if !ok || !record.ValidID(k, id) {
			return nil, invalidAt(string(k)+"/"+e.Name, errors.New("unknown file in a record directory"))
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Scan calls fn with a copy of every valid record of kind k, in id order, checking
// ctx between records. An invalid record stops the scan with its error.
func (s *Store) Scan(ctx context.Context, k record.Kind, fn func(record.Record) error) error {
	ids, err := s.List(k)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := s.Get(k, id)
		if err != nil {
			return err
		}
		if r == nil {
			continue
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}
