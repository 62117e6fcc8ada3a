// Package fsfixtures builds named sealbridge stores on disk, at test time, for the
// tests of sealbridge-fsck and of the store (DESIGN §16). It is a test-only package:
// nothing but tests imports it.
//
// Every fixture is built in a fresh t.TempDir() laid out like a real data root:
//
//	<root>/delivery/<hex sha256(owner DID)>/   the store directory Build returns
//
// so the owner DID is confirmed by the directory's name, exactly as for a real store.
// Keys are fixed test keys (deterministic seeds) and record times are fixed, so record
// file names and bytes are the same on every run. Valid records are written through
// the store's own API (store.Open + Transaction, or record.Encode for the large
// fixture) and then damaged by plain file operations; so are blobs (store.CreateBlob,
// store.PartialBlob), sealed once into testdata/blobs (blobs.go).
//
// The expected fsck findings of each fixture live in testdata/<name>.golden.json (see
// Golden); they are rewritten only by `go test ./fsfixtures -update`.
package fsfixtures

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The fixed test keys. They are test keys only: never use them for anything else.
var (
	ownerSeed   = seed("sealbridge fsfixtures owner")
	foreignSeed = seed("sealbridge fsfixtures foreign signer")
	peerSeed    = seed("sealbridge fsfixtures peer")
)

func seed(label string) []byte {
	s := sha256.Sum256([]byte(label))
	return s[:]
}

func mustIdentity(s []byte) *identity.Identity {
	id, err := identity.FromSeed(s)
	if err != nil {
		panic("fsfixtures: " + err.Error()) // fixed seeds: never happens
	}
	return id
}

// Owner returns the identity that owns every fixture store.
func Owner() *identity.Identity { return mustIdentity(ownerSeed) }

// OwnerDID returns the DID of Owner.
func OwnerDID() identity.DID { return Owner().DID() }

// Foreign returns an identity that owns no fixture: the signer of planted records.
func Foreign() *identity.Identity { return mustIdentity(foreignSeed) }

// PeerDID is the remote party of the fixtures' messages and receipts.
func PeerDID() identity.DID { return mustIdentity(peerSeed).DID() }

// Fixed times of the fixtures' records.
var (
	// T0 is the creation time of every record.
	T0 = time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	// Far is the deadline of live records; their retainUntil is a week later.
	Far = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
)

// relayURL is the relay of every outgoing message.
const relayURL = "https://relay.example/"

// DefaultLargeRecords is the size of valid-large when Records is not given.
const DefaultLargeRecords = 2000

// names lists every fixture in a fixed order.
var names = []string{
	"valid", "valid-large", "stale-lock", "live-lock", "leftover-temps", "truncated-record",
	"flipped-byte", "foreign-signer", "wrong-id", "wrong-kind", "wrong-mode",
	"symlinked-record", "symlinked-dir", "orphan-outbox", "batch-missing-member",
	"oversize-record", "unknown-file", "expired-records", "unacknowledged-receipt", "combined",
	"single-member", "message-status", "held-flags",
	"blobs-valid", "blob-missing", "blob-truncated", "blob-digest", "blob-unreferenced", "blob-partial", "blob-layout",
}

// Names returns the name of every fixture, in a fixed order.
func Names() []string { return slices.Clone(names) }

// headNames lists the fixtures of the head checks (DESIGN §5, "The head"), in a
// fixed order. Every other fixture has a valid head (seq 1) and its local witness.
var headNames = []string{"head-absent", "head-invalid", "head-foreign", "store-rolled-back", "head-format-newer"}

// HeadNames returns the name of every head fixture, in a fixed order: a store
// without a head (head-absent, a note), with a damaged head or one signed by
// another identity (head-invalid, not repairable), behind its local witness
// (store-rolled-back, not repairable), and with a head of a newer format than
// store.FormatVersion, which fsck refuses to check (STORE_FORMAT_NEWER, exit 8):
// its golden file holds that exit code and no findings.
func HeadNames() []string { return slices.Clone(headNames) }

// HeadFormatNewer is the fixture fsck refuses to check.
const HeadFormatNewer = "head-format-newer"

