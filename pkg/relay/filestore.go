package relay

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// fileStore is the file-backed storage (the package doc's "Persistence"):
// receipt records in the relay's own store, envelope files in the inbox
// directory, an in-memory index of the inboxes. One fileStore (one process)
// owns its inbox directory at a time.
type fileStore struct {
	id       *identity.Identity
	st       *store.Store
	inboxDir string
	fs       fsx.FS       // rooted at inboxDir; every inbox file call goes through it
	dirs     fsx.DirsMade // inbox and registry directories made durable through fs
	lockFile *os.File
	now      func() time.Time
	log      *slog.Logger
	wake     func(rdir string) // the Relay's: an envelope became visible in inbox rdir

	mu       sync.Mutex
	inboxes  map[string]*inbox   // recipient dir name → inbox
	byID     map[string]*entry   // envelopeId → entry in an inbox
	inflight map[uint64]struct{} // sequence numbers being written
	hidden   map[uint64]string   // entries inserted behind one being written: seq → recipient dir
	lastSeq  uint64
	allowed  map[string]bool // recipient dir names registered (the allow-list)

	regMu sync.Mutex // serializes registrations

	bodies *fileBodies // the blob bodies and pending envelopes (filebodies.go)

	heads           *fileHeads                // the witnessed store heads (fileheads.go)
	statuses        map[string][]*statusEntry // recipient dir → retained statuses by seq (filestatuses.go); guarded by mu
	statusRetention time.Duration             // how long an acknowledged status is retained (0: not at all)
}

// inbox is one recipient's waiting envelopes, in sequence order.
type inbox struct {
	dir     string
	entries []*entry
	bytes   int64 // the sum of the entries' sizes and body sizes
}

// entry is one waiting envelope.
type entry struct {
	seq        uint64
	envelopeID string
	digest     string
	receivedAt int64
	size       int
	body       int64  // the sealed size of its blob body (0: inline), in bodies/<envelopeId>.blob
	deadline   int64  // delivery deadline, Unix ms: never served at or after it
	file       string // name of the envelope file in f.fs: "<recipient dir>/<file name>"
	recipient  string // recipient dir name
	status     bool   // a delivery status: retained when acknowledged
}

// openFiles opens (creating on first use) the relay's store and inbox
// directory — refusing a data root, store or inbox directory that breaks the
// data-root rules (internal/dataroot) —, locks the inbox directory, and loads
// the inboxes, completing what a crash interrupted: an envelope file without
// its receipt record gets the record; a file whose envelope was acknowledged
// is removed.
func openFiles(opts Options, now func() time.Time, log *slog.Logger, wake func(string)) (*fileStore, error) {
	if opts.Home == "" {
		return nil, errors.New("relay: Options.Home is required")
	}
	f := &fileStore{
		id: opts.Identity, now: now, log: log, wake: wake,
		inboxes: map[string]*inbox{}, byID: map[string]*entry{}, inflight: map[uint64]struct{}{},
		hidden: map[uint64]string{}, allowed: map[string]bool{},
		statuses: map[string][]*statusEntry{}, statusRetention: max(opts.StatusRetention, 0),
	}
	// The relay's clock: it dates the receipts, so it judges their retention too.
	sopts := store.Options{Home: opts.Home, WrapFS: opts.WrapFS, Now: now}
	var err error
	if f.st, err = store.Open(f.id.Signer(), sopts); err != nil {
		return nil, fmt.Errorf("relay: open store: %w", err)
	}
	f.inboxDir = filepath.Join(opts.Home, dataroot.RelayDir, recipientDir(f.id.DID()))
	if f.inboxDir, err = filepath.Abs(f.inboxDir); err != nil {
		return nil, fmt.Errorf("relay: inbox dir: %w", err)
	}
	if err := dataroot.CheckDir(f.inboxDir, "the relay's inbox directory"); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if err := ensureInboxDir(f.inboxDir); err != nil {
		return nil, fmt.Errorf("relay: create inbox dir: %w", err)
	}
	f.fs = fsx.NewOS(f.inboxDir)
	if opts.WrapFS != nil {
		f.fs = opts.WrapFS(f.fs)
	}
	f.heads = &fileHeads{fs: f.fs, dirs: &f.dirs}
	if f.lockFile, err = lockDir(f.inboxDir); err != nil {
		return nil, err
	}
	if err := f.load(context.Background()); err != nil {
		f.lockFile.Close()
		return nil, err
	}
	if err := f.loadRegistry(); err != nil {
		f.lockFile.Close()
		return nil, err
	}
	if err := f.loadStatuses(); err != nil {
		f.lockFile.Close()
		return nil, err
	}
	f.heads.removeTemps()
	if f.bodies, err = openFileBodies(f); err != nil {
		f.lockFile.Close()
		return nil, err
	}
	return f, nil
}

