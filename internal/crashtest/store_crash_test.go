package crashtest_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/crashtest"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

var (
	ownerSeed = [32]byte{7: 7, 31: 1}
	peerSeed  = [32]byte{7: 9, 31: 2}
)

func owner(t testing.TB) *identity.Identity {
	id, err := identity.FromSeed(ownerSeed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func peer() identity.DID {
	return identity.FormatDID(ed25519.NewKeyFromSeed(peerSeed[:]).Public().(ed25519.PublicKey))
}

// clock is the stores' clock; the maintenance workload moves it.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// expectation is what the operation under test acknowledged: after the first `at`
// recorded calls, record path holds rec (nil: absent).
type expectation struct {
	at   int
	path string
	kind record.Kind
	id   string
	rec  record.Record
}

// workload runs the operation under test on s (over the recording file system) and
// calls ack for every record state it acknowledged.
type workload struct {
	name  string
	setup func(t *testing.T, s *store.Store, c *clock)
	arm   func(f *fsx.Faulty) // if set, called with the recording FS before run (to inject)
	run   func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string))
	// remount: each state is also checked as a file-system shutdown and remount
	// leaves it, without a reboot (files dated now, so the boot rule frees no lock):
	// the first write must take the lock at its first attempt (checkRemount).
	remount bool
	// until, if set, stops the exploration at the first state with a violation that
	// contains it (for a weakened protocol: once caught, the rest is not needed).
	until string
}

// result of exploring one workload.
type result struct {
	states     int
	violations []string
}

