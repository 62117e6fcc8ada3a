package store

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// TempMaxAge is the age after which maintenance removes a leftover staged temp.
const TempMaxAge = time.Hour

// MaintenanceReport counts what one maintenance pass did.
type MaintenanceReport struct {
	ClosedByDeadline int // pending members closed because their deadline passed
	BatchesFinished  int // settled batches removed (marker first, then members; a single by itself)
	OrphansRemoved   int // outbox records that no marker lists (singles: that no message record commits), unbound operations
	ExpiredRemoved   int // records past retainUntil
	TempsRemoved     int // staged temps older than TempMaxAge
	BlobsRemoved     int // blobs no record refers to, older than Limits.BlobGrace
	BlobPartsRemoved int // staged (.<uuid>.tmp) and partial (.<envelopeId>.part) blobs older than Limits.BlobGrace
	Errors           []error
}

// Maintain runs every maintenance step of DESIGN §10, each in its own short
// transaction that rechecks its condition under the lock, checking ctx between steps.
// A step that fails is recorded in the report and the pass goes on; ctx cancellation
// stops the pass and is returned. A rolled-back Store refuses it (STORE_ROLLED_BACK).
func (s *Store) Maintain(ctx context.Context) (MaintenanceReport, error) {
	var rep MaintenanceReport
	if err := s.checkWritable(); err != nil {
		return rep, err
	}
	stepFailed := false // the last step's transaction failed (recorded in the report)
	step := func(fn func(tx *Tx) error) error {
		stepFailed = false
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.Transaction(ctx, fn); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			rep.Errors = append(rep.Errors, err)
			stepFailed = true
		}
		return nil
	}
	// 1. Batches: close members past their deadline; finish settled batches.
	batches, err := s.listLenient(record.KindBatches, &rep)
	if err != nil {
		return rep, err
	}
	// A step that wrote (closed a member, moved a message forward) finishes its batch
	// in a second transaction, once what it wrote is durable: never in the same one,
	// whose removals could outlive the message's move in a crash.
	// A step whose transaction failed leaves its batch alone: what it wrote may not
	// be durable, and a removal after it could outlive it.
	for _, id := range batches {
		wrote := false
		if err := step(func(tx *Tx) (err error) { wrote, err = s.maintainBatch(tx, id, &rep); return err }); err != nil {
			return rep, err
		}
		if wrote && !stepFailed {
			if err := step(func(tx *Tx) (err error) { _, err = s.maintainBatch(tx, id, &rep); return err }); err != nil {
				return rep, err
			}
		}
	}
	// The same for singles (DESIGN §7), up to maintainChunk outbox records a step.
	outbox, err := s.listLenient(record.KindOutbox, &rep)
	if err != nil {
		return rep, err
	}
	for chunk := range slices.Chunk(outbox, maintainChunk) {
		wrote := false
		if err := step(func(tx *Tx) (err error) { wrote, err = s.maintainSingles(tx, chunk, &rep); return err }); err != nil {
			return rep, err
		}
		if wrote && !stepFailed {
			if err := step(func(tx *Tx) (err error) { _, err = s.maintainSingles(tx, chunk, &rep); return err }); err != nil {
				return rep, err
			}
		}
	}
	// Operations some binding points to (outside the lock; see maintainRecord).
	bound, err := s.boundOperations(ctx, &rep)
	if err != nil {
		return rep, err
	}
	// 2. Orphan outbox records and operations, and 3. records past retainUntil: up to
	// maintainChunk records of one kind a step, removed together with one directory
	// fsync, so that neither a lock hold nor the fsyncs grow with the store.
	for _, k := range retentionOrder {
		ids, err := s.listLenient(k, &rep)
		if err != nil {
			return rep, err
		}
		for chunk := range slices.Chunk(ids, maintainChunk) {
			if err := step(func(tx *Tx) error { return s.maintainRecords(tx, k, chunk, bound, &rep) }); err != nil {
				return rep, err
			}
		}
	}
	// 4. Leftover temps: found outside the lock, removed under it in chunks.
	for _, k := range record.Kinds {
		old, err := s.oldTemps(k)
		if err != nil {
			rep.Errors = append(rep.Errors, err)
			continue
		}
		for chunk := range slices.Chunk(old, maintainChunk) {
			if err := step(func(tx *Tx) error { return s.removeOldTemps(tx, k, chunk, &rep) }); err != nil {
				return rep, err
			}
		}
	}
	// 5. Blobs no record refers to, and leftover staged and partial blobs, older than
	// Limits.BlobGrace: found and their references scanned outside the lock, removed
	// under it in chunks, each after the references were checked again.
	if err := s.maintainBlobs(ctx, step, &rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// maintainChunk bounds the records one maintenance step examines and removes under
// one lock hold.
const maintainChunk = 64

// retentionOrder is the order in which steps 2 and 3 go through the kinds: batch
// markers before the outbox, so that a marker past retention is removed (durably, by
// its own step) before its members, which are then orphans. A member is never removed
// while a marker lists it (removable), so no crash leaves a marker without members.
var retentionOrder = func() []record.Kind {
	order := []record.Kind{record.KindBatches}
	for _, k := range record.Kinds {
		if k != record.KindBatches {
			order = append(order, k)
		}
	}
	return order
}()

// listLenient lists a kind, recording (not returning) an invalid directory.
func (s *Store) listLenient(k record.Kind, rep *MaintenanceReport) ([]string, error) {
	ids, err := s.List(k)
	if err != nil {
		if errors.Is(err, errcode.OutboxStoreInvalid) {
			rep.Errors = append(rep.Errors, err)
			return nil, nil
		}
		return nil, err
	}
	return ids, nil
}

// maintainBatch closes batch id's members past their deadline and brings its message
// forward to follow its members (record.MessageFollow: a crash between a
// settlement's publications can leave it behind). If it wrote nothing it finishes the
// batch once every member is settled; it reports whether it wrote, so that the caller
// finishes the batch in a later transaction, after the writes are durable.
func (s *Store) maintainBatch(tx *Tx, id string, rep *MaintenanceReport) (bool, error) {
	members, err := tx.Committed(id)
	if err != nil || members == nil {
		return false, err
	}
	now := s.nowMs()
	wrote := false
	for _, m := range members {
		if m.State != record.StatePending || m.DeliveryDeadline > now {
			continue
		}
		// A held envelope closes by its deadline too; a closed one is never held.
		m.State, m.LastError, m.Lease, m.Held = record.StateClosed, errcode.OutboxDeadlineExpired.String(), nil, nil
		if err := tx.Put(m); err != nil {
			return wrote, err
		}
		wrote = true
		rep.ClosedByDeadline++
	}
	if len(members) == 0 {
		return wrote, nil
	}
	msg, err := TxGet[*record.Message](tx, members[0].MessageID)
	if err != nil {
		return wrote, err
	}
	switch f := record.MessageFollow(msg, members, now); {
	case f.Status == record.StatusClosed && f.ClosedBy == "":
		// Closed for a reason its envelope does not say: left for fsck to report,
		// and the batch kept, so the message is never reported absent.
		return wrote, nil
	case f.Status == record.StatusClosed:
		tx.EndMessage(msg, record.StatusClosed, f.ClosedBy, f.Reason, now)
		msg.Attempts = max(msg.Attempts, f.Attempts)
		if err := tx.Put(msg); err != nil {
			return wrote, err
		}
		return true, nil
	case f.Status == record.StatusRelayed || f.Unhold:
		if f.Status == record.StatusRelayed {
			msg.Status, msg.Attempts = record.StatusRelayed, max(msg.Attempts, f.Attempts)
		}
		if f.Unhold {
			msg.Held = nil // a hold never outlives the message's last pending envelope
		}
		msg.UpdatedAt = max(now, 1)
		if err := tx.Put(msg); err != nil {
			return wrote, err
		}
		return true, nil
	}
	if wrote {
		return true, nil
	}
	return false, s.finishBatch(tx, id, members, rep)
}

// maintainSingles runs maintainBatch on those of the outbox records ids that are
// committed singles (DESIGN §7; a single's batch id is its envelope id), and reports
// whether any wrote.
func (s *Store) maintainSingles(tx *Tx, ids []string, rep *MaintenanceReport) (bool, error) {
	wrote := false
	for _, id := range ids {
		r, err := tx.get(record.KindOutbox, id)
		if err != nil {
			return wrote, err
		}
		if o, _ := r.(*record.Outbox); o == nil || !record.IsSingle(o.BatchID, o.EnvelopeID, o.Ordinal) {
			continue
		}
		w, err := s.maintainBatch(tx, id, rep)
		wrote = wrote || w
		if err != nil {
			return wrote, err
		}
	}
	return wrote, nil
}

// finishBatch removes a batch whose members are all settled: the marker first, so an
// interrupted cleanup can never make a member dispatchable again. A single has no
// marker; removing it is one unlink.
func (s *Store) finishBatch(tx *Tx, id string, members []*record.Outbox, rep *MaintenanceReport) error {
	if slices.ContainsFunc(members, func(m *record.Outbox) bool { return m.State == record.StatePending }) {
		return nil
	}
	if err := tx.Delete(record.KindBatches, id); err != nil {
		return err
	}
	for _, m := range members {
		if err := tx.Delete(record.KindOutbox, m.EnvelopeID); err != nil {
			return err
		}
	}
	rep.BatchesFinished++
	return nil
}

// boundOperations returns the ids of the operations that an idempotency binding
// points to.
func (s *Store) boundOperations(ctx context.Context, rep *MaintenanceReport) (map[string]bool, error) {
	bound := map[string]bool{}
	ids, err := s.listLenient(record.KindIdempotency, rep)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b, err := GetAs[*record.Binding](s, id)
		if err != nil {
			rep.Errors = append(rep.Errors, err)
			continue
		}
		if b != nil {
			bound[b.OperationID] = true
		}
	}
	return bound, nil
}