// close releases the inbox directory.
func (f *fileStore) close() error {
	if f.lockFile == nil {
		return nil
	}
	err := f.lockFile.Close()
	f.lockFile = nil
	return err
}

// fileName is <16 hex digits of seq>-<envelopeId>.env: listing order is
// sequence order.
func fileName(seq uint64, envelopeID string) string {
	return fmt.Sprintf("%016x-%s.env", seq, envelopeID)
}

func parseFileName(name string) (seq uint64, envelopeID string, ok bool) {
	if len(name) != 16+1+36+4 || name[16] != '-' || !strings.HasSuffix(name, ".env") {
		return 0, "", false
	}
	seq, err := strconv.ParseUint(name[:16], 16, 64)
	if err != nil {
		return 0, "", false
	}
	envelopeID = name[17 : 17+36]
	return seq, envelopeID, uuid.Valid(envelopeID)
}

// parseFileCursor parses a file-backend cursor (a decimal sequence number; ""
// is the start). A JetStream backend's cursor is taken as the start: the
// recipient's relay changed backend, and its inbox here is all new to it.
func parseFileCursor(s string) (uint64, error) {
	if _, ok, err := jsCursor(s); s == "" || ok || err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, newError(http.StatusBadRequest, relayproto.CodeBadRequest, "after is not a cursor")
	}
	return v, nil
}