// privateDir is a fresh store directory laid out as in a data root
// (<tmp>/delivery/<hex sha256(owner)>, the only place fsck accepts a store) and
// 0700, as the store requires of it.
func privateDir(t testing.TB) string {
	t.Helper()
	dir := dataroot.StoreDir(t.TempDir(), string(owner(t).DID()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func openAt(t testing.TB, dir string, c *clock, wrap func(fsx.FS) fsx.FS) *store.Store {
	s, err := store.Open(owner(t).Signer(), store.Options{Dir: dir, Now: c.Now, WrapFS: wrap, LockWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newMessage(now time.Time) *record.Message {
	return &record.Message{MessageID: uuid.NewString(), Status: record.StatusQueued, PeerOwnerDID: string(peer()),
		RelayURL: "http://127.0.0.1:9/", EnvelopeDigest: envelope.Digest([]byte("m")), DeliveryDeadline: now.Add(time.Hour).UnixMilli(),
		CreatedAt: now.UnixMilli(), UpdatedAt: now.UnixMilli(), RetainUntil: now.Add(2 * time.Hour).UnixMilli()}
}

func sendRequest(now time.Time, n int) store.SendRequest {
	req := store.SendRequest{MessageID: uuid.NewString(), PeerOwnerDID: peer(), RelayURL: "http://127.0.0.1:9/",
		DeliveryDeadline: now.Add(time.Hour)}
	for i := 0; i < n; i++ {
		id := uuid.NewString()
		env, _ := json.Marshal(map[string]any{"envelopeId": id, "n": i})
		kind := record.EnvelopeMessage
		if i > 0 {
			kind = record.EnvelopeDeliveryStatus
		}
		req.Envelopes = append(req.Envelopes, store.OutgoingEnvelope{EnvelopeID: id, Kind: kind, Envelope: env})
	}
	return req
}

// explore runs w, explores its crash states and checks every invariant on each.
func explore(t *testing.T, w workload, weaken func(*fsx.Faulty)) result {
	t.Helper()
	c := &clock{}
	c.ns.Store(time.Now().UnixNano())
	dir := filepath.Join(t.TempDir(), "store")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if w.setup != nil {
		w.setup(t, openAt(t, dir, c, nil), c)
	}
	initial, err := crashtest.Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	var faulty *fsx.Faulty
	s := openAt(t, dir, c, func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		if weaken != nil {
			weaken(faulty)
		}
		return faulty
	})
	if w.arm != nil {
		w.arm(faulty)
	}
	var exps []expectation
	ack := func(r record.Record, more ...record.Record) {
		for _, r := range append([]record.Record{r}, more...) {
			exps = append(exps, expectation{at: faulty.Count(), path: record.Path(r.Kind(), r.RecordID()), kind: r.Kind(), id: r.RecordID(), rec: r})
		}
	}
	gone := func(k record.Kind, id string) {
		exps = append(exps, expectation{at: faulty.Count(), path: record.Path(k, id), kind: k, id: id})
	}
	w.run(t, s, c, ack, gone)
	log := faulty.Log()
	var bounds []int
	for _, e := range exps {
		bounds = append(bounds, e.at)
	}
	states, err := crashtest.Explore(initial, log, bounds...)
	if err != nil {
		t.Fatal(err)
	}
	versions := attemptedVersions(t, initial, log)
	res := result{states: len(states)}
	_, lockBefore := initial.Names[".lock"]
	for i, st := range states {
		// Where the store lives in a data root: fsck checks only a directory laid
		// out so.
		sdir := dataroot.StoreDir(t.TempDir(), string(owner(t).DID()))
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := st.Tree.Materialize(sdir); err != nil {
			t.Fatal(err)
		}
		var bad []string
		if w.remount {
			bad = checkRemount(t, st.Tree, c)
		}
		// 8. A ".lock" the operation made is never empty: its first contents are
		// durable before its name (lockfile's create).
		if ino, ok := st.Tree.Names[".lock"]; ok && !lockBefore && len(st.Tree.Inodes[ino]) == 0 {
			bad = append(bad, ".lock is empty: its first contents were not durable before its name")
		}
		ageTree(t, sdir)
		bad = append(bad, checkState(t, sdir, c, st, exps, versions)...)
		for _, v := range bad {
			res.violations = append(res.violations, fmt.Sprintf("state %d (%s): %s", i, st.Desc, v))
		}
		os.RemoveAll(sdir)
		if w.until != "" && slices.ContainsFunc(bad, func(v string) bool { return strings.Contains(v, w.until) }) {
			break
		}
	}
	return res
}

// checkRemount opens a crash state as a file-system shutdown and remount leaves it —
// no reboot, so its files are dated now and the boot rule frees no lock — and checks
// that the first write takes the lock at its first attempt (LockWait -1: any wait is
// OUTBOX_STORE_BUSY), with a stale bound of an hour that no age rule can meet: a lock
// the crash left (empty, torn, or a dead holder's) never holds the store. It writes
// into a copy of the state, so that the other checks see the state itself.
func checkRemount(t *testing.T, tree *crashtest.Tree, c *clock) []string {
	cp := dataroot.StoreDir(t.TempDir(), string(owner(t).DID()))
	if err := os.MkdirAll(cp, 0o700); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(cp)
	if err := tree.Materialize(cp); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(owner(t).Signer(), store.Options{Dir: cp, Now: c.Now, LockWait: -1, LockStale: time.Hour})
	if err != nil {
		return []string{fmt.Sprintf("after a remount the store does not open: %v", err)}
	}
	if _, err := s.Enqueue(context.Background(), sendRequest(c.Now(), 1)); err != nil {
		return []string{fmt.Sprintf("after a remount the first write does not take the lock at once: %v", err)}
	}
	return nil
}

// ageTree dates every file of a crash state before this host's boot, as a power cut
// and reboot would leave them.
func ageTree(t *testing.T, dir string) {
	long := time.Unix(86400, 0)
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil {
			os.Chtimes(p, long, long)
		}
		return nil
	})
}

// attemptedVersions parses every record the log wrote (and the initial tree holds),
// by path: the only records a crash state may show as valid.
func attemptedVersions(t *testing.T, initial *crashtest.Tree, log []fsx.Op) map[string][]record.Record {
	out := map[string][]record.Record{}
	id := owner(t)
	parse := func(path string, data []byte) {
		kind, base, ok := strings.Cut(path, "/")
		if !ok {
			return
		}
		k := record.Kind(kind)
		if !k.Valid() {
			return
		}
		// temps carry no id: find it in the header
		var h struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(data, &h) != nil {
			return
		}
		_ = base
		r, err := record.Parse(k, h.ID, data, id.DID(), id.Public())
		if err == nil {
			p := record.Path(k, h.ID)
			out[p] = append(out[p], r)
		}
	}
	for _, n := range initial.Files() {
		parse(n, initial.Inodes[initial.Names[n]])
	}
	for _, op := range log {
		if op.Kind == fsx.OpWrite && op.Offset == 0 {
			parse(op.Path, op.Data)
		}
	}
	return out
}

// checkState opens the store in dir and checks the invariants of DESIGN §16.
func checkState(t *testing.T, dir string, c *clock, st crashtest.State, exps []expectation, versions map[string][]record.Record) []string {
	var bad []string
	// 6. .generation, if present, starts with a whole header: it is only ever made
	// by a durable replace, so no crash tears it.
	if data, err := os.ReadFile(filepath.Join(dir, store.GenerationFile)); err == nil && !generationHeader.Match(data) {
		bad = append(bad, fmt.Sprintf(".generation has no whole header: %.60q", data))
	}
	s := openAt(t, dir, c, nil)
	// 1. Every acknowledged record state is there (or a later, unacknowledged
	// change to it persisted).
	latest := map[string]expectation{}
	for _, e := range exps {
		if e.at <= st.Prefix {
			latest[e.path] = e
		}
	}
	for p, e := range latest {
		if isBlob, why := checkAckedBlob(dir, e); isBlob {
			if why != "" {
				bad = append(bad, why)
			}
			continue
		}
		got, err := s.Get(e.kind, e.id)
		if err != nil {
			bad = append(bad, fmt.Sprintf("acknowledged %s unreadable: %v", p, err))
			continue
		}
		if reflect.DeepEqual(got, e.rec) || (got == nil && e.rec == nil) {
			continue
		}
		if laterChange(exps, e, got, versions) {
			continue
		}
		bad = append(bad, fmt.Sprintf("acknowledged %s lost: got %s", p, summary(got)))
	}
	// 2. Nothing invalid is returned as valid: every record that reads is one we wrote.
	for _, k := range record.Kinds {
		ids, err := s.List(k)
		if err != nil {
			bad = append(bad, fmt.Sprintf("list %s: %v", k, err))
			continue
		}
		for _, id := range ids {
			got, err := s.Get(k, id)
			if err != nil {
				if !errors.Is(err, errcode.OutboxStoreInvalid) {
					bad = append(bad, fmt.Sprintf("%s/%s: unexpected error %v", k, id, err))
				}
				continue
			}
			if got != nil && !isVersion(got, versions[record.Path(k, id)]) {
				bad = append(bad, fmt.Sprintf("%s/%s read as a record never written: %s", k, id, summary(got)))
			}
		}
	}
	// 3. A batch is all or nothing: every marker's members are present and consistent,
	// and a queued message is visible only with its marker (a single's message only
	// with its member); nothing uncommitted is dispatchable.
	batches, _ := s.List(record.KindBatches)
	for _, b := range batches {
		if _, err := s.Committed(b); err != nil {
			bad = append(bad, fmt.Sprintf("batch %s: %v", b, err))
		}
	}
	msgs, _ := s.List(record.KindMessages)
	var visible []*record.Message
	for _, id := range msgs {
		m, err := s.Message(id)
		if err != nil {
			bad = append(bad, fmt.Sprintf("message %s: %v", id, err))
			continue
		}
		if m == nil {
			continue
		}
		visible = append(visible, m)
		pending, err := s.Pending(context.Background(), id)
		if err != nil {
			bad = append(bad, fmt.Sprintf("pending of %s: %v", id, err))
		}
		for _, o := range pending {
			if members, err := s.Committed(o.BatchID); err != nil || len(members) == 0 {
				bad = append(bad, fmt.Sprintf("envelope %s dispatchable without its marker", o.EnvelopeID))
			}
		}
	}
	// Every committed member has its message record: a marker, and a single's own
	// commit, are published only after the message record is durable.
	outbox, _ := s.List(record.KindOutbox)
	for _, id := range outbox {
		o, err := store.GetAs[*record.Outbox](s, id)
		if err != nil || o == nil {
			continue
		}
		members, err := s.Committed(o.BatchID)
		if err != nil || !slices.ContainsFunc(members, func(m *record.Outbox) bool { return m.EnvelopeID == id }) {
			continue
		}
		if m, err := store.GetAs[*record.Message](s, o.MessageID); err != nil || m == nil {
			bad = append(bad, fmt.Sprintf("envelope %s committed without its message record: %v", id, err))
		}
	}
	// 10. Every blob a record refers to is there whole (DESIGN §7: blob first).
	bad = append(bad, checkReferencedBlobs(s, dir)...)
	// 11. Maintenance never removes a referenced blob (checked on a copy).
	bad = append(bad, checkMaintenanceKeepsBlobs(t, c, st)...)
	// 7. Maintenance never makes a visible message absent (a message behind its
	// settled members is brought forward before they are removed): checked on a copy
	// of the state, so that the checks below see the state itself.
	bad = append(bad, checkMaintenanceKeeps(t, c, st, visible)...)
	// 4. fsck reports only repairable problems; repair fixes them; fsck is then clean;
	// and no acknowledged record was lost by the repair.
	bad = append(bad, checkFsck(t, dir, c, st, exps, versions)...)
	// 5. The store opens and accepts a new write (no wedge).
	if _, err := openAt(t, dir, c, nil).Enqueue(context.Background(), sendRequest(c.Now(), 1)); err != nil {
		bad = append(bad, fmt.Sprintf("store does not accept a new write: %v", err))
	}
	return bad
}

// agedCopy materializes state st in a fresh store directory of the owner, dated
// as after a reboot (ageTree: every file older than any grace time), and opens
// it on clock c; the caller removes dir.
func agedCopy(t *testing.T, c *clock, st crashtest.State) (*store.Store, string) {
	dir := dataroot.StoreDir(t.TempDir(), string(owner(t).DID()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := st.Tree.Materialize(dir); err != nil {
		t.Fatal(err)
	}
	ageTree(t, dir)
	return openAt(t, dir, c, nil), dir
}

// checkMaintenanceKeeps runs maintenance twice (a pass finishes a batch whose message
// it moved forward only in its next transaction; the second pass finishes what is
// left) on a copy of state st, and checks that every message in visible (visible in
// st) is still visible, unless its retention has ended.
func checkMaintenanceKeeps(t *testing.T, c *clock, st crashtest.State, visible []*record.Message) []string {
	if len(visible) == 0 {
		return nil
	}
	s, dir := agedCopy(t, c, st)
	defer os.RemoveAll(dir)
	var bad []string
	for range 2 {
		if _, err := s.Maintain(context.Background()); err != nil {
			return []string{fmt.Sprintf("maintenance: %v", err)}
		}
	}
	for _, was := range visible {
		m, err := s.Message(was.MessageID)
		if err == nil && m == nil && was.RetainUntil > c.Now().UnixMilli() {
			bad = append(bad, fmt.Sprintf("maintenance made %s message %s absent", was.Status, was.MessageID))
		}
	}
	return bad
}

// checkFsck runs fsck, repair, and fsck again on a crash state.
func checkFsck(t *testing.T, dir string, c *clock, st crashtest.State, exps []expectation, versions map[string][]record.Record) []string {
	var bad []string
	ctx := context.Background()
	// The owner's key, as `sealbridge-fsck --repair --identity` gives it: a state
	// repair (an interrupted transaction's message behind its envelopes) rewrites a
	// signed record.
	opts := fsck.Options{Owner: owner(t).DID(), Signer: owner(t).Signer()}
	rep, err := fsck.Check(ctx, dir, opts)
	if err != nil {
		return []string{fmt.Sprintf("fsck: %v", err)}
	}
	for _, f := range rep.Findings {
		if f.Severity == fsck.Problem && !f.Repairable {
			bad = append(bad, fmt.Sprintf("fsck: unrepairable %s %s: %s", f.Code, f.Path, f.Explanation))
		}
	}
	if rep.Problems() == 0 {
		return bad
	}
	if _, err := fsck.Repair(ctx, dir, opts); err != nil {
		return append(bad, fmt.Sprintf("fsck repair: %v", err))
	}
	again, err := fsck.Check(ctx, dir, opts)
	if err != nil {
		return append(bad, fmt.Sprintf("fsck after repair: %v", err))
	}
	for _, f := range again.Findings {
		if f.Severity == fsck.Problem {
			bad = append(bad, fmt.Sprintf("fsck after repair still finds %s %s", f.Code, f.Path))
		}
	}
	// No acknowledged record or blob was lost by the repair, nor a referenced blob.
	s := openAt(t, dir, c, nil)
	for _, v := range checkReferencedBlobs(s, dir) {
		bad = append(bad, "after repair: "+v)
	}
	latest := map[string]expectation{}
	for _, e := range exps {
		if e.at <= st.Prefix {
			latest[e.path] = e
		}
	}
	for _, e := range latest {
		if isBlob, why := checkAckedBlob(dir, e); isBlob {
			if why != "" {
				bad = append(bad, "after repair: "+why)
			}
			continue
		}
		if e.rec == nil {
			continue
		}
		got, err := s.Get(e.kind, e.id)
		if err != nil || (got == nil && !laterChange(exps, e, nil, versions)) {
			bad = append(bad, fmt.Sprintf("repair lost acknowledged %s: %v", e.path, err))
		}
	}
	return bad
}

// laterChange reports whether got is the result of a change to e's record made after
// e was acknowledged (a write or removal whose call had not returned at the crash).
func laterChange(exps []expectation, e expectation, got record.Record, versions map[string][]record.Record) bool {
	if got == nil {
		// absent: allowed only if a removal was attempted after the acknowledgement
		for _, x := range exps {
			if x.path == e.path && x.at > e.at && x.rec == nil {
				return true
			}
		}
		return false
	}
	// present with another content: one of the versions written after e
	vs := versions[e.path]
	seenAck := false
	for _, v := range vs {
		if reflect.DeepEqual(v, e.rec) {
			seenAck = true
			continue
		}
		if seenAck && reflect.DeepEqual(v, got) {
			return true
		}
	}
	return false
}

func isVersion(r record.Record, vs []record.Record) bool {
	for _, v := range vs {
		if reflect.DeepEqual(v, r) {
			return true
		}
	}
	return false
}

func summary(r record.Record) string {
	if r == nil {
		return "<absent>"
	}
	b, _ := json.Marshal(r)
	if len(b) > 160 {
		b = append(b[:160], "…"...)
	}
	return string(b)
}

func put(ctx context.Context, s *store.Store, recs ...record.Record) error {
	return s.Transaction(ctx, func(tx *store.Tx) error { return tx.PutAll(recs...) })
}

// workloads covers every store operation that writes, removes or locks.
func workloads() []workload {
	ctx := context.Background()
	return []workload{
		{name: "single-write", run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			m := newMessage(c.Now())
			if err := put(ctx, s, m); err != nil {
				t.Fatal(err)
			}
			ack(m)
		}},
		{name: "removal", setup: func(t *testing.T, s *store.Store, c *clock) {
			if err := put(ctx, s, fixedMessage(c)); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			id := fixedMessage(c).MessageID
			if err := s.Transaction(ctx, func(tx *store.Tx) error { return tx.Delete(record.KindMessages, id) }); err != nil {
				t.Fatal(err)
			}
			gone(record.KindMessages, id)
		}},
		{name: "enqueue-3-envelopes", run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			req := sendRequest(c.Now(), 3)
			m, err := s.Enqueue(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			ack(m)
			members, err := s.Pending(ctx, req.MessageID)
			if err != nil || len(members) != 3 {
				t.Fatal(members, err)
			}
			for _, o := range members {
				ack(o)
			}
			b, _ := store.GetAs[*record.Batch](s, members[0].BatchID)
			ack(b)
		}},
		{name: "enqueue-1-envelope", run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			// A single (DESIGN §7): the member, then the message record that commits
			// it; no marker.
			req := sendRequest(c.Now(), 1)
			m, err := s.Enqueue(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			members, err := s.Pending(ctx, req.MessageID)
			if err != nil || len(members) != 1 || members[0].BatchID != members[0].EnvelopeID {
				t.Fatal(members, err)
			}
			if ids, _ := s.List(record.KindBatches); len(ids) != 0 {
				t.Fatalf("a one-envelope enqueue wrote markers %v", ids)
			}
			ack(m, members[0])
		}},
		// The sender's hot path: four one-envelope enqueues at once, sharing their
		// publication holds and directory fsyncs (group commit). Each is acknowledged
		// as it returns.
		{name: "enqueue-4-senders", run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			var mu sync.Mutex
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for range 4 {
				wg.Go(func() {
					req := sendRequest(c.Now(), 1)
					m, err := s.Enqueue(ctx, req)
					if err != nil {
						errs <- err
						return
					}
					members, err := s.Pending(ctx, req.MessageID)
					if err != nil || len(members) != 1 {
						errs <- fmt.Errorf("pending of %s: %v %v", req.MessageID, members, err)
						return
					}
					mu.Lock()
					ack(m, members[0])
					mu.Unlock()
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
		}},
		{name: "prepared-4-records", run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			var recs []record.Record
			for range 4 {
				recs = append(recs, newMessage(c.Now()))
			}
			if err := s.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.PutAll(recs...) }); err != nil {
				t.Fatal(err)
			}
			ack(recs[0], recs[1:]...)
		}},
		{name: "receipt-state-change", setup: func(t *testing.T, s *store.Store, c *clock) {
			if err := put(ctx, s, fixedReceipt(c, record.ReceiptPersisted)); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			r := fixedReceipt(c, record.ReceiptProcessed)
			if err := s.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.Put(r) }); err != nil {
				t.Fatal(err)
			}
			ack(r)
		}},
		{name: "maintenance", setup: maintenanceSetup, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			ids, _ := s.List(record.KindOutbox)
			batches, _ := s.List(record.KindBatches)
			c.ns.Add(int64(2 * time.Hour)) // past the deadlines and the retention of one record
			rep, err := s.Maintain(ctx)
			if err != nil || len(rep.Errors) > 0 {
				t.Fatal(err, rep.Errors)
			}
			if rep.BatchesFinished != 3 || rep.ClosedByDeadline == 0 || rep.OrphansRemoved != 1 || rep.ExpiredRemoved == 0 {
				t.Fatalf("maintenance did not run every step: %+v", rep)
			}
			for _, id := range ids {
				gone(record.KindOutbox, id)
			}
			for _, id := range batches {
				gone(record.KindBatches, id)
			}
		}},
		// Expired records removed together: maintenance unlinks a chunk of one kind
		// and fsyncs its directory once, so a crash may keep any subset of them.
		{name: "maintenance-bulk-expiry", setup: bulkExpirySetup, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			ids, _ := s.List(record.KindReceipts)
			msgs, _ := s.List(record.KindMessages)
			c.ns.Add(int64(2 * time.Hour)) // past every retainUntil
			rep, err := s.Maintain(ctx)
			if err != nil || len(rep.Errors) > 0 {
				t.Fatal(err, rep.Errors)
			}
			if rep.ExpiredRemoved != len(ids)+len(msgs) || len(ids) != bulkExpiry || len(msgs) != bulkExpiry {
				t.Fatalf("removed %d of %d receipts and %d messages", rep.ExpiredRemoved, len(ids), len(msgs))
			}
			for _, id := range ids {
				gone(record.KindReceipts, id)
			}
			for _, id := range msgs {
				gone(record.KindMessages, id)
			}
		}},
		{name: "idempotency-bind-and-response", run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			start, err := s.BeginOperation(ctx, "key", []byte(`{"q":1}`))
			if err != nil {
				t.Fatal(err)
			}
			ack(start.Operation)
			b, _ := store.GetAs[*record.Binding](s, record.IdempotencyID("key"))
			ack(b)
			if err := s.CompleteOperation(ctx, start.Operation.OperationID, json.RawMessage(`{"ok":true}`)); err != nil {
				t.Fatal(err)
			}
			done, _ := store.GetAs[*record.Operation](s, start.Operation.OperationID)
			ack(done)
		}},
		staleLockWorkload(),
		batchedDeliveryWorkload(),
		cancelledEnqueueWorkload(),
		holdWorkload(),
		releaseWorkload(),
		cancelWorkload(),
		retryWorkload(),
		{name: "lock-acquire-release", remount: true, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			// The first hold makes .lock (temp with the free record, fsync, link,
			// unlink, directory fsync); the second only writes the holder's details and
			// the free record over it.
			for range 2 {
				if err := s.Transaction(ctx, func(tx *store.Tx) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
		}},
		cutLockWorkload("lock-empty-after-cut", func(*testing.T) []byte { return nil }),
		cutLockWorkload("lock-torn-after-cut", func(t *testing.T) []byte {
			// The first half of a holder's details (a dead pid of this host) over
			// the free record: a pwrite a power cut tore.
			h := fmt.Sprintf(`{"pid":%d,"host":%q,"time":%q}`, 1<<22+7, hostname(t), time.Now().UTC().Format(time.RFC3339Nano))
			rec := []byte(`{"free":true,"time":"1970-01-01T00:00:00Z"}` + strings.Repeat(" ", 512-44) + "\n")
			copy(rec, h[:len(h)/2])
			return rec
		}),
		{name: "generation-compaction", setup: compactionSetup, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
			// The first publication finds .generation at its bound and replaces it
			// (temp, fsync, rename, directory fsync) before its own rename; the
			// enqueue after it appends to the new file.
			m := newMessage(c.Now())
			if err := put(ctx, s, m); err != nil {
				t.Fatal(err)
			}
			ack(m)
			if info, err := os.Lstat(filepath.Join(s.Dir(), store.GenerationFile)); err != nil || info.Size() >= generationBound {
				t.Fatalf("the write did not compact .generation: %v %v", info.Size(), err)
			}
			req := sendRequest(c.Now(), 2)
			msg, err := s.Enqueue(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			ack(msg)
			members, err := s.Pending(ctx, req.MessageID)
			if err != nil || len(members) != 2 {
				t.Fatal(members, err)
			}
			for _, o := range members {
				ack(o)
			}
			b, _ := store.GetAs[*record.Batch](s, members[0].BatchID)
			ack(b)
		}},
	}
}

