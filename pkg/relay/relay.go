// Package relay is sealbridge's reference relay (DESIGN §12): an HTTP/1.1 +
// JSON service that accepts signed wire envelopes from carriers, answers each
// with its own signed receipt, de-duplicates them durably by envelopeId and
// digest, and holds them in per-recipient inboxes that the recipient fetches
// and acknowledges with requests signed by its key. docs/RELAY.md is the
// protocol; pkg/relayproto defines it for the relay and its clients alike.
//
// Persistence: the relay has an identity of its own and keeps its
// de-duplication records in a store of that identity (pkg/store, kind
// receipts, id record.ReceiptID(envelopeId)). The envelope bytes waiting in
// inboxes live in a relay-private directory next to the store, one file per
// envelope, written durably through internal/fsx (O_EXCL temp, fsync, a rename
// that never replaces, directory fsync) before the receipt record, and read
// without following a symlink or blocking on a FIFO; an envelope is acknowledged
// (200) only after both
// are durable. The signed receipt is not stored as bytes: Ed25519 signatures
// are deterministic, so signing the stored fields (envelopeId, digest,
// receivedAt) again with the same key reproduces the first receipt byte for
// byte.
package relay

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
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

// DefaultListen is the address both relay commands (sealbridge relay and
// sealbridge-relay) listen on unless --listen says otherwise.
const DefaultListen = "127.0.0.1:8470"

// Limits of this relay (the protocol's own are relayproto's).
const (
	// maxPageBytes bounds the envelope bytes of one inbox page (at least one
	// envelope is always returned when one is due).
	maxPageBytes = 4 << 20
	// dedupeRetention is how long after an envelope's delivery deadline its
	// receipt record (and so its de-duplication) is kept.
	dedupeRetention = 24 * time.Hour
	// maxNonces bounds the replay cache; past it inbox requests get 503.
	maxNonces = 1 << 20
)

// Options configure a Relay. Identity and Home are required.
type Options struct {
	// Identity is the relay's own identity: it signs receipts and owns the store.
	Identity *identity.Identity
	// Home is the data root: the store is <Home>/delivery/<hex sha256(DID)>
	// (store.Options.Home) and the inboxes <Home>/relay/<hex sha256(DID)>.
	Home string
	// Now is the clock (default time.Now). Only tests set it, to step a fake
	// clock across the signed-request window, dedupe retention, deadlines and
	// the sender rate.
	Now func() time.Time
	// Limits bound what the relay accepts and keeps (the zero value: nothing).
	Limits Limits
	// Logger receives one line per request outcome (default slog.Default()).
	// It never sees payloads or keys.
	Logger *slog.Logger
	// OnAccept, if set, is called after an envelope is durable and before the
	// receipt is written to the client — for a new envelope (duplicate false)
	// and for a de-duplicated one (duplicate true). Tests use it to observe
	// acceptance or to kill a sender between send and settle.
	OnAccept func(envelopeID, digest string, duplicate bool)
	// WrapFS, if set, wraps the file systems of both the store
	// (store.Options.WrapFS) and the inbox directory: fault injection and crash
	// exploration in tests.
	WrapFS func(fsx.FS) fsx.FS
	// MaxInboxWaiters bounds the inbox fetches held at once (GET /v1/inbox
	// with wait=); past it a waiting fetch gets 503 RELAY_BUSY. Default
	// DefaultMaxInboxWaiters.
	MaxInboxWaiters int
}

// Stats counts what a Relay did since it started.
type Stats struct {
	Accepted   int64 // new envelopes stored
	Duplicates int64 // the same envelope again, answered with the stored receipt
	Conflicts  int64 // same envelopeId, other digest (409)
	Refused    int64 // other 4xx answers to POST /v1/envelopes
	Acked      int64 // envelopes removed from inboxes by acknowledgements
	// Limits (Options.Limits): refusals and removals.
	OverQuota   int64 // 429 RELAY_QUOTA
	RateLimited int64 // 429 RELAY_RATE_LIMITED
	NotAllowed  int64 // 403 RECIPIENT_NOT_ALLOWED
	Expired     int64 // envelopes removed from inboxes past their deadline
}