// load scans the inbox directory and reconciles it with the receipt records.
func (f *fileStore) load(ctx context.Context) error {
	dirs, err := readDirSorted(f.fs, ".")
	if err != nil {
		return fmt.Errorf("relay: read inbox dir: %w", err)
	}
	var loaded, completed, removed int
	for _, d := range dirs {
		if d.Type != fs.ModeDir && fsx.IsTempName(d.Name) {
			_ = f.fs.Remove(d.Name) // a readiness probe (ops.go) a crash interrupted
			continue
		}
		if d.Type != fs.ModeDir || len(d.Name) != 64 {
			continue
		}
		rdir := d.Name
		files, err := readDirSorted(f.fs, rdir)
		if err != nil {
			return fmt.Errorf("relay: read inbox: %w", err)
		}
		for _, fi := range files {
			name := fi.Name
			if strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".tmp") {
				_ = f.fs.Remove(path.Join(rdir, name)) // an interrupted write, never acknowledged
				continue
			}
			seq, envID, ok := parseFileName(name)
			if !ok {
				f.log.Warn("relay: ignoring unexpected file in inbox", "dir", rdir, "file", name)
				continue
			}
			file := path.Join(rdir, name)
			data, info, err := fsx.ReadFile(f.fs, file, envelope.MaxSize)
			if err != nil {
				return fmt.Errorf("relay: read inbox: %w", err)
			}
			env, err := envelope.Parse(data)
			if err != nil || env.ID() != envID || recipientDir(env.Recipient()) != rdir {
				return fmt.Errorf("relay: inbox file %s is not the envelope its name says: %v", name, err)
			}
			rec, err := store.GetAs[*record.Receipt](f.st, record.ReceiptID(envID))
			if err != nil {
				return fmt.Errorf("relay: read receipt of %s: %w", envID, err)
			}
			if _, dup := f.byID[envID]; dup || (rec != nil && rec.EnvelopeDigest != env.Digest()) {
				// A second file for one id cannot be acknowledged twice; the
				// receipt record names the one that was.
				_ = f.fs.Remove(file)
				removed++
				continue
			}
			switch {
			case rec == nil:
				// Crash between the file and the record: the envelope was never
				// acknowledged, but it is durable and valid — complete the accept.
				// Its receipt was never answered; it names the head witnessed
				// now, which was durable before the accept began.
				_, seq, err := f.heads.read(env.Sender())
				if err != nil {
					return fmt.Errorf("relay: complete receipt of %s: %w", envID, err)
				}
				rec = receiptRecord(env, info.MtimeNs/int64(time.Millisecond), seq)
				if err := f.st.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.Put(rec) }); err != nil {
					return fmt.Errorf("relay: complete receipt of %s: %w", envID, err)
				}
				completed++
			case rec.State != record.ReceiptPersisted:
				_ = f.fs.Remove(file) // acknowledged; the removal was interrupted
				removed++
				continue
			}
			e := &entry{seq: seq, envelopeID: envID, digest: env.Digest(), receivedAt: rec.ReceivedAt,
				size: len(data), body: blobSize(env), deadline: env.DeliveryDeadlineMillis(), file: file, recipient: rdir,
				status: env.Kind() == envelope.KindDeliveryStatus}
			f.insert(e)
			f.lastSeq = max(f.lastSeq, seq)
			loaded++
		}
		if removed > 0 {
			_ = f.fs.SyncDir(rdir)
		}
	}
	f.log.Info("relay: inboxes loaded", "envelopes", loaded, "completed", completed, "removed", removed,
		"relayDid", string(f.id.DID()))
	return nil
}

// readDirSorted lists directory name of fsys in name order (so, for envelope files,
// in sequence order).
func readDirSorted(fsys fsx.FS, name string) ([]fsx.DirEntry, error) {
	ents, err := fsys.ReadDir(name)
	slices.SortFunc(ents, func(a, b fsx.DirEntry) int { return strings.Compare(a.Name, b.Name) })
	return ents, err
}

// insert adds e to its inbox in sequence order and wakes the fetches waiting
// for it once it is visible. f.mu must be held (or f not yet shared).
func (f *fileStore) insert(e *entry) {
	ib := f.inboxes[e.recipient]
	if ib == nil {
		ib = &inbox{dir: filepath.Join(f.inboxDir, e.recipient)}
		f.inboxes[e.recipient] = ib
	}
	i := firstAtLeast(ib.entries, e.seq)
	ib.entries = slices.Insert(ib.entries, i, e)
	ib.bytes += int64(e.size) + e.body
	f.byID[e.envelopeID] = e
	if e.seq < f.visibleBelow() {
		f.wake(e.recipient)
	} else {
		f.hidden[e.seq] = e.recipient
	}
}

// allocSeq returns a new sequence number, larger than every earlier one in
// this process and — as it follows the clock (milliseconds × 4096) — than the
// ones of earlier processes on the same directory, even after their inboxes
// emptied. It is marked in flight until done is called, which wakes the
// fetches waiting for the envelopes that become visible.
func (f *fileStore) allocSeq() (seq uint64, done func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seq = max(f.lastSeq+1, uint64(f.now().UnixMilli())<<12)
	f.lastSeq = seq
	f.inflight[seq] = struct{}{}
	return seq, func() {
		f.mu.Lock()
		delete(f.inflight, seq)
		below := f.visibleBelow()
		for s, rdir := range f.hidden {
			if s < below {
				delete(f.hidden, s)
				f.wake(rdir)
			}
		}
		f.mu.Unlock()
	}
}