// maintainRecords removes, together, those of the records kind/ids that are orphans
// or past their retention. An operation is an orphan when no binding pointed to it
// (bound, listed before the steps) and its lease has run out since its creation: new
// bindings only ever point to operations created with them, so an aged operation
// cannot gain one later. The records are independent of one another, so a crash that
// keeps any subset of the removals leaves a store as valid as one removal at a time.
func (s *Store) maintainRecords(tx *Tx, k record.Kind, ids []string, bound map[string]bool, rep *MaintenanceReport) error {
	var doomed []string
	for _, id := range ids {
		why, err := s.removable(tx, k, id, bound)
		if err != nil {
			return err
		}
		switch why {
		case removeOrphan:
			rep.OrphansRemoved++
		case removeExpired:
			rep.ExpiredRemoved++
		default:
			continue
		}
		doomed = append(doomed, id)
	}
	return tx.deleteAll(k, doomed)
}

const (
	keep = iota
	removeOrphan
	removeExpired
)

// removable says whether kind/id is to be removed, and why.
func (s *Store) removable(tx *Tx, k record.Kind, id string, bound map[string]bool) (int, error) {
	r, err := tx.get(k, id)
	if err != nil || r == nil {
		return keep, err
	}
	if op, ok := r.(*record.Operation); ok && !bound[id] && op.CreatedAt+s.leaseMs() <= s.nowMs() {
		return removeOrphan, nil
	}
	if o, ok := r.(*record.Outbox); ok {
		b, err := TxGet[*record.Batch](tx, o.BatchID)
		if err != nil {
			return keep, err
		}
		if b == nil && record.IsSingle(o.BatchID, o.EnvelopeID, o.Ordinal) {
			m, err := TxGet[*record.Message](tx, o.MessageID)
			if err != nil {
				return keep, err
			}
			if !record.CommitsSingle(m, o) {
				return removeOrphan, nil // its message record never committed it
			}
		} else if b == nil || !slices.Contains(b.EnvelopeIDs, id) {
			return removeOrphan, nil
		} else {
			return keep, nil // listed by its marker: it goes after the marker
		}
	}
	if retainUntil(r) <= s.nowMs() {
		return removeExpired, nil
	}
	return keep, nil
}