// Relay is the reference relay. Its Handler is safe for concurrent use; one
// Relay (one process) owns its inbox directory at a time.
type Relay struct {
	id       *identity.Identity
	st       *store.Store
	inboxDir string
	fs       fsx.FS // rooted at inboxDir; every inbox file call goes through it
	lockFile *os.File
	now      func() time.Time
	log      *slog.Logger
	onAccept func(string, string, bool)
	started  time.Time

	stripes [64]sync.Mutex // serialize accepts of one envelopeId

	mu       sync.Mutex
	inboxes  map[string]*inbox   // recipient dir name → inbox
	byID     map[string]*entry   // envelopeId → entry in an inbox
	inflight map[uint64]struct{} // sequence numbers being written
	lastSeq  uint64
	stats    Stats
	reserved map[string]usage // recipient dir name → quota held by accepts in flight
	allowed  map[string]bool  // recipient dir names registered (the allow-list)

	limits    Limits
	rate      *senderRate
	regMu     sync.Mutex // serializes registrations
	stopMaint chan struct{}
	maintDone chan struct{}
	waits     waitState // held fetches (wait.go)

	nonces nonceCache
}

// inbox is one recipient's waiting envelopes, in sequence order.
type inbox struct {
	dir     string
	entries []*entry
	bytes   int64 // the sum of the entries' sizes
}

// entry is one waiting envelope.
type entry struct {
	seq        uint64
	envelopeID string
	digest     string
	receivedAt int64
	size       int
	deadline   int64  // delivery deadline, Unix ms: never served at or after it
	file       string // name of the envelope file in r.fs: "<recipient dir>/<file name>"
	recipient  string // recipient dir name
}