// visibleBelow returns the smallest sequence still being written (or max):
// a page never shows an envelope past it, so a cursor can never jump over an
// envelope that becomes visible later. f.mu must be held.
func (f *fileStore) visibleBelow() uint64 {
	low := ^uint64(0)
	for s := range f.inflight {
		low = min(low, s)
	}
	return low
}

// firstAfter is the index of the first entry with a sequence number above after.
func firstAfter(entries []*entry, after uint64) int { return firstAtLeast(entries, after+1) }

// firstAtLeast is the index of the first entry with a sequence number of at least seq.
func firstAtLeast(entries []*entry, seq uint64) int {
	i, _ := slices.BinarySearchFunc(entries, seq, func(x *entry, s uint64) int {
		switch {
		case x.seq < s:
			return -1
		case x.seq > s:
			return 1
		}
		return 0
	})
	return i
}

func receiptRecord(env *envelope.Envelope, receivedAt, senderSeq int64) *record.Receipt {
	retain := env.DeliveryDeadlineMillis() + dedupeRetention.Milliseconds()
	retain = min(max(retain, receivedAt+dedupeRetention.Milliseconds()), envelope.MaxTime)
	return &record.Receipt{
		EnvelopeID: env.ID(), SenderDID: string(env.Sender()), EnvelopeDigest: env.Digest(),
		State: record.ReceiptPersisted, ReceivedAt: receivedAt, RetainUntil: retain, SenderSeq: senderSeq,
	}
}

func heldOf(rec *record.Receipt) *held {
	return &held{envelopeID: rec.EnvelopeID, digest: rec.EnvelopeDigest, receivedAt: rec.ReceivedAt,
		senderKey: recipientDir(identity.DID(rec.SenderDID)), senderSeq: rec.SenderSeq}
}

// errConflict is a receipt record for the id with another digest.
var errConflict = errors.New("relay: envelope id already used with another digest")

func (f *fileStore) lookup(_ context.Context, id string) (*held, error) {
	rec, err := store.GetAs[*record.Receipt](f.st, record.ReceiptID(id))
	if err != nil {
		return nil, storeError(err)
	}
	if rec == nil {
		return nil, nil
	}
	return heldOf(rec), nil
}

func (f *fileStore) put(ctx context.Context, items []*newEnvelope) error {
	if len(items) == 1 {
		return f.putOne(ctx, items[0])
	}
	return f.commitBatch(ctx, items)
}

// putOne writes one new envelope: envelope file durable → receipt record
// durable.
func (f *fileStore) putOne(ctx context.Context, it *newEnvelope) error {
	env, data := it.env, it.wire
	rid := record.ReceiptID(env.ID())
	seq, done := f.allocSeq()
	defer done()
	rdir := recipientDir(env.Recipient())
	name := fileName(seq, env.ID())
	if err := f.dirs.Ensure(f.fs, rdir); err != nil {
		return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its inbox", err)
	}
	// The name's sequence number is new, so nothing may be there: CreateFile
	// refuses to replace what is.
	if err := fsx.CreateFile(f.fs, rdir, name, data); err != nil {
		return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its inbox", err)
	}
	rec := receiptRecord(env, it.receivedAt.UnixMilli(), it.senderSeq)
	err := f.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
		cur, err := store.TxGet[*record.Receipt](tx, rid)
		if err != nil {
			return err
		}
		if cur != nil {
			return errConflict // another process wrote it; cannot happen under the directory lock
		}
		return tx.Put(rec)
	})
	e := &entry{seq: seq, envelopeID: env.ID(), digest: env.Digest(), receivedAt: rec.ReceivedAt,
		size: len(data), body: blobSize(env), deadline: env.DeliveryDeadlineMillis(), file: path.Join(rdir, name), recipient: rdir,
		status: env.Kind() == envelope.KindDeliveryStatus}
	if err != nil {
		// Keep the file only if the record made it to disk after all (a
		// failure after publication): it is then the envelope the record names.
		if cur, gerr := store.GetAs[*record.Receipt](f.st, rid); gerr == nil && cur != nil && cur.EnvelopeDigest == env.Digest() {
			f.mu.Lock()
			f.insert(e)
			f.mu.Unlock()
		} else {
			_ = fsx.RemoveFile(f.fs, rdir, name)
		}
		if errors.Is(err, errConflict) {
			it.outcome = putConflict
			return nil
		}
		return storeError(err)
	}
	f.mu.Lock()
	f.insert(e)
	f.mu.Unlock()
	it.held, it.outcome = *heldOf(rec), putNew
	return nil
}

