package fsck_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

var ctx = context.Background()

func check(t *testing.T, dir string, opts fsck.Options) *fsck.Report {
	t.Helper()
	rep, err := fsck.Check(ctx, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func repair(t *testing.T, dir string, opts fsck.Options) *fsck.RepairReport {
	t.Helper()
	rr, err := fsck.Repair(ctx, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

// find returns the finding at path with code, or nil.
func find(r *fsck.Report, path string, code fsck.Code) *fsck.Finding {
	for i, f := range r.Findings {
		if f.Path == path && f.Code == code {
			return &r.Findings[i]
		}
	}
	return nil
}

func mustFind(t *testing.T, r *fsck.Report, path string, code fsck.Code) *fsck.Finding {
	t.Helper()
	f := find(r, path, code)
	if f == nil {
		t.Fatalf("no %s at %s in %+v", code, path, r.Findings)
	}
	return f
}

// repairedClean repairs dir and checks that every action was done, nothing is left,
// and a second run finds nothing.
func repairedClean(t *testing.T, dir string) *fsck.RepairReport {
	t.Helper()
	rr := repair(t, dir, fsck.Options{})
	for _, a := range rr.Actions {
		if a.Result != fsck.ResultDone {
			t.Errorf("%s %s: %s (%s)", a.Code, a.Path, a.Result, a.Detail)
		}
	}
	if rr.After.Problems() != 0 {
		t.Fatalf("problems left after repair: %+v", rr.After.Findings)
	}
	if again := repair(t, dir, fsck.Options{}); len(again.Actions) != 0 || again.Before.Problems() != 0 {
		t.Fatalf("second repair not a no-op: %+v", again.Actions)
	}
	return rr
}

func TestCheckValid(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	rep := check(t, dir, fsck.Options{})
	if rep.Records != 12 || rep.Valid != 12 || len(rep.Findings) != 0 || rep.Lock != "absent" ||
		rep.Owner != fsfixtures.OwnerDID() || rep.OwnerSource != fsck.OwnerDirectoryName || rep.Dir != dir {
		t.Fatalf("%+v", rep)
	}
}

// TestCheckWritesNothing records every mutating file-system call of a check: none.
func TestCheckWritesNothing(t *testing.T) {
	for _, name := range []string{"combined", "stale-lock", "live-lock", "symlinked-dir", "wrong-mode"} {
		dir := fsfixtures.Build(t, name)
		faulty := fsx.NewFaulty(fsx.NewOS(dir))
		rep := check(t, dir, fsck.Options{WrapFS: func(fsx.FS) fsx.FS { return faulty }})
		if log := faulty.Log(); len(log) != 0 {
			t.Errorf("%s: a check made %d mutating calls, first %+v", name, len(log), log[0])
		}
		if len(rep.Findings) == 0 {
			t.Errorf("%s: no findings", name)
		}
	}
}

func TestOwner(t *testing.T) {
	t.Run("given", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		rep := check(t, dir, fsck.Options{Owner: fsfixtures.OwnerDID()})
		if rep.OwnerSource != fsck.OwnerGiven || len(rep.Findings) != 0 {
			t.Fatalf("%+v", rep)
		}
	})
	t.Run("given, another identity's directory", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		_, err := fsck.Check(ctx, dir, fsck.Options{Owner: fsfixtures.Foreign().DID()})
		if !errors.Is(err, fsck.ErrOwner) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("given, not a DID", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		if _, err := fsck.Check(ctx, dir, fsck.Options{Owner: "did:key:zBad"}); !errors.Is(err, fsck.ErrOwner) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("directory named for someone else", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		other := fsfixtures.StoreDirOf(fsfixtures.DataRoot(dir), fsfixtures.Foreign().DID())
		if err := os.Rename(dir, other); err != nil {
			t.Fatal(err)
		}
		_, err := fsck.Check(ctx, other, fsck.Options{})
		if !errors.Is(err, fsck.ErrOwner) || !strings.Contains(err.Error(), "--identity") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("empty store", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "delivery", strings.Repeat("ab", 32))
		mkdir(t, dir)
		rep := check(t, dir, fsck.Options{})
		if rep.OwnerSource != fsck.OwnerNone || len(rep.Findings) != 0 || rep.Records != 0 {
			t.Fatalf("%+v", rep)
		}
	})
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}

// plantMessage writes a valid message record signed by id into dir/messages.
func plantMessage(t *testing.T, dir string, id *identity.Identity, label string) string {
	t.Helper()
	m := &record.Message{MessageID: fsfixtures.ID(label), Status: record.StatusQueued, PeerOwnerDID: string(fsfixtures.PeerDID()),
		RelayURL: "https://relay.example/", EnvelopeDigest: strings.Repeat("0", 64), DeliveryDeadline: fsfixtures.Far.UnixMilli(),
		CreatedAt: fsfixtures.T0.UnixMilli(), UpdatedAt: fsfixtures.T0.UnixMilli(), RetainUntil: fsfixtures.Far.UnixMilli()}
	data, err := record.Encode(id.Signer(), id.DID(), m)
	if err != nil {
		t.Fatal(err)
	}
	p := record.Path(record.KindMessages, m.MessageID)
	if err := os.WriteFile(filepath.Join(dir, p), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNotAStore(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "missing"), filepath.Join(dir, ".generation"), link} {
		if _, err := fsck.Check(ctx, p, fsck.Options{}); !errors.Is(err, fsck.ErrNotStore) {
			t.Errorf("%s: err %v", p, err)
		}
		if _, err := fsck.Repair(ctx, p, fsck.Options{}); !errors.Is(err, fsck.ErrNotStore) {
			t.Errorf("repair %s: err %v", p, err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		if _, err := fsck.Check(ctx, dir, fsck.Options{}); !errors.Is(err, fsck.ErrNotStore) || !strings.Contains(err.Error(), "uid 1000") {
			t.Errorf("another user's store: err %v", err)
		}
	}
}

// TestLayout: only a directory laid out like a store is checked or repaired. A data
// root, a directory not named like a store or not in delivery/, and one holding
// none of a store's names are refused with nothing changed; a store with planted
// unknown names is still a store, and what the store did not make at its top is
// reported and left in place.
func TestLayout(t *testing.T) {
	refused := func(t *testing.T, dir string, want error) {
		t.Helper()
		hash := fsfixtures.HashTree(t, dir)
		if _, err := fsck.Check(ctx, dir, fsck.Options{}); !errors.Is(err, want) {
			t.Errorf("check %s: err %v, want %v", dir, err, want)
		}
		if _, err := fsck.Repair(ctx, dir, fsck.Options{}); !errors.Is(err, want) {
			t.Errorf("repair %s: err %v, want %v", dir, err, want)
		}
		if fsfixtures.HashTree(t, dir) != hash {
			t.Errorf("%s changed", dir)
		}
	}
	t.Run("a data root", func(t *testing.T) {
		dir := fsfixtures.Build(t, "combined")
		root := fsfixtures.DataRoot(dir)
		mkdir(t, filepath.Join(root, "identities"))
		if err := os.WriteFile(filepath.Join(root, "identities", "default.key"), []byte("key\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		refused(t, root, fsck.ErrDataRoot)
	})
	t.Run("a store holding a data root's directory", func(t *testing.T) {
		dir := fsfixtures.Build(t, "truncated-record")
		mkdir(t, filepath.Join(dir, "run"))
		refused(t, dir, fsck.ErrDataRoot)
	})
	t.Run("not named like a store", func(t *testing.T) {
		dir := fsfixtures.Build(t, "combined")
		plain := filepath.Join(fsfixtures.DataRoot(dir), "delivery", "plain")
		if err := os.Rename(dir, plain); err != nil {
			t.Fatal(err)
		}
		refused(t, plain, fsck.ErrNotStoreLayout)
	})
	t.Run("not in delivery", func(t *testing.T) {
		dir := fsfixtures.Build(t, "combined")
		other := filepath.Join(fsfixtures.DataRoot(dir), filepath.Base(dir))
		if err := os.Rename(dir, other); err != nil {
			t.Fatal(err)
		}
		refused(t, other, fsck.ErrNotStoreLayout)
	})
	t.Run("foreign names and no record of the owner", func(t *testing.T) {
		// Named like a store, even with a kind's directory in it: a source tree.
		dir := filepath.Join(t.TempDir(), "delivery", strings.Repeat("ab", 32))
		mkdir(t, filepath.Join(dir, ".git"))
		mkdir(t, filepath.Join(dir, "messages"))
		for _, f := range []string{"go.mod", "main.go", "messages/a.txt"} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("x\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		refused(t, dir, fsck.ErrNotStoreLayout)
		// A damaged store whose every record is gone, with a planted file.
		emptied := fsfixtures.Build(t, "valid")
		for _, k := range []string{"messages", "outbox", "batches", "receipts", "observations", "operations", "idempotency"} {
			if err := os.RemoveAll(filepath.Join(emptied, k)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(emptied, "notes.txt"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		refused(t, emptied, fsck.ErrNotStoreLayout)
		_, err := fsck.Check(ctx, emptied, fsck.Options{})
		if !strings.Contains(fmt.Sprint(err), "(notes.txt) and no record of its owner; if it is a store, move those names out of it") {
			t.Fatalf("err %v", err)
		}
		// Without the planted file it is an empty store.
		if err := os.Remove(filepath.Join(emptied, "notes.txt")); err != nil {
			t.Fatal(err)
		}
		check(t, emptied, fsck.Options{})
	})
	t.Run("planted names at the top are noted and left", func(t *testing.T) {
		dir := fsfixtures.Build(t, "unknown-file")
		rr := repairedClean(t, dir)
		for _, p := range []string{"notes.txt", "cache"} {
			if f := mustFind(t, rr.Before, p, fsck.CodeUnknownTop); f.Severity != fsck.Note || f.Repairable {
				t.Errorf("%s: %+v", p, f)
			}
			if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
				t.Errorf("%s was moved: %v", p, err)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "cache", "index")); err != nil {
			t.Errorf("cache/index: %v", err)
		}
	})
}

// TestRepairRechecks: before every change, Repair confirms that the directory is
// still the store it checked and that no daemon serves it; if not, it stops with
// nothing more changed.
func TestRepairRechecks(t *testing.T) {
	for _, c := range []struct {
		name string
		want error
		// after the first change: do something to dir; return the directory whose
		// remaining files must be unchanged.
		after  func(t *testing.T, dir string) string
		daemon bool
	}{
		{name: "a data root's directory appears", want: fsck.ErrDataRoot, after: func(t *testing.T, dir string) string {
			mkdir(t, filepath.Join(dir, "identities"))
			return dir
		}},
		{name: "the directory is replaced", want: fsck.ErrNotStore, after: func(t *testing.T, dir string) string {
			moved := dir + ".old"
			if err := os.Rename(dir, moved); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(moved, dir); err != nil {
				t.Fatal(err)
			}
			return moved
		}},
		{name: "a daemon starts", want: fsck.ErrLive, daemon: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := fsfixtures.Build(t, "combined")
			var started atomic.Bool
			var rest string
			var hash string
			opts := fsck.Options{OnRepair: func(a fsck.ActionResult) {
				if started.Swap(true) {
					return
				}
				rest = dir
				if c.after != nil {
					rest = c.after(t, dir)
				}
				hash = fsfixtures.HashTree(t, rest)
			}}
			if c.daemon {
				opts.DaemonLive = func(string) (bool, string, error) { return started.Load(), "pid 7", nil }
			}
			rr, err := fsck.Repair(ctx, dir, opts)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if n := len(rr.Actions); n != 2 || rr.Actions[0].Result != fsck.ResultDone || rr.Actions[1].Result != fsck.ResultSkipped {
				t.Fatalf("actions %+v", rr.Actions)
			}
			if fsfixtures.HashTree(t, rest) != hash {
				t.Fatal("a change was made after the recheck failed")
			}
		})
	}
}

// TestWorkersAgree: the report does not depend on the number of workers.
func TestWorkersAgree(t *testing.T) {
	dir := fsfixtures.Build(t, "combined")
	now := time.Now()
	clock := func() time.Time { return now }
	one, _ := json.Marshal(check(t, dir, fsck.Options{Workers: 1, Now: clock}).Findings)
	many, _ := json.Marshal(check(t, dir, fsck.Options{Workers: 8, Now: clock}).Findings)
	if string(one) != string(many) {
		t.Fatalf("1 worker:\n%s\n8 workers:\n%s", one, many)
	}
}

func TestProgress(t *testing.T) {
	dir := fsfixtures.Build(t, "valid-large", fsfixtures.Records(600))
	var calls, inCall atomic.Int32
	last := -1
	rep := check(t, dir, fsck.Options{Workers: 4, Progress: func(p fsck.Progress) {
		if inCall.Add(1) != 1 {
			t.Error("Progress called concurrently")
		}
		defer inCall.Add(-1)
		calls.Add(1)
		if p.Total != 600 || p.Done < last || p.Done > p.Total {
			t.Errorf("progress %+v after %d", p, last)
		}
		last = p.Done
	}})
	if last != 600 || calls.Load() < 10 || rep.Records != 600 {
		t.Fatalf("last %d, %d calls, %d records", last, calls.Load(), rep.Records)
	}
}

func TestCancel(t *testing.T) {
	dir := fsfixtures.Build(t, "valid-large", fsfixtures.Records(600))
	c, cancel := context.WithCancel(ctx)
	_, err := fsck.Check(c, dir, fsck.Options{Progress: func(p fsck.Progress) {
		if p.Done >= 60 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if _, err := fsck.Repair(c, dir, fsck.Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("repair: err %v", err)
	}
}

// TestRepairSkipsWhatChanged: a file that changed between the check and its repair
// is left alone (its fingerprint no longer matches); the next run repairs it.
func TestRepairSkipsWhatChanged(t *testing.T) {
	dir := fsfixtures.Build(t, "combined")
	victim := record.Path(record.KindMessages, fsfixtures.ID("msg-a")) // truncated
	first := true
	rr := repair(t, dir, fsck.Options{OnRepair: func(fsck.ActionResult) {
		if first {
			first = false
			f, err := os.OpenFile(filepath.Join(dir, victim), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("x")
			f.Close()
		}
	}})
	var got *fsck.ActionResult
	for i, a := range rr.Actions {
		if a.Path == victim {
			got = &rr.Actions[i]
		}
	}
	if got == nil || got.Result != fsck.ResultSkipped || !strings.Contains(got.Detail, "changed since the check") {
		t.Fatalf("action on the changed file: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, victim)); err != nil {
		t.Fatal("the changed file was moved anyway")
	}
	mustFind(t, rr.After, victim, fsck.CodeRecordInvalid)
	if rr.After.Problems() != 1 {
		t.Fatalf("after: %+v", rr.After.Findings)
	}
	repairedClean(t, dir)
}

func TestRepairRefusesALiveStore(t *testing.T) {
	t.Run("live lock", func(t *testing.T) {
		dir := fsfixtures.Build(t, "live-lock")
		hash := fsfixtures.HashTree(t, dir)
		f := mustFind(t, check(t, dir, fsck.Options{}), ".lock", fsck.CodeLockLive)
		if f.Holder == nil || f.Holder.Pid != os.Getpid() {
			t.Fatalf("holder %+v", f.Holder)
		}
		if _, err := fsck.Repair(ctx, dir, fsck.Options{}); !errors.Is(err, fsck.ErrLive) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
			t.Fatalf("err %v", err)
		}
		if fsfixtures.HashTree(t, dir) != hash {
			t.Fatal("changed")
		}
	})
	t.Run("held, not stale yet", func(t *testing.T) {
		dir := fsfixtures.Build(t, "truncated-record")
		holder := fmt.Sprintf(`{"pid":1,"host":"elsewhere.invalid","time":%q}`+"\n", time.Now().UTC().Format(time.RFC3339Nano))
		if err := os.WriteFile(filepath.Join(dir, ".lock"), []byte(holder), 0o600); err != nil {
			t.Fatal(err)
		}
		rep := check(t, dir, fsck.Options{})
		if mustFind(t, rep, ".lock", fsck.CodeLockHeld); rep.Lock != "held" {
			t.Fatalf("lock %s", rep.Lock)
		}
		hash := fsfixtures.HashTree(t, dir)
		if _, err := fsck.Repair(ctx, dir, fsck.Options{}); !errors.Is(err, fsck.ErrLive) || !strings.Contains(err.Error(), "not stale yet") {
			t.Fatalf("err %v", err)
		}
		if fsfixtures.HashTree(t, dir) != hash {
			t.Fatal("changed")
		}
		// With a short stale bound it is stale, and repaired.
		rr := repair(t, dir, fsck.Options{LockStale: time.Nanosecond})
		if rr.After.Problems() != 0 || find(rr.Before, ".lock", fsck.CodeLockStale) == nil {
			t.Fatalf("%+v", rr)
		}
	})
	t.Run("daemon", func(t *testing.T) {
		dir := fsfixtures.Build(t, "truncated-record")
		live := func(d string) (bool, string, error) {
			if d != dir {
				t.Errorf("asked about %s", d)
			}
			return true, "pid 42", nil
		}
		if _, err := fsck.Repair(ctx, dir, fsck.Options{DaemonLive: live}); !errors.Is(err, fsck.ErrLive) || !strings.Contains(err.Error(), "pid 42") {
			t.Fatalf("err %v", err)
		}
		boom := errors.New("boom")
		failing := func(string) (bool, string, error) { return false, "", boom }
		if _, err := fsck.Repair(ctx, dir, fsck.Options{DaemonLive: failing}); !errors.Is(err, boom) {
			t.Fatalf("err %v", err)
		}
		idle := func(string) (bool, string, error) { return false, "", nil }
		if rr := repair(t, dir, fsck.Options{DaemonLive: idle}); rr.After.Problems() != 0 {
			t.Fatal("not repaired")
		}
	})
}

// TestSpecialFiles: FIFOs, directories and files where the layout wants something
// else, a planted .lock and a broken .generation. The check never blocks on a FIFO.
func TestSpecialFiles(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	fifo := record.Path(record.KindMessages, fsfixtures.ID("fifo"))
	if err := syscall.Mkfifo(filepath.Join(dir, fifo), 0o600); err != nil {
		t.Fatal(err)
	}
	recdir := record.Path(record.KindMessages, fsfixtures.ID("dir"))
	mkdir(t, filepath.Join(dir, recdir))
	if err := os.WriteFile(filepath.Join(dir, "operations.tmp"), nil, 0o600); err != nil { // unknown, left in place
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "operations")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "operations"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, ".generation")); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(dir, ".generation"))
	// The store's lock file (made by its first write, saying free) is planted over.
	if err := os.Remove(filepath.Join(dir, ".lock")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, ".lock")); err != nil {
		t.Fatal(err)
	}
	rep := check(t, dir, fsck.Options{})
	mustFind(t, rep, fifo, fsck.CodeWrongType)
	mustFind(t, rep, recdir, fsck.CodeWrongType)
	mustFind(t, rep, "operations", fsck.CodeWrongType)
	mustFind(t, rep, "operations.tmp", fsck.CodeUnknownTop)
	mustFind(t, rep, ".generation", fsck.CodeGenerationInvalid)
	mustFind(t, rep, ".lock", fsck.CodeLockInvalid)
	if rep.Lock != "invalid" || rep.Problems() != 5 {
		t.Fatalf("%+v", rep)
	}
	rr := repairedClean(t, dir)
	if info, err := os.Lstat(filepath.Join(dir, ".generation")); err != nil || !info.Mode().IsRegular() {
		t.Fatalf("no new generation file: %v", err)
	}
	if got := len(fsfixtures.LostFound(t, dir)); got != 5 || rr.After.LostFound != 5 {
		t.Fatalf("lost+found holds %d (report %d)", got, rr.After.LostFound)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal("the link's target was touched")
	}
}

// TestForeignOwnerAndHardLink: a valid record owned by another user or with a second
// link is rewritten as a private copy with the same bytes.
func TestForeignOwnerAndHardLink(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	linked := record.Path(record.KindMessages, fsfixtures.ID("msg-a"))
	if err := os.Link(filepath.Join(dir, linked), filepath.Join(fsfixtures.DataRoot(dir), "second-link")); err != nil {
		t.Fatal(err)
	}
	foreign := record.Path(record.KindMessages, fsfixtures.ID("msg-b"))
	root := os.Geteuid() == 0
	if root {
		if err := os.Chown(filepath.Join(dir, foreign), 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	before := fsfixtures.Files(t, dir)
	rep := check(t, dir, fsck.Options{})
	mustFind(t, rep, linked, fsck.CodeHardLink)
	if root {
		mustFind(t, rep, foreign, fsck.CodeBadOwner)
	}
	repairedClean(t, dir)
	for _, p := range []string{linked, foreign} {
		info, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		st := info.Sys().(*syscall.Stat_t)
		data, _ := os.ReadFile(filepath.Join(dir, p))
		if st.Nlink != 1 || int(st.Uid) != os.Geteuid() || info.Mode().Perm() != 0o600 || string(data) != string(before[p]) {
			t.Errorf("%s: nlink %d uid %d mode %v, same bytes %v", p, st.Nlink, st.Uid, info.Mode(), string(data) == string(before[p]))
		}
	}
}

// TestExplanationsCarryNoPayload: a record signed by the owner whose payload breaks
// the schema is explained without the payload's values or key names.
func TestExplanationsCarryNoPayload(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	owner := fsfixtures.Owner()
	for i, payload := range []string{
		`{"messageId":"%s","status":"SECRET-STATUS","peerOwnerDid":"%s","relayUrl":"https://relay.example/","envelopeDigest":"%s","deliveryDeadline":1,"createdAt":1,"updatedAt":1,"attempts":0,"retainUntil":1}`,
		`{"messageId":"%s","SECRETKEY":1,"peerOwnerDid":"%s","envelopeDigest":"%s"}`,
	} {
		id := fsfixtures.ID(fmt.Sprintf("secret-%d", i))
		p := fmt.Sprintf(payload, id, fsfixtures.PeerDID(), strings.Repeat("0", 64))
		sig, err := identity.SignDomain(owner.Signer(), identity.DomainRecord, []byte("messages"), []byte(id), []byte(p))
		if err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf(`{"v":1,"kind":"messages","id":"%s","signer":"%s","payload":%s,"sig":"%s"}`+"\n",
			id, owner.DID(), p, base64.RawURLEncoding.EncodeToString(sig))
		if err := os.WriteFile(filepath.Join(dir, "messages", id+".json"), []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
		f := mustFind(t, check(t, dir, fsck.Options{}), record.Path(record.KindMessages, id), fsck.CodeRecordInvalid)
		if strings.Contains(strings.ToUpper(f.Explanation), "SECRET") || !strings.HasPrefix(f.Explanation, "the store refuses this record: ") {
			t.Errorf("explanation %q", f.Explanation)
		}
	}
}

// TestMoveNotes: a moved file keeps its bytes, gets a note, and lost+found is private.
func TestMoveNotes(t *testing.T) {
	dir := fsfixtures.Build(t, "truncated-record")
	p := record.Path(record.KindMessages, fsfixtures.ID("msg-a"))
	data, _ := os.ReadFile(filepath.Join(dir, p))
	when := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	rr := repair(t, dir, fsck.Options{Now: func() time.Time { return when }, Tool: "fsck-test"})
	if len(rr.Actions) != 1 || !strings.HasPrefix(rr.Actions[0].Detail, "moved to lost+found/20300102T030405Z-") {
		t.Fatalf("%+v", rr.Actions)
	}
	to := strings.TrimPrefix(rr.Actions[0].Detail, "moved to ")
	moved, err := os.ReadFile(filepath.Join(dir, to))
	if err != nil || string(moved) != string(data) {
		t.Fatalf("moved bytes differ: %v", err)
	}
	var n fsck.MoveNote
	raw, err := os.ReadFile(filepath.Join(dir, to+".fsck.json"))
	if err != nil || json.Unmarshal(raw, &n) != nil {
		t.Fatalf("note: %v %s", err, raw)
	}
	want := fsck.MoveNote{V: 1, From: p, To: to, MovedAt: when, Code: fsck.CodeRecordInvalid,
		Why: "the store refuses this record: record is not exactly one line", Tool: "fsck-test"}
	if n != want {
		t.Fatalf("note %+v, want %+v", n, want)
	}
	info, err := os.Lstat(filepath.Join(dir, "lost+found"))
	if err != nil || info.Mode().Perm() != 0o700 || !info.IsDir() {
		t.Fatalf("lost+found %v %v", info.Mode(), err)
	}
	if rr.After.LostFound != 1 {
		t.Fatalf("LostFound %d", rr.After.LostFound)
	}
}

// TestRepairDurability records a repair's calls: each move writes its note durably
// first, then renames the file, grows the generation, and fsyncs lost+found and the
// source directory — so a crash never leaves a moved file without its note.
func TestRepairDurability(t *testing.T) {
	dir := fsfixtures.Build(t, "truncated-record")
	faulty := fsx.NewFaulty(fsx.NewOS(dir))
	repair(t, dir, fsck.Options{WrapFS: func(fsx.FS) fsx.FS { return faulty }})
	var seq []string
	for _, op := range faulty.Log() {
		switch {
		case op.Path == ".lock" || strings.HasPrefix(op.Path, ".lock-") || strings.HasPrefix(op.Path2, ".lock"):
			continue // the lock's own calls
		case op.Kind == fsx.OpRename && strings.HasPrefix(op.Path, "messages/"):
			seq = append(seq, "rename record")
		case op.Kind == fsx.OpWrite && op.Path == ".generation":
			seq = append(seq, "bump generation")
		case op.Kind == fsx.OpSyncDir:
			seq = append(seq, "syncdir "+op.Path)
		case op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, "lost+found/"):
			seq = append(seq, "rename note")
		case op.Kind == fsx.OpSync:
			seq = append(seq, "fsync")
		}
	}
	want := "syncdir . fsync rename note syncdir lost+found rename record bump generation syncdir lost+found syncdir messages"
	if got := strings.Join(seq, " "); got != want {
		t.Fatalf("calls:\n got %s\nwant %s", got, want)
	}
}

// TestRepairFaults: a failed rename leaves the file in place and the problem
// reported; the next run repairs it.
func TestRepairFaults(t *testing.T) {
	dir := fsfixtures.Build(t, "truncated-record")
	faulty := fsx.NewFaulty(fsx.NewOS(dir))
	faulty.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpRename && strings.HasPrefix(op.Path, "messages/") {
			return syscall.EIO
		}
		return nil
	}
	rr := repair(t, dir, fsck.Options{WrapFS: func(fsx.FS) fsx.FS { return faulty }})
	if len(rr.Actions) != 1 || rr.Actions[0].Result != fsck.ResultFailed || !strings.Contains(rr.Actions[0].Detail, "input/output error") {
		t.Fatalf("%+v", rr.Actions)
	}
	if rr.After.Problems() != 1 {
		t.Fatalf("after: %+v", rr.After.Findings)
	}
	repairedClean(t, dir)
}

// TestWrongModeRepair: modes are set, bytes and inodes kept.
func TestWrongModeRepair(t *testing.T) {
	dir := fsfixtures.Build(t, "wrong-mode")
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	mustFind(t, check(t, dir, fsck.Options{}), ".", fsck.CodeBadMode)
	p := filepath.Join(dir, record.Path(record.KindMessages, fsfixtures.ID("msg-a")))
	before, _ := os.Lstat(p)
	repairedClean(t, dir)
	if info, _ := os.Lstat(dir); info.Mode().Perm() != 0o700 {
		t.Fatalf("store dir mode %v", info.Mode())
	}
	after, _ := os.Lstat(p)
	if after.Mode().Perm() != 0o600 || !os.SameFile(before, after) {
		t.Fatalf("record mode %v, same inode %v", after.Mode(), os.SameFile(before, after))
	}
	if info, _ := os.Lstat(filepath.Join(dir, "receipts")); info.Mode().Perm() != 0o700 {
		t.Fatalf("receipts mode %v", info.Mode())
	}
}

// TestStoreAcceptsRepairedStore: after repair the store itself lists and reads every
// kind, and accepts writes (no wedge).
func TestStoreAcceptsRepairedStore(t *testing.T) {
	dir := fsfixtures.Build(t, "combined")
	repairedClean(t, dir)
	s, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range record.Kinds {
		if err := s.Scan(ctx, k, func(record.Record) error { return nil }); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	mrep, err := s.Maintain(ctx)
	if err != nil || len(mrep.Errors) != 0 {
		t.Fatalf("maintenance: %v %v", err, mrep.Errors)
	}
	if rep := check(t, dir, fsck.Options{}); rep.Problems() != 0 {
		t.Fatalf("after maintenance: %+v", rep.Findings)
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestStoreDirName: the owner's store directory is the SHA-256 of its DID.
func TestStoreDirName(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	if filepath.Base(dir) != sha(string(fsfixtures.OwnerDID())) {
		t.Fatalf("%s", dir)
	}
}

// A one-envelope message committed by its message record (a single, no marker) is
// valid and stays; a single without its message record — a send interrupted before it
// committed — is a note, not a problem: never acknowledged, never dispatched, and
// left for store maintenance, which removes it; the store still delivers the
// committed one. (On the code before, it was an orphan-outbox problem: exit 4.)
func TestSingles(t *testing.T) {
	dir := fsfixtures.Build(t, "single-member")
	opts := fsck.Options{Owner: fsfixtures.Owner().DID()}
	committed := record.Path(record.KindOutbox, fsfixtures.ID("msg-single/envelope/0"))
	half := record.Path(record.KindOutbox, fsfixtures.ID("msg-single-half/envelope/0"))
	rep := check(t, dir, opts)
	if f := mustFind(t, rep, half, fsck.CodeOutboxUncommitted); f.Severity != fsck.Note {
		t.Fatalf("the uncommitted single: %+v, want a note", f)
	}
	if rep.Problems() != 0 {
		t.Fatalf("problems in a store a send left half done: %+v", rep.Findings)
	}
	for _, f := range rep.Findings {
		if f.Path == committed || f.Path == record.Path(record.KindMessages, fsfixtures.ID("msg-single")) {
			t.Errorf("finding on the committed single's records: %+v", f)
		}
	}
	if rr := repair(t, dir, opts); len(rr.Actions) != 0 {
		t.Fatalf("repair acted on a note: %+v", rr.Actions)
	}
	if _, err := os.Lstat(filepath.Join(dir, half)); err != nil {
		t.Fatalf("repair moved the uncommitted single: %v", err)
	}
	s, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, half)); !os.IsNotExist(err) {
		t.Errorf("maintenance left the uncommitted single: %v", err)
	}
	if again := check(t, dir, opts); len(again.Findings) != 0 {
		t.Fatalf("after maintenance: %+v", again.Findings)
	}
	if p, err := s.Pending(ctx, fsfixtures.ID("msg-single")); err != nil || len(p) != 1 {
		t.Fatalf("the committed single after maintenance: %v %v", p, err)
	}
}

// TestStateRulesReadRecordsWithoutOperatorFields: records written before the hold and
// operator fields existed (the valid fixture's have neither) are checked as before —
// no state finding — and a repair given the owner's key rewrites nothing.
func TestStateRulesReadRecordsWithoutOperatorFields(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	before := fsfixtures.Files(t, dir)
	for p, data := range before {
		if strings.Contains(string(data), `"held"`) || strings.Contains(string(data), `"operator"`) {
			t.Fatalf("%s has a hold or operator field; the fixture must predate them", p)
		}
	}
	opts := fsck.Options{Owner: fsfixtures.OwnerDID(), Signer: fsfixtures.Owner().Signer()}
	rep, err := fsck.Repair(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Before.Findings) != 0 || len(rep.Actions) != 0 {
		t.Fatalf("findings %+v, actions %+v", rep.Before.Findings, rep.Actions)
	}
	for p, data := range fsfixtures.Files(t, dir) {
		if string(before[p]) != string(data) {
			t.Errorf("%s changed", p)
		}
	}
}

// TestStateRepair: with the owner's key, each state problem is repaired as
// docs/FSCK.md says (a message moved forward or closed with its envelope's closer, a
// hold cleared or completed), every envelope stays where it was, and a second check
// finds nothing.
func TestStateRepair(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"message-status", "held-flags"} {
		dir := fsfixtures.Build(t, name)
		opts := fsck.Options{Owner: fsfixtures.OwnerDID(), Signer: fsfixtures.Owner().Signer()}
		rep, err := fsck.Repair(ctx, dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range rep.Actions {
			if a.Result != fsck.ResultDone {
				t.Errorf("%s: %s %s: %s (%s)", name, a.Code, a.Path, a.Result, a.Detail)
			}
		}
		for _, f := range rep.After.Findings {
			if f.Severity == fsck.Problem {
				t.Errorf("%s: after repair: %s %s", name, f.Code, f.Path)
			}
		}
		s, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		msg := func(label string) *record.Message {
			m, err := store.GetAs[*record.Message](s, fsfixtures.ID(label))
			if err != nil || m == nil {
				t.Fatalf("%s: %v", label, err)
			}
			return m
		}
		out := func(label string) *record.Outbox {
			o, err := store.GetAs[*record.Outbox](s, fsfixtures.ID(label))
			if err != nil || o == nil {
				t.Fatalf("%s: %v", label, err)
			}
			return o
		}
		switch name {
		case "message-status":
			if m := msg("msg-behind"); m.Status != record.StatusRelayed || m.Attempts != 1 {
				t.Errorf("msg-behind: %s, %d attempts; want relayed, 1", m.Status, m.Attempts)
			}
			if m := msg("msg-unclosed"); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByRefused ||
				m.LastError != "refused by the relay: no such recipient" || m.Attempts != 2 {
				t.Errorf("msg-unclosed: %+v", m)
			}
			if m := msg("msg-confirmation-behind"); m.Status != record.StatusRelayed || m.Attempts != 1 {
				t.Errorf("msg-confirmation-behind: %s, %d attempts; want relayed, 1 (a confirmation's delivery-status speaks for it)", m.Status, m.Attempts)
			}
			if o := out("msg-behind/envelope/1"); o.State != record.StatePending {
				t.Errorf("msg-behind's pending envelope is %s", o.State)
			}
		case "held-flags":
			if m := msg("msg-held-closed"); m.Held != nil || m.Status != record.StatusClosed {
				t.Errorf("msg-held-closed: %+v", m)
			}
			if o := out("msg-held-closed/envelope/0"); o.Held != nil || o.State != record.StateClosed {
				t.Errorf("msg-held-closed's envelope: %+v", o)
			}
			m := msg("msg-half-held")
			o := out("msg-half-held/envelope/1")
			if m.Held == nil || m.Held.Op != record.ActionHold || o.Held == nil || o.State != record.StatePending {
				t.Errorf("msg-half-held: message held %v, other envelope held %v (%s): the repair must complete the hold", m.Held, o.Held, o.State)
			}
			for _, label := range []string{"msg-held-relayed", "msg-held-removed"} {
				if m := msg(label); m.Held != nil || m.Status != record.StatusRelayed || m.Operator == nil || m.Operator.Op != record.ActionHold {
					t.Errorf("%s: %+v: the repair must clear the hold that outlived its last pending envelope, and keep the rest", label, m)
				}
			}
			if o := out("msg-half-cancelled/envelope/1"); o.State != record.StateClosed || o.Operator == nil ||
				o.Operator.Op != record.ActionCancel || o.LastError != "cancelled by operator" {
				t.Errorf("msg-half-cancelled's pending envelope: %+v: the repair must complete the cancel", o)
			}
		}
	}
}

// TestStateRepairRefusesAnotherKey: a key that is not the owner's signs nothing.
func TestStateRepairRefusesAnotherKey(t *testing.T) {
	dir := fsfixtures.Build(t, "held-flags")
	hash := fsfixtures.HashTree(t, dir)
	_, err := fsck.Repair(context.Background(), dir, fsck.Options{Owner: fsfixtures.OwnerDID(), Signer: fsfixtures.Foreign().Signer()})
	if !errors.Is(err, fsck.ErrOwner) {
		t.Fatalf("err %v, want ErrOwner", err)
	}
	if fsfixtures.HashTree(t, dir) != hash {
		t.Fatal("a repair with another key changed the store")
	}
}

// TestStateRepairsAtOnce: two state repairs of one store at once (an operator
// running fsck twice), many times: each change is decided again on the records its
// transaction reads, so whichever makes a change first, the other skips it (or finds
// the store in use); no hold is completed twice or cleared wrongly, and the store ends
// with nothing to repair.
func TestStateRepairsAtOnce(t *testing.T) {
	trials := 6
	if testing.Short() {
		trials = 2
	}
	opts := fsck.Options{Owner: fsfixtures.OwnerDID(), Signer: fsfixtures.Owner().Signer()}
	both := 0 // trials in which neither repair found the store in use
	for trial := range trials {
		dir := fsfixtures.Build(t, "held-flags")
		gate := make(chan struct{})
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				<-gate
				_, err := fsck.Repair(ctx, dir, opts)
				errs <- err
			}()
		}
		close(gate)
		live := 0
		for range 2 {
			err := <-errs
			if err != nil && !errors.Is(err, fsck.ErrLive) {
				t.Fatalf("trial %d: %v", trial, err)
			}
			if err != nil {
				live++
			}
		}
		if live == 0 {
			both++
		}
		rep := check(t, dir, opts)
		if rep.Problems() != 0 {
			t.Fatalf("trial %d: problems after two repairs at once: %+v", trial, rep.Findings)
		}
		s, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		for _, label := range []string{"msg-held-relayed", "msg-held-removed"} {
			if m, err := store.GetAs[*record.Message](s, fsfixtures.ID(label)); err != nil || m == nil || m.Held != nil || m.Status != record.StatusRelayed {
				t.Fatalf("trial %d: %s: %+v %v", trial, label, m, err)
			}
		}
		if m, err := store.GetAs[*record.Message](s, fsfixtures.ID("msg-half-held")); err != nil || m == nil || m.Held == nil {
			t.Fatalf("trial %d: msg-half-held: %+v %v: the hold must be completed", trial, m, err)
		}
	}
	t.Logf("%d trials, both repairs ran to the end in %d", trials, both)
}