// New opens (creating on first use) the relay's store and inbox directory —
// refusing a data root, store or inbox directory that breaks the data-root rules
// (internal/dataroot) —, locks the inbox directory, and loads the inboxes, completing what a crash
// interrupted: an envelope file without its receipt record gets the record; a
// file whose envelope was acknowledged is removed.
func New(opts Options) (*Relay, error) {
	if opts.Identity == nil {
		return nil, errors.New("relay: Options.Identity is required")
	}
	if opts.Home == "" {
		return nil, errors.New("relay: Options.Home is required")
	}
	if err := opts.Limits.Check(); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	r := &Relay{
		id: opts.Identity, now: opts.Now, log: opts.Logger, onAccept: opts.OnAccept,
		inboxes: map[string]*inbox{}, byID: map[string]*entry{}, inflight: map[uint64]struct{}{},
		reserved: map[string]usage{}, allowed: map[string]bool{},
		limits: opts.Limits, rate: newSenderRate(opts.Limits),
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.started = r.now()
	r.waits.max = cmp.Or(opts.MaxInboxWaiters, DefaultMaxInboxWaiters)
	r.nonces.entries = map[string]int64{}
	sopts := store.Options{Home: opts.Home, WrapFS: opts.WrapFS}
	var err error
	if r.st, err = store.Open(r.id.Signer(), sopts); err != nil {
		return nil, fmt.Errorf("relay: open store: %w", err)
	}
	sum := sha256.Sum256([]byte(r.id.DID()))
	r.inboxDir = filepath.Join(opts.Home, dataroot.RelayDir, hex.EncodeToString(sum[:]))
	if r.inboxDir, err = filepath.Abs(r.inboxDir); err != nil {
		return nil, fmt.Errorf("relay: inbox dir: %w", err)
	}
	if err := dataroot.CheckDir(r.inboxDir, "the relay's inbox directory"); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if err := ensureInboxDir(r.inboxDir); err != nil {
		return nil, fmt.Errorf("relay: create inbox dir: %w", err)
	}
	r.fs = fsx.NewOS(r.inboxDir)
	if opts.WrapFS != nil {
		r.fs = opts.WrapFS(r.fs)
	}
	if r.lockFile, err = lockDir(r.inboxDir); err != nil {
		return nil, err
	}
	if err := r.load(context.Background()); err != nil {
		r.lockFile.Close()
		return nil, err
	}
	if err := r.loadRegistry(); err != nil {
		r.lockFile.Close()
		return nil, err
	}
	if opts.Limits.ExpireEvery > 0 {
		r.stopMaint, r.maintDone = make(chan struct{}), make(chan struct{})
		go r.maintain(opts.Limits.ExpireEvery, r.stopMaint, r.maintDone)
	}
	return r, nil
}

// Stats returns the counters.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Close stops the maintenance pass and releases the inbox directory. Stop
// serving the Handler first.
func (r *Relay) Close() error {
	if r.stopMaint != nil {
		close(r.stopMaint)
		<-r.maintDone
		r.stopMaint = nil
	}
	if r.lockFile == nil {
		return nil
	}
	err := r.lockFile.Close()
	r.lockFile = nil
	return err
}

// recipientDir names a recipient's inbox directory: hex SHA-256 of the DID, so
// no sender-chosen string becomes a path.
func recipientDir(did identity.DID) string {
	sum := sha256.Sum256([]byte(did))
	return hex.EncodeToString(sum[:])
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

// load scans the inbox directory and reconciles it with the receipt records.
func (r *Relay) load(ctx context.Context) error {
	dirs, err := readDirSorted(r.fs, ".")
	if err != nil {
		return fmt.Errorf("relay: read inbox dir: %w", err)
	}
	var loaded, completed, removed int
	for _, d := range dirs {
		if d.Type != fs.ModeDir || len(d.Name) != 64 {
			continue
		}
		rdir := d.Name
		files, err := readDirSorted(r.fs, rdir)
		if err != nil {
			return fmt.Errorf("relay: read inbox: %w", err)
		}
		for _, f := range files {
			name := f.Name
			if strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".tmp") {
				_ = r.fs.Remove(path.Join(rdir, name)) // an interrupted write, never acknowledged
				continue
			}
			seq, envID, ok := parseFileName(name)
			if !ok {
				r.log.Warn("relay: ignoring unexpected file in inbox", "dir", rdir, "file", name)
				continue
			}
			file := path.Join(rdir, name)
			data, info, err := fsx.ReadFile(r.fs, file, envelope.MaxSize)
			if err != nil {
				return fmt.Errorf("relay: read inbox: %w", err)
			}
			env, err := envelope.Parse(data)
			if err != nil || env.ID() != envID || recipientDir(env.Recipient()) != rdir {
				return fmt.Errorf("relay: inbox file %s is not the envelope its name says: %v", name, err)
			}
			rec, err := store.GetAs[*record.Receipt](r.st, record.ReceiptID(envID))
			if err != nil {
				return fmt.Errorf("relay: read receipt of %s: %w", envID, err)
			}
			if _, dup := r.byID[envID]; dup || (rec != nil && rec.EnvelopeDigest != env.Digest()) {
				// A second file for one id cannot be acknowledged twice; the
				// receipt record names the one that was.
				_ = r.fs.Remove(file)
				removed++
				continue
			}
			switch {
			case rec == nil:
				// Crash between the file and the record: the envelope was never
				// acknowledged, but it is durable and valid — complete the accept.
				rec = r.receiptRecord(env, info.MtimeNs/int64(time.Millisecond))
				if err := r.st.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.Put(rec) }); err != nil {
					return fmt.Errorf("relay: complete receipt of %s: %w", envID, err)
				}
				completed++
			case rec.State != record.ReceiptPersisted:
				_ = r.fs.Remove(file) // acknowledged; the removal was interrupted
				removed++
				continue
			}
			e := &entry{seq: seq, envelopeID: envID, digest: env.Digest(), receivedAt: rec.ReceivedAt,
				size: len(data), deadline: env.DeliveryDeadlineMillis(), file: file, recipient: rdir}
			r.insert(e)
			r.lastSeq = max(r.lastSeq, seq)
			loaded++
		}
		if removed > 0 {
			_ = r.fs.SyncDir(rdir)
		}
	}
	r.log.Info("relay: inboxes loaded", "envelopes", loaded, "completed", completed, "removed", removed,
		"relayDid", string(r.id.DID()))
	return nil
}