func retainUntil(r record.Record) int64 {
	switch v := r.(type) {
	case *record.Outbox:
		return v.RetainUntil
	case *record.Batch:
		return v.RetainUntil
	case *record.Message:
		return v.RetainUntil
	case *record.Receipt:
		return v.RetainUntil
	case *record.Observation:
		return v.RetainUntil
	case *record.Operation:
		return v.RetainUntil
	case *record.Binding:
		return v.RetainUntil
	case *record.Refusal:
		return v.RetainUntil
	}
	return 0
}

// oldTemps lists, without the lock, the staged temps of kind k older than TempMaxAge.
func (s *Store) oldTemps(k record.Kind) ([]string, error) {
	ents, err := s.fs.ReadDir(string(k))
	if fsx.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, invalidAt(string(k), err)
	}
	var old []string
	for _, e := range ents {
		if fsx.IsTempName(e.Name) && s.tempIsOld(k, e.Name) {
			old = append(old, e.Name)
		}
	}
	return old, nil
}

func (s *Store) tempIsOld(k record.Kind, name string) bool {
	info, err := s.fs.Lstat(path.Join(string(k), name))
	return err == nil && s.now().UnixNano()-info.MtimeNs >= int64(TempMaxAge)
}

// removeOldTemps removes, under the lock, those of the temps names of kind k that are
// still older than TempMaxAge (checked again: a name may have been reused meanwhile),
// then fsyncs the directory once.
func (s *Store) removeOldTemps(tx *Tx, k record.Kind, names []string, rep *MaintenanceReport) error {
	if s.staging.Load() > 0 {
		// A transaction of this process is staging or publishing: any temp may be
		// its own. Names are fresh, so a temp staged after this check was not
		// listed; one listed before it is left for a later pass.
		return nil
	}
	removed := false
	for _, name := range names {
		if !s.tempIsOld(k, name) {
			continue
		}
		if err := tx.removeFile(string(k), name); err != nil {
			return err
		}
		removed = true
		rep.TempsRemoved++
	}
	if removed {
		if err := s.fs.SyncDir(string(k)); err != nil {
			return writeError(string(k), err)
		}
	}
	return nil
}

