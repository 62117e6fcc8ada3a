package crashtest_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/crashtest"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

var (
	relaySeed = [32]byte{7: 11, 31: 3}
	carolSeed = [32]byte{7: 13, 31: 4}
)

func relayIdentity(t testing.TB) *identity.Identity {
	id, err := identity.FromSeed(relaySeed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func carol() identity.DID {
	return identity.FormatDID(ed25519.NewKeyFromSeed(carolSeed[:]).Public().(ed25519.PublicKey))
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// relayAck is an envelope whose receipt the relay returned to its caller: after the
// first `at` recorded calls (0: before the snapshot).
type relayAck struct {
	at      int
	id      string
	receipt []byte
}

// relayWorkload runs a relay operation on r (over the recording file systems) and
// calls ack for every envelope whose receipt it returned. offered lists every
// envelope the workload sends (setup included); after a crash they are all sent
// again, as one batch if batch is set.
type relayWorkload struct {
	name    string
	batch   bool
	offered [][]byte
	setup   func(t *testing.T, r *relay.Relay, ack func(id string, receipt []byte))
	run     func(t *testing.T, r *relay.Relay, ack func(id string, receipt []byte))
}

// relayWorkloads: a single accept, and a batch of four new envelopes for two
// recipients, one repeated in the batch, and one the relay accepted before. Each
// setup accepts an envelope first, so the relay's store directory exists (its
// creation is the store's, explored there); each run creates one recipient's inbox
// directory.
func relayWorkloads(t *testing.T, now time.Time) []relayWorkload {
	msg := func(to identity.DID) []byte {
		_, data, err := envelope.NewMessage(owner(t), to, uuid.NewString(), []byte("hello"), now.Add(72*time.Hour), now)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	accept := func(t *testing.T, r *relay.Relay, data []byte, ack func(string, []byte)) {
		receipt, err := r.Accept(context.Background(), data)
		if err != nil {
			t.Fatal(err)
		}
		env, _ := envelope.Parse(data)
		ack(env.ID(), receipt)
	}
	earlier, single := msg(carol()), msg(peer())
	held := msg(peer())
	news := [][]byte{msg(peer()), msg(peer()), msg(carol()), msg(peer())}
	batch := [][]byte{news[0], held, news[1], news[2], news[0], news[3]}
	return []relayWorkload{
		{name: "relay-accept", offered: [][]byte{earlier, single}, setup: func(t *testing.T, r *relay.Relay, ack func(string, []byte)) {
			accept(t, r, earlier, ack)
		}, run: func(t *testing.T, r *relay.Relay, ack func(string, []byte)) {
			accept(t, r, single, ack)
		}},
		{name: "relay-accept-batch", batch: true, offered: batch, setup: func(t *testing.T, r *relay.Relay, ack func(string, []byte)) {
			accept(t, r, held, ack)
		}, run: func(t *testing.T, r *relay.Relay, ack func(string, []byte)) {
			results, err := r.AcceptBatch(context.Background(), batch)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"accepted", "duplicate", "accepted", "accepted", "duplicate", "accepted"}
			for i, res := range results {
				if res.Outcome != want[i] {
					t.Fatalf("batch answer %d: %+v, want %s", i, res, want[i])
				}
			}
			for i, res := range results {
				env, _ := envelope.Parse(batch[i])
				ack(env.ID(), res.Receipt)
			}
		}},
	}
}

// homeRecorder records the calls of every file system a relay wraps (its store's and
// its inbox directory's) in one log, with paths relative to the relay's home, so one
// snapshot of the home and one exploration cover both trees and their order.
type homeRecorder struct {
	home   string
	faulty *fsx.Faulty
	// Test switches that weaken the inbox's write protocol (the store's stays whole).
	dropInboxSyncDir, dropInboxSync bool
}

func newHomeRecorder(home string) *homeRecorder {
	return &homeRecorder{home: home, faulty: fsx.NewFaulty(fsx.NewOS(home))}
}

// wrap is the relay's WrapFS: inner is rooted somewhere under the home; its calls
// go, prefixed, through the one recorder.
func (h *homeRecorder) wrap(inner fsx.FS) fsx.FS {
	rel, err := filepath.Rel(h.home, inner.Root())
	if err != nil || !filepath.IsLocal(rel) {
		panic(fmt.Sprintf("crashtest: %s is not under the relay home %s", inner.Root(), h.home))
	}
	rel = filepath.ToSlash(rel)
	return &underHome{h: h, prefix: rel, root: inner.Root(), inbox: strings.HasPrefix(rel, dataroot.RelayDir+"/")}
}

// underHome is one wrapped file system: names are prefixed and passed to the
// recorder.
type underHome struct {
	h      *homeRecorder
	prefix string
	root   string
	inbox  bool
}

func (u *underHome) p(name string) string { return path.Join(u.prefix, name) }

func (u *underHome) Root() string { return u.root }

func (u *underHome) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	f, err := u.h.faulty.OpenFile(u.p(name), flag, perm)
	if err == nil && u.inbox && u.h.dropInboxSync {
		f = noSyncFile{f}
	}
	return f, err
}

func (u *underHome) Lstat(name string) (fsx.Info, error)  { return u.h.faulty.Lstat(u.p(name)) }
func (u *underHome) Mkdir(name string, perm uint32) error { return u.h.faulty.Mkdir(u.p(name), perm) }
func (u *underHome) Rename(oldname, newname string) error {
	return u.h.faulty.Rename(u.p(oldname), u.p(newname))
}
func (u *underHome) Link(oldname, newname string) error {
	return u.h.faulty.Link(u.p(oldname), u.p(newname))
}
func (u *underHome) Remove(name string) error    { return u.h.faulty.Remove(u.p(name)) }
func (u *underHome) RemoveDir(name string) error { return u.h.faulty.RemoveDir(u.p(name)) }
func (u *underHome) ReadDir(name string) ([]fsx.DirEntry, error) {
	return u.h.faulty.ReadDir(u.p(name))
}

func (u *underHome) SyncDir(name string) error {
	if u.inbox && u.h.dropInboxSyncDir {
		return nil
	}
	return u.h.faulty.SyncDir(u.p(name))
}

// noSyncFile drops fsync: unrecorded, so the explorer treats the data as never durable.
type noSyncFile struct{ fsx.File }

func (noSyncFile) Sync() error { return nil }

// exploreRelay runs w on a relay whose home is one recorded tree, explores the
// crash states of that tree and checks checkRelayState on each (if untilViolation,
// from the last state back to the first with a violation: a weakened protocol needs
// only one, and it shows after the acknowledgements).
func exploreRelay(t *testing.T, w relayWorkload, now time.Time, weaken func(*homeRecorder), untilViolation bool) result {
	t.Helper()
	home := t.TempDir()
	open := func(dir string, wrap func(fsx.FS) fsx.FS) (*relay.Relay, error) {
		return relay.New(relay.Options{Identity: relayIdentity(t), Home: dir, Now: func() time.Time { return now },
			Logger: quietLog, WrapFS: wrap})
	}
	var acks []relayAck
	r, err := open(home, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w.setup != nil {
		w.setup(t, r, func(id string, receipt []byte) { acks = append(acks, relayAck{id: id, receipt: receipt}) })
	}
	r.Close()
	initial, err := crashtest.Snapshot(home)
	if err != nil {
		t.Fatal(err)
	}
	rec := newHomeRecorder(home)
	if weaken != nil {
		weaken(rec)
	}
	r, err = open(home, rec.wrap)
	if err != nil {
		t.Fatal(err)
	}
	w.run(t, r, func(id string, receipt []byte) {
		acks = append(acks, relayAck{at: rec.faulty.Count(), id: id, receipt: receipt})
	})
	r.Close()
	log := rec.faulty.Log()
	var bounds []int
	for _, a := range acks {
		bounds = append(bounds, a.at)
	}
	states, err := crashtest.Explore(initial, log, bounds...)
	if err != nil {
		t.Fatal(err)
	}
	res := result{states: len(states)}
	order := slices.Collect(func(yield func(int) bool) {
		for i := range states {
			yield(i)
		}
	})
	if untilViolation {
		slices.Reverse(order) // the states after the acknowledgements first
	}
	for _, i := range order {
		st := states[i]
		dir := t.TempDir()
		if err := st.Tree.Materialize(dir); err != nil {
			t.Fatal(err)
		}
		ageTree(t, dir)
		for _, v := range checkRelayState(t, dir, w, st, acks, func() (*relay.Relay, error) { return open(dir, nil) }) {
			res.violations = append(res.violations, fmt.Sprintf("state %d (%s): %s", i, st.Desc, v))
		}
		os.RemoveAll(dir)
		if untilViolation && len(res.violations) > 0 {
			break
		}
	}
	return res
}

// checkRelayState reopens the relay on a crash state of its home and checks: its store
// has no problem fsck cannot repair; the relay opens; its inboxes serve only complete
// envelopes it was offered, each once; every acknowledged envelope is in its
// recipient's inbox with its receipt record, which reproduces the receipt returned;
// and every offered envelope sent again is accepted or answered as a duplicate — with
// the same receipt bytes if it was acknowledged — and is then in its inbox once.
func checkRelayState(t *testing.T, home string, w relayWorkload, st crashtest.State, acks []relayAck, open func() (*relay.Relay, error)) []string {
	var bad []string
	rid := relayIdentity(t)
	rep, err := fsck.Check(context.Background(), dataroot.StoreDir(home, string(rid.DID())), fsck.Options{Owner: rid.DID()})
	if err != nil {
		return []string{fmt.Sprintf("fsck of the relay's store: %v", err)}
	}
	for _, f := range rep.Findings {
		if f.Severity == fsck.Problem && !f.Repairable {
			bad = append(bad, fmt.Sprintf("fsck: unrepairable %s %s: %s", f.Code, f.Path, f.Explanation))
		}
	}
	r, err := open()
	if err != nil {
		return append(bad, fmt.Sprintf("the relay does not reopen: %v", err))
	}
	defer r.Close()
	offered := map[string][]byte{} // envelope id → wire bytes
	recipients := map[identity.DID]bool{}
	recipientOf := map[string]identity.DID{}
	for _, data := range w.offered {
		env, err := envelope.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		offered[env.ID()] = data
		recipients[env.Recipient()] = true
		recipientOf[env.ID()] = env.Recipient()
	}
	// inboxes lists what the relay serves (ids by recipient, in inbox order),
	// checking every entry is whole.
	inboxes := func(when string) (map[string]int, map[identity.DID][]string) {
		seen := map[string]int{}
		order := map[identity.DID][]string{}
		for did := range recipients {
			page, err := r.Fetch(context.Background(), did, "", relayproto.MaxFetchLimit)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s: fetch: %v", when, err))
				continue
			}
			for _, e := range page.Envelopes {
				seen[e.EnvelopeID]++
				order[did] = append(order[did], e.EnvelopeID)
				env, err := envelope.Parse(e.Envelope)
				switch {
				case err != nil:
					bad = append(bad, fmt.Sprintf("%s: inbox serves an invalid envelope %s: %v", when, e.EnvelopeID, err))
				case !bytes.Equal(e.Envelope, offered[e.EnvelopeID]) || env.Digest() != e.EnvelopeDigest:
					bad = append(bad, fmt.Sprintf("%s: inbox serves %s, which is not the envelope offered", when, e.EnvelopeID))
				case env.Recipient() != did:
					bad = append(bad, fmt.Sprintf("%s: %s served to another recipient", when, e.EnvelopeID))
				}
			}
		}
		for id, n := range seen {
			if n > 1 {
				bad = append(bad, fmt.Sprintf("%s: %s served %d times", when, id, n))
			}
		}
		return seen, order
	}
	seen, order := inboxes("after the crash")
	s, err := store.Open(rid.Signer(), store.Options{Home: home})
	if err != nil {
		return append(bad, fmt.Sprintf("the relay's store does not open: %v", err))
	}
	acked := map[string][]byte{}
	var ackOrder []string
	for _, a := range acks {
		if a.at > st.Prefix {
			continue
		}
		if acked[a.id] == nil {
			ackOrder = append(ackOrder, a.id)
		}
		acked[a.id] = a.receipt
		if seen[a.id] == 0 {
			bad = append(bad, fmt.Sprintf("acknowledged %s not in its inbox", a.id))
		}
		got, err := envelope.ParseRelayReceipt(a.receipt)
		if err != nil || got.EnvelopeID != a.id || got.RelayDID != rid.DID() {
			bad = append(bad, fmt.Sprintf("the receipt returned for %s does not verify: %v", a.id, err))
			continue
		}
		rec, err := store.GetAs[*record.Receipt](s, record.ReceiptID(a.id))
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("acknowledged %s: receipt record unreadable: %v", a.id, err))
		case rec == nil:
			bad = append(bad, fmt.Sprintf("acknowledged %s: receipt record lost", a.id))
		case rec.EnvelopeDigest != got.EnvelopeDigest || rec.ReceivedAt != got.ReceivedAt.UnixMilli() || rec.State != record.ReceiptPersisted:
			bad = append(bad, fmt.Sprintf("acknowledged %s: receipt record %s does not match its receipt", a.id, summary(rec)))
		}
	}
	// De-duplication holds: the same envelopes again.
	receipts := map[string][]byte{}
	if w.batch {
		results, err := r.AcceptBatch(context.Background(), w.offered)
		if err != nil {
			return append(bad, fmt.Sprintf("the batch sent again: %v", err))
		}
		for i, res := range results {
			env, _ := envelope.Parse(w.offered[i])
			if res.Outcome == relayproto.BatchRefused {
				bad = append(bad, fmt.Sprintf("%s sent again: refused %d %s", env.ID(), res.Status, res.Code))
				continue
			}
			if prev, ok := receipts[env.ID()]; ok && !bytes.Equal(prev, res.Receipt) {
				bad = append(bad, fmt.Sprintf("%s sent twice in the batch again: two receipts", env.ID()))
			}
			receipts[env.ID()] = res.Receipt
		}
	} else {
		for id, data := range offered {
			receipt, err := r.Accept(context.Background(), data)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s sent again: %v", id, err))
				continue
			}
			receipts[id] = receipt
		}
	}
	for id, want := range acked {
		if got, ok := receipts[id]; ok && !bytes.Equal(got, want) {
			bad = append(bad, fmt.Sprintf("acknowledged %s sent again: another receipt", id))
		}
	}
	// The acknowledged envelopes of an inbox are in it in the order they were
	// acknowledged (a batch's in the batch's order).
	for did, ids := range order {
		var got, want []string
		for _, id := range ids {
			if acked[id] != nil {
				got = append(got, id)
			}
		}
		for _, id := range ackOrder {
			if recipientOf[id] == did {
				want = append(want, id)
			}
		}
		if !slices.Equal(got, want) {
			bad = append(bad, fmt.Sprintf("inbox order of the acknowledged envelopes %v, want %v", got, want))
		}
	}
	after, _ := inboxes("after sending again")
	for id := range offered {
		if after[id] != 1 {
			bad = append(bad, fmt.Sprintf("after sending again: %s in its inbox %d times", id, after[id]))
		}
	}
	return bad
}