// readDirSorted lists directory name of fsys in name order (so, for envelope files,
// in sequence order).
func readDirSorted(fsys fsx.FS, name string) ([]fsx.DirEntry, error) {
	ents, err := fsys.ReadDir(name)
	slices.SortFunc(ents, func(a, b fsx.DirEntry) int { return strings.Compare(a.Name, b.Name) })
	return ents, err
}

// insert adds e to its inbox in sequence order. r.mu must be held (or r not
// yet shared).
func (r *Relay) insert(e *entry) {
	ib := r.inboxes[e.recipient]
	if ib == nil {
		ib = &inbox{dir: filepath.Join(r.inboxDir, e.recipient)}
		r.inboxes[e.recipient] = ib
	}
	i, _ := slices.BinarySearchFunc(ib.entries, e.seq, func(x *entry, s uint64) int {
		switch {
		case x.seq < s:
			return -1
		case x.seq > s:
			return 1
		}
		return 0
	})
	ib.entries = slices.Insert(ib.entries, i, e)
	ib.bytes += int64(e.size)
	r.byID[e.envelopeID] = e
	if e.seq < r.visibleBelow() {
		r.wakeLocked(e.recipient)
	}
}

// allocSeq returns a new sequence number, larger than every earlier one in
// this process and — as it follows the clock (milliseconds × 4096) — than the
// ones of earlier processes on the same directory, even after their inboxes
// emptied. It is marked in flight until done is called, which wakes the
// fetches waiting for the envelopes that become visible.
func (r *Relay) allocSeq() (seq uint64, done func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seq = max(r.lastSeq+1, uint64(r.now().UnixMilli())<<12)
	r.lastSeq = seq
	r.inflight[seq] = struct{}{}
	return seq, func() {
		r.mu.Lock()
		below := r.visibleBelow()
		delete(r.inflight, seq)
		r.publishedLocked(below, r.visibleBelow())
		r.mu.Unlock()
	}
}

// visibleBelow returns the smallest sequence still being written (or max):
// a page never shows an envelope past it, so a cursor can never jump over an
// envelope that becomes visible later. r.mu must be held.
func (r *Relay) visibleBelow() uint64 {
	low := ^uint64(0)
	for s := range r.inflight {
		low = min(low, s)
	}
	return low
}

func (r *Relay) receiptRecord(env *envelope.Envelope, receivedAt int64) *record.Receipt {
	retain := env.DeliveryDeadlineMillis() + dedupeRetention.Milliseconds()
	retain = min(max(retain, receivedAt+dedupeRetention.Milliseconds()), envelope.MaxTime)
	return &record.Receipt{
		EnvelopeID: env.ID(), SenderDID: string(env.Sender()), EnvelopeDigest: env.Digest(),
		State: record.ReceiptPersisted, ReceivedAt: receivedAt, RetainUntil: retain,
	}
}

// signReceipt signs the relay receipt of a stored receipt record. Ed25519 is
// deterministic, so the bytes are the same every time.
func (r *Relay) signReceipt(rec *record.Receipt) ([]byte, error) {
	return envelope.SignRelayReceipt(r.id, envelope.RelayReceipt{
		EnvelopeID: rec.EnvelopeID, EnvelopeDigest: rec.EnvelopeDigest, State: envelope.ReceiptStatePersisted,
		RelayDID: r.id.DID(), ReceivedAt: time.UnixMilli(rec.ReceivedAt),
	})
}