// blobScan is what the records that may refer to a blob — outbox records (their
// envelope) and observations — referred to when they were read: by record path, the
// file's fingerprint, whether it was racy (DESIGN §8) and the digest it names ("" for
// none). A record's reference never changes while its file does not: an outbox
// record's envelope and an observation's blob are immutable, and a record is only
// ever replaced by a rename, which changes its fingerprint.
type blobScan struct {
	gen     generation // the generation file's state before the records were read
	entries map[string]blobScanEntry
}

type blobScanEntry struct {
	fp     fsx.Fingerprint
	racy   bool
	digest string
}

// blobRefKinds are the kinds whose records refer to blobs.
var blobRefKinds = []record.Kind{record.KindOutbox, record.KindObservations}

// scanBlobRefs reads every outbox record and observation and returns what they refer
// to. With prev (a scan made earlier) it first asks the generation file (DESIGN §7):
// if no outbox record or observation was published since prev began, and this
// process has no unmarked publication, prev is still what they refer to and nothing
// is read. Otherwise it reads again only the records whose file is not the one prev
// read (new, replaced, or racy then), and takes the rest from prev: one lstat each.
// Any record it cannot read makes the scan fail (OUTBOX_STORE_INVALID): what that
// record refers to cannot be told, so no blob may be removed.
func (s *Store) scanBlobRefs(ctx context.Context, prev *blobScan) (*blobScan, error) {
	gen, err := s.generation()
	if err != nil {
		return nil, err
	}
	if prev != nil && !s.hasUnmarked() {
		counts, known := s.markCounts(prev.gen, gen)
		if known && counts[record.KindOutbox] == 0 && counts[record.KindObservations] == 0 {
			return &blobScan{gen: gen, entries: prev.entries}, nil
		}
	}
	var old map[string]blobScanEntry
	if prev != nil {
		old = prev.entries
	}
	scan := &blobScan{gen: gen, entries: map[string]blobScanEntry{}}
	for _, k := range blobRefKinds {
		ids, err := s.List(k)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			p := record.Path(k, id)
			if e, ok := old[p]; ok && !e.racy {
				info, err := s.fs.Lstat(p)
				if err == nil && info.Fingerprint() == e.fp {
					scan.entries[p] = e
					continue
				}
			}
			now := s.now()
			r, fp, err := s.readFP(k, id)
			if err != nil {
				return nil, err
			}
			if r == nil {
				continue // removed since the listing
			}
			e := blobScanEntry{fp: fp, racy: s.racyAt(now, fp.CtimeNs)}
			switch v := r.(type) {
			case *record.Outbox:
				ref, ok, err := envelopeBlob(v.Envelope)
				if err != nil {
					return nil, invalidAt(p, fmt.Errorf("its envelope names a blob but does not parse: %w", err))
				}
				if ok {
					e.digest = ref.Digest
				}
			case *record.Observation:
				if v.Blob != nil {
					e.digest = v.Blob.Digest
				}
			}
			scan.entries[p] = e
		}
	}
	return scan, nil
}