// cutLockWorkload is a write to a store whose .lock a power cut left as content makes
// it (empty: its first contents never reached the disk, as on the code before the lock
// file was made durably; or torn), dated now: the write takes it over at once, and so
// does the first write of every crash state after a remount (remount).
func cutLockWorkload(name string, content func(*testing.T) []byte) workload {
	return workload{name: name, remount: true, setup: func(t *testing.T, s *store.Store, c *clock) {
		if err := put(context.Background(), s, newMessage(c.Now())); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.Dir(), ".lock"), content(t), 0o600); err != nil {
			t.Fatal(err)
		}
	}, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
		m := newMessage(c.Now())
		if err := put(context.Background(), s, m); err != nil {
			t.Fatal(err)
		}
		ack(m)
	}}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Skipf("no host name: %v", err)
	}
	return h
}

// generationHeader matches the start of a generation file (docs/FORMAT.md §7).
var generationHeader = regexp.MustCompile(`\Asealbridge-generation [0-9a-f]{32}\n`)

// generationBound is the size at which the store compacts .generation
// (docs/FORMAT.md §7).
const generationBound = 64 << 10

// compactionSetup leaves a store with one record and its .generation at the bound,
// as tens of thousands of publications would.
func compactionSetup(t *testing.T, s *store.Store, c *clock) {
	if err := put(context.Background(), s, fixedMessage(c)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(s.Dir(), store.GenerationFile)
	info, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte(strings.Repeat("m", generationBound-int(info.Size())))); err != nil {
		t.Fatal(err)
	}
}

