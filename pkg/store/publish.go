package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The commit engine's stage, publish and mark steps (DESIGN §9): signing and staging
// records outside the lock, and under it renaming or unlinking them, marking each
// publication in the generation file, and adopting it into this process's caches,
// listings and indexes. Nothing else in the package publishes a record or changes a
// listing or index in place.

// encode signs w's record and checks its size limit.
func (s *Store) encode(w *write) error {
	data, err := record.Encode(s.signer, s.owner, w.rec)
	if err != nil {
		code := errcode.OutboxStoreUnwritable
		if errors.Is(err, record.ErrInvalid) {
			code = errcode.OutboxStoreInvalid
		}
		return errcode.New(code, where(w.rec), err)
	}
	if int64(len(data)) > s.limits.MaxBytes(w.kind) {
		code := errcode.OutboxFull
		if w.kind == record.KindOperations {
			code = errcode.IdempotencyStoreFull
		}
		return errcode.New(code, where(w.rec), errors.New("record exceeds its size limit"))
	}
	w.data = data
	return nil
}

// Staging runs on at most stageWorkers(n) goroutines: min(GOMAXPROCS*stageWorkersPerCPU,
// maxStageWorkers, n). A staged write is a signature (CPU) and a create, write and
// fsync (the disk): a few writes per CPU keep the disk's queue full while others sign,
// and the cap keeps a transaction of 10,000 records (a settle of a large backlog) from
// starting 10,000 goroutines, each with a file open.
const (
	stageWorkersPerCPU = 4
	maxStageWorkers    = 32
)

// stageWorkers returns the number of goroutines that stage n writes.
func stageWorkers(n int) int {
	return max(1, min(n, runtime.GOMAXPROCS(0)*stageWorkersPerCPU, maxStageWorkers))
}

// stage signs every record write and writes it to a fresh, fsynced temp in its kind's
// directory, on a bounded pool of goroutines (stageWorkers). No write starts once ctx
// is done. On error, and when ctx ended before staging finished, every temp staged so
// far is removed: a cancelled caller leaves no temp behind and gets OUTBOX_STORE_BUSY
// with ctx's error as the cause (see abandoned).
func (s *Store) stage(ctx context.Context, ws []*write) error {
	errs := make([]error, len(ws))
	run := func(i int) {
		w := ws[i]
		if w.rec == nil || ctx.Err() != nil {
			return
		}
		if w.live == nil {
			w.live = &s.staging
			w.live.Add(1)
		}
		if errs[i] = s.encode(w); errs[i] != nil {
			return
		}
		if errs[i] = s.ensureKindDir(w.kind); errs[i] != nil {
			return
		}
		st, err := fsx.Stage(s.fs, string(w.kind), w.data)
		if err != nil {
			errs[i] = writeError(string(w.kind), err)
			return
		}
		w.staged = st
	}
	var next atomic.Int64
	work := func() {
		for i := int(next.Add(1) - 1); i < len(ws); i = int(next.Add(1) - 1) {
			run(i)
		}
	}
	var wg sync.WaitGroup
	for range stageWorkers(len(ws)) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	if err := firstCoded(errs); err != nil {
		discard(ws)
		return err
	}
	if ctx.Err() != nil {
		discard(ws)
		return s.abandoned(ctx, "staging")
	}
	return nil
}

// abandoned is the error of a transaction whose ctx ended during step: what it had
// not published by then is not (a prepared transaction publishes nothing).
// OUTBOX_STORE_BUSY, as for a lock wait that ctx cut short, with ctx's error as the
// cause (errors.Is(err, context.Canceled) holds for a cancelled ctx).
func (s *Store) abandoned(ctx context.Context, step string) error {
	return errcode.New(errcode.OutboxStoreBusy, s.dir, fmt.Errorf("abandoned while %s: %w", step, ctx.Err()))
}

