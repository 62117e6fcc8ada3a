package store

import (
	"context"
	"errors"
	"path"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// Tx is the view a Transaction gives its fn: reads see the transaction's own writes,
// and every Put or Delete is durable (file and directory fsynced) when it returns. A
// Tx must not be used after fn returns, nor from more than one goroutine.
type Tx struct {
	s      *Store
	ctx    context.Context
	lock   *lockfile.Lock
	reads  map[string]Record // path → record (nil: absent)
	gen    fsx.File          // the generation file, opened at the first publication
	genLen int64
	done   bool
}

// Transaction takes the store lock, runs fn, and releases the lock. fn may read and
// write records through tx; each write is durable when its call returns, and the
// writes of fn are visible to other processes in the order fn made them. fn runs
// exactly once; it must not do network I/O or unbounded work (the lock is held).
// Errors keep their codes; an error from fn is returned as is, after the lock is
// released. Transactions of one Store are serialized; ctx bounds the wait for them
// and for the lock.
func (s *Store) Transaction(ctx context.Context, fn func(tx *Tx) error) error {
	unlock, err := s.lockStore(ctx)
	if err != nil {
		return err
	}
	tx := &Tx{s: s, ctx: ctx, reads: map[string]Record{}}
	tx.lock = s.heldLock
	err = fn(tx)
	tx.done = true
	if tx.gen != nil {
		_ = tx.gen.Close()
	}
	if uerr := unlock(); uerr != nil && err == nil {
		err = uerr
	}
	return err
}

// lockStore serializes with this process's other lock holders, creates the store
// directory if needed, and takes the store lock.
func (s *Store) lockStore(ctx context.Context) (unlock func() error, err error) {
	select {
	case s.txSem <- struct{}{}:
	case <-ctx.Done():
		return nil, errcode.New(errcode.OutboxStoreBusy, s.dir, ctx.Err())
	}
	release := func() { <-s.txSem }
	if err := s.ensureStoreDir(); err != nil {
		release()
		return nil, err
	}
	lock, err := lockfile.Acquire(ctx, s.fs, s.lockOpts)
	if err != nil {
		release()
		return nil, lockError(s.dir, err)
	}
	s.heldLock = lock
	return func() error {
		s.heldLock = nil
		defer release()
		if err := lock.Unlock(); err != nil {
			return lockError(s.dir, err)
		}
		return nil
	}, nil
}

func (tx *Tx) check() error {
	if tx.done {
		return errors.New("store: transaction used after it ended")
	}
	return tx.ctx.Err()
}

// Get returns a copy of record kind/id as this transaction sees it, or nil.
func (tx *Tx) Get(k Kind, id string) (Record, error) {
	r, err := tx.get(k, id)
	if r == nil || err != nil {
		return nil, err
	}
	return cloneRecord(r), nil
}

// TxGet returns record id of type T as tx sees it, or the zero T if absent.
func TxGet[T Record](tx *Tx, id string) (T, error) {
	var zero T
	r, err := tx.Get(zero.Kind(), id)
	if r == nil || err != nil {
		return zero, err
	}
	t, ok := r.(T)
	if !ok {
		return zero, invalidAt(id, errors.New("record has an unexpected type"))
	}
	return t, nil
}

func (tx *Tx) get(k Kind, id string) (Record, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	p := recordPath(k, id)
	if r, ok := tx.reads[p]; ok {
		return r, nil
	}
	r, err := tx.s.read(k, id)
	if err != nil {
		return nil, err
	}
	tx.reads[p] = r
	return r, nil
}

// List returns the sorted ids of kind k as this transaction sees them.
func (tx *Tx) List(k Kind) ([]string, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	return tx.s.List(k)
}

// Put durably writes r, enforcing the write invariants against the stored version.
func (tx *Tx) Put(r Record) error { return tx.PutAll(r) }

// PutAll durably writes the records: every file is staged and fsynced, then all are
// renamed, then each directory touched is fsynced once. On error, records renamed
// before the failure may or may not be durable; none is acknowledged.
func (tx *Tx) PutAll(recs ...Record) error {
	if err := tx.check(); err != nil {
		return err
	}
	type write struct {
		rec    Record
		data   []byte
		staged *fsx.Staged
	}
	writes := make([]write, 0, len(recs))
	defer func() {
		for _, w := range writes {
			if w.staged != nil {
				_ = w.staged.Cleanup()
			}
		}
	}()
	for _, r := range recs {
		data, err := tx.prepare(r)
		if err != nil {
			return err
		}
		writes = append(writes, write{rec: r, data: data})
	}
	for i := range writes {
		k := writes[i].rec.Kind()
		if err := tx.s.ensureKindDir(k); err != nil {
			return err
		}
		st, err := fsx.Stage(tx.s.fs, string(k), writes[i].data)
		if err != nil {
			return writeError(string(k), err)
		}
		writes[i].staged = st
	}
	if err := tx.lock.Check(); err != nil {
		return lockError(tx.s.dir, err)
	}
	dirs := map[string]bool{}
	var pubErr error
	for _, w := range writes {
		k, id := w.rec.Kind(), w.rec.RecordID()
		before, err := tx.s.ListingStamp(k)
		if err != nil {
			pubErr = err
			break
		}
		if err := w.staged.Publish(fileName(id)); err != nil {
			pubErr = writeError(recordPath(k, id), err)
			break
		}
		dirs[string(k)] = true
		if err := tx.published(k, id, w.rec, w.data, before); err != nil {
			pubErr = err
			break
		}
	}
	for _, d := range sortedKeys(dirs) {
		if err := tx.s.fs.SyncDir(d); err != nil && pubErr == nil {
			pubErr = writeError(d, err)
		}
	}
	return pubErr
}

// prepare validates r against the stored version and returns its signed bytes.
func (tx *Tx) prepare(r Record) ([]byte, error) {
	k, id := r.Kind(), r.RecordID()
	if err := r.Validate(); err != nil {
		return nil, invalidAt(where(r), err)
	}
	if err := checkKindID(k, id); err != nil {
		return nil, invalidAt(where(r), err)
	}
	prev, err := tx.get(k, id)
	if err != nil {
		return nil, err
	}
	if err := checkReplacement(prev, r); err != nil {
		return nil, err
	}
	if b, ok := r.(*Batch); ok {
		if err := tx.checkBatchMembers(b); err != nil {
			return nil, err
		}
	}
	data, err := EncodeRecord(tx.s.signer, tx.s.owner, r)
	if err != nil {
		return nil, errcode.New(errcode.OutboxStoreUnwritable, where(r), err)
	}
	if int64(len(data)) > tx.s.limits.MaxBytes(k) {
		code := errcode.OutboxFull
		if k == KindOperations {
			code = errcode.IdempotencyStoreFull
		}
		return nil, errcode.New(code, where(r), errors.New("record exceeds its size limit"))
	}
	return data, nil
}

// checkBatchMembers refuses a batch marker unless every member it lists is already
// written and consistent with it: same message, peer, relay and deadline, and ordinals
// 0..n-1 in the listed order. A marker therefore never commits a missing member.
func (tx *Tx) checkBatchMembers(b *Batch) error {
	for i, id := range b.EnvelopeIDs {
		r, err := tx.get(KindOutbox, id)
		if err != nil {
			return err
		}
		if o, _ := r.(*Outbox); !memberOf(b, i, o) {
			return conflict(b, "member %d (%s) is missing or inconsistent with the marker", i, id)
		}
	}
	return nil
}

// published runs after a successful rename or unlink of kind/id: it grows the
// generation and brings this process's caches, listings and indexes up to date.
func (tx *Tx) published(k Kind, id string, rec Record, data []byte, before Stamp) error {
	p := recordPath(k, id)
	oldGen, newGen, err := tx.bumpGeneration()
	if err != nil {
		return err
	}
	tx.reads[p] = rec
	var fp fsx.Fingerprint
	if rec == nil {
		tx.s.cache.Remove(p)
	} else if info, err := tx.s.fs.Lstat(p); err == nil {
		fp = info.Fingerprint()
		tx.s.remember(p, data, fp, rec)
	}
	tx.s.adoptPublication(k, id, rec, fp, before, oldGen, newGen)
	return nil
}

// bumpGeneration appends one byte to the generation file (DESIGN §6).
func (tx *Tx) bumpGeneration() (oldGen, newGen int64, err error) {
	if tx.gen == nil {
		f, err := tx.s.fs.OpenFile(generationName, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT, 0o600)
		if err != nil {
			return 0, 0, writeError(generationName, err)
		}
		info, err := f.Stat()
		if err == nil {
			err = fsx.CheckPrivateFile(generationName, info)
		}
		if err != nil {
			f.Close()
			return 0, 0, invalidAt(generationName, err)
		}
		tx.gen, tx.genLen = f, info.Size
	}
	if _, err := tx.gen.Write([]byte{'\n'}); err != nil {
		return 0, 0, writeError(generationName, err)
	}
	tx.genLen++
	return tx.genLen - 1, tx.genLen, nil
}

// Delete durably removes record kind/id; removing an absent record does nothing.
func (tx *Tx) Delete(k Kind, id string) error {
	prev, err := tx.get(k, id)
	if err != nil || prev == nil {
		return err
	}
	if err := tx.lock.Check(); err != nil {
		return lockError(tx.s.dir, err)
	}
	before, err := tx.s.ListingStamp(k)
	if err != nil {
		return err
	}
	p := recordPath(k, id)
	if err := tx.s.fs.Remove(p); err != nil {
		return writeError(p, err)
	}
	if err := tx.published(k, id, nil, nil, before); err != nil {
		return err
	}
	if err := tx.s.fs.SyncDir(string(k)); err != nil {
		return writeError(string(k), err)
	}
	return nil
}

// RemoveTemp removes a staged temp file name (maintenance and repair).
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