func TestRelayCrashStates(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	now := time.Now()
	total := 0
	for _, w := range relayWorkloads(t, now) {
		t.Run(w.name, func(t *testing.T) {
			total += report(t, w.name, exploreRelay(t, w, now, nil, false))
		})
	}
	t.Logf("%d relay crash states explored in all", total)
	if total < 100 {
		t.Errorf("only %d relay crash states explored, want at least 100", total)
	}
}

// The test of the test: an inbox written without its directory fsync, or without
// the file fsync, must be caught in both the single and the batch accept.
func TestRelayCrashExplorerCatchesWeakenedProtocol(t *testing.T) {
	t.Parallel() // sequential inside; independent of the other explorations
	now := time.Now()
	for _, c := range []struct {
		name   string
		weaken func(*homeRecorder)
	}{
		{"no-inbox-directory-fsync", func(h *homeRecorder) { h.dropInboxSyncDir = true }},
		{"no-inbox-file-fsync", func(h *homeRecorder) { h.dropInboxSync = true }},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, w := range relayWorkloads(t, now) {
				res := exploreRelay(t, w, now, c.weaken, true)
				if len(res.violations) == 0 {
					t.Errorf("%s: %d states explored and no violation found: the explorer is too weak", w.name, res.states)
				} else {
					t.Logf("%s: caught, e.g. %s", w.name, res.violations[0])
				}
			}
		})
	}
}