func (r *Relay) count(f func(s *Stats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// errConflict is a receipt record for the id with another digest.
var errConflict = errors.New("relay: envelope id already used with another digest")

// Accept verifies and stores one wire envelope and returns the relay's
// receipt: the same bytes for the same envelope again. Its errors are
// *relayproto.Error values with an HTTP status and a code.
// Exported for the package's external tests, which call it without an HTTP server.
func (r *Relay) Accept(ctx context.Context, data []byte) ([]byte, error) {
	env, err := envelope.Parse(data)
	if err != nil {
		return nil, envelopeError(err)
	}
	mu := &r.stripes[stripe(env.ID())]
	mu.Lock()
	defer mu.Unlock()

	rid := record.ReceiptID(env.ID())
	rec, err := store.GetAs[*record.Receipt](r.st, rid)
	if err != nil {
		return nil, storeError(err)
	}
	if rec != nil {
		return r.existing(env, rec)
	}
	now := r.now()
	if err := env.CheckDeadline(now); err != nil {
		return nil, envelopeError(err)
	}
	res, lerr := r.admit(env, len(data))
	if lerr != nil {
		return nil, lerr
	}
	defer r.release(res)

	seq, done := r.allocSeq()
	defer done()
	rdir := recipientDir(env.Recipient())
	name := fileName(seq, env.ID())
	if _, err := fsx.MkdirPrivate(r.fs, rdir); err != nil {
		return nil, unavailable("INBOX_UNWRITABLE", "the relay cannot write its inbox", err)
	}
	// The name's sequence number is new, so nothing may be there: CreateFile
	// refuses to replace what is.
	if err := fsx.CreateFile(r.fs, rdir, name, data); err != nil {
		return nil, unavailable("INBOX_UNWRITABLE", "the relay cannot write its inbox", err)
	}
	rec = r.receiptRecord(env, now.UnixMilli())
	err = r.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
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
		size: len(data), deadline: env.DeliveryDeadlineMillis(), file: path.Join(rdir, name), recipient: rdir}
	if err != nil {
		// Keep the file only if the record made it to disk after all (a
		// failure after publication): it is then the envelope the record names.
		if cur, gerr := store.GetAs[*record.Receipt](r.st, rid); gerr == nil && cur != nil && cur.EnvelopeDigest == env.Digest() {
			r.mu.Lock()
			r.insert(e)
			r.settleLocked(res)
			r.mu.Unlock()
		} else {
			_ = fsx.RemoveFile(r.fs, rdir, name)
		}
		if errors.Is(err, errConflict) {
			return nil, conflictError(env)
		}
		return nil, storeError(err)
	}
	r.mu.Lock()
	r.insert(e)
	r.settleLocked(res)
	r.stats.Accepted++
	r.mu.Unlock()
	receipt, err := r.signReceipt(rec)
	if err != nil {
		return nil, internalError(err)
	}
	r.log.Info("relay: envelope accepted", "envelopeId", env.ID(), "digest", env.Digest()[:16],
		"sender", string(env.Sender()), "recipient", string(env.Recipient()), "size", len(data))
	if r.onAccept != nil {
		r.onAccept(env.ID(), env.Digest(), false)
	}
	return receipt, nil
}

// existing answers an envelope whose id has a receipt record.
func (r *Relay) existing(env *envelope.Envelope, rec *record.Receipt) ([]byte, error) {
	if rec.EnvelopeDigest != env.Digest() {
		r.count(func(s *Stats) { s.Conflicts++ })
		r.log.Warn("relay: envelope id conflict", "envelopeId", env.ID(), "digest", env.Digest()[:16],
			"storedDigest", rec.EnvelopeDigest[:16], "sender", string(env.Sender()))
		return nil, conflictError(env)
	}
	receipt, err := r.signReceipt(rec)
	if err != nil {
		return nil, internalError(err)
	}
	r.count(func(s *Stats) { s.Duplicates++ })
	r.log.Info("relay: duplicate envelope", "envelopeId", env.ID(), "digest", env.Digest()[:16])
	if r.onAccept != nil {
		r.onAccept(env.ID(), env.Digest(), true)
	}
	return receipt, nil
}

func stripe(id string) int {
	var h uint32 = 2166136261
	for i := 0; i < len(id); i++ {
		h = (h ^ uint32(id[i])) * 16777619
	}
	return int(h % 64)
}

// Fetch returns recipient's envelopes after cursor after (0: from the start),
// at most limit and maxPageBytes of them.
// Exported for the FIFO test, which checks the error chain HTTP would flatten.
func (r *Relay) Fetch(recipient identity.DID, after uint64, limit int) (*relayproto.InboxPage, error) {
	if limit <= 0 {
		limit = relayproto.DefaultFetchLimit
	}
	limit = min(limit, relayproto.MaxFetchLimit)
	nowMs := r.now().UnixMilli()
	r.mu.Lock()
	var pick []*entry
	more := false
	if ib := r.inboxes[recipientDir(recipient)]; ib != nil {
		below := r.visibleBelow()
		i, _ := slices.BinarySearchFunc(ib.entries, after+1, func(x *entry, s uint64) int {
			switch {
			case x.seq < s:
				return -1
			case x.seq > s:
				return 1
			}
			return 0
		})
		bytes := 0
		for ; i < len(ib.entries) && ib.entries[i].seq < below; i++ {
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
	r.mu.Unlock()
	page := &relayproto.InboxPage{Envelopes: []relayproto.InboxEnvelope{}, Cursor: strconv.FormatUint(after, 10), More: more}
	for _, e := range pick {
		page.Cursor = strconv.FormatUint(e.seq, 10)
		data, _, err := fsx.ReadFile(r.fs, e.file, envelope.MaxSize)
		if errors.Is(err, os.ErrNotExist) {
			continue // acknowledged meanwhile
		}
		if err != nil {
			return nil, unavailable("INBOX_UNREADABLE", "the relay cannot read its inbox", err)
		}
		page.Envelopes = append(page.Envelopes, relayproto.InboxEnvelope{
			Cursor: page.Cursor, EnvelopeID: e.envelopeID, EnvelopeDigest: e.digest,
			ReceivedAt: e.receivedAt, Envelope: data,
		})
	}
	return page, nil
}

// Ack removes the listed envelopes from recipient's inbox (ids not waiting
// there are ignored) and raises their receipt records to terminal. It returns
// how many it removed.
// Exported for the test that passes an already cancelled context, which HTTP cannot.
func (r *Relay) Ack(ctx context.Context, recipient identity.DID, ids []string) (int, error) {
	rdir := recipientDir(recipient)
	r.mu.Lock()
	var gone []*entry
	if ib := r.inboxes[rdir]; ib != nil {
		for _, id := range ids {
			e := r.byID[id]
			if e == nil || e.recipient != rdir {
				continue
			}
			delete(r.byID, id) // an id listed twice is removed once
			gone = append(gone, e)
		}
		r.unlinkLocked(rdir, ib, gone)
	}
	r.stats.Acked += int64(len(gone))
	r.mu.Unlock()
	if len(gone) == 0 {
		return 0, nil
	}
	if err := r.removeEntries(ctx, rdir, gone, "ACKNOWLEDGED"); err != nil {
		return 0, err
	}
	return len(gone), nil
}

// removeEntries removes the files of gone, entries of inbox rdir already taken
// out of it, fsyncs the inbox directory, then raises their receipt records to
// terminal with outcome code: an Ack's or Expire's durable removal.
func (r *Relay) removeEntries(ctx context.Context, rdir string, gone []*entry, outcome string) error {
	var firstErr error
	for _, e := range gone {
		if err := r.fs.Remove(e.file); err != nil && !errors.Is(err, os.ErrNotExist) && firstErr == nil {
			firstErr = err
		}
	}
	if err := r.fs.SyncDir(rdir); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		return unavailable("INBOX_UNWRITABLE", "the relay cannot write its inbox", firstErr)
	}
	// The files are gone: the records must follow even if the caller has gone
	// away meanwhile (a client that disconnects, a server shutting down), so
	// the update is not cancelled with the request, only bounded. The records
	// only say what happened; a failure here (or a crash before it) leaves them
	// "persisted" without a file, which neither de-duplication nor load minds.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackRecordTimeout)
	defer cancel()
	err := r.st.PreparedTransaction(uctx, func(tx *store.Tx) error {
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
		r.log.Warn("relay: envelopes removed, receipt records not updated", "outcome", outcome, "count", len(gone), "err", err)
	}
	return nil
}

// ackRecordTimeout bounds the receipt-record update of an Ack, which runs to the
// end even when the request is cancelled.
const ackRecordTimeout = 10 * time.Second
