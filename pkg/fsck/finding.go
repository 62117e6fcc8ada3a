package fsck

import (
	"crypto"
	"errors"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Code is the stable name of a kind of finding. docs/FSCK.md lists every code with
// its meaning and its repair. The constants are exported, though only this package's
// tests name most of them, because they are the report's contract: a program that
// embeds fsck (or reads --json) switches on them.
type Code string

// Problems: the store is damaged or not as the store would leave it. Each makes the
// default run exit 4 (problems left) unless repaired.
const (
	// CodeRecordInvalid: a "<kind>/<id>.json" file that the store refuses
	// (record.Parse or the read failed): truncated, tampered, foreign signer,
	// wrong id or kind, bad schema. Repair moves it to lost+found.
	CodeRecordInvalid Code = "record-invalid"
	// CodeOversize: a record file larger than its kind's limit; never read. Moved.
	CodeOversize Code = "oversize"
	// CodeSymlink: a symbolic link anywhere in the store. The link itself is moved.
	CodeSymlink Code = "symlink"
	// CodeWrongType: a name of the layout with the wrong file type (a FIFO named like
	// a record, a kind name that is a file, …). Moved.
	CodeWrongType Code = "wrong-type"
	// CodeBadMode: a directory or file with group or other permission bits. Repair
	// sets 0700 or 0600.
	CodeBadMode Code = "bad-mode"
	// CodeBadOwner: owned by another user. A valid record (or the generation file) is
	// rewritten as our own private copy; a directory cannot be repaired.
	CodeBadOwner Code = "bad-owner"
	// CodeHardLink: a record or the generation file with more than one link. It is
	// rewritten as a private copy with the same bytes.
	CodeHardLink Code = "hard-link"
	// CodeUnknownFile: a name in a kind directory that is not part of the layout (at
	// the top of the store directory it is CodeUnknownTop). Moved.
	CodeUnknownFile Code = "unknown-file"
	// CodeTempLeftover: a staged write older than store.TempMaxAge. Removed.
	CodeTempLeftover Code = "temp-leftover"
	// CodeLockStale: a ".lock" whose holder is gone. Removed.
	CodeLockStale Code = "lock-stale"
	// CodeLockInvalid: a ".lock" that is a symbolic link, not a regular file, or owned
	// by another user: every writer refuses the store until it is gone. Moved.
	CodeLockInvalid Code = "lock-invalid"
	// CodeLockTempLeftover: an orphan ".lock-<uuid>.tmp" older than the stale bound.
	// Removed.
	CodeLockTempLeftover Code = "lock-temp-leftover"
	// CodeGenerationInvalid: ".generation" is not a regular file. Moved (the store
	// makes a new one at its next publication).
	CodeGenerationInvalid Code = "generation-invalid"
	// CodeLostFoundInvalid: "lost+found" is not a directory. Not repairable.
	CodeLostFoundInvalid Code = "lost-found-invalid"
	// CodeLostFoundStaleNote: a note in lost+found whose entry is not there: a repair
	// was interrupted after writing the note (notes are written first) and before the
	// move. Repair removes the note; the entry's finding is still reported in place.
	CodeLostFoundStaleNote Code = "lost-found-stale-note"
	// CodeBatchMissingMember: a batch marker lists a member that is absent or invalid.
	// The batch is unwound: its marker is moved first, then its present members.
	CodeBatchMissingMember Code = "batch-missing-member"
	// CodeBatchInconsistent: every member is present but record.CheckBatch refuses the
	// batch. Unwound like a missing member.
	CodeBatchInconsistent Code = "batch-inconsistent"
	// CodeOrphanOutbox: an outbox record left without a batch by damage: a member of
	// a broken batch (unwound), a member whose marker is unusable, or a single whose
	// message record is unusable. Moved, after its marker. (An outbox record that a
	// send left uncommitted is CodeOutboxUncommitted, a note.)
	CodeOrphanOutbox Code = "orphan-outbox"
	// CodeDataRootUnsafe: the store directory sits in a data root
	// (<root>/delivery/<hex>) and the data root, or its delivery/, identities/, run/
	// or relay/ directory, breaks the data-root rules (internal/dataroot): a symbolic
	// link, not a directory, another user's, or writable by group or others. Every
	// binary refuses the data root until it is fixed. The finding's path is absolute;
	// not repairable: the action is the fix.
	CodeDataRootUnsafe Code = "data-root-unsafe"
	// CodeMessageBehind: a queued message with a committed envelope that speaks for
	// it (record.Speaks: of kind message, or a confirmation's delivery-status) that is
	// relayed (the carrier moves the message to relayed in the transaction that
	// settles the envelope). Repair moves the message forward to relayed.
	CodeMessageBehind Code = "message-behind"
	// CodeMessageNotClosed: a queued or relayed message with a committed envelope
	// that speaks for it and is closed (closing an envelope closes its message in the
	// same transaction). Repair closes the message with the envelope's closer and
	// reason.
	CodeMessageNotClosed Code = "message-not-closed"
	// CodeHeldNotOpen: an operator's hold left on a record that is no longer open (an
	// outbox envelope not pending, a message delivered or closed). Repair clears it.
	CodeHeldNotOpen Code = "held-not-open"
	// CodeHoldIncomplete: a queued or relayed message and its pending envelopes
	// disagree on the hold (an interrupted hold or release). Repair holds both.
	CodeHoldIncomplete Code = "hold-incomplete"
	// CodeHeldWithoutPending: a queued or relayed message still held while none of
	// its envelopes is pending (all settled or closed, or settled and removed): a hold
	// never outlives the last pending envelope of its message, whose settlement or
	// close clears it in the same transaction, and nothing would ever release this
	// one. Repair clears the hold.
	CodeHeldWithoutPending Code = "held-without-pending"
	// CodeCancelIncomplete: a pending envelope of a message closed by cancel (an
	// interrupted cancel). Repair closes the envelope as the cancel would have.
	CodeCancelIncomplete Code = "cancel-incomplete"
	// CodeBlobMissing: a record that still needs its body — a pending outbox envelope
	// (the carrier uploads it) or an observation (the recipient reads it) — names a
	// blob that is not in blobs/ as a regular file. Not repairable: the record is
	// left, and the daemon closes such an envelope with BODY_MISSING (a received
	// body is lost; its sender must send it again).
	CodeBlobMissing Code = "blob-missing"
	// CodeBlobTruncated: a blob whose size is not the size a record names for it
	// (shorter: truncated; or longer). Moved to lost+found.
	CodeBlobTruncated Code = "blob-truncated"
	// CodeBlobDigest: a blob whose content's SHA-256 is not its name (or that cannot
	// be read). Moved to lost+found.
	CodeBlobDigest Code = "blob-digest"
	// CodeHeadInvalid: ".head" is not a private regular file holding one head
	// signed by the store's owner (envelope.ParseStoreHead): the store refuses to
	// open. Not repairable: fsck never writes the head.
	CodeHeadInvalid Code = "head-invalid"
	// CodeWitnessInvalid: the local witness of the store's head
	// (<data root>/witness/<hex>.head) is not a private regular file holding one
	// head signed by the store's owner: the store refuses to open. The path is
	// absolute; not repairable.
	CodeWitnessInvalid Code = "witness-invalid"
	// CodeStoreRolledBack: the local witness holds a head of a higher seq than
	// ".head": the store was restored from an older copy and refuses every write.
	// Not repairable by --repair: sealbridge-fsck --reconcile brings it forward.
	CodeStoreRolledBack Code = "store-rolled-back"
)

// Notes: facts worth knowing that are not damage. They never change the exit code and
// repair leaves them alone.
const (
	// CodeLockLive: a writer holds the lock right now. Repair refuses to run.
	CodeLockLive Code = "lock-live"
	// CodeLockHeld: ".lock" exists without a running holder but is not stale yet.
	// Repair refuses to run until it is.
	CodeLockHeld Code = "lock-held"
	// CodeTempRecent: a staged write younger than store.TempMaxAge (maybe in progress).
	CodeTempRecent Code = "temp-recent"
	// CodeLockTempRecent: a lock temp younger than the stale bound (maybe in progress).
	CodeLockTempRecent Code = "lock-temp-recent"
	// CodeRecordExpired: valid records past their retainUntil (one note per kind);
	// store maintenance removes them.
	CodeRecordExpired Code = "record-expired"
	// CodeMessageMissing: an intact batch whose message record is absent.
	CodeMessageMissing Code = "message-missing"
	// CodeStoreAbsent: the store directory does not exist, and Options.MayBeAbsent
	// says that its owner's identity does: nothing is stored yet. The only finding.
	CodeStoreAbsent Code = "store-absent"
	// CodeOutboxUncommitted: an outbox record that nothing commits because its send
	// was interrupted before it committed: no batch marker exists for it (nor an
	// unusable one), its marker does not list it (the message was sent again with
	// other envelopes), or — a single — its message record is absent or commits
	// another envelope. Such a send was never acknowledged and the record is never
	// dispatched; store maintenance removes it. Kept.
	CodeOutboxUncommitted Code = "outbox-uncommitted"
	// CodeUnknownTop: a name at the top of the store directory that is not part of the
	// layout. The store ignores it; repair never moves it (nothing at the top of the
	// store directory that the store did not make is moved).
	CodeUnknownTop Code = "unknown-top"
	// CodeMessageUnaccepted: a queued message that no intact batch marker commits; the
	// store reports it as absent, and sending it again finishes it.
	CodeMessageUnaccepted Code = "message-unaccepted"
	// CodeCancelUnrecorded: a message closed by "cancelled" without an operator's
	// cancel recorded on it: who cancelled it cannot be told. Kept.
	CodeCancelUnrecorded Code = "cancel-unrecorded"
	// CodeReceiptUnacknowledged: a receipt still "persisted" while the
	// observation of the same envelope exists. The daemon's inbox follower writes both
	// in one transaction and raises the receipt only after acknowledging the envelope
	// at the relay, so this is the state between the two (or after a crash between
	// them), which the follower finishes at its next start. Kept.
	CodeReceiptUnacknowledged Code = "receipt-unacknowledged"
	// CodeBlobUnreferenced: a blob that no valid record names: what a send
	// interrupted between committing the blob and enqueueing its records leaves, or a
	// received body whose records were not written. Store maintenance removes it
	// after its grace time. Kept.
	CodeBlobUnreferenced Code = "blob-unreferenced"
	// CodeBlobPartial: a staged blob ("blobs/.<uuid>.tmp") or a partial download
	// ("blobs/.<envelopeId>.part"): a transfer in progress or interrupted; the daemon
	// resumes a download from its end, and maintenance removes what is abandoned.
	// Kept.
	CodeBlobPartial Code = "blob-partial"
	// CodeBlobMissingSettled: an outbox envelope that is relayed or closed names a
	// blob that is absent: it is never sent again, so nothing needs the body (the
	// daemon closes an envelope whose blob is missing, which leaves this). Kept.
	CodeBlobMissingSettled Code = "blob-missing-settled"
	// CodeHeadAbsent: the store has no ".head": a store from before heads (format
	// 1), or one that has not written a head yet. The store writes one after its
	// next commit. Kept.
	CodeHeadAbsent Code = "head-absent"
)

// Severity says whether a finding is a problem or a note.
type Severity string

const (
	Problem Severity = "problem"
	Note    Severity = "note"
)

// Finding is one thing fsck found. Path is relative to the store directory, with
// forward slashes ("." is the store directory itself), except for a directory above
// the store (CodeDataRootUnsafe), whose path is absolute. Explanation is one line and
// never contains payload contents or key material. Action says what Repair does about
// it ("none: …" when it does nothing).
type Finding struct {
	Code        Code     `json:"code"`
	Severity    Severity `json:"severity"`
	Path        string   `json:"path"`
	Explanation string   `json:"explanation"`
	Action      string   `json:"action"`
	Repairable  bool     `json:"repairable"`
	// AgeSeconds is the age of a temp, lock temp or lock, where it matters.
	AgeSeconds int64 `json:"ageSeconds,omitempty"`
	// Holder describes the holder of a live or held lock, when it wrote its info.
	Holder *LockHolder `json:"holder,omitempty"`

	fix *fix // what Repair does; nil when not repairable
}

// LockHolder is the holder info recorded in a lock file.
type LockHolder struct {
	Pid  int       `json:"pid"`
	Host string    `json:"host"`
	Time time.Time `json:"time"`
}

// OwnerSource says how the owner DID was established.
type OwnerSource string

const (
	// OwnerGiven: Options.Owner, confirmed against the directory name.
	OwnerGiven OwnerSource = "given"
	// OwnerDirectoryName: the signer of the records whose SHA-256 is the store
	// directory's name.
	OwnerDirectoryName OwnerSource = "directory-name"
	// OwnerNone: there are no records to verify.
	OwnerNone OwnerSource = "none"
)

// Report is the result of Check.
type Report struct {
	// Dir is the absolute store directory.
	Dir         string       `json:"store"`
	Owner       identity.DID `json:"owner,omitempty"`
	OwnerSource OwnerSource  `json:"ownerSource"`
	// Records counts the "<kind>/<id>.json" names examined; Valid those the store
	// accepts by content (a valid record with a wrong mode counts as valid).
	Records int `json:"records"`
	Valid   int `json:"valid"`
	// Blobs counts the committed blob files (blobs/<digest>, regular files) examined.
	Blobs int `json:"blobs"`
	// LostFound counts the entries already in lost+found (moved by earlier repairs).
	LostFound int `json:"lostFound"`
	// Lock is the state of the store lock: "absent", "live", "held", "stale" or
	// "invalid".
	Lock string `json:"lock"`
	// Findings, sorted by path then code.
	Findings []Finding `json:"findings"`
	// Duration of the check.
	Duration time.Duration `json:"-"`

	root fsx.Fingerprint // the store directory as the check saw it
}

// Problems returns the number of findings of severity Problem.
func (r *Report) Problems() int {
	return r.count(func(f Finding) bool { return f.Severity == Problem })
}

// Repairable returns the number of problems that Repair would act on.
func (r *Report) Repairable() int {
	return r.count(func(f Finding) bool { return f.Severity == Problem && f.Repairable })
}

// Notes returns the number of findings of severity Note.
func (r *Report) Notes() int { return r.count(func(f Finding) bool { return f.Severity == Note }) }

func (r *Report) count(pred func(Finding) bool) int {
	n := 0
	for _, f := range r.Findings {
		if pred(f) {
			n++
		}
	}
	return n
}

// Progress is reported while records are verified (Stage "verify": Done of Total
// records) and while Repair makes its changes (Stage "repair": Done of Total
// repairs). Repair's checks before and after report "verify" stages too.
type Progress struct {
	Stage       string
	Done, Total int
}

// Progress stages.
const (
	StageVerify = "verify"
	StageRepair = "repair"
)

// Options configure Check and Repair. The zero value is usable.
type Options struct {
	// Owner, if set, is the store's owner: the directory's name must be the SHA-256
	// of Owner.
	Owner identity.DID
	// Now is the clock for ages and expiry (default time.Now).
	Now func() time.Time
	// Workers verifies records in parallel (default runtime.GOMAXPROCS(0)).
	Workers int
	// Limits are the per-kind size limits (default store.DefaultLimits()).
	Limits store.Limits
	// Progress, if set, is called from one goroutine at a time as records are
	// verified and repairs made, with Done non-decreasing within a stage, and once at
	// the end of each stage with Done == Total.
	Progress func(Progress)
	// OnRepair, if set, is called by Repair after each change it made or skipped.
	OnRepair func(ActionResult)
	// LockStale is the lock's stale bound (default 30 s, as the store's).
	LockStale time.Duration
	// LockWait bounds how long Repair waits for the store lock before each change
	// (default 2 s); then it gives up with ErrLive.
	LockWait time.Duration
	// DaemonLive, if set, tells Repair whether a daemon serves the store; Repair
	// refuses to run while it does, and asks again before every change (stopping
	// with ErrLive if one has started). An error also stops the repair: whether a
	// daemon is live must be known.
	DaemonLive func(storeDir string) (live bool, who string, err error)
	// Signer, if set, holds the owner's private key: Repair then also repairs the
	// state rules (a message behind its envelopes, a hold left or half made), by
	// rewriting the record through the store's own transaction, signed with it.
	// Without it those problems are reported as not repairable. Its public key must
	// be the owner's.
	Signer crypto.Signer
	// Tool names the program in lost+found notes (default "sealbridge-fsck").
	Tool string
	// WrapFS, if set, wraps the file system fsck uses (fault injection in tests).
	WrapFS func(fsx.FS) fsx.FS
	// WitnessFile, if set, is the local witness of the store's head; by default it
	// is <data root>/witness/<store directory name>.head (dataroot.WitnessFile), the
	// data root being the store directory's grandparent (<data root>/delivery/<hex>).
	WitnessFile string
	// MayBeAbsent says that the store directory was named from its owner's identity
	// (dataroot.StoreDir of a data root and Owner, as sealbridge-fsck --identity NAME
	// names it) and that the identity exists: a store directory that does not exist
	// then means an identity that has stored nothing yet (the store makes its
	// directory at its first write). Check reports such a store as healthy — no
	// records, the note CodeStoreAbsent, and the data root's rules checked as always —
	// and Repair has nothing to do. It needs Owner, and the directory to be
	// <data root>/delivery/<hex sha256(Owner)>; otherwise, or without it, a missing
	// store directory is ErrNotStore.
	MayBeAbsent bool
}

// Errors of Check and Repair; test with errors.Is.
var (
	// ErrNotStore: the directory does not exist, is not a directory (symbolic links are
	// not followed), or belongs to another user.
	ErrNotStore = errors.New("fsck: not a usable store directory")
	// ErrOwner: the owner DID cannot be established or does not match the directory.
	ErrOwner = errors.New("fsck: cannot establish the store's owner")
	// ErrDataRoot: the directory looks like a data root (it holds delivery/,
	// identities/ or run/), not a store directory. Nothing is checked or changed.
	ErrDataRoot = errors.New("fsck: a data root, not a store directory")
	// ErrNotStoreLayout: the directory is not laid out like a store directory
	// (<data root>/delivery/<64 hex digits>, holding the store's names). Nothing is
	// checked or changed.
	ErrNotStoreLayout = errors.New("fsck: not a store directory")
	// ErrLive: Repair refused because the store lock is live (or held and not yet
	// stale) or a daemon serves the store.
	ErrLive = errors.New("fsck: the store is in use")
)

// fixKind is what Repair does about a finding.
type fixKind int

const (
	fixMove           fixKind = iota + 1 // move to lost+found
	fixRemove                            // unlink (stale temps)
	fixChmod                             // set the mode
	fixRewrite                           // rewrite the same bytes as a new private file
	fixBreakLock                         // lockfile.BreakStale
	fixCleanLockTemps                    // lockfile.CleanOrphans
	fixState                             // rewrite a record by a store transaction (state rules)
	fixCopyBlob                          // replace a blob by a streamed private copy of its bytes
)

// Repair phases: the order in which fixes run.
const (
	phaseLockFile = iota // the lock itself, before the lock is taken
	phaseRoot            // the store directory, top-level names and kind directories
	phaseMarkers         // batch markers: a marker is removed before its members
	phaseRecords         // every other record-level move
	phaseMetadata        // modes and private copies of records we keep
	phaseState           // state rules: records rewritten by the store, once the layout is sound
	phaseTemps           // staged temps and lock temps
)

type fix struct {
	kind  fixKind
	phase int
	perm  uint32 // fixChmod
	dir   bool   // the path is a directory (fixChmod, deps)
	// record is the kind of a record file to re-verify before fixRewrite ("" for the
	// generation file).
	record record.Kind
	// bump: grow .generation after the change (it changes a kind's listing).
	bump bool
	// digest: the name a fixCopyBlob's bytes must still hash to ("" for a staged or
	// partial blob).
	digest string
	// state names the records of a fixState, whose rule is decided again under the
	// store's lock.
	state *stateRef
	// deps must all still hold, under the lock, for the fix to run.
	deps []dep
}

// dep is one fact a fix relies on: path has fingerprint fp, or is absent.
type dep struct {
	path     string
	fp       fsx.Fingerprint
	dir      bool // compare identity only (dev, ino, uid): a directory's times change with its entries
	absent   bool // must be absent
	orAbsent bool // may also have vanished (a marker moved by an earlier fix)
}