func (f *fileStore) fetch(_ context.Context, recipient identity.DID, cursor string, limit int) (*relayproto.InboxPage, error) {
	after, err := parseFileCursor(cursor)
	if err != nil {
		return nil, err
	}
	nowMs := f.now().UnixMilli()
	f.mu.Lock()
	var pick []*entry
	more := false
	if ib := f.inboxes[recipientDir(recipient)]; ib != nil {
		below := f.visibleBelow()
		bytes := 0
		for i := firstAfter(ib.entries, after); i < len(ib.entries) && ib.entries[i].seq < below; i++ {
			e := ib.entries[i]
			if e.deadline <= nowMs {
				continue // expired: never served, removed by Expire
			}
			if len(pick) == limit || (len(pick) > 0 && bytes+e.size > maxPageBytes) {
				more = true
				break
			}
			pick = append(pick, e)
			bytes += e.size
		}
	}
	f.mu.Unlock()
	page := &relayproto.InboxPage{Envelopes: []relayproto.InboxEnvelope{}, Cursor: strconv.FormatUint(after, 10), More: more}
	for _, e := range pick {
		page.Cursor = strconv.FormatUint(e.seq, 10)
		data, _, err := fsx.ReadFile(f.fs, e.file, envelope.MaxSize)
		if errors.Is(err, os.ErrNotExist) {
			continue // acknowledged meanwhile
		}
		if err != nil {
			return nil, unavailable(relayproto.CodeInboxUnreadable, "the relay cannot read its inbox", err)
		}
		page.Envelopes = append(page.Envelopes, relayproto.InboxEnvelope{
			Cursor: page.Cursor, EnvelopeID: e.envelopeID, EnvelopeDigest: e.digest,
			ReceivedAt: e.receivedAt, Envelope: data,
		})
	}
	return page, nil
}

func (f *fileStore) ack(ctx context.Context, recipient identity.DID, ids []string) (int, error) {
	rdir := recipientDir(recipient)
	f.mu.Lock()
	var gone []*entry
	if ib := f.inboxes[rdir]; ib != nil {
		for _, id := range ids {
			e := f.byID[id]
			if e == nil || e.recipient != rdir {
				continue
			}
			delete(f.byID, id) // an id listed twice is removed once
			gone = append(gone, e)
		}
		f.unlinkLocked(rdir, ib, gone)
	}
	f.mu.Unlock()
	if len(gone) == 0 {
		return 0, nil
	}
	if err := f.retainStatuses(rdir, gone); err != nil {
		return 0, err
	}
	if err := f.removeEntries(ctx, rdir, gone, "ACKNOWLEDGED"); err != nil {
		return 0, err
	}
	return len(gone), nil
}