func fixedMessage(c *clock) *record.Message {
	m := newMessage(time.UnixMilli(1_800_000_000_000))
	m.MessageID = "11111111-2222-4333-8444-555555555555"
	return m
}

func fixedReceipt(c *clock, state string) *record.Receipt {
	now := time.UnixMilli(1_800_000_000_000)
	return &record.Receipt{EnvelopeID: "66666666-7777-4888-9999-aaaaaaaaaaaa", SenderDID: string(peer()),
		EnvelopeDigest: envelope.Digest([]byte("e")), State: state, ReceivedAt: now.UnixMilli(), RetainUntil: now.Add(24 * time.Hour).UnixMilli()}
}

// cancelledEnqueueWorkload is an enqueue whose context is cancelled at the first
// fsync of a staged record: it publishes nothing and removes the temps it staged, so
// no crash state may hold any of its records.
func cancelledEnqueueWorkload() workload {
	var cancel atomic.Pointer[context.CancelFunc]
	return workload{name: "cancelled-enqueue", arm: func(f *fsx.Faulty) {
		f.Inject = func(op fsx.Op) error {
			dir, base, _ := strings.Cut(op.Path, "/")
			if op.Kind == fsx.OpSync && record.Kind(dir).Valid() && fsx.IsTempName(base) {
				if c := cancel.Swap(nil); c != nil {
					(*c)()
				}
			}
			return nil
		}
	}, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		cancel.Store(&stop)
		req := sendRequest(c.Now(), 3)
		if _, err := s.Enqueue(ctx, req); !errors.Is(err, context.Canceled) || !errors.Is(err, errcode.OutboxStoreBusy) {
			t.Fatalf("enqueue cancelled while staging: %v", err)
		}
		if cancel.Load() != nil {
			t.Fatal("the enqueue staged nothing")
		}
		filepath.WalkDir(s.Dir(), func(p string, e os.DirEntry, err error) error {
			if err == nil && fsx.IsTempName(e.Name()) {
				t.Errorf("temp left behind: %s", p)
			}
			return nil
		})
		gone(record.KindMessages, req.MessageID)
		for _, e := range req.Envelopes {
			gone(record.KindOutbox, e.EnvelopeID)
		}
	}}
}

