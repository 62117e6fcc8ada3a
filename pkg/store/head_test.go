package store_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// signHead signs a head of the test owner (or of signer if set).
func signHead(t testing.TB, format int, seq int64) []byte {
	t.Helper()
	id := ownerIdentity(t)
	data, err := envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: format, Seq: seq, Time: time.UnixMilli(1_700_000_000_000)})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// strangerHead is a valid head of another identity.
func strangerHead(t testing.TB, seq int64) []byte {
	t.Helper()
	seed := testSeed
	seed[0] = 77
	key := ed25519.NewKeyFromSeed(seed[:])
	data, err := envelope.SignStoreHead(key, envelope.StoreHead{Owner: identity.FormatDID(key.Public().(ed25519.PublicKey)),
		Format: store.FormatVersion, Seq: seq, Time: time.UnixMilli(1_700_000_000_000)})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// treeSnapshot describes every name under root (type, mode, links, inode, size,
// mtime, ctime and a digest of the contents), so that two snapshots are equal only
// if nothing changed.
func treeSnapshot(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s mode=%o nlink=%d ino=%d size=%d mtime=%d ctime=%d", strings.TrimPrefix(p, root), st.Mode, st.Nlink, st.Ino, st.Size,
			st.Mtim.Nano(), st.Ctim.Nano())
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" sha=%x", sha256.Sum256(data))
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func headSeq(t testing.TB, s *store.Store) int64 {
	t.Helper()
	h, _ := s.Head()
	if h == nil {
		return 0
	}
	return h.Seq
}

// diskSeq parses the head in file p (0 if absent).
func diskSeq(t testing.TB, p string) int64 {
	t.Helper()
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	h, err := envelope.ParseStoreHead(data)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return h.Seq
}