// removeEntries removes the files of gone, entries of inbox rdir already taken
// out of it, fsyncs the inbox directory, then raises their receipt records to
// terminal with outcome code: an Ack's or Expire's durable removal.
func (f *fileStore) removeEntries(ctx context.Context, rdir string, gone []*entry, outcome string) error {
	var firstErr error
	for _, e := range gone {
		if err := f.fs.Remove(e.file); err != nil && !errors.Is(err, os.ErrNotExist) && firstErr == nil {
			firstErr = err
		}
	}
	if err := f.fs.SyncDir(rdir); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its inbox", firstErr)
	}
	// Then their bodies: an envelope file is never there without its body,
	// and a body left by a crash here is removed at the next start.
	for _, e := range gone {
		if e.body > 0 {
			if err := f.bodies.discard(ctx, e.envelopeID); err != nil {
				f.log.Warn("relay: body of a removed envelope not removed", "envelopeId", e.envelopeID, "err", err)
			}
		}
	}
	// The files are gone: the records must follow even if the caller has gone
	// away meanwhile (a client that disconnects, a server shutting down), so
	// the update is not cancelled with the request, only bounded. The records
	// only say what happened; a failure here (or a crash before it) leaves them
	// "persisted" without a file, which neither de-duplication nor load minds.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackRecordTimeout)
	defer cancel()
	err := f.st.PreparedTransaction(uctx, func(tx *store.Tx) error {
		for _, e := range gone {
			rec, err := store.TxGet[*record.Receipt](tx, record.ReceiptID(e.envelopeID))
			if err != nil || rec == nil || rec.State != record.ReceiptPersisted {
				continue
			}
			rec.State = record.ReceiptTerminal
			rec.OutcomeCode = outcome
			if err := tx.Put(rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		f.log.Warn("relay: envelopes removed, receipt records not updated", "outcome", outcome, "count", len(gone), "err", err)
	}
	return nil
}

// ackRecordTimeout bounds the receipt-record update of an Ack, which runs to the
// end even when the request is cancelled.
const ackRecordTimeout = 10 * time.Second

func (f *fileStore) fetchable(_ context.Context, recipient identity.DID, id string) (int64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.byID[id]
	if e == nil || e.recipient != recipientDir(recipient) || e.seq >= f.visibleBelow() || e.deadline <= f.now().UnixMilli() {
		return 0, false, nil
	}
	return e.body, true, nil
}

func (f *fileStore) status(_ context.Context, recipient identity.DID) (relayproto.InboxStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var st relayproto.InboxStatus
	ib := f.inboxes[recipientDir(recipient)]
	if ib == nil {
		return st, nil
	}
	below, now := f.visibleBelow(), f.now().UnixMilli()
	for _, e := range ib.entries {
		if e.seq >= below {
			break
		}
		if e.deadline <= now {
			continue // never served again; the expiry pass removes it
		}
		st.Count++
		st.Bytes += int64(e.size) + e.body
		if st.OldestReceivedAt == 0 || e.receivedAt < st.OldestReceivedAt {
			st.OldestReceivedAt = e.receivedAt
		}
		st.NewestReceivedAt = max(st.NewestReceivedAt, e.receivedAt)
	}
	return st, nil
}

func (f *fileStore) usage(_ context.Context, recipient identity.DID) (usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var u usage
	if ib := f.inboxes[recipientDir(recipient)]; ib != nil {
		now := f.now().UnixMilli()
		for _, e := range ib.entries {
			if e.deadline > now { // an expired envelope takes no room: it is never served again
				u.n++
				u.bytes += int64(e.size) + e.body
			}
		}
	}
	return u, nil
}

// loadRegistry reads the allow-list (registryDir) into f.allowed.
func (f *fileStore) loadRegistry() error {
	ents, err := f.fs.ReadDir(registryDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("relay: read the registered recipients: %w", err)
	}
	for _, d := range ents {
		if d.Type.IsRegular() && len(d.Name) == 64 {
			f.allowed[d.Name] = true
		}
	}
	return nil
}

func (f *fileStore) registered(_ context.Context, did identity.DID) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.allowed[recipientDir(did)], nil
}

// register adds did to the allow-list, durably (fsx.CreateFile), before it
// answers. Registering again changes nothing.
func (f *fileStore) register(_ context.Context, did identity.DID) error {
	rdir := recipientDir(did)
	f.regMu.Lock()
	defer f.regMu.Unlock()
	if err := f.dirs.Ensure(f.fs, registryDir); err != nil {
		return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its list of recipients", err)
	}
	if err := fsx.CreateFile(f.fs, registryDir, rdir, []byte(string(did)+"\n")); err != nil && !os.IsExist(err) {
		return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its list of recipients", err)
	}
	f.mu.Lock()
	f.allowed[rdir] = true
	f.mu.Unlock()
	return nil
}

// unregister removes did from the allow-list, durably (fsx.RemoveFile).
// Envelopes waiting for it stay to be fetched.
func (f *fileStore) unregister(_ context.Context, did identity.DID) error {
	rdir := recipientDir(did)
	f.regMu.Lock()
	defer f.regMu.Unlock()
	f.mu.Lock()
	delete(f.allowed, rdir) // refuse from now on, even if the removal fails
	f.mu.Unlock()
	if err := fsx.RemoveFile(f.fs, registryDir, rdir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its list of recipients", err)
	}
	return nil
}

// expire removes the inbox envelopes whose delivery deadline has passed —
// files removed and each inbox directory fsynced, then their receipt records
// raised to terminal with outcome EXPIRED (Ack's order) — in chunks of at most
// expireChunk envelopes of one inbox, so no lock is held across the file
// system and no transaction grows without bound.
func (f *fileStore) expire(ctx context.Context, now time.Time) (int, error) {
	total := 0
	for ctx.Err() == nil {
		rdir, gone := f.takeExpired(now.UnixMilli())
		if len(gone) == 0 {
			break
		}
		if err := f.removeEntries(ctx, rdir, gone, "EXPIRED"); err != nil {
			return total, err
		}
		total += len(gone)
	}
	if _, err := f.expireStatuses(now.UnixMilli()); err != nil {
		return total, err
	}
	// Then the relay's store: receipt records past their retainUntil (the
	// deadline + 24 h, after which an envelope sent again is refused as expired
	// anyway) and old temps, in bounded chunks (DESIGN §10).
	rep, err := f.st.Maintain(ctx)
	if err != nil {
		return total, err
	}
	if len(rep.Errors) > 0 {
		return total, fmt.Errorf("relay: store maintenance: %w", errors.Join(rep.Errors...))
	}
	return total, nil
}

// takeExpired takes up to expireChunk expired entries of one inbox out of it.
func (f *fileStore) takeExpired(nowMs int64) (string, []*entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for rdir, ib := range f.inboxes {
		var gone []*entry
		for _, e := range ib.entries {
			if e.deadline <= nowMs {
				gone = append(gone, e)
				if len(gone) == expireChunk {
					break
				}
			}
		}
		if len(gone) == 0 {
			continue
		}
		f.unlinkLocked(rdir, ib, gone)
		return rdir, gone
	}
	return "", nil
}

// unlinkLocked takes gone out of ib (and of byID). f.mu must be held.
func (f *fileStore) unlinkLocked(rdir string, ib *inbox, gone []*entry) {
	for _, e := range gone {
		delete(f.byID, e.envelopeID)
		ib.bytes -= int64(e.size) + e.body
	}
	if len(gone) > 0 {
		ib.entries = slices.DeleteFunc(ib.entries, func(e *entry) bool { return f.byID[e.envelopeID] != e })
	}
	if len(ib.entries) == 0 {
		delete(f.inboxes, rdir)
	}
}

// stageWorkers bounds the inbox files of one batch written (and fsynced) at once.
const stageWorkers = 8

// fileBatchItem is a new envelope of a batch in commitBatch: its record,
// inbox directory, file name, sequence number and staged file.
type fileBatchItem struct {
	*newEnvelope
	rec    *record.Receipt
	rdir   string
	name   string
	seq    uint64
	staged *fsx.Staged
}

// commitBatch writes the new envelopes of a batch: their inbox files are
// staged (in parallel, each fsynced), published, and each recipient directory
// fsynced once, then their receipt records are written in one prepared
// transaction — one group commit for the batch instead of one per envelope.
// The order of the inbox files (their sequence numbers) is the batch's order.
func (f *fileStore) commitBatch(ctx context.Context, items []*newEnvelope) error {
	fresh := make([]*fileBatchItem, len(items))
	var dones []func()
	defer func() {
		for _, d := range dones {
			d()
		}
	}()
	dirs := map[string]bool{}
	for i, ne := range items {
		it := &fileBatchItem{newEnvelope: ne}
		fresh[i] = it
		var done func()
		it.seq, done = f.allocSeq()
		dones = append(dones, done)
		it.rdir = recipientDir(it.env.Recipient())
		it.name = fileName(it.seq, it.env.ID())
		it.rec = receiptRecord(it.env, it.receivedAt.UnixMilli(), it.senderSeq)
		if !dirs[it.rdir] {
			if err := f.dirs.Ensure(f.fs, it.rdir); err != nil {
				return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its inbox", err)
			}
			dirs[it.rdir] = true
		}
	}
	// Stage every file (write and fsync each) with a bounded pool.
	var mu sync.Mutex
	var stageErr error
	work := make(chan *fileBatchItem)
	var wg sync.WaitGroup
	for range min(stageWorkers, len(fresh)) {
		wg.Go(func() {
			for it := range work {
				s, err := fsx.Stage(f.fs, it.rdir, it.wire)
				mu.Lock()
				if err != nil && stageErr == nil {
					stageErr = err
				}
				it.staged = s
				mu.Unlock()
			}
		})
	}
	for _, it := range fresh {
		work <- it
	}
	close(work)
	wg.Wait()
	cleanup := func() {
		for _, it := range fresh {
			if it.staged == nil {
				continue
			}
			if it.staged.Published() {
				_ = f.fs.Remove(path.Join(it.rdir, it.name))
			} else {
				_ = it.staged.Cleanup()
			}
		}
		for d := range dirs {
			_ = f.fs.SyncDir(d)
		}
	}
	if stageErr != nil {
		cleanup()
		return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its inbox", stageErr)
	}
	// Publish in sequence order; each name's sequence number is new, so
	// nothing may be there (PublishNoReplace refuses to replace what is).
	for _, it := range fresh {
		if err := it.staged.PublishNoReplace(it.name); err != nil {
			cleanup()
			return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its inbox", err)
		}
	}
	for d := range dirs {
		if err := f.fs.SyncDir(d); err != nil {
			cleanup()
			return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its inbox", err)
		}
	}
	err := f.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
		for _, it := range fresh {
			cur, err := store.TxGet[*record.Receipt](tx, it.rec.RecordID())
			if err != nil {
				return err
			}
			if cur != nil {
				return errConflict // another process wrote it; cannot happen under the directory lock
			}
			if err := tx.Put(it.rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		// Keep a file only if its record made it to disk after all (a failure
		// after publication): it is then the envelope the record names.
		removed := false
		for _, it := range fresh {
			if cur, gerr := store.GetAs[*record.Receipt](f.st, it.rec.RecordID()); gerr == nil && cur != nil && cur.EnvelopeDigest == it.env.Digest() {
				f.mu.Lock()
				f.insert(it.entry())
				f.mu.Unlock()
				continue
			}
			_ = f.fs.Remove(path.Join(it.rdir, it.name))
			removed = true
		}
		if removed {
			for d := range dirs {
				_ = f.fs.SyncDir(d)
			}
		}
		if errors.Is(err, errConflict) {
			return internalError(err)
		}
		return storeError(err)
	}
	f.mu.Lock()
	for _, it := range fresh {
		f.insert(it.entry())
		it.held, it.outcome = *heldOf(it.rec), putNew
	}
	f.mu.Unlock()
	return nil
}

func (it *fileBatchItem) entry() *entry {
	return &entry{seq: it.seq, envelopeID: it.env.ID(), digest: it.env.Digest(), receivedAt: it.rec.ReceivedAt,
		size: len(it.wire), body: blobSize(it.env), deadline: it.env.DeliveryDeadlineMillis(), file: path.Join(it.rdir, it.name), recipient: it.rdir,
		status: it.env.Kind() == envelope.KindDeliveryStatus}
}