// firstCoded returns the first non-nil error of errs.
func firstCoded(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// discard removes the temps of writes that were staged but not published, and takes
// every write out of Store.staging. It may run more than once on the same writes.
func discard(ws []*write) {
	for _, w := range ws {
		if w.staged != nil && !w.staged.Published() {
			_ = w.staged.Cleanup()
		}
		if w.live != nil {
			w.live.Add(-1)
			w.live = nil
		}
	}
}

// publish renames each staged write into place (or removes the record), in order,
// under the lock held by tx, marks the head dirty (markDirty) and marks each
// (mark). The first publish of tx checks that .lock still names the inode it holds
// (lockfile.Lock.Check) and reads .head's inode. It returns the directories to
// fsync. A failure stops at that write and keeps what was published before it.
func (tx *Tx) publish(ws []*write) (dirs map[string]bool, err error) {
	dirs = map[string]bool{}
	if !tx.lockChecked { // once per transaction or group commit: the hold is one
		if err := tx.lock.Check(); err != nil {
			return dirs, lockError(tx.s.dir, err)
		}
		tx.lockChecked = true
		tx.headIno = tx.s.headInode()
	}
	for _, w := range ws {
		if err := tx.marks.ready(); err != nil {
			return dirs, err
		}
		// Under the lock only this publisher changes the generation file: its state
		// is the one the handle left it in, and no read of the file is needed.
		before, err := tx.s.stampWith(w.kind, tx.marks.state)
		if err != nil {
			return dirs, err
		}
		tx.s.beginPublication(w.kind, w.id)
		if w.rec == nil {
			err = tx.s.fs.Remove(w.path())
			if fsx.IsNotExist(err) {
				err = nil
			}
		} else {
			err = w.staged.Publish(record.FileName(w.id))
		}
		if err != nil {
			tx.s.endPublication(w.kind)
			return dirs, writeError(w.path(), err)
		}
		dirs[string(w.kind)] = true
		tx.s.markDirty(tx.headIno)
		if err := tx.mark(w, before); err != nil {
			tx.markFailed(w.kind)
			return dirs, err
		}
		tx.s.endPublication(w.kind)
	}
	return dirs, nil
}

// syncDirs fsyncs each directory once, in name order, and returns the first error.
func (s *Store) syncDirs(dirs map[string]bool) error {
	var first error
	for _, d := range sortedKeys(dirs) {
		if err := s.fs.SyncDir(d); err != nil && first == nil {
			first = writeError(d, err)
		}
	}
	return first
}

// mark runs after a successful rename or unlink of w: it appends the kind's mark to
// the generation file and brings this process's caches, listings and indexes up to
// date (adopt).
func (tx *Tx) mark(w *write, before Stamp) error {
	oldGen, newGen, err := tx.marks.add(w.kind)
	if err != nil {
		return err
	}
	p := w.path()
	tx.reads[p] = w.rec
	var fp fsx.Fingerprint
	now := tx.s.now()
	if w.rec == nil {
		tx.s.cache.Remove(p)
	} else if info, err := tx.s.fs.Lstat(p); err == nil {
		fp = info.Fingerprint()
		tx.s.remember(p, w.data, fp, w.rec, now)
	}
	after, err := tx.s.stampWith(w.kind, newGen)
	tx.s.adopt(w.kind, w.id, w.rec, fp, w.rec != nil && tx.s.racyAt(now, fp.CtimeNs), before, after, err == nil, oldGen, newGen)
	return nil
}

// markFailed handles a publication of kind k whose rename or unlink is done but whose
// mark failed. No stamp or plan of any process can show that change, so the
// generation file is replaced (a compaction) or, if that fails too (a full disk),
// removed: either way no state any process remembers matches it any more, so every
// reader lists again and every plan is stale. This process's listing and index of k
// are dropped, to be rebuilt from the directory. Only if the file can be neither
// replaced nor removed does k stay unmarked: this process then reconciles k in full at
// every read, and its next publication replaces the file first (marks.ready); other
// processes cannot learn of the change before that.
func (tx *Tx) markFailed(k record.Kind) {
	s := tx.s
	s.mu.Lock()
	delete(s.listings, k)
	delete(s.indexes, k)
	s.mu.Unlock()
	if tx.marks.compact() == nil || tx.marks.remove() == nil {
		s.endPublication(k)
		return
	}
	s.mu.Lock()
	if s.unmarkedKinds == nil {
		s.unmarkedKinds = map[record.Kind]bool{}
	}
	s.unmarkedKinds[k] = true
	s.mu.Unlock()
	s.endPublication(k)
}

// kindMark is the byte the generation file grows by for a publication of each kind.
// A prepared transaction reads the bytes appended since its plan to learn which kinds
// changed; any other byte means "unknown: assume every kind changed".
var kindMark = map[record.Kind]byte{
	record.KindObservations: 'o', record.KindMessages: 'm', record.KindOutbox: 'x', record.KindBatches: 'b',
	record.KindReceipts: 'r', record.KindOperations: 'p', record.KindIdempotency: 'i',
	record.KindRefusals: 'f',
}

var markKind = func() map[byte]record.Kind {
	m := map[byte]record.Kind{}
	for k, b := range kindMark {
		m[b] = k
	}
	return m
}()

// marks is a publisher's handle on the generation file (DESIGN §7): opened at its
// first publication, kept for the rest of its hold, with the state it left the file
// in. It is used by one goroutine, under the lock.
type marks struct {
	s       *Store
	f       fsx.File // nil while the file is absent
	opened  bool
	removed bool // this hold removed the file (markFailed)
	state   generation
}

// close closes the handle.
func (m *marks) close() {
	if m.f != nil {
		_ = m.f.Close()
		m.f = nil
	}
}

// ready makes the generation file ready for the next mark, before the publication it
// marks: it opens the file once per hold and, if the file is absent, has no valid
// header or has reached generationBound bytes, or a publication of this process is
// still unmarked (markFailed), compacts it. A failure here comes before the rename,
// so nothing is published without its mark.
func (m *marks) ready() error {
	if err := m.open(); err != nil {
		return err
	}
	unmarked := m.s.hasUnmarked()
	if m.f != nil && m.state.epoch != [16]byte{} && m.state.size < generationBound && !unmarked {
		return nil
	}
	if err := m.compact(); err != nil {
		return err
	}
	if unmarked {
		m.s.clearUnmarked()
	}
	return nil
}

// open opens the file once per hold (an absent file stays absent: f nil, the zero
// state), without compacting it.
func (m *marks) open() error {
	if m.f == nil && !m.opened {
		f, g, err := m.s.openGeneration(syscall.O_RDWR | syscall.O_APPEND)
		if err != nil {
			return err
		}
		m.f, m.state, m.opened = f, g, true
	}
	return nil
}

// add appends k's mark to the file ready opened, and returns the states before and
// after.
func (m *marks) add(k record.Kind) (before, after generation, err error) {
	if m.f == nil {
		return generation{}, generation{}, unwritable(generationName, errGenerationNotReady)
	}
	if _, err := m.f.Write([]byte{kindMark[k]}); err != nil {
		return generation{}, generation{}, writeError(generationName, err)
	}
	before = m.state
	m.state.size++
	return before, m.state, nil
}

// compact replaces the generation file, durably (fsx.WriteFile: temp, fsync, rename,
// directory fsync), by a header of a fresh epoch and no marks. The new file is a new
// inode of a new epoch: every state taken of the old one compares unequal to every
// state of it, so readers re-list and plans re-plan. This process's cached listings
// and indexes at the old state move to the new one: no directory changed.
func (m *marks) compact() error {
	var epoch [16]byte
	if _, err := rand.Read(epoch[:]); err != nil {
		return unwritable(generationName, err)
	}
	if err := fsx.WriteFile(m.s.fs, ".", generationName, generationHeader(epoch)); err != nil {
		return writeError(generationName, err)
	}
	old := m.state
	m.close()
	f, g, err := m.s.openGeneration(syscall.O_RDWR | syscall.O_APPEND)
	if err == nil && (f == nil || g.epoch != epoch) {
		if f != nil {
			f.Close()
		}
		err = invalidAt(generationName, errGenerationReplaced)
	}
	if err != nil {
		return err
	}
	m.f, m.state = f, g
	m.s.adoptGeneration(old, g)
	return nil
}

// remove removes the generation file (not durably: marks are never durable) and moves
// this process's current caches to the absent state, which no other process's state
// of the removed file matches. The next publication makes a new file of a fresh epoch.
func (m *marks) remove() error {
	m.close()
	m.opened, m.removed = false, true
	if err := m.s.fs.Remove(generationName); err != nil && !fsx.IsNotExist(err) {
		return writeError(generationName, err)
	}
	old := m.state
	m.state = generation{}
	m.s.adoptGeneration(old, generation{})
	return nil
}

// beginPublication marks a publication of kind/id in flight, just before its rename
// or unlink; endPublication ends it after the publication was adopted, or failed (and
// so changed nothing), or its mark failed (markFailed). One goroutine of a process
// publishes at a time, so a kind has at most one publication in flight.
func (s *Store) beginPublication(k record.Kind, id string) {
	s.mu.Lock()
	if s.inFlight == nil {
		s.inFlight = map[record.Kind]string{}
	}
	if s.published == nil {
		s.published = make(chan struct{})
	}
	s.inFlight[k] = id
	s.mu.Unlock()
}

func (s *Store) endPublication(k record.Kind) {
	s.mu.Lock()
	delete(s.inFlight, k)
	if s.published != nil {
		close(s.published) // wakes the index readers waiting for it (indexRound)
	}
	s.published = make(chan struct{})
	s.mu.Unlock()
}

// hasUnmarked reports whether a publication of this process is still unmarked.
func (s *Store) hasUnmarked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.unmarkedKinds) > 0
}