func writeHead(t testing.TB, s *store.Store, force bool) *envelope.StoreHead {
	t.Helper()
	h, _, err := s.WriteHead(context.Background(), force)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestWriteHeadOnlyWhenDirty(t *testing.T) {
	home := t.TempDir()
	s := openStore(t, store.Options{Home: home})
	if h, data := s.Head(); h != nil || data != nil {
		t.Fatalf("fresh store has head %+v", h)
	}
	if h := writeHead(t, s, false); h != nil {
		t.Fatalf("WriteHead on a store without commits wrote %+v", h)
	}
	if _, err := os.Lstat(filepath.Join(s.Dir(), store.HeadFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a clean WriteHead made .head: %v", err)
	}
	enqueue(t, s, 2)
	h := writeHead(t, s, false)
	if h == nil || h.Seq != 1 || h.Format != store.FormatVersion || h.Owner != ownerIdentity(t).DID() {
		t.Fatalf("WriteHead after a commit: %+v", h)
	}
	headPath := filepath.Join(s.Dir(), store.HeadFile)
	before := treeSnapshot(t, home)
	if h := writeHead(t, s, false); h.Seq != 1 {
		t.Fatalf("WriteHead with nothing committed since: seq %d", h.Seq)
	}
	if after := treeSnapshot(t, home); !slices.Equal(before, after) {
		t.Fatalf("a clean WriteHead changed the tree:\n%v\n%v", before, after)
	}
	// Each entry point of the commit engine dirties the head.
	commits := map[string]func() error{
		"Transaction": func() error {
			return s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(receiptRecord(t)) })
		},
		"PreparedTransaction": func() error {
			return s.PreparedTransaction(context.Background(), func(tx *store.Tx) error { return tx.Put(receiptRecord(t)) })
		},
		"Enqueue": func() error { _, err := s.Enqueue(context.Background(), sendRequest(t, 1)); return err },
		"BeginOperation": func() error {
			_, err := s.BeginOperation(context.Background(), uuid.NewString(), []byte("req"))
			return err
		},
	}
	seq := int64(1)
	for _, name := range slices.Sorted(maps.Keys(commits)) {
		if err := commits[name](); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		seq++
		if h := writeHead(t, s, false); h.Seq != seq {
			t.Fatalf("WriteHead after %s: seq %d, want %d", name, h.Seq, seq)
		}
	}
	// A transaction that writes nothing does not.
	if err := s.Transaction(context.Background(), func(tx *store.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.PreparedTransaction(context.Background(), func(tx *store.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if h := writeHead(t, s, false); h.Seq != seq {
		t.Fatalf("WriteHead after empty transactions: seq %d, want %d", h.Seq, seq)
	}
	// force writes anyway.
	if h := writeHead(t, s, true); h.Seq != seq+1 {
		t.Fatalf("forced WriteHead: seq %d, want %d", h.Seq, seq+1)
	}
	// .head and the witness: the same bytes, private.
	_, data := s.Head()
	witness := dataroot.WitnessFile(home, string(ownerIdentity(t).DID()))
	for _, p := range []string{headPath, witness} {
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s holds %q (%v), want the head %q", p, got, err, data)
		}
		info, _ := os.Lstat(p)
		if info.Mode() != 0o600 {
			t.Fatalf("%s mode %v", p, info.Mode())
		}
	}
	if info, _ := os.Lstat(filepath.Dir(witness)); info.Mode() != fs.ModeDir|0o700 {
		t.Fatalf("witness dir mode %v", info.Mode())
	}
	// A reopened store knows the head and is not rolled back.
	s2 := openStore(t, store.Options{Home: home})
	if got, gotData := s2.Head(); got == nil || got.Seq != seq+1 || !bytes.Equal(gotData, data) {
		t.Fatalf("reopened head %+v", got)
	}
	if err := s2.RolledBack(); err != nil {
		t.Fatal(err)
	}
}

// receiptRecord is a fresh valid receipt record.
func receiptRecord(t testing.TB) record.Record {
	t.Helper()
	now := time.Now().UnixMilli()
	return &record.Receipt{EnvelopeID: uuid.NewString(), SenderDID: string(peerDID(t)), EnvelopeDigest: envelope.Digest([]byte("in")),
		State: record.ReceiptPersisted, ReceivedAt: now, RetainUntil: now + 3_600_000}
}

func TestMaintainDirtiesTheHead(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := openStore(t, store.Options{Now: clock})
	mustPut(t, s, receiptRecord(t))
	writeHead(t, s, false)
	mu.Lock()
	now = now.Add(30 * 24 * time.Hour) // past every retention: maintenance removes the receipt
	mu.Unlock()
	rep, err := s.Maintain(context.Background())
	if err != nil || rep.ExpiredRemoved == 0 {
		t.Fatalf("Maintain: %+v %v", rep, err)
	}
	if h := writeHead(t, s, false); h.Seq != 2 {
		t.Fatalf("WriteHead after a maintenance removal: seq %d, want 2", h.Seq)
	}
}

func TestOpenRefusesNewerFormatChangingNothing(t *testing.T) {
	home := t.TempDir()
	s := openStore(t, store.Options{Home: home})
	enqueue(t, s, 2)
	writeHead(t, s, false)
	if err := os.WriteFile(filepath.Join(s.Dir(), store.HeadFile), signHead(t, store.FormatVersion+1, 9), 0o600); err != nil {
		t.Fatal(err)
	}
	before := treeSnapshot(t, home)
	for _, opts := range []store.Options{{Home: home}, {Dir: s.Dir()}} {
		_, err := store.Open(ownerIdentity(t).Signer(), opts)
		wantCode(t, err, errcode.StoreFormatNewer)
		hint := errcode.HintOf(err)
		want := fmt.Sprintf("this sealbridge reads format %d; the store at %s was written by format %d: use a newer sealbridge", store.FormatVersion, s.Dir(), store.FormatVersion+1)
		if hint != want {
			t.Fatalf("hint %q, want %q", hint, want)
		}
	}
	// A Store opened before the newer binary wrote refuses to write a head over it.
	_, _, err := s.WriteHead(context.Background(), true)
	wantCode(t, err, errcode.StoreFormatNewer)
	after := treeSnapshot(t, home)
	// The lock file is the one thing WriteHead may touch (it took the lock to look).
	strip := func(lines []string) []string {
		return slices.DeleteFunc(slices.Clone(lines), func(l string) bool { return strings.Contains(l, "/.lock") })
	}
	if !slices.Equal(strip(before), strip(after)) {
		t.Fatalf("the tree changed:\n%s\n---\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
}

func TestOpenWithoutWriteTouchesNothing(t *testing.T) {
	home := t.TempDir()
	s := openStore(t, store.Options{Home: home})
	enqueue(t, s, 1)
	writeHead(t, s, false)
	before := treeSnapshot(t, home)
	openStore(t, store.Options{Home: home})
	if after := treeSnapshot(t, home); !slices.Equal(before, after) {
		t.Fatalf("Open changed the tree")
	}
}

func TestOpenRefusesInvalidHead(t *testing.T) {
	valid := signHead(t, store.FormatVersion, 3)
	cases := map[string]func(t *testing.T, p string){
		"stranger": func(t *testing.T, p string) { os.WriteFile(p, strangerHead(t, 3), 0o600) },
		"garbage":  func(t *testing.T, p string) { os.WriteFile(p, []byte("not a head"), 0o600) },
		"newline":  func(t *testing.T, p string) { os.WriteFile(p, append(slices.Clone(valid), '\n'), 0o600) },
		"flipped": func(t *testing.T, p string) {
			b := slices.Clone(valid)
			b[len(b)-5] ^= 1
			os.WriteFile(p, b, 0o600)
		},
		"too large": func(t *testing.T, p string) {
			os.WriteFile(p, bytes.Repeat([]byte("a"), envelope.MaxHeadSize+1), 0o600)
		},
		"mode 0644": func(t *testing.T, p string) { os.WriteFile(p, valid, 0o600); os.Chmod(p, 0o644) },
		"hard link": func(t *testing.T, p string) { os.WriteFile(p, valid, 0o600); os.Link(p, p+"-link") },
		"symlink": func(t *testing.T, p string) {
			os.WriteFile(p+"-target", valid, 0o600)
			os.Symlink(filepath.Base(p)+"-target", p)
		},
		"directory": func(t *testing.T, p string) { os.Mkdir(p, 0o700) },
		"fifo":      func(t *testing.T, p string) { syscall.Mkfifo(p, 0o600) },
	}
	for name, plant := range cases {
		t.Run(name, func(t *testing.T) {
			s := openStore(t, store.Options{})
			enqueue(t, s, 1)
			plant(t, filepath.Join(s.Dir(), store.HeadFile))
			_, err := store.Open(ownerIdentity(t).Signer(), store.Options{Dir: s.Dir()})
			wantCode(t, err, errcode.OutboxStoreInvalid)
		})
	}
}

func TestOpenRefusesInvalidWitness(t *testing.T) {
	for name, data := range map[string][]byte{"stranger": strangerHead(t, 3), "garbage": []byte("x")} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			wf := filepath.Join(dir, "w", "h.head")
			os.Mkdir(filepath.Dir(wf), 0o700)
			os.WriteFile(wf, data, 0o600)
			_, err := store.Open(ownerIdentity(t).Signer(), store.Options{Dir: filepath.Join(dir, "s"), WitnessFile: wf})
			wantCode(t, err, errcode.OutboxStoreInvalid)
		})
	}
}

// copyTree copies the directory src to dst (which must not exist), keeping modes.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Mkdir(to, info.Mode().Perm())
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// restoredStore makes a store, copies its directory at head 1, commits and writes
// head 2, then puts the copy back in place: the store is behind its witness.
func restoredStore(t *testing.T) (home string, acked store.SendRequest, s *store.Store) {
	t.Helper()
	home = t.TempDir()
	s = openStore(t, store.Options{Home: home})
	acked, _ = enqueue(t, s, 1)
	writeHead(t, s, false)
	backup := filepath.Join(t.TempDir(), "copy")
	copyTree(t, s.Dir(), backup)
	enqueue(t, s, 1)
	if h := writeHead(t, s, false); h.Seq != 2 {
		t.Fatalf("seq %d", h.Seq)
	}
	if err := os.RemoveAll(s.Dir()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, s.Dir()); err != nil {
		t.Fatal(err)
	}
	return home, acked, openStore(t, store.Options{Home: home})
}

func TestRestoredStoreIsRolledBackAndRefusesEveryWrite(t *testing.T) {
	home, acked, s := restoredStore(t)
	err := s.RolledBack()
	wantCode(t, err, errcode.StoreRolledBack)
	witness := dataroot.WitnessFile(home, string(ownerIdentity(t).DID()))
	for _, want := range []string{"seq 1", "seq 2", witness} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %q", err, want)
		}
	}
	if hint := errcode.HintOf(err); !strings.Contains(hint, "sealbridge-fsck --reconcile --identity") {
		t.Fatalf("hint %q", hint)
	}
	before := treeSnapshot(t, home)
	ctx := context.Background()
	writes := map[string]func() error{
		"Transaction": func() error {
			return s.Transaction(ctx, func(tx *store.Tx) error { return tx.Put(receiptRecord(t)) })
		},
		"PreparedTransaction": func() error {
			return s.PreparedTransaction(ctx, func(tx *store.Tx) error { return tx.Put(receiptRecord(t)) })
		},
		"Update": func() error {
			return s.Update(ctx, record.KindMessages, acked.MessageID, func(cur record.Record) (record.Record, error) { return cur, nil })
		},
		"Enqueue":        func() error { _, err := s.Enqueue(ctx, sendRequest(t, 1)); return err },
		"BeginOperation": func() error { _, err := s.BeginOperation(ctx, "k", []byte("r")); return err },
		"CreateBlob":     func() error { _, err := s.CreateBlob(); return err },
		"PartialBlob":    func() error { _, err := s.PartialBlob(uuid.NewString()); return err },
		"Maintain":       func() error { _, err := s.Maintain(ctx); return err },
		"WriteHead":      func() error { _, _, err := s.WriteHead(ctx, false); return err },
		"WriteHead(force)": func() error {
			_, _, err := s.WriteHead(ctx, true)
			return err
		},
	}
	for name, write := range writes {
		if err := write(); !errors.Is(err, errcode.StoreRolledBack) {
			t.Errorf("%s while rolled back: %v, want STORE_ROLLED_BACK", name, err)
		}
	}
	if after := treeSnapshot(t, home); !slices.Equal(before, after) {
		t.Fatalf("refused writes changed the tree:\n%s\n---\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
	// Reads work.
	if m, err := s.Message(acked.MessageID); err != nil || m == nil {
		t.Fatalf("Message while rolled back: %v %v", m, err)
	}
	if ids, err := s.List(record.KindMessages); err != nil || len(ids) != 1 {
		t.Fatalf("List while rolled back: %v %v", ids, err)
	}
}

func TestWitnessAheadRollsBackAndPersists(t *testing.T) {
	home := t.TempDir()
	s := openStore(t, store.Options{Home: home})
	enqueue(t, s, 1)
	writeHead(t, s, false) // seq 1
	enqueue(t, s, 1)
	writeHead(t, s, false) // seq 2
	witness := dataroot.WitnessFile(home, string(ownerIdentity(t).DID()))

	// Not above: nothing happens.
	for _, seq := range []int64{1, 2} {
		if err := s.Witness(signHead(t, store.FormatVersion, seq), "https://relay.example"); err != nil {
			t.Fatalf("Witness(seq %d): %v", seq, err)
		}
	}
	// Not the owner's, or not a head: invalid, nothing happens.
	wantCode(t, s.Witness(strangerHead(t, 9), "https://relay.example"), errcode.OutboxStoreInvalid)
	wantCode(t, s.Witness([]byte("{}"), "https://relay.example"), errcode.OutboxStoreInvalid)
	if err := s.RolledBack(); err != nil {
		t.Fatal(err)
	}
	// A relay witnessed seq 5: rolled back, and the witness holds it.
	relayHead := signHead(t, store.FormatVersion, 5)
	err := s.Witness(relayHead, "https://relay.example")
	wantCode(t, err, errcode.StoreRolledBack)
	for _, want := range []string{"seq 2", "seq 5", "https://relay.example"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %q", err, want)
		}
	}
	wantCode(t, s.RolledBack(), errcode.StoreRolledBack)
	if got, _ := os.ReadFile(witness); !bytes.Equal(got, relayHead) {
		t.Fatalf("witness %q, want the relay's head", got)
	}
	// A lower one later does not lower the witness.
	wantCode(t, s.Witness(signHead(t, store.FormatVersion, 4), "https://other.example"), errcode.StoreRolledBack)
	if got, _ := os.ReadFile(witness); !bytes.Equal(got, relayHead) {
		t.Fatalf("witness lowered to %q", got)
	}
	_, err = s.Enqueue(context.Background(), sendRequest(t, 1))
	wantCode(t, err, errcode.StoreRolledBack)
	// A Store opened later is rolled back too.
	s2 := openStore(t, store.Options{Home: home})
	wantCode(t, s2.RolledBack(), errcode.StoreRolledBack)

	// Reconcile: fn's error writes nothing of the head.
	headBefore, _ := os.ReadFile(filepath.Join(s.Dir(), store.HeadFile))
	boom := errors.New("boom")
	if err := s2.Reconcile(context.Background(), 5, func(tx *store.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Reconcile with a failing fn: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(s.Dir(), store.HeadFile)); !bytes.Equal(got, headBefore) {
		t.Fatal("a failed Reconcile wrote the head")
	}
	wantCode(t, s2.RolledBack(), errcode.StoreRolledBack)
	// Reconcile with fn bringing a record forward.
	rec := receiptRecord(t)
	if err := s2.Reconcile(context.Background(), 3, func(tx *store.Tx) error { return tx.Put(rec) }); err != nil {
		t.Fatal(err)
	}
	if err := s2.RolledBack(); err != nil {
		t.Fatalf("after Reconcile: %v", err)
	}
	if h, _ := s2.Head(); h == nil || h.Seq != 6 {
		t.Fatalf("head after Reconcile %+v, want seq 6 = max(3, witness 5, head 2)+1", h)
	}
	if diskSeq(t, witness) != 6 || diskSeq(t, filepath.Join(s.Dir(), store.HeadFile)) != 6 {
		t.Fatal("Reconcile did not write the head and the witness")
	}
	if got, _ := store.GetAs[*record.Receipt](s2, rec.RecordID()); got == nil {
		t.Fatal("Reconcile's fn wrote nothing")
	}
	s3 := openStore(t, store.Options{Home: home})
	if err := s3.RolledBack(); err != nil {
		t.Fatal(err)
	}
	enqueue(t, s3, 1)
	if h := writeHead(t, s3, false); h.Seq != 7 {
		t.Fatalf("seq %d after reconcile and a commit", h.Seq)
	}
	// The first Store learns of the reconcile only by reopening; its writes stay
	// refused (its state is in memory).
	wantCode(t, s.RolledBack(), errcode.StoreRolledBack)
}

func TestReconcileOfRestoredStore(t *testing.T) {
	home, _, s := restoredStore(t)
	if err := s.Reconcile(context.Background(), 0, nil); err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Head(); h.Seq != 3 {
		t.Fatalf("seq %d, want 3", h.Seq)
	}
	if err := s.RolledBack(); err != nil {
		t.Fatal(err)
	}
	enqueue(t, s, 1)
	if err := openStore(t, store.Options{Home: home}).RolledBack(); err != nil {
		t.Fatal(err)
	}
}

func TestWriteHeadFindsWitnessAheadUnderTheLock(t *testing.T) {
	// A second process witnessed a relay's head above .head after this Store opened.
	home := t.TempDir()
	s := openStore(t, store.Options{Home: home})
	enqueue(t, s, 1)
	writeHead(t, s, false)
	other := openStore(t, store.Options{Home: home})
	wantCode(t, other.Witness(signHead(t, store.FormatVersion, 8), "relay"), errcode.StoreRolledBack)
	if err := s.RolledBack(); err != nil {
		t.Fatal("s cannot know yet")
	}
	enqueue(t, s, 1)
	_, _, err := s.WriteHead(context.Background(), false)
	wantCode(t, err, errcode.StoreRolledBack)
	wantCode(t, s.RolledBack(), errcode.StoreRolledBack)
	if diskSeq(t, filepath.Join(s.Dir(), store.HeadFile)) != 1 {
		t.Fatal("WriteHead wrote over a witness ahead")
	}
}

func TestWitnessFileOption(t *testing.T) {
	dir := t.TempDir()
	wf := filepath.Join(dir, "wit", "x.head")
	opts := store.Options{Dir: filepath.Join(dir, "store"), WitnessFile: wf}
	s := openStore(t, opts)
	enqueue(t, s, 1)
	writeHead(t, s, false)
	if diskSeq(t, wf) != 1 {
		t.Fatal("no witness at Options.WitnessFile")
	}
	// Without WitnessFile, Options.Dir has no witness: a relay's head rolls back in
	// memory only.
	bare := openStore(t, store.Options{Dir: filepath.Join(dir, "bare")})
	enqueue(t, bare, 1)
	writeHead(t, bare, false)
	wantCode(t, bare.Witness(signHead(t, store.FormatVersion, 4), "relay"), errcode.StoreRolledBack)
	if err := openStore(t, store.Options{Dir: filepath.Join(dir, "bare")}).RolledBack(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Fatalf("unexpected files: %v", ents)
	}
}

func TestHeadFormatIsNeverLowered(t *testing.T) {
	// A head of format 1 (no binary writes one, but the rule holds): the next is
	// FormatVersion.
	s := openStore(t, store.Options{})
	enqueue(t, s, 1)
	if err := os.WriteFile(filepath.Join(s.Dir(), store.HeadFile), signHead(t, 1, 4), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, store.Options{Dir: s.Dir()})
	if h, _ := s2.Head(); h.Format != 1 || h.Seq != 4 {
		t.Fatalf("%+v", h)
	}
	if h := writeHead(t, s2, true); h.Format != store.FormatVersion || h.Seq != 5 {
		t.Fatalf("%+v", h)
	}
}

// TestHeadConcurrentWritersNeverLowerSeq: goroutines of two Stores of one directory
// (two processes' worth: each its own lock side, caches and dirty flag) commit and
// write heads at once, released by one gate, while a watcher reads .head and the
// witness: neither ever goes down, every head written has its own seq, and the last
// seq is the number of heads written.
func TestHeadConcurrentWritersNeverLowerSeq(t *testing.T) {
	home := t.TempDir()
	opts := store.Options{Home: home, LockWait: 30 * time.Second}
	stores := []*store.Store{openStore(t, opts), openStore(t, opts)}
	headPath := filepath.Join(stores[0].Dir(), store.HeadFile)
	witness := dataroot.WitnessFile(home, string(ownerIdentity(t).DID()))
	const writers, heads, committers, commits = 3, 15, 2, 10
	gate := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[int64]bool{}
	errs := make(chan error, 100)
	for _, s := range stores {
		for range writers {
			wg.Go(func() {
				<-gate
				last := int64(0)
				for range heads {
					h, _, err := s.WriteHead(context.Background(), true)
					if err != nil {
						errs <- err
						return
					}
					if h.Seq <= last {
						errs <- fmt.Errorf("WriteHead returned seq %d after %d", h.Seq, last)
					}
					last = h.Seq
					mu.Lock()
					if seen[h.Seq] {
						errs <- fmt.Errorf("seq %d written twice", h.Seq)
					}
					seen[h.Seq] = true
					mu.Unlock()
				}
			})
		}
		for range committers {
			wg.Go(func() {
				<-gate
				for range commits {
					if _, err := s.Enqueue(context.Background(), sendRequest(t, 1)); err != nil {
						errs <- err
						return
					}
					if _, _, err := s.WriteHead(context.Background(), false); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	done := make(chan struct{})
	watched := make(chan int)
	go func() {
		reads := 0
		defer func() { watched <- reads }()
		var lastHead, lastWitness int64
		for {
			select {
			case <-done:
				return
			default:
			}
			for _, w := range []struct {
				p    string
				last *int64
			}{{headPath, &lastHead}, {witness, &lastWitness}} {
				data, err := os.ReadFile(w.p)
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				h, err := envelope.ParseStoreHead(data)
				if err != nil {
					errs <- fmt.Errorf("%s: %v", w.p, err)
					return
				}
				if h.Seq < *w.last {
					errs <- fmt.Errorf("%s went down from %d to %d", w.p, *w.last, h.Seq)
				}
				*w.last = h.Seq
				reads++
			}
		}
	}()
	close(gate)
	wg.Wait()
	close(done)
	if n := <-watched; n == 0 {
		t.Error("the watcher read nothing")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	final := writeHead(t, stores[0], true).Seq
	if want := int64(len(seen)) + 1; final < want {
		t.Fatalf("final seq %d below the %d heads written", final, want)
	}
	if diskSeq(t, witness) != final || diskSeq(t, headPath) != final {
		t.Fatalf("witness %d, head %d, want %d", diskSeq(t, witness), diskSeq(t, headPath), final)
	}
	for _, s := range stores {
		if err := s.RolledBack(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWitnessConcurrent(t *testing.T) {
	home := t.TempDir()
	s := openStore(t, store.Options{Home: home, LockWait: 30 * time.Second})
	enqueue(t, s, 1)
	writeHead(t, s, false)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			<-gate
			err := s.Witness(signHead(t, store.FormatVersion, int64(2+i)), "relay")
			if !errors.Is(err, errcode.StoreRolledBack) {
				t.Errorf("Witness: %v", err)
			}
		})
	}
	close(gate)
	wg.Wait()
	if got := diskSeq(t, dataroot.WitnessFile(home, string(ownerIdentity(t).DID()))); got != 17 {
		t.Fatalf("witness seq %d, want the highest, 17", got)
	}
}

// A head another Store wrote after this Store's last commit counts that commit: this
// Store's next WriteHead writes none (a backup's forced head, then the daemon's
// periodic one, must not raise the seq with no commit between, or restoring the
// backup would look like a rollback). A commit after that head makes it dirty again.
func TestHeadWrittenElsewhereCountsEarlierCommits(t *testing.T) {
	home := t.TempDir()
	opts := store.Options{Home: home}
	daemon, backup := openStore(t, opts), openStore(t, opts)
	ctx := context.Background()
	if _, err := daemon.Enqueue(ctx, sendRequest(t, 1)); err != nil {
		t.Fatal(err)
	}
	forced, _, err := backup.WriteHead(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := daemon.WriteHead(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if h == nil || h.Seq != forced.Seq {
		t.Fatalf("after the other Store's head %d, WriteHead left seq %v", forced.Seq, h)
	}
	if _, err := daemon.Enqueue(ctx, sendRequest(t, 1)); err != nil {
		t.Fatal(err)
	}
	if h, _, err = daemon.WriteHead(ctx, false); err != nil || h.Seq != forced.Seq+1 {
		t.Fatalf("after a later commit: head %v, %v; want seq %d", h, err, forced.Seq+1)
	}
}