// Option configures Build.
type Option func(*config)

type config struct {
	records int
}

// Records sets the number of records of valid-large (default DefaultLargeRecords).
// Other fixtures ignore it.
func Records(n int) Option { return func(c *config) { c.records = n } }

// Build makes fixture name in a fresh temporary data root and returns its store
// directory. Everything is removed when the test ends; the live-lock fixture holds its
// lock until then. An unknown name fails the test.
func Build(t testing.TB, name string, opts ...Option) string {
	t.Helper()
	cfg := config{records: DefaultLargeRecords}
	for _, o := range opts {
		o(&cfg)
	}
	b := newBuilder(t)
	switch name {
	case "head-absent":
		b.noHead = true
		b.base()
	case "head-invalid":
		b.base()
		data := b.read(store.HeadFile)
		data[strings.Index(string(data), `"sig":"`)+16] ^= 0x01
		b.write(store.HeadFile, data, 0o600)
	case "head-foreign":
		b.base()
		b.write(store.HeadFile, b.signHead(Foreign(), store.FormatVersion, 2), 0o600)
	case "store-rolled-back":
		b.base()
		b.writeAbs(dataroot.WitnessFile(b.root, string(b.owner.DID())), b.signHead(b.owner, store.FormatVersion, 5))
	case HeadFormatNewer:
		b.base()
		b.write(store.HeadFile, b.signHead(b.owner, store.FormatVersion+1, 2), 0o600)
	case "valid":
		b.base()
	case "valid-large":
		b.large(cfg.records)
	case "stale-lock":
		b.base()
		b.staleLock()
	case "live-lock":
		b.base()
		b.liveLock()
	case "leftover-temps":
		b.base()
		b.temps(true)
	case "truncated-record":
		b.base()
		b.truncate(record.KindMessages, ID("msg-a"))
	case "flipped-byte":
		b.base()
		b.flipByte(record.KindOperations, ID("op-1"), `"requestDigest":"`)
	case "foreign-signer":
		b.base()
		b.foreignRecord()
	case "wrong-id":
		b.base()
		b.copyRecord(record.KindMessages, ID("msg-b"), record.KindMessages, ID("wrong-id"))
	case "wrong-kind":
		b.base()
		b.copyRecord(record.KindMessages, ID("msg-b"), record.KindReceipts, ID("msg-b"))
	case "wrong-mode":
		b.base()
		b.chmod(record.Path(record.KindMessages, ID("msg-a")), 0o644)
		b.chmod(string(record.KindReceipts), 0o755)
	case "symlinked-record":
		b.base()
		b.symlinkedRecord()
	case "symlinked-dir":
		b.base()
		b.symlinkedDir(record.KindObservations)
	case "orphan-outbox":
		b.base()
		b.orphans()
	case "batch-missing-member":
		b.base()
		b.remove(record.Path(record.KindOutbox, ID("msg-a/envelope/1")))
	case "oversize-record":
		b.base()
		b.write(record.Path(record.KindMessages, ID("oversize")), []byte(strings.Repeat("x", 300<<10)+"\n"), 0o600)
	case "unknown-file":
		b.base()
		b.unknownFiles()
	case "expired-records":
		b.base()
		b.expired()
	case "unacknowledged-receipt":
		b.base()
		b.unacknowledgedReceipt()
	case "single-member":
		b.base()
		b.singles()
	case "message-status":
		b.base()
		b.messageStatus()
	case "held-flags":
		b.base()
		b.heldFlags()
	case "blobs-valid":
		b.base()
		b.sendBlob(BlobOut, record.StatePending)
		b.receiveBlob()
	case "blob-missing":
		b.base()
		_, out := b.sendBlob(BlobOut, record.StatePending)
		in := b.receiveBlob()
		b.sendBlob(BlobOutSettled, record.StateRelayed)
		b.remove(BlobPath(out))
		b.remove(BlobPath(in))
	case "blob-truncated":
		b.base()
		_, d := b.sendBlob(BlobOut, record.StatePending)
		b.truncateBlob(d)
	case "blob-digest":
		b.base()
		b.flipBlobByte(b.receiveBlob())
	case "blob-unreferenced":
		b.base()
		_, ref, sealed := ReadBlobTestdata(b.t, BlobOut)
		b.writeBlob(ref.Digest, sealed)
	case "blob-partial":
		b.base()
		b.blobPartials()
	case "blob-layout":
		b.base()
		b.blobLayout()
	case "combined":
		b.base()
		b.temps(false)
		b.truncate(record.KindMessages, ID("msg-a"))
		b.foreignRecord()
		b.orphans()
		b.remove(record.Path(record.KindOutbox, ID("msg-a/envelope/1")))
		b.write("notes.txt", []byte("planted\n"), 0o600)
		b.unacknowledgedReceipt()
		b.chmod(string(record.KindReceipts), 0o750)
		b.staleLock() // last: the store's own writes above would break it
	default:
		t.Fatalf("fsfixtures: unknown fixture %q", name)
	}
	return b.dir
}