// referenced returns the set of digests the scan's records refer to.
func (scan *blobScan) referenced() map[string]bool {
	refs := map[string]bool{}
	for _, e := range scan.entries {
		if e.digest != "" {
			refs[e.digest] = true
		}
	}
	return refs
}

// maintainBlobs is maintenance step 5 (DESIGN §10). Outside the lock it lists blobs/
// and keeps the files older than Limits.BlobGrace by mtime — blobs, staged blobs
// (.<uuid>.tmp) and partial ones (.<envelopeId>.part) — and, if any is a blob, scans
// what the records refer to. Then, a chunk at a time under the lock, it scans the
// references again (only the records changed since: a reference appears only with a
// new or replaced record) and removes what is still old and, for a blob, still
// unreferenced, then fsyncs blobs/ once. Enqueue checks its blobs under the lock in
// the hold that publishes its records, so a blob is never removed between that check
// and the record that refers to it. Anything else in blobs/ is left for fsck.
func (s *Store) maintainBlobs(ctx context.Context, step func(func(tx *Tx) error) error, rep *MaintenanceReport) error {
	ents, err := s.fs.ReadDir(BlobDir)
	if fsx.IsNotExist(err) {
		return nil
	}
	if err != nil {
		rep.Errors = append(rep.Errors, invalidAt(BlobDir, err))
		return nil
	}
	var old []string
	blobs := false
	for _, e := range ents {
		if !blobFileName(e.Name) || !s.blobFileIsOld(e.Name) {
			continue
		}
		old = append(old, e.Name)
		blobs = blobs || ValidBlobDigest(e.Name)
	}
	if len(old) == 0 {
		return nil
	}
	slices.Sort(old)
	var scan *blobScan
	if blobs {
		if scan, err = s.scanBlobRefs(ctx, nil); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			rep.Errors = append(rep.Errors, err)
			scan, old = nil, slices.DeleteFunc(old, ValidBlobDigest) // no blob removed this pass
		}
	}
	if blobsScanned != nil {
		blobsScanned()
	}
	for chunk := range slices.Chunk(old, maintainChunk) {
		err := step(func(tx *Tx) error {
			var refs map[string]bool
			if slices.ContainsFunc(chunk, ValidBlobDigest) {
				again, err := s.scanBlobRefs(tx.ctx, scan)
				if err != nil {
					return err
				}
				scan, refs = again, again.referenced()
			}
			return s.removeOldBlobs(tx, chunk, refs, rep)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// blobsScanned, if set (by tests, before the Store is used), runs after maintenance
// scanned the blob references outside the lock and before it takes the lock.
var blobsScanned func()

// blobFileName reports whether base is a name maintenance may remove from blobs/: a
// blob, a staged blob or a partial blob.
func blobFileName(base string) bool {
	_, part := BlobPartEnvelope(base)
	return ValidBlobDigest(base) || fsx.IsTempName(base) || part
}

// blobFileIsOld reports whether blobs/base is a regular file older than
// Limits.BlobGrace by mtime, on the store's clock.
func (s *Store) blobFileIsOld(base string) bool {
	info, err := s.fs.Lstat(path.Join(BlobDir, base))
	return err == nil && info.IsRegular() && s.now().UnixNano()-info.MtimeNs >= int64(s.limits.BlobGrace)
}

// removeOldBlobs removes, under the lock, those of names that are still old and, for
// a blob, not in refs, then fsyncs blobs/ once.
func (s *Store) removeOldBlobs(tx *Tx, names []string, refs map[string]bool, rep *MaintenanceReport) error {
	removed := false
	for _, name := range names {
		blob := ValidBlobDigest(name)
		if (blob && refs[name]) || !s.blobFileIsOld(name) {
			continue
		}
		if err := tx.removeFile(BlobDir, name); err != nil {
			return err
		}
		removed = true
		if blob {
			rep.BlobsRemoved++
		} else {
			rep.BlobPartsRemoved++
		}
	}
	if removed {
		if err := s.fs.SyncDir(BlobDir); err != nil {
			return writeError(BlobDir, err)
		}
	}
	return nil
}