// maintenanceSetup leaves work for every maintenance step: a batch past its deadline,
// a settled single (DESIGN §7), a settled one-envelope batch with a marker (as stores
// written before singles hold), an orphan outbox record, a record past retention, an
// old temp.
func maintenanceSetup(t *testing.T, s *store.Store, c *clock) {
	ctx := context.Background()
	now := c.Now()
	late := sendRequest(now, 2)
	late.DeliveryDeadline = now.Add(time.Minute)
	if _, err := s.Enqueue(ctx, late); err != nil {
		t.Fatal(err)
	}
	settled := sendRequest(now, 1)
	if _, err := s.Enqueue(ctx, settled); err != nil {
		t.Fatal(err)
	}
	o, _ := store.GetAs[*record.Outbox](s, settled.Envelopes[0].EnvelopeID)
	o.State = record.StateRelayed
	env := json.RawMessage(`{"orphan":1}`)
	orphan := &record.Outbox{EnvelopeID: uuid.NewString(), MessageID: uuid.NewString(), BatchID: uuid.NewString(),
		EnvelopeKind: record.EnvelopeMessage, State: record.StatePending, RelayURL: "http://127.0.0.1:9/", PeerOwnerDID: string(peer()),
		DeliveryDeadline: now.Add(48 * time.Hour).UnixMilli(), NextAttemptAt: now.UnixMilli(), Envelope: env,
		EnvelopeDigest: envelope.Digest(env), RetainUntil: now.Add(72 * time.Hour).UnixMilli()}
	r := fixedReceipt(c, record.ReceiptTerminal)
	r.EnvelopeID = uuid.NewString()
	r.ReceivedAt, r.RetainUntil = now.UnixMilli(), now.Add(time.Hour).UnixMilli()
	if err := put(ctx, s, o, orphan, r); err != nil {
		t.Fatal(err)
	}
	legacy := *o
	legacy.EnvelopeID, legacy.MessageID, legacy.BatchID = uuid.NewString(), uuid.NewString(), uuid.NewString()
	lm := newMessage(now)
	lm.MessageID, lm.EnvelopeDigest, lm.DeliveryDeadline = legacy.MessageID, legacy.EnvelopeDigest, legacy.DeliveryDeadline
	lb := &record.Batch{BatchID: legacy.BatchID, MessageID: legacy.MessageID, EnvelopeIDs: []string{legacy.EnvelopeID},
		PeerOwnerDID: legacy.PeerOwnerDID, RelayURL: legacy.RelayURL, DeliveryDeadline: legacy.DeliveryDeadline,
		CreatedAt: now.UnixMilli(), RetainUntil: legacy.RetainUntil}
	if err := put(ctx, s, &legacy, lm); err != nil {
		t.Fatal(err)
	}
	if err := put(ctx, s, lb); err != nil {
		t.Fatal(err)
	}
	temp := filepath.Join(s.Dir(), "outbox", "."+uuid.NewString()+".tmp")
	if err := os.WriteFile(temp, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := now.Add(-3 * time.Hour)
	os.Chtimes(temp, old, old)
}

// bulkExpiry is how many receipts and messages bulkExpirySetup writes: several to a
// maintenance chunk, few enough that the states of every subset stay cheap.
const bulkExpiry = 5

// bulkExpirySetup writes bulkExpiry receipts and bulkExpiry settled messages whose
// retention ends within the hour.
func bulkExpirySetup(t *testing.T, s *store.Store, c *clock) {
	now := c.Now()
	var recs []record.Record
	for range bulkExpiry {
		r := fixedReceipt(c, record.ReceiptTerminal)
		r.EnvelopeID = uuid.NewString()
		r.ReceivedAt, r.RetainUntil = now.UnixMilli(), now.Add(time.Hour).UnixMilli()
		m := &record.Message{MessageID: uuid.NewString(), Status: record.StatusDelivered, PeerOwnerDID: string(peer()),
			RelayURL: "http://127.0.0.1:9/", EnvelopeDigest: envelope.Digest([]byte("m")), DeliveryDeadline: now.Add(time.Minute).UnixMilli(),
			CreatedAt: now.UnixMilli(), UpdatedAt: now.UnixMilli(), RetainUntil: now.Add(time.Hour).UnixMilli()}
		recs = append(recs, r, m)
	}
	if err := put(context.Background(), s, recs...); err != nil {
		t.Fatal(err)
	}
}

// report logs how many states an exploration of workload name covered, fails t with
// its first ten violations, and returns the state count.
func report(t *testing.T, name string, res result) int {
	t.Helper()
	t.Logf("%s: %d crash states explored", name, res.states)
	for i, v := range res.violations {
		if i == 10 {
			t.Errorf("… and %d more", len(res.violations)-10)
			break
		}
		t.Error(v)
	}
	return res.states
}

func TestCrashStates(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	total := 0
	for _, w := range workloads() {
		t.Run(w.name, func(t *testing.T) {
			total += report(t, w.name, explore(t, w, nil))
		})
	}
	t.Logf("%d crash states explored in all", total)
	if total < 1000 {
		t.Errorf("only %d crash states explored, want at least 1,000", total)
	}
}

// The test of the test: a write path without the directory fsync, or without the
// file fsync, must be caught — also in the compaction of .generation, and, without the
// file fsync, in the making of .lock (an empty .lock after a power cut).
func TestCrashExplorerCatchesWeakenedProtocol(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	single := workloads()[0]
	enq := workloads()[2]
	enq1 := workloads()[3]
	compact := workloads()[len(workloads())-1]
	if compact.name != "generation-compaction" || enq.name != "enqueue-3-envelopes" || enq1.name != "enqueue-1-envelope" {
		t.Fatalf("the workloads are not in the order this test expects: %s, %s, %s", enq.name, enq1.name, compact.name)
	}
	i := slices.IndexFunc(workloads(), func(w workload) bool { return w.name == "lock-acquire-release" })
	if i < 0 {
		t.Fatal("no lock-acquire-release workload")
	}
	lock := workloads()[i]
	for _, c := range []struct {
		name   string
		weaken func(*fsx.Faulty)
	}{
		{"no-directory-fsync", func(f *fsx.Faulty) { f.DropSyncDir = true }},
		{"no-file-fsync", func(f *fsx.Faulty) { f.DropSync = true }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ws := []workload{single, enq, enq1, compact}
			if c.name == "no-file-fsync" {
				// Without the directory fsync a .lock may vanish, which is harmless.
				ws = append(ws, lock)
			}
			for _, w := range ws {
				res := explore(t, w, c.weaken)
				if len(res.violations) == 0 {
					t.Errorf("%s: %d states explored and no violation found: the explorer is too weak", w.name, res.states)
				} else if w.name == compact.name && c.name == "no-file-fsync" && !slices.ContainsFunc(res.violations, func(v string) bool {
					return strings.Contains(v, ".generation has no whole header")
				}) {
					t.Errorf("%s: without the fsync of the compacted file no state lost its header: the explorer misses it", w.name)
				} else if w.name == lock.name && !slices.ContainsFunc(res.violations, func(v string) bool {
					return strings.Contains(v, ".lock is empty")
				}) {
					t.Errorf("%s: without the fsync of the lock file's temp no state has an empty .lock: the explorer misses it", w.name)
				} else {
					t.Logf("%s: caught (%d violations), e.g. %s", w.name, len(res.violations), res.violations[0])
				}
			}
		})
	}
}