// ID returns the fixed lower-case UUID of a label, the same on every run.
func ID(label string) string {
	return uuid.FromURL("https://sealbridge.invalid/fsfixtures/" + label)
}

// DataRoot returns the data root of a fixture's store directory.
func DataRoot(dir string) string { return filepath.Dir(filepath.Dir(dir)) }

type builder struct {
	t      testing.TB
	root   string // the data root
	dir    string // the store directory
	owner  *identity.Identity
	s      *store.Store
	noHead bool // base and large write no head (a store from before heads)
}

// head writes the store's head (seq 1 in a fresh store) and its local witness,
// as the daemon does after the fixture's commits.
func (b *builder) head() {
	b.t.Helper()
	if b.noHead {
		return
	}
	if _, _, err := b.s.WriteHead(context.Background(), true); err != nil {
		b.t.Fatalf("fsfixtures: write the head: %v", err)
	}
}

// signHead returns a head of id's store at the fixtures' time T0.
func (b *builder) signHead(id *identity.Identity, format int, seq int64) []byte {
	b.t.Helper()
	data, err := envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: format, Seq: seq, Time: T0})
	if err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	return data
}

// writeAbs replaces the file at the absolute path p (0600).
func (b *builder) writeAbs(p string, data []byte) {
	b.t.Helper()
	if err := os.WriteFile(p, data, 0o600); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
}

func newBuilder(t testing.TB) *builder {
	t.Helper()
	root := t.TempDir()
	owner := Owner()
	s, err := store.Open(owner.Signer(), store.Options{Home: root, Now: func() time.Time { return T0 }})
	if err != nil {
		t.Fatalf("fsfixtures: open store: %v", err)
	}
	b := &builder{t: t, root: root, dir: s.Dir(), owner: owner, s: s}
	if want := dataroot.StoreDir(root, string(owner.DID())); b.dir != want {
		t.Fatalf("fsfixtures: store dir %s, want %s", b.dir, want)
	}
	return b
}

func ms(t time.Time) int64 { return t.UnixMilli() }

var week = 7 * 24 * time.Hour

// tx runs fn in one store transaction.
func (b *builder) tx(fn func(tx *store.Tx) error) {
	b.t.Helper()
	if err := b.s.Transaction(context.Background(), fn); err != nil {
		b.t.Fatalf("fsfixtures: transaction: %v", err)
	}
}

