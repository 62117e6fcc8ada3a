package store

import (
	"context"
	"errors"
	"path"
	"slices"
	"sync/atomic"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// Tx is the view a transaction gives its fn. Reads see the transaction's own writes.
//
// In a Transaction, every Put or Delete is durable (file and directory fsynced) when
// it returns. In a PreparedTransaction, Put and Delete only plan: the records are
// signed, written and fsynced outside the lock after fn returns, and published
// together; they are durable when PreparedTransaction returns nil.
//
// A Tx must not be used after fn returns, nor from more than one goroutine.
type Tx struct {
	s     *Store
	ctx   context.Context
	lock  *lockfile.Lock
	reads map[string]record.Record // path → record as this transaction sees it (nil: absent)
	done  bool

	// Prepared mode: the plan and what it depends on.
	prepared bool
	gen0     generation                 // generation when the plan was made
	deps     map[string]fsx.Fingerprint // path → fingerprint read (zero: absent)
	listed   map[record.Kind]bool       // kinds whose listing the plan read
	writes   []*write

	// Publishing: what the plans accepted so far in this group commit write (nil
	// outside a group), and the handle on the generation file.
	group       *groupWrites
	marks       marks
	lockChecked bool // lock.Check passed in this hold
	// headIno is .head's inode as this hold found it, read with lockChecked: no
	// head is written during a hold (WriteHead holds the lock exclusively), so one
	// lstat serves every publication of the hold.
	headIno uint64
}

// write is one planned or performed publication: a record to write, or (rec nil) one
// to remove.
type write struct {
	kind   record.Kind
	id     string
	rec    record.Record
	last   bool // published only after the transaction's other writes are durable
	data   []byte
	staged *fsx.Staged
	live   *atomic.Int64 // Store.staging while this write counts in it, nil otherwise
}

func (w *write) path() string { return record.Path(w.kind, w.id) }

// Transaction takes the store lock, runs fn once, and releases the lock. fn may read
// and write records through tx; each write is durable when its call returns, and the
// writes of fn become visible to other processes in the order fn made them. fn must
// not do network I/O or unbounded work (the lock is held). Errors keep their codes;
// fn's error is returned as is, after the lock is released.
//
// Transaction fsyncs while holding the lock; hot paths that run concurrently should
// use PreparedTransaction, which never does. A rolled-back Store refuses it
// (STORE_ROLLED_BACK, RolledBack).
func (s *Store) Transaction(ctx context.Context, fn func(tx *Tx) error) error {
	if err := s.checkWritable(); err != nil {
		return err
	}
	unlock, h, err := s.lockStore(ctx, exclusive)
	if err != nil {
		return err
	}
	err = s.runTx(ctx, h, fn)
	if uerr := unlock(); uerr != nil && err == nil {
		err = uerr
	}
	return err
}

// runTx runs fn as a Transaction in the exclusive hold h the caller has.
func (s *Store) runTx(ctx context.Context, h lockHold, fn func(tx *Tx) error) error {
	tx := &Tx{s: s, ctx: ctx, lock: h.lock, reads: map[string]record.Record{}, marks: marks{s: s}}
	err := fn(tx)
	tx.end()
	return err
}

// heldGeneration returns the generation state a publisher under the lock has its
// handle on (the file as it is: only the publisher changes it), or nil before its
// handle is open.
func (tx *Tx) heldGeneration() *generation {
	if tx.marks.f == nil {
		return nil
	}
	g := tx.marks.state
	return &g
}

// unpublishedCreates returns how many records of kind k the plans accepted so far in
// this group commit create with writes not yet published (their putLast writes, in
// the first phase). A capacity check adds them to what its index counts.
func (tx *Tx) unpublishedCreates(k record.Kind) int {
	if tx.group == nil {
		return 0
	}
	return tx.group.lastCreates[k]
}

// end closes the transaction's view and its generation handle.
func (tx *Tx) end() {
	tx.done = true
	tx.marks.close()
}

func (tx *Tx) check() error {
	if tx.done {
		return errors.New("store: transaction used after it ended")
	}
	if tx.ctx.Err() != nil {
		step := "running"
		if tx.prepared {
			step = "planning"
		}
		return tx.s.abandoned(tx.ctx, step)
	}
	return nil
}

// getCopy returns a copy of record kind/id as this transaction sees it, or nil.
func (tx *Tx) getCopy(k record.Kind, id string) (record.Record, error) {
	r, err := tx.get(k, id)
	if r == nil || err != nil {
		return nil, err
	}
	return record.Clone(r), nil
}

// TxGet returns record id of type T as tx sees it, or the zero T if absent.
func TxGet[T record.Record](tx *Tx, id string) (T, error) {
	var zero T
	return typed[T](tx.getCopy(zero.Kind(), id))
}

func (tx *Tx) get(k record.Kind, id string) (record.Record, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	p := record.Path(k, id)
	if r, ok := tx.reads[p]; ok {
		return r, nil
	}
	r, fp, err := tx.s.readFP(k, id)
	if err != nil {
		return nil, err
	}
	tx.reads[p] = r
	if tx.prepared {
		tx.deps[p] = fp
	}
	return r, nil
}

// list returns the sorted ids of kind k as this transaction sees them. In a prepared
// transaction the plan then depends on the whole listing: any publication to k
// before the plan is published makes it run again.
func (tx *Tx) list(k record.Kind) ([]string, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	ids, err := tx.s.List(k)
	if err != nil || !tx.prepared {
		return ids, err
	}
	tx.listed[k] = true
	shared := true // ids is the store's shared listing: copy before changing it
	for _, w := range tx.writes {
		if w.kind != k {
			continue
		}
		i, found := slices.BinarySearch(ids, w.id)
		if found == (w.rec != nil) {
			continue
		}
		if shared {
			ids, shared = slices.Clone(ids), false
		}
		if found {
			ids = slices.Delete(ids, i, i+1)
		} else {
			ids = slices.Insert(ids, i, w.id)
		}
	}
	return ids, nil
}

// Put writes r, enforcing the write invariants against the version tx sees.
func (tx *Tx) Put(r record.Record) error { return tx.PutAll(r) }

// PutAll writes the records. In a Transaction every file is staged and fsynced, then
// all are renamed, then each directory touched is fsynced once; on error, records
// renamed before the failure may or may not be durable and none is acknowledged.
func (tx *Tx) PutAll(recs ...record.Record) error { return tx.putAll(false, recs) }

// putLast writes r after everything else the transaction writes is durable: in a
// prepared transaction it is renamed only after the other writes' directories were
// fsynced (a batch marker after its members). In a Transaction, where each Put is
// durable on return, it is Put.
func (tx *Tx) putLast(r record.Record) error { return tx.putAll(true, []record.Record{r}) }

func (tx *Tx) putAll(last bool, recs []record.Record) error {
	if err := tx.check(); err != nil {
		return err
	}
	ws := make([]*write, 0, len(recs))
	for _, r := range recs {
		if err := tx.checkWrite(r); err != nil {
			return err
		}
		w := &write{kind: r.Kind(), id: r.RecordID(), rec: record.Clone(r), last: last}
		if tx.prepared {
			tx.planWrite(w)
			continue
		}
		ws = append(ws, w)
	}
	if tx.prepared {
		return nil
	}
	defer discard(ws)
	if err := tx.s.stage(tx.ctx, ws); err != nil {
		return err
	}
	dirs, err := tx.publish(ws)
	if serr := tx.s.syncDirs(dirs); err == nil {
		err = serr
	}
	return err
}

// planWrite adds w to the plan. A record the plan already writes is written once, in
// its final version, at the place of the last write (and last if either was): the
// plan's writes are published together, so an intermediate version is nothing but a
// state a crash between the two renames could keep.
func (tx *Tx) planWrite(w *write) {
	p := w.path()
	if i := slices.IndexFunc(tx.writes, func(x *write) bool { return x.path() == p }); i >= 0 {
		w.last = w.last || tx.writes[i].last
		tx.writes = slices.Delete(tx.writes, i, i+1)
	}
	tx.writes = append(tx.writes, w)
	tx.reads[p] = w.rec
}

// checkWrite validates r and enforces the write invariants against the stored
// version as tx sees it.
func (tx *Tx) checkWrite(r record.Record) error {
	k, id := r.Kind(), r.RecordID()
	if err := r.Validate(); err != nil {
		return invalidAt(where(r), err)
	}
	if err := record.CheckKindID(k, id); err != nil {
		return invalidAt(where(r), err)
	}
	prev, err := tx.get(k, id)
	if err != nil {
		return err
	}
	if err := record.CheckReplacement(prev, r); err != nil {
		return err
	}
	if b, ok := r.(*record.Batch); ok {
		return tx.checkBatchMembers(b)
	}
	return nil
}

// checkBatchMembers refuses a batch marker unless every member it lists is already
// written and consistent with it: same message, peer, relay and deadline, and ordinals
// 0..n-1 in the listed order. A marker therefore never commits a missing member.
func (tx *Tx) checkBatchMembers(b *record.Batch) error {
	for i, id := range b.EnvelopeIDs {
		r, err := tx.get(record.KindOutbox, id)
		if err != nil {
			return err
		}
		if o, _ := r.(*record.Outbox); !record.MemberOf(b, i, o) {
			return conflict(b, "member %d (%s) is missing or inconsistent with the marker", i, id)
		}
	}
	return nil
}

// Delete removes record kind/id; removing an absent record does nothing. In a
// Transaction the removal is durable when Delete returns. Outside this package only
// tests call it (the crash explorer and the benchmarks remove records through a
// Transaction to exercise the removal path); it is kept as the counterpart of Put.
func (tx *Tx) Delete(k record.Kind, id string) error { return tx.deleteAll(k, []string{id}) }

// deleteAll removes the records kind/ids together; absent ids are skipped. In a
// PreparedTransaction it only plans the removals. In a Transaction it unlinks them all,
// then fsyncs the kind's directory once: they are durable when it returns nil; on error
// some may be removed, none is acknowledged.
func (tx *Tx) deleteAll(k record.Kind, ids []string) error {
	var ws []*write
	for _, id := range ids {
		prev, err := tx.get(k, id)
		if err != nil {
			return err
		}
		if prev != nil {
			ws = append(ws, &write{kind: k, id: id})
		}
	}
	if tx.prepared {
		for _, w := range ws {
			tx.planWrite(w)
		}
		return nil
	}
	if len(ws) == 0 {
		return nil
	}
	dirs, err := tx.publish(ws)
	if serr := tx.s.syncDirs(dirs); err == nil {
		err = serr
	}
	return err
}

// removeFile removes a file that is not a record (a staged temp) from dir.
func (tx *Tx) removeFile(dir, base string) error {
	if err := tx.s.fs.Remove(path.Join(dir, base)); err != nil && !fsx.IsNotExist(err) {
		return writeError(path.Join(dir, base), err)
	}
	return nil
}

// writeError classifies a file-system error of a write path.
func writeError(where string, err error) error {
	if errcode.CodeOf(err) != nil {
		return err
	}
	switch fsx.Errno(err) {
	case syscall.ELOOP, syscall.ENOTDIR:
		return invalidAt(where, err)
	}
	return unwritable(where, err)
}