// clearUnmarked ends the unmarked state once the generation file was replaced (no
// process's state of the old file matches the new one): the kinds' listings and
// indexes are dropped, because one installed while the kind was unmarked may carry a
// stamp that the new file would make look current.
func (s *Store) clearUnmarked() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.unmarkedKinds {
		delete(s.listings, k)
		delete(s.indexes, k)
	}
	s.unmarkedKinds = nil
}

// adopt updates this process's listings and indexes after it published (rec != nil,
// from the file with fingerprint fp, racy if fp was taken within the racy window of
// its ctime) or removed (rec == nil) kind/id under the lock. The generation moved from
// oldGen to newGen and only k's directory changed (from stamp before to after; known
// false: after could not be taken), so k's cached list and index are patched and move
// to after, and every other kind's cached stamp takes the new generation. Anything
// that was not current before is dropped.
func (s *Store) adopt(k record.Kind, id string, rec record.Record, fp fsx.Fingerprint, racy bool, before, after Stamp, known bool, oldGen, newGen generation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.moveGenerationLocked(k, oldGen, newGen)
	if c := s.listings[k]; c != nil {
		delete(s.listings, k)
		if known && c.stamp == before {
			ids := c.ids
			i, found := slices.BinarySearch(ids, id)
			switch {
			case rec != nil && !found:
				ids = slices.Insert(slices.Clone(ids), i, id)
			case rec == nil && found:
				ids = slices.Delete(slices.Clone(ids), i, i+1)
			}
			s.listings[k] = &listing{stamp: after, racy: c.racy, ids: ids}
		}
	}
	if ix := s.indexes[k]; ix != nil {
		// An index current at after was scanned after the rename (while this
		// publication was in flight): patching it again changes nothing. One left
		// behind by another process's publication is patched too and keeps its stamp;
		// ownMarks counts this publication's mark for the refresh that catches up
		// (refreshChanged).
		switch {
		case !known:
			delete(s.indexes, k)
		case s.indexCurrent(k, ix, before) || s.indexCurrent(k, ix, after):
			ix.apply(id, rec, fp, racy)
			ix.stamp = after
		default:
			ix.apply(id, rec, fp, racy)
			ix.ownMarks++
		}
	}
}

// adoptGeneration moves this process's cached listings and indexes at generation
// state oldGen to newGen: this process, holding the lock, replaced (or removed) the
// generation file and changed no directory.
func (s *Store) adoptGeneration(oldGen, newGen generation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.moveGenerationLocked("", oldGen, newGen)
}

// moveGenerationLocked moves the cached listings and indexes of every kind other than
// except from generation state oldGen to newGen. Caller holds s.mu.
func (s *Store) moveGenerationLocked(except record.Kind, oldGen, newGen generation) {
	for kind, c := range s.listings {
		if kind != except && c.stamp.gen == oldGen {
			st := c.stamp
			st.gen = newGen
			s.listings[kind] = &listing{stamp: st, racy: c.racy, ids: c.ids}
		}
	}
	for kind, ix := range s.indexes {
		if kind != except && ix.stamp.gen == oldGen {
			ix.stamp.gen = newGen
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedKeysOf[V any](m map[string]V) []string {
	keys := make(map[string]bool, len(m))
	for k := range m {
		keys[k] = true
	}
	return sortedKeys(keys)
}