// message returns the records of an outgoing message of n envelopes: members,
// message record and batch marker.
func message(label string, n int, deadline, retain time.Time) ([]*record.Outbox, *record.Message, *record.Batch) {
	mid, bid := ID(label), ID(label+"/batch")
	peer := string(PeerDID())
	var members []*record.Outbox
	for i := 0; i < n; i++ {
		eid := ID(fmt.Sprintf("%s/envelope/%d", label, i))
		env := []byte(fmt.Sprintf(`{"envelopeId":%q,"messageId":%q,"part":%d}`, eid, mid, i))
		kind := record.EnvelopeMessage
		if i > 0 {
			kind = record.EnvelopeDeliveryStatus
		}
		members = append(members, &record.Outbox{EnvelopeID: eid, MessageID: mid, BatchID: bid, EnvelopeKind: kind,
			State: record.StatePending, Ordinal: i, RelayURL: relayURL, PeerOwnerDID: peer,
			DeliveryDeadline: ms(deadline), NextAttemptAt: ms(T0), Envelope: env, EnvelopeDigest: envelope.Digest(env),
			RetainUntil: ms(retain)})
	}
	msg := &record.Message{MessageID: mid, Status: record.StatusQueued, PeerOwnerDID: peer, RelayURL: relayURL,
		EnvelopeDigest: members[0].EnvelopeDigest, DeliveryDeadline: ms(deadline), CreatedAt: ms(T0),
		UpdatedAt: ms(T0), RetainUntil: ms(retain)}
	batch := &record.Batch{BatchID: bid, MessageID: mid, PeerOwnerDID: peer, RelayURL: relayURL,
		DeliveryDeadline: ms(deadline), CreatedAt: ms(T0), RetainUntil: ms(retain)}
	for _, m := range members {
		batch.EnvelopeIDs = append(batch.EnvelopeIDs, m.EnvelopeID)
	}
	return members, msg, batch
}

// send writes a committed message: members and message record, then the marker.
func (b *builder) send(label string, n int, deadline, retain time.Time) {
	members, msg, batch := message(label, n, deadline, retain)
	b.tx(func(tx *store.Tx) error {
		recs := []record.Record{msg}
		for _, m := range members {
			recs = append(recs, m)
		}
		if err := tx.PutAll(recs...); err != nil {
			return err
		}
		return tx.Put(batch)
	})
}

// inboundRecords returns a receipt in state and the observation of the same
// envelope (same sender and digest).
func inboundRecords(label, state string, retain time.Time) (*record.Receipt, *record.Observation) {
	eid, mid := ID(label+"/envelope"), ID(label+"/message")
	env := []byte(fmt.Sprintf(`{"envelopeId":%q,"messageId":%q}`, eid, mid))
	d := envelope.Digest(env)
	peer := string(PeerDID())
	r := &record.Receipt{EnvelopeID: eid, SenderDID: peer, EnvelopeDigest: d, State: state,
		ReceivedAt: ms(T0), RetainUntil: ms(retain)}
	o := &record.Observation{MessageID: mid, SenderDID: peer, EnvelopeDigest: d, CreatedAt: ms(T0),
		DeliveryDeadline: ms(Far), Facts: []json.RawMessage{json.RawMessage(`{"fact":"received"}`)},
		Published: []string{ID(label + "/published")}, RetainUntil: ms(retain)}
	return r, o
}

// base writes the records every fixture starts from: two committed messages (of two
// envelopes and of one), an inbound envelope that was processed (receipt and
// observation), one received but not yet processed (receipt only), and a finished
// idempotent operation with its key binding. Twelve records, every kind.
func (b *builder) base() {
	retain := Far.Add(week)
	b.send("msg-a", 2, Far, retain)
	b.send("msg-b", 1, Far, retain)
	r1, o1 := inboundRecords("in-1", record.ReceiptProcessed, retain)
	r2, _ := inboundRecords("in-2", record.ReceiptPersisted, retain)
	req := envelope.Digest([]byte("request-1"))
	op := &record.Operation{OperationID: ID("op-1"), RequestDigest: req, State: record.OperationDone,
		CreatedAt: ms(T0), LeaseUntil: ms(T0.Add(2 * time.Minute)),
		Response: json.RawMessage(fmt.Sprintf(`{"messageId":%q}`, ID("msg-a"))), RetainUntil: ms(T0.Add(100 * 365 * 24 * time.Hour))}
	bind := &record.Binding{KeyHash: record.IdempotencyID("fixture-key-1"), OperationID: op.OperationID,
		RequestDigest: req, CreatedAt: ms(T0), RetainUntil: op.RetainUntil}
	b.tx(func(tx *store.Tx) error { return tx.PutAll(r1, o1, r2, op) })
	b.tx(func(tx *store.Tx) error { return tx.Put(bind) })
	b.head()
}

