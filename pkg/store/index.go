package store

import (
	"context"
	"slices"
	"strings"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// OutboxSummary is the outbox index's metadata of one envelope (no envelope bytes).
type OutboxSummary struct {
	EnvelopeID       string
	MessageID        string
	BatchID          string
	EnvelopeKind     string
	State            string
	Ordinal          int
	RelayURL         string
	PeerOwnerDID     string
	DeliveryDeadline int64
	NextAttemptAt    int64
	Attempts         int
	Lease            *record.Lease
	UnreachableSince int64 // the persisted target wait, 0 if none
	Held             bool  // an operator's hold is in force
	LastError        string
	Bytes            int64 // size of the signed envelope
	RetainUntil      int64
}

// MessageSummary is the messages index's metadata of one message.
type MessageSummary struct {
	MessageID        string
	Status           string
	ClosedBy         string
	PeerOwnerDID     string
	RelayURL         string
	DeliveryDeadline int64
	CreatedAt        int64
	UpdatedAt        int64
	Attempts         int
	LastError        string // why it closed, or the last failed attempt's error
	// Held is the operator's hold in force and Operator the last operator action
	// (nil: none); the summaries MessageSummaries returns hold their own copies.
	Held, Operator *record.Action
	RetainUntil    int64
}

// index is a kind's metadata index, current at one listing stamp (DESIGN §8). It is
// guarded by Store.mu.
//
// Every entry was read (or written by this process) after the generation state of
// stamp was current, except the ownMarks publications of this process patched in
// since stamp (adopt on an index a foreign publication had left behind): their marks
// lie after stamp's generation and are accounted for. version grows at every change,
// so a refresh computed outside s.mu installs its result only on the version it
// started from.
type index struct {
	stamp    Stamp
	ownMarks int
	version  uint64
	fps      map[string]fsx.Fingerprint // the file each entry summarizes
	racy     map[string]bool            // entries fingerprinted within the racy window of the file's ctime
	outbox   map[string]OutboxSummary
	messages map[string]MessageSummary
	ops      map[string]operationSummary
	// Outbox aggregates, kept by apply: pending envelopes and all envelope bytes.
	pending int
	bytes   int64
}

// indexSnapshot is what a refresh of a kind's index starts from, taken under s.mu:
// the index and the parts of it a publication may change meanwhile, and this
// process's publication state of the kind.
type indexSnapshot struct {
	index    *index // nil: none installed yet
	stamp    Stamp  // index.stamp
	version  uint64 // index.version: the result is installed only over this version
	ownMarks int    // index.ownMarks
	// fullScan: the kind has an unmarked publication (markFailed), so no stamp or
	// mark count can be trusted and every entry is reconciled.
	fullScan bool
	// inFlight is the id of this process's publication of the kind between its rename
	// and its adoption, "" if none.
	inFlight string
}

// operationSummary is the operations index's metadata of one operation.
type operationSummary struct {
	OperationID string
	State       string
	CreatedAt   int64
	LeaseUntil  int64
	RetainUntil int64
	Bytes       int64 // size of the stored response
}

func summarizeOutbox(r *record.Outbox) OutboxSummary {
	var lease *record.Lease
	if r.Lease != nil {
		l := *r.Lease
		lease = &l
	}
	return OutboxSummary{EnvelopeID: r.EnvelopeID, MessageID: r.MessageID, BatchID: r.BatchID,
		EnvelopeKind: r.EnvelopeKind, State: r.State, Ordinal: r.Ordinal, RelayURL: r.RelayURL,
		PeerOwnerDID: r.PeerOwnerDID, DeliveryDeadline: r.DeliveryDeadline, NextAttemptAt: r.NextAttemptAt,
		Attempts: r.Attempts, Lease: lease, UnreachableSince: r.UnreachableSince, Held: r.Held != nil, LastError: r.LastError, Bytes: int64(len(r.Envelope)),
		RetainUntil: r.RetainUntil}
}

func summarizeMessage(r *record.Message) MessageSummary {
	return MessageSummary{MessageID: r.MessageID, Status: r.Status, ClosedBy: r.ClosedBy,
		PeerOwnerDID: r.PeerOwnerDID, RelayURL: r.RelayURL, DeliveryDeadline: r.DeliveryDeadline,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Attempts: r.Attempts, LastError: r.LastError,
		Held: record.CloneAction(r.Held), Operator: record.CloneAction(r.Operator), RetainUntil: r.RetainUntil}
}

func newIndex(k record.Kind, st Stamp) *index {
	ix := &index{stamp: st, fps: map[string]fsx.Fingerprint{}, racy: map[string]bool{}}
	switch k {
	case record.KindOutbox:
		ix.outbox = map[string]OutboxSummary{}
	case record.KindMessages:
		ix.messages = map[string]MessageSummary{}
	case record.KindOperations:
		ix.ops = map[string]operationSummary{}
	}
	return ix
}

// apply records rec (nil: removed), read from the file with fingerprint fp, under id;
// racy says fp was taken within the racy window of the file's ctime.
func (ix *index) apply(id string, rec record.Record, fp fsx.Fingerprint, racy bool) {
	ix.version++
	ix.fps[id] = fp
	if racy {
		ix.racy[id] = true
	} else {
		delete(ix.racy, id)
	}
	switch r := rec.(type) {
	case *record.Outbox:
		ix.setOutbox(id, summarizeOutbox(r))
	case *record.Message:
		ix.messages[id] = summarizeMessage(r)
	case *record.Operation:
		ix.ops[id] = operationSummary{OperationID: r.OperationID, State: r.State, CreatedAt: r.CreatedAt,
			LeaseUntil: r.LeaseUntil, RetainUntil: r.RetainUntil, Bytes: int64(len(r.Response))}
	case nil:
		delete(ix.fps, id)
		delete(ix.racy, id)
		ix.dropOutbox(id)
		delete(ix.messages, id)
		delete(ix.ops, id)
	}
}

// setOutbox sets id's outbox entry, keeping the aggregates.
func (ix *index) setOutbox(id string, e OutboxSummary) {
	ix.dropOutbox(id)
	ix.outbox[id] = e
	ix.bytes += e.Bytes
	if e.State == record.StatePending {
		ix.pending++
	}
}

// dropOutbox removes id's outbox entry, if any, keeping the aggregates.
func (ix *index) dropOutbox(id string) {
	if e, ok := ix.outbox[id]; ok {
		delete(ix.outbox, id)
		ix.bytes -= e.Bytes
		if e.State == record.StatePending {
			ix.pending--
		}
	}
}

// copyEntry copies id's entry from old.
func (ix *index) copyEntry(old *index, id string) {
	ix.fps[id] = old.fps[id]
	if old.racy[id] {
		ix.racy[id] = true
	}
	if e, ok := old.outbox[id]; ok {
		ix.setOutbox(id, e)
	}
	if e, ok := old.messages[id]; ok {
		ix.messages[id] = e
	}
	if e, ok := old.ops[id]; ok {
		ix.ops[id] = e
	}
}

// maxIndexRounds bounds how often an index build repeats because the stamp moved.
const maxIndexRounds = 8

// prepareIndex brings k's index up to date, outside the lock. This process's own
// publications patch the index as they are made (adoptPublication), so it is usually
// current and costs a stamp. After another process published to k, the index is
// brought up to date for the entries that changed only (refreshIndex): a directory
// listing with inode numbers and the generation marks tell which, and only those are
// read and verified; when they cannot tell, every entry is lstat-ed and the changed
// ones read (reconcile). ctx is checked between records.
//
// When it returns nil the index is current as of some moment during the call: it
// holds every publication completed before the call, and every publication of this
// process whose rename came before the call (one still in flight then is waited for).
// If writers keep moving the stamp under a reconciliation, it is repeated at most
// maxIndexRounds times, and then once more under the lock, where no one else
// publishes. It returns the index that answers the call: callers read it, never
// s.indexes[k] afterwards (another reader may install a newer index meanwhile, which
// is fine, but the one returned is the one found current). It must not be called
// inside a transaction (it may take the lock); under the lock use prepareIndexHeld.
func (s *Store) prepareIndex(ctx context.Context, k record.Kind) (*index, error) {
	return s.prepareIndexFrom(ctx, k, nil)
}

// prepareIndexFrom is prepareIndex whose first round takes k's stamp with generation
// state gen, read by the caller before the call (nil: read it).
func (s *Store) prepareIndexFrom(ctx context.Context, k record.Kind, gen *generation) (*index, error) {
	for round := 0; round < maxIndexRounds; round++ {
		ix, done, err := s.indexRound(ctx, k, gen)
		gen = nil
		if err != nil {
			return nil, err
		}
		if done {
			return s.answer(k, ix), nil
		}
	}
	unlock, _, err := s.lockStore(ctx, exclusive)
	if err != nil {
		return nil, err
	}
	ix, err := s.prepareIndexHeld(ctx, k, nil)
	if uerr := unlock(); err == nil {
		err = uerr
	}
	if err != nil {
		return nil, err
	}
	return s.answer(k, ix), nil
}

// indexAnswered, if set (by tests, before the Store is used), runs when an index
// reader has found the index that answers it and before it reads it.
var indexAnswered func(k record.Kind)

// answer returns ix, the index that answers a reader of k (an empty one if none).
func (s *Store) answer(k record.Kind, ix *index) *index {
	if indexAnswered != nil {
		indexAnswered(k)
	}
	if ix == nil {
		return newIndex(k, Stamp{})
	}
	return ix
}

// prepareIndexHeld is prepareIndex for a caller holding the store lock: the stamp can
// then move only by staged temps (which indexCurrent sees through) or by a change
// that bypasses the store, so a second round finds the index current. gen, if not
// nil, is the generation state: a publisher under the lock knows it (Tx.heldGeneration).
func (s *Store) prepareIndexHeld(ctx context.Context, k record.Kind, gen *generation) (*index, error) {
	var last *index
	for round := 0; round < maxIndexRounds; round++ {
		ix, done, err := s.indexRound(ctx, k, gen)
		if done || err != nil {
			return ix, err
		}
		last = ix
	}
	return last, nil // a foreign writer keeps changing the directory: keep the last scan
}

// indexRound reports whether k's index is current, and returns it; if not, it brings
// it up to date once and returns the result and whether it was installed (then it is
// current as of the call: its stamp was taken when the round began).
//
// While a publication of this process is in flight (renamed or unlinked, not yet
// adopted), no stamp can show the index current. The round waits for it to be adopted
// (a rename, a mark and an lstat: microseconds) and takes the stamp again, up to
// maxInFlightWaits times; a reader that still meets one then refreshes the index with
// that publication's record read again (refreshChanged), so it holds every
// publication a read before the call could have seen. A kind with a publication whose
// mark failed (unmarkedKinds) is reconciled with a full scan every time.
func (s *Store) indexRound(ctx context.Context, k record.Kind, gen *generation) (ix *index, current bool, err error) {
	for waits := 0; ; waits++ {
		var st Stamp
		if gen != nil {
			st, err = s.stampWith(k, *gen)
		} else {
			st, err = s.ListingStamp(k)
		}
		if err != nil {
			return nil, false, err
		}
		s.mu.Lock()
		from := indexSnapshot{index: s.indexes[k], fullScan: s.unmarkedKinds[k], inFlight: s.inFlight[k]}
		if from.inFlight != "" && !from.fullScan && waits < maxInFlightWaits {
			adopted := s.published
			s.mu.Unlock()
			select {
			case <-adopted:
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
			gen = nil // the state read before the wait is old now
			continue
		}
		if from.inFlight == "" && !from.fullScan && s.indexCurrent(k, from.index, st) {
			s.mu.Unlock()
			return from.index, true, nil
		}
		// Publications patch the index in place: what the refresh needs of it is read
		// here, under s.mu (if it changes meanwhile, its version says so).
		if from.index != nil {
			from.stamp, from.version, from.ownMarks = from.index.stamp, from.index.version, from.index.ownMarks
		}
		s.mu.Unlock()
		return s.refreshIndex(ctx, k, st, from)
	}
}

// maxInFlightWaits bounds how often an index round waits for a publication of this
// process in flight before it refreshes around it (a publisher that keeps publishing
// could otherwise keep a reader waiting).
var maxInFlightWaits = 8

// reconcile builds k's index for ids, reusing old's entries whose file is unchanged.
// An entry whose fingerprint was racy when taken is not reused on the fingerprint
// alone (the file may have been rewritten within the same tick): it is read and
// verified again, and trusted from then on once the racy window has passed. old is
// only read: entries are copied under s.mu.
func (s *Store) reconcile(ctx context.Context, k record.Kind, st Stamp, ids []string, old *index) (*index, error) {
	fresh := newIndex(k, st)
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		info, err := s.fs.Lstat(record.Path(k, id))
		if fsx.IsNotExist(err) {
			continue // removed meanwhile: the stamp check will notice
		}
		if err != nil {
			return nil, invalidAt(record.Path(k, id), err)
		}
		fp := info.Fingerprint()
		if old != nil {
			s.mu.Lock()
			known, ok := old.fps[id]
			reuse := ok && known == fp && !old.racy[id]
			if reuse {
				fresh.copyEntry(old, id)
			}
			s.mu.Unlock()
			if reuse {
				continue
			}
		}
		now := s.now() // before the read: what is read then is racy or not as of now
		r, rfp, err := s.readFP(k, id)
		if err != nil {
			return nil, err
		}
		if r != nil {
			fresh.apply(id, r, rfp, s.racyAt(now, rfp.CtimeNs))
		}
	}
	return fresh, nil
}

// indexCurrent reports whether ix still describes kind k at stamp st, and if so
// moves it to st (never back). It is current when the stamp is unchanged; when ix is
// at least as new as st (a later state of the same generation file: this process
// patched it after st was taken); or when only the directory's times moved (staged
// temps come and go outside the lock) while the generation shows no publication to k
// since ix was made: every sealbridge publication appends its kind's mark under the
// lock. Caller holds s.mu.
func (s *Store) indexCurrent(k record.Kind, ix *index, st Stamp) bool {
	switch {
	case ix == nil:
		return false
	case ix.stamp == st:
		return true
	case st.absent:
		return false
	case ix.stamp.absent:
		// The directory appeared; without a publication to k it holds only temps.
	case ix.stamp.Dir.Dev != st.Dir.Dev || ix.stamp.Dir.Ino != st.Dir.Ino:
		return false
	case ix.ownMarks == 0 && ix.stamp.gen.sameFile(st.gen) && ix.stamp.gen.size > st.gen.size:
		return true // newer than st
	}
	if ix.ownMarks > 0 || s.changedKinds(ix.stamp.gen, st.gen)[k] { // every kind, across a compaction
		return false
	}
	ix.stamp = st
	return true
}

// Prepare makes the outbox and messages indexes current, in bounded slices that honour
// ctx, so later operations (and capacity checks under the lock) need no scan.
func (s *Store) Prepare(ctx context.Context) error {
	gen, err := s.generation() // one read of the generation file for both stamps
	if err != nil {
		return err
	}
	if _, err := s.prepareIndexFrom(ctx, record.KindMessages, &gen); err != nil {
		return err
	}
	_, err = s.prepareIndexFrom(ctx, record.KindOutbox, &gen)
	return err
}

// OutboxSummaries returns the outbox index entries sorted by (messageId, ordinal),
// preparing the index first if its stamp moved.
func (s *Store) OutboxSummaries(ctx context.Context) ([]OutboxSummary, error) {
	ix, err := s.prepareIndex(ctx, record.KindOutbox)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	out := make([]OutboxSummary, 0, len(ix.outbox))
	for _, e := range ix.outbox {
		if e.Lease != nil {
			l := *e.Lease
			e.Lease = &l
		}
		out = append(out, e)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b OutboxSummary) int {
		if c := strings.Compare(a.MessageID, b.MessageID); c != 0 {
			return c
		}
		return a.Ordinal - b.Ordinal
	})
	return out, nil
}

// MessageSummaries returns the messages index entries sorted by id.
func (s *Store) MessageSummaries(ctx context.Context) ([]MessageSummary, error) {
	ix, err := s.prepareIndex(ctx, record.KindMessages)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	out := make([]MessageSummary, 0, len(ix.messages))
	for _, e := range ix.messages {
		e.Held, e.Operator = record.CloneAction(e.Held), record.CloneAction(e.Operator)
		out = append(out, e)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b MessageSummary) int { return strings.Compare(a.MessageID, b.MessageID) })
	return out, nil
}
