package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// The head (DESIGN §5, "The head"; FORMAT.md "Versions").
//
// <store>/.head holds one signed store head (envelope.SignStoreHead): the newest
// format version that wrote the store and a sequence number that grows with its
// commits. Every publication of the commit engine marks the head dirty in this
// process (one atomic store); WriteHead, called by the daemon every HeadInterval and
// by the commands that write, replaces .head by one of seq+1 if it is dirty. It is
// written under the store lock after the commits it counts are durable, so a head
// on disk never claims more than what is durable; the head lags this process's
// commits by at most one call of WriteHead.
//
// After .head is durable, still under the lock, the same bytes go to the local
// witness (dataroot.WitnessFile, outside the store directory), which is only ever
// replaced by a head of a higher seq. A store whose .head is below its witness (or
// below a head a relay witnessed, Witness) was rolled back: restored from an older
// copy. Such a Store refuses every write (STORE_ROLLED_BACK) until Reconcile.

// FormatVersion is the store format this binary reads and writes: 1 is a store
// from before singles, refusals, blobs and heads (it has no .head); 2 is a store
// with a head. A store whose head names a newer format is refused
// (STORE_FORMAT_NEWER) and left unchanged.
const FormatVersion = 2

// HeadInterval is how often the daemon calls WriteHead.
const HeadInterval = time.Second

// HeadFile is the name of the head in the store directory.
const HeadFile = ".head"

// headState is the head this Store last read or wrote on disk.
type headState struct {
	head *envelope.StoreHead // nil: none on disk
	data []byte
}

func (h headState) seq() int64 {
	if h.head == nil {
		return 0
	}
	return h.head.Seq
}

// rolledBack is the rolled-back state of a Store: the error every write returns.
type rolledBack struct{ err error }

// headFields are the Store's head fields (embedded in Store).
type headFields struct {
	headDirty atomic.Bool // a publication since the last head write
	// dirtyUnder is the inode of the .head on disk at this process's last
	// publication (markDirty).
	dirtyUnder atomic.Uint64
	rolled     atomic.Pointer[rolledBack] // nil: not rolled back
	headMu     sync.Mutex                 // guards cur
	cur        headState
	// witnessPath is the local witness ("" : none); witnessFS is rooted at its
	// directory, witnessParent at that directory's parent (to make it).
	witnessPath   string
	witnessFS     fsx.FS
	witnessParent fsx.FS
	witnessDir    fsx.DirsMade
}

// markDirty records that a publication happened: the next WriteHead writes a head.
// Made by the publisher under the lock, it also notes which .head was on disk then
// (headIno, its inode, from one lstat per hold): a head renamed in after it, by any
// process (a backup's final hold), counts this publication, and WriteHead need not
// write another.
func (s *Store) markDirty(headIno uint64) {
	s.dirtyUnder.Store(headIno)
	s.headDirty.Store(true)
}

// headInode is the inode of .head, 0 when there is none (or it cannot be seen).
func (s *Store) headInode() uint64 {
	info, err := s.fs.Lstat(HeadFile)
	if err != nil {
		return 0
	}
	return info.Ino
}

// Head returns the latest head this Store knows on disk — read at Open or later,
// or written by this Store — as parsed and as its bytes; nil, nil if none. Safe
// for concurrent use; the values must not be modified.
func (s *Store) Head() (*envelope.StoreHead, []byte) {
	s.headMu.Lock()
	defer s.headMu.Unlock()
	return s.cur.head, s.cur.data
}

func (s *Store) setHead(h headState) {
	s.headMu.Lock()
	if h.seq() >= s.cur.seq() {
		s.cur = h
	}
	s.headMu.Unlock()
}

// RolledBack returns nil, or the STORE_ROLLED_BACK error (with its hint) that every
// write of this Store returns: its head is below a head its owner signed earlier.
func (s *Store) RolledBack() error {
	if r := s.rolled.Load(); r != nil {
		return r.err
	}
	return nil
}