// path returns the absolute path of a name relative to the store directory.
func (b *builder) path(rel string) string { return filepath.Join(b.dir, filepath.FromSlash(rel)) }

func (b *builder) read(rel string) []byte {
	b.t.Helper()
	data, err := os.ReadFile(b.path(rel))
	if err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	return data
}

func (b *builder) write(rel string, data []byte, perm os.FileMode) {
	b.t.Helper()
	p := b.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	if err := os.WriteFile(p, data, perm); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	if err := os.Chmod(p, perm); err != nil { // not subject to the umask
		b.t.Fatalf("fsfixtures: %v", err)
	}
}

func (b *builder) remove(rel string) {
	b.t.Helper()
	if err := os.Remove(b.path(rel)); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
}

func (b *builder) chmod(rel string, perm os.FileMode) {
	b.t.Helper()
	if err := os.Chmod(b.path(rel), perm); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
}

func (b *builder) age(rel string, d time.Duration) {
	b.t.Helper()
	when := time.Now().Add(-d)
	if err := os.Chtimes(b.path(rel), when, when); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
}

// encode signs r with the owner key, as the store does.
func (b *builder) encode(signer *identity.Identity, r record.Record) []byte {
	b.t.Helper()
	data, err := record.Encode(signer.Signer(), signer.DID(), r)
	if err != nil {
		b.t.Fatalf("fsfixtures: encode: %v", err)
	}
	return data
}

// staleLock plants a ".lock" left by a holder that is gone (another host, long ago:
// stale by age) and an orphan lock temp older than the stale bound.
func (b *builder) staleLock() {
	holder := []byte(`{"pid":999999999,"host":"fsfixtures.invalid","time":"2025-06-01T00:00:00Z"}` + "\n")
	b.write(".lock", holder, 0o600)
	name := ".lock-" + ID("lock-temp") + ".tmp"
	b.write(name, holder, 0o600)
	b.age(name, 2*time.Hour)
}

// liveLock holds the store lock — the real one, taken by a store transaction in this
// process — until the test ends.
func (b *builder) liveLock() {
	held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- b.s.Transaction(context.Background(), func(*store.Tx) error {
			close(held)
			<-release
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-done:
		b.t.Fatalf("fsfixtures: taking the lock: %v", err)
	}
	b.t.Cleanup(func() {
		close(release)
		if err := <-done; err != nil {
			b.t.Errorf("fsfixtures: releasing the lock: %v", err)
		}
	})
}

// temps plants staged writes left by crashes: two older than store.TempMaxAge, and,
// if young, one just written (perhaps in progress).
func (b *builder) temps(young bool) {
	rec := b.read(record.Path(record.KindOutbox, ID("msg-a/envelope/0")))
	old1 := string(record.KindOutbox) + "/." + ID("temp-1") + ".tmp"
	b.write(old1, rec[:len(rec)/2], 0o600)
	b.age(old1, 2*time.Hour)
	old2 := string(record.KindMessages) + "/." + ID("temp-2") + ".tmp"
	b.write(old2, nil, 0o600)
	b.age(old2, 3*time.Hour)
	if young {
		b.write(string(record.KindReceipts)+"/."+ID("temp-3")+".tmp", rec, 0o600)
	}
}

// truncate cuts a record file to half its length.
func (b *builder) truncate(k record.Kind, id string) {
	rel := record.Path(k, id)
	data := b.read(rel)
	b.write(rel, data[:len(data)/2], 0o600)
}

// flipByte flips the lowest bit of the byte ten bytes after marker in a record.
func (b *builder) flipByte(k record.Kind, id, marker string) {
	b.t.Helper()
	rel := record.Path(k, id)
	data := b.read(rel)
	i := strings.Index(string(data), marker)
	if i < 0 {
		b.t.Fatalf("fsfixtures: %q not in %s", marker, rel)
	}
	data[i+len(marker)+10] ^= 0x01
	b.write(rel, data, 0o600)
}

// foreignRecord plants a well-formed message record signed by another key.
func (b *builder) foreignRecord() {
	_, msg, _ := message("msg-foreign", 1, Far, Far.Add(week))
	b.write(record.Path(record.KindMessages, msg.MessageID), b.encode(Foreign(), msg), 0o600)
}

// copyRecord copies a valid record file to another kind or id.
func (b *builder) copyRecord(fromKind record.Kind, fromID string, toKind record.Kind, toID string) {
	b.write(record.Path(toKind, toID), b.read(record.Path(fromKind, fromID)), 0o600)
}

// symlinkedRecord plants a record name that is a symbolic link to a valid record
// kept outside the store.
func (b *builder) symlinkedRecord() {
	b.t.Helper()
	outside := filepath.Join(b.root, "outside", "record.json")
	if err := os.MkdirAll(filepath.Dir(outside), 0o700); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(outside, b.read(record.Path(record.KindMessages, ID("msg-b"))), 0o600); err != nil {
		b.t.Fatal(err)
	}
	if err := os.Symlink(outside, b.path(record.Path(record.KindMessages, ID("symlinked")))); err != nil {
		b.t.Fatal(err)
	}
}

// symlinkedDir moves a kind directory out of the store and leaves a symbolic link to
// it in its place.
func (b *builder) symlinkedDir(k record.Kind) {
	b.t.Helper()
	elsewhere := filepath.Join(b.root, "elsewhere")
	if err := os.MkdirAll(elsewhere, 0o700); err != nil {
		b.t.Fatal(err)
	}
	target := filepath.Join(elsewhere, string(k))
	if err := os.Rename(b.path(string(k)), target); err != nil {
		b.t.Fatal(err)
	}
	if err := os.Symlink(target, b.path(string(k))); err != nil {
		b.t.Fatal(err)
	}
}

// orphans writes outbox records that no marker lists, as interrupted sends leave them
// (outbox-uncommitted notes): a half-done enqueue (members and message, no marker) and
// a member of msg-b's batch that its marker does not list.
func (b *builder) orphans() {
	members, msg, _ := message("msg-half", 2, Far, Far.Add(week))
	extra, _, _ := message("msg-b", 2, Far, Far.Add(week))
	b.tx(func(tx *store.Tx) error {
		return tx.PutAll(members[0], members[1], msg, extra[1])
	})
}

// singles writes one-envelope messages as the store enqueues them (DESIGN §7): a
// committed one (its member, a single, then the message record that commits it; no
// marker) and a half-done one (the single only), left uncommitted (a note).
func (b *builder) singles() {
	members, msg, _ := message("msg-single", 1, Far, Far.Add(week))
	members[0].BatchID = members[0].EnvelopeID
	half, _, _ := message("msg-single-half", 1, Far, Far.Add(week))
	half[0].BatchID = half[0].EnvelopeID
	b.tx(func(tx *store.Tx) error {
		if err := tx.PutAll(members[0], half[0]); err != nil {
			return err
		}
		return tx.Put(msg)
	})
}

// plant writes records signed by the owner directly, past the store's write rules
// (record.CheckReplacement), as a restored backup or a lost write leaves them.
func (b *builder) plant(recs ...record.Record) {
	for _, r := range recs {
		b.write(record.Path(r.Kind(), r.RecordID()), b.encode(b.owner, r), 0o600)
	}
}

// operatorAction is the fixtures' operator action op.
func operatorAction(op string) *record.Action {
	return &record.Action{Op: op, By: "uid:1000", At: ms(T0.Add(time.Minute)), Reason: "fixture"}
}

// messageStatus writes messages behind their envelopes: a queued message whose
// envelope of kind message is relayed (msg-behind), a relayed message whose envelope
// the relay refused (msg-unclosed), a message closed by cancel without the
// operator's action recorded (msg-cancel-unrecorded), and a confirmation (a message
// whose one envelope is a delivery-status, which speaks for it) queued while that
// envelope is relayed (msg-confirmation-behind).
func (b *builder) messageStatus() {
	retain := Far.Add(week)
	b.send("msg-behind", 2, Far, retain)
	b.send("msg-unclosed", 1, Far, retain)
	b.send("msg-cancel-unrecorded", 1, Far, retain)
	behind, _, _ := message("msg-behind", 2, Far, retain)
	behind[0].State, behind[0].Attempts = record.StateRelayed, 1
	unclosed, um, _ := message("msg-unclosed", 1, Far, retain)
	unclosed[0].State, unclosed[0].Attempts, unclosed[0].LastError = record.StateClosed, 2, "refused by the relay: no such recipient"
	um.Status, um.Attempts = record.StatusRelayed, 1
	cancelled, cm, _ := message("msg-cancel-unrecorded", 1, Far, retain)
	cancelled[0].State, cancelled[0].LastError = record.StateClosed, "cancelled by operator: fixture"
	cm.Status, cm.ClosedBy, cm.LastError = record.StatusClosed, record.ClosedByCancelled, cancelled[0].LastError
	b.plant(behind[0], unclosed[0], um, cancelled[0], cm)
	conf, _, _ := message("msg-confirmation-behind", 1, Far, retain)
	conf[0].EnvelopeKind = record.EnvelopeDeliveryStatus
	b.tx(func(tx *store.Tx) error {
		_, m, batch := message("msg-confirmation-behind", 1, Far, retain)
		if err := tx.PutAll(m, conf[0]); err != nil {
			return err
		}
		return tx.Put(batch)
	})
	conf[0].State, conf[0].Attempts = record.StateRelayed, 1
	b.plant(conf[0])
}

// heldFlags writes operator holds the store never leaves: a hold on a closed message
// and on its closed envelope (msg-held-closed), and a hold made on one side only, an
// interrupted hold: the first envelope of msg-half-held is held, its message and its
// other pending envelope are not; an interrupted cancel: msg-half-cancelled is
// closed by cancel while its second envelope is still pending; and holds that
// outlived their message's last pending envelope: msg-held-relayed is relayed and
// held with both its envelopes relayed, msg-held-removed relayed and held with its
// settled batch already removed by maintenance.
func (b *builder) heldFlags() {
	retain := Far.Add(week)
	b.send("msg-held-closed", 1, Far, retain)
	b.send("msg-half-held", 2, Far, retain)
	hold := operatorAction(record.ActionHold)
	closed, cm, _ := message("msg-held-closed", 1, Far, retain)
	closed[0].State, closed[0].LastError, closed[0].Held = record.StateClosed, "OUTBOX_DEADLINE_EXPIRED", hold
	cm.Status, cm.ClosedBy, cm.LastError, cm.Held = record.StatusClosed, record.ClosedByDeadline, "OUTBOX_DEADLINE_EXPIRED", hold
	half, _, _ := message("msg-half-held", 2, Far, retain)
	half[0].Held, half[0].Operator = hold, hold
	// An interrupted cancel: the message closed, its second envelope still pending.
	b.send("msg-half-cancelled", 2, Far, retain)
	cancel := operatorAction(record.ActionCancel)
	hc, hcm, _ := message("msg-half-cancelled", 2, Far, retain)
	hc[0].State, hc[0].LastError, hc[0].Operator = record.StateClosed, "cancelled by operator", cancel
	hcm.Status, hcm.ClosedBy, hcm.LastError, hcm.Operator = record.StatusClosed, record.ClosedByCancelled, "cancelled by operator", cancel
	b.plant(closed[0], cm, half[0], hc[0], hcm)
	b.send("msg-held-relayed", 2, Far, retain)
	b.send("msg-held-removed", 1, Far, retain)
	hr, hrm, _ := message("msg-held-relayed", 2, Far, retain)
	for _, o := range hr {
		o.State, o.Attempts = record.StateRelayed, 1
	}
	hrm.Status, hrm.Attempts, hrm.Held, hrm.Operator = record.StatusRelayed, 1, hold, hold
	removed, rm, rb := message("msg-held-removed", 1, Far, retain)
	rm.Status, rm.Attempts, rm.Held, rm.Operator = record.StatusRelayed, 1, hold, hold
	b.plant(hr[0], hr[1], hrm, rm)
	b.remove(record.Path(record.KindBatches, rb.BatchID)) // maintenance: the marker first
	b.remove(record.Path(record.KindOutbox, removed[0].EnvelopeID))
}

// unknownFiles plants names that are not part of the layout.
func (b *builder) unknownFiles() {
	b.t.Helper()
	b.write("notes.txt", []byte("planted\n"), 0o600)
	b.write("outbox/README", []byte("planted\n"), 0o600)
	b.write(record.Path(record.KindMessages, ID("msg-a"))+".bak", b.read(record.Path(record.KindMessages, ID("msg-a"))), 0o600)
	b.write("cache/index", []byte("planted\n"), 0o600)
	if err := os.Chmod(b.path("cache"), 0o700); err != nil {
		b.t.Fatal(err)
	}
}

// expired writes valid records past their retainUntil: a committed message and a
// receipt. Maintenance removes them; fsck only notes them.
func (b *builder) expired() {
	b.send("msg-old", 1, T0.Add(time.Hour), T0.Add(24*time.Hour))
	r, _ := inboundRecords("in-old", record.ReceiptTerminal, T0.Add(24*time.Hour))
	b.tx(func(tx *store.Tx) error { return tx.Put(r) })
}

// unacknowledgedReceipt leaves in-1's receipt "persisted" beside its observation, as
// the inbox follower does between storing an envelope and acknowledging it at the
// relay (or when it crashed in between). The store refuses to lower a receipt, so it
// is planted directly over the processed one.
func (b *builder) unacknowledgedReceipt() {
	r, _ := inboundRecords("in-1", record.ReceiptPersisted, Far.Add(week))
	b.write(record.Path(record.KindReceipts, r.RecordID()), b.encode(b.owner, r), 0o600)
}

// large writes n valid records: committed messages of one envelope (member, message,
// marker), then receipts for the remainder. They are encoded with record.Encode
// on every core and written without fsync (a test fixture needs no durability).
func (b *builder) large(n int) {
	b.t.Helper()
	retain := Far.Add(week)
	type file struct {
		rel string
		rec record.Record
	}
	var files []file
	for i := 0; len(files) < n; i++ {
		if n-len(files) >= 3 {
			members, msg, batch := message(fmt.Sprintf("large/%d", i), 1, Far, retain)
			files = append(files, file{record.Path(record.KindOutbox, members[0].EnvelopeID), members[0]},
				file{record.Path(record.KindMessages, msg.MessageID), msg},
				file{record.Path(record.KindBatches, batch.BatchID), batch})
			continue
		}
		r, _ := inboundRecords(fmt.Sprintf("large/%d", i), record.ReceiptPersisted, retain)
		files = append(files, file{record.Path(record.KindReceipts, r.RecordID()), r})
	}
	fsys := fsx.NewOS(b.dir)
	if _, err := fsx.MkdirPrivate(fsx.NewOS(b.root), "delivery"); err != nil {
		b.t.Fatal(err)
	}
	if _, err := fsx.MkdirPrivate(fsx.NewOS(filepath.Dir(b.dir)), filepath.Base(b.dir)); err != nil {
		b.t.Fatal(err)
	}
	for _, k := range []record.Kind{record.KindOutbox, record.KindMessages, record.KindBatches, record.KindReceipts} {
		if _, err := fsx.MkdirPrivate(fsys, string(k)); err != nil {
			b.t.Fatal(err)
		}
	}
	workers := runtime.GOMAXPROCS(0)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(files); i += workers {
				data, err := record.Encode(b.owner.Signer(), b.owner.DID(), files[i].rec)
				if err == nil {
					err = os.WriteFile(b.path(files[i].rel), data, 0o600)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.t.Fatalf("fsfixtures: large: %v", err)
	}
	b.head()
}

// StoreDirOf returns the store directory of did under data root root, as the store
// names it.
func StoreDirOf(root string, did identity.DID) string {
	sum := sha256.Sum256([]byte(did))
	return filepath.Join(root, "delivery", hex.EncodeToString(sum[:]))
}