// rolledBackError is the STORE_ROLLED_BACK error of a store whose head seq is
// below witnessed, a head seen at source.
func (s *Store) rolledBackError(headSeq, witnessed int64, source string, cause error) error {
	err := errcode.New(errcode.StoreRolledBack,
		fmt.Sprintf("%s: the store's head is seq %d but its owner signed seq %d (witnessed by %s)", s.dir, headSeq, witnessed, source), cause)
	return errcode.WithHint(err, "the store was restored from an older copy: run sealbridge-fsck --reconcile --identity NAME (the identity that owns "+s.dir+")")
}

// formatNewerError is the STORE_FORMAT_NEWER error of a head of format f.
func (s *Store) formatNewerError(f int) error {
	err := errcode.New(errcode.StoreFormatNewer, s.dir+"/"+HeadFile, fmt.Errorf("store format %d, this binary reads format %d", f, FormatVersion))
	return errcode.WithHint(err, fmt.Sprintf("this sealbridge reads format %d; the store at %s was written by format %d: use a newer sealbridge", FormatVersion, s.dir, f))
}

// readHeadFile reads and verifies the head in file name of fsys (a private regular
// file, read without following a link, at most MaxHeadSize bytes) as the owner's.
// An absent file is the zero headState. what names the file in errors.
func (s *Store) readHeadFile(fsys fsx.FS, name, what string) (headState, error) {
	data, info, err := fsx.ReadFile(fsys, name, envelope.MaxHeadSize)
	if err != nil {
		if fsx.IsNotExist(err) {
			return headState{}, nil
		}
		return headState{}, invalidAt(what, err)
	}
	if err := fsx.CheckPrivateFile(what, info); err != nil {
		return headState{}, invalidAt(what, err)
	}
	h, err := envelope.ParseStoreHead(data)
	if err != nil {
		return headState{}, invalidAt(what, err)
	}
	if h.Owner != s.owner {
		return headState{}, invalidAt(what, fmt.Errorf("the head is signed by %s, not by the store's owner", h.Owner))
	}
	return headState{head: h, data: data}, nil
}

// readHead reads .head; a head of a newer format is STORE_FORMAT_NEWER.
func (s *Store) readHead() (headState, error) {
	h, err := s.readHeadFile(s.fs, HeadFile, s.dir+"/"+HeadFile)
	if err != nil {
		return headState{}, err
	}
	if h.head != nil && h.head.Format > FormatVersion {
		return headState{}, s.formatNewerError(h.head.Format)
	}
	return h, nil
}

// readWitness reads the local witness (the zero headState if there is none).
func (s *Store) readWitness() (headState, error) {
	if s.witnessFS == nil {
		return headState{}, nil
	}
	return s.readHeadFile(s.witnessFS, filepath.Base(s.witnessPath), s.witnessPath)
}

// initHead is Open's part: the witness location, .head and the witness compared.
func (s *Store) initHead(opts Options) error {
	switch {
	case opts.WitnessFile != "":
		wf, err := filepath.Abs(opts.WitnessFile)
		if err != nil {
			return unwritable(opts.WitnessFile, err)
		}
		s.witnessPath = wf
	case s.dataRoot != "":
		s.witnessPath = dataroot.WitnessFile(s.dataRoot, string(s.owner))
	}
	if s.witnessPath != "" {
		dir := filepath.Dir(s.witnessPath)
		s.witnessFS, s.witnessParent = fsx.NewOS(dir), fsx.NewOS(filepath.Dir(dir))
		if opts.WrapWitnessFS != nil {
			s.witnessFS, s.witnessParent = opts.WrapWitnessFS(s.witnessFS), opts.WrapWitnessFS(s.witnessParent)
		}
	}
	h, err := s.readHead()
	if err != nil {
		return err
	}
	w, err := s.readWitness()
	if err != nil {
		return err
	}
	s.cur = h
	if w.seq() > h.seq() {
		s.rolled.Store(&rolledBack{err: s.rolledBackError(h.seq(), w.seq(), s.witnessPath, nil)})
	}
	return nil
}

// checkWritable refuses a write of a rolled-back Store.
func (s *Store) checkWritable() error { return s.RolledBack() }

// WriteHead writes a new head if a commit of this process published since the last
// one (or force): under the store lock, with seq one above the head on disk (which
// another process may have advanced) and format max(FormatVersion, the format on
// disk), durably (fsx.WriteFile: stage, fsync, rename, fsync the store directory),
// then the same bytes to the local witness, durably, if its seq is higher. It
// returns the head now on disk as this Store knows it (nil if none). Refused with
// STORE_ROLLED_BACK while rolled back — also when, under the lock, the witness is
// found ahead of .head — and with STORE_FORMAT_NEWER if a newer format wrote .head
// meanwhile. On an error the head stays dirty, so the next call tries again; an
// error from the witness write comes after the head was written. Safe for
// concurrent use, also by other processes.
func (s *Store) WriteHead(ctx context.Context, force bool) (*envelope.StoreHead, []byte, error) {
	if err := s.checkWritable(); err != nil {
		return nil, nil, err
	}
	if !force && !s.headDirty.Load() {
		h, data := s.Head()
		return h, data, nil
	}
	unlock, _, err := s.lockStore(ctx, exclusive)
	if err != nil {
		return nil, nil, err
	}
	// Under the exclusive hold no publication of this process runs: every one before
	// it has marked the head dirty and is durable, every one after marks it again.
	var head *envelope.StoreHead
	var data []byte
	switch {
	case !force && s.headDirty.Load() && s.headInode() != s.dirtyUnder.Load():
		// Another head was renamed in after this process's last publication (under
		// the lock, so after it was durable): it counts it. Writing one more would
		// raise the seq with no commit, and a copy made with that head (a backup)
		// would then look rolled back once restored.
		var disk headState
		if disk, err = s.readHead(); err == nil {
			s.setHead(disk)
			s.headDirty.Store(false)
			head, data = s.Head()
		}
	case force || s.headDirty.Load():
		head, data, err = s.writeHeadHeld()
	default:
		head, data = s.Head()
	}
	if uerr := unlock(); err == nil {
		err = uerr
	}
	if err != nil {
		return nil, nil, err
	}
	return head, data, nil
}

// writeHeadHeld is a forced WriteHead for a caller of this package that holds the
// store lock exclusively (a backup's final hold): the head it writes counts every
// publication made durable before it.
func (s *Store) writeHeadHeld() (*envelope.StoreHead, []byte, error) {
	if err := s.checkWritable(); err != nil {
		return nil, nil, err
	}
	s.headDirty.Store(false)
	h, err := s.writeHeadLocked(false, 0)
	if err != nil {
		s.headDirty.Store(true)
		return nil, nil, err
	}
	return h.head, h.data, nil
}

// writeHeadLocked writes, under the lock the caller holds, a head of seq one above
// .head's, then the witness. For WriteHead (reconcile false) a witness ahead of
// .head is a rollback, refused; for Reconcile the seq is one above the highest of
// floor, .head's and the witness's.
func (s *Store) writeHeadLocked(reconcile bool, floor int64) (headState, error) {
	disk, err := s.readHead()
	if err != nil {
		return headState{}, err
	}
	s.setHead(disk)
	wit, err := s.readWitness()
	if err != nil {
		return headState{}, err
	}
	if !reconcile && wit.seq() > disk.seq() {
		err := s.rolledBackError(disk.seq(), wit.seq(), s.witnessPath, nil)
		s.rolled.CompareAndSwap(nil, &rolledBack{err: err})
		return headState{}, s.RolledBack()
	}
	seq := disk.seq()
	if reconcile {
		seq = max(seq, floor, wit.seq())
	}
	format := FormatVersion
	if disk.head != nil {
		format = max(format, disk.head.Format)
	}
	now := s.now()
	if now.UnixMilli() <= 0 {
		now = time.UnixMilli(1)
	}
	next := &envelope.StoreHead{Owner: s.owner, Format: format, Seq: seq + 1, Time: now}
	data, err := envelope.SignStoreHead(s.signer, *next)
	if err != nil {
		return headState{}, unwritable(HeadFile, err)
	}
	next.Time = time.UnixMilli(now.UnixMilli())
	if err := fsx.WriteFile(s.fs, ".", HeadFile, data); err != nil {
		return headState{}, writeError(HeadFile, err)
	}
	h := headState{head: next, data: data}
	s.setHead(h)
	if err := s.writeWitnessLocked(h, wit); err != nil {
		return h, err
	}
	return h, nil
}

// writeWitnessLocked durably replaces the local witness by h if h's seq is above
// wit's (the witness as read under the lock the caller holds).
func (s *Store) writeWitnessLocked(h, wit headState) error {
	if s.witnessFS == nil || h.seq() <= wit.seq() {
		return nil
	}
	dir := filepath.Base(filepath.Dir(s.witnessPath))
	if err := s.witnessDir.Ensure(s.witnessParent, dir); err != nil {
		return writeError(filepath.Dir(s.witnessPath), err)
	}
	if err := fsx.WriteFile(s.witnessFS, ".", filepath.Base(s.witnessPath), h.data); err != nil {
		return writeError(s.witnessPath, err)
	}
	return nil
}

// Witness takes note of head, a head of this store's owner seen elsewhere (source
// names where: a relay's URL). It must parse and be signed by the owner, else
// OUTBOX_STORE_INVALID. If its seq is above the seq of .head (read again, under the
// lock, when above the head this Store knows), the Store becomes rolled back and
// head is written durably to the local witness if it is above it (so that a Store
// opened later is rolled back too), and Witness returns the STORE_ROLLED_BACK
// error; otherwise nil. Safe for concurrent use.
func (s *Store) Witness(head []byte, source string) error {
	h, err := envelope.ParseStoreHead(head)
	if err != nil {
		return invalidAt("head witnessed by "+source, err)
	}
	if h.Owner != s.owner {
		return invalidAt("head witnessed by "+source, fmt.Errorf("the head is signed by %s, not by the store's owner", h.Owner))
	}
	if cur, _ := s.Head(); cur != nil && h.Seq <= cur.Seq {
		return nil
	}
	// .head only grows (by a rename, under the lock) unless the store is rolled
	// back, and the relay saw h from this owner's store: read without the lock, a
	// .head below h means the store was rolled back.
	disk, err := s.readHead()
	if err != nil {
		return err
	}
	s.setHead(disk)
	if h.Seq <= disk.seq() {
		return nil
	}
	s.rolled.CompareAndSwap(nil, &rolledBack{err: s.rolledBackError(disk.seq(), h.Seq, source, nil)})
	if err := s.persistWitness(headState{head: h, data: head}); err != nil {
		return s.rolledBackError(disk.seq(), h.Seq, source, err)
	}
	return s.rolledBackError(disk.seq(), h.Seq, source, nil)
}

// persistWitness writes h to the local witness, under the lock, if it is above it.
func (s *Store) persistWitness(h headState) error {
	if s.witnessFS == nil {
		return nil
	}
	unlock, _, err := s.lockStore(context.Background(), exclusive)
	if err != nil {
		return err
	}
	wit, err := s.readWitness()
	if err == nil {
		err = s.writeWitnessLocked(h, wit)
	}
	if uerr := unlock(); err == nil {
		err = uerr
	}
	return err
}

func (s *Store) curSeq() int64 {
	s.headMu.Lock()
	defer s.headMu.Unlock()
	return s.cur.seq()
}

// Reconcile is the one way out of the rolled-back state (it works on a store that
// is not rolled back, too). In one hold of the store lock it runs fn as a
// Transaction (fn brings records forward); then it writes a head of seq
// max(witnessed, the witness's seq, the seq of .head)+1, durably, and the local
// witness, and clears the rolled-back state. fn's error aborts with nothing of the
// head written (what fn wrote before it stays, as in a Transaction). A head newer
// in format than this binary is refused (STORE_FORMAT_NEWER).
func (s *Store) Reconcile(ctx context.Context, witnessed int64, fn func(tx *Tx) error) error {
	unlock, h, err := s.lockStore(ctx, exclusive)
	if err != nil {
		return err
	}
	err = s.reconcileLocked(ctx, h, witnessed, fn)
	if uerr := unlock(); err == nil {
		err = uerr
	}
	return err
}

func (s *Store) reconcileLocked(ctx context.Context, h lockHold, witnessed int64, fn func(tx *Tx) error) error {
	if _, err := s.readHead(); err != nil {
		return err
	}
	if fn != nil {
		if err := s.runTx(ctx, h, fn); err != nil {
			return err
		}
	}
	s.headDirty.Store(false)
	if _, err := s.writeHeadLocked(true, witnessed); err != nil {
		s.headDirty.Store(true)
		return err
	}
	s.rolled.Store(nil)
	return nil
}
