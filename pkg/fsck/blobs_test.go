package fsck_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// plantBlob writes data as blobs/<name> (name "" = its SHA-256) with mode perm, blobs/
// made 0700, and returns its path relative to the store directory.
func plantBlob(t *testing.T, dir, name string, data []byte, perm os.FileMode) string {
	t.Helper()
	if name == "" {
		sum := sha256.Sum256(data)
		name = hex.EncodeToString(sum[:])
	}
	mkdir(t, filepath.Join(dir, "blobs"))
	p := filepath.Join(dir, "blobs", name)
	if err := os.WriteFile(p, data, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil {
		t.Fatal(err)
	}
	return path.Join("blobs", name)
}

func blobBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// TestBlobLayout: every name in blobs/ obeys the layout rules; a blob whose content
// does not hash to its name is a problem moved to lost+found, an unreferenced one and
// staged or partial ones are notes left in place, and a symbolic link is reported,
// never followed, and moved (the link only).
func TestBlobLayout(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	good := plantBlob(t, dir, "", blobBytes(300<<10), 0o600)
	flipped := blobBytes(200 << 10)
	sum := sha256.Sum256(flipped)
	flipped[1000] ^= 1
	bad := plantBlob(t, dir, hex.EncodeToString(sum[:]), flipped, 0o600)
	loose := plantBlob(t, dir, "", blobBytes(10), 0o644)
	tmp := plantBlob(t, dir, "."+fsfixtures.ID("blob-temp")+".tmp", blobBytes(100), 0o600)
	part := plantBlob(t, dir, "."+fsfixtures.ID("blob-part")+".part", blobBytes(100), 0o600)
	unknown := plantBlob(t, dir, "README", []byte("planted\n"), 0o600)
	// A link named like a blob, to a file whose content hashes to that name: followed,
	// it would look like a good blob.
	outside := filepath.Join(t.TempDir(), "outside")
	target := blobBytes(50)
	if err := os.WriteFile(outside, target, 0o600); err != nil {
		t.Fatal(err)
	}
	ts := sha256.Sum256(target)
	link := path.Join("blobs", hex.EncodeToString(ts[:]))
	if err := os.Symlink(outside, filepath.Join(dir, link)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "blobs"), 0o750); err != nil {
		t.Fatal(err)
	}

	faulty := fsx.NewFaulty(fsx.NewOS(dir))
	rep := check(t, dir, fsck.Options{WrapFS: func(fsx.FS) fsx.FS { return faulty }})
	if log := faulty.Log(); len(log) != 0 {
		t.Fatalf("a check made %d mutating calls, first %+v", len(log), log[0])
	}
	want := []struct {
		path string
		code fsck.Code
		sev  fsck.Severity
	}{
		{"blobs", fsck.CodeBadMode, fsck.Problem},
		{good, fsck.CodeBlobUnreferenced, fsck.Note},
		{bad, fsck.CodeBlobDigest, fsck.Problem},
		{loose, fsck.CodeBadMode, fsck.Problem},
		{loose, fsck.CodeBlobUnreferenced, fsck.Note},
		{tmp, fsck.CodeBlobPartial, fsck.Note},
		{part, fsck.CodeBlobPartial, fsck.Note},
		{unknown, fsck.CodeUnknownFile, fsck.Problem},
		{link, fsck.CodeSymlink, fsck.Problem},
	}
	for _, w := range want {
		if f := mustFind(t, rep, w.path, w.code); f.Severity != w.sev || f.Repairable != (w.sev == fsck.Problem) {
			t.Errorf("%s %s: %+v", w.path, w.code, f)
		}
	}
	if len(rep.Findings) != len(want) {
		t.Errorf("%d findings, want %d: %+v", len(rep.Findings), len(want), rep.Findings)
	}
	if rep.Blobs != 3 || rep.Records != 12 || rep.Valid != 12 {
		t.Errorf("%d blobs, %d records, %d valid", rep.Blobs, rep.Records, rep.Valid)
	}

	files := fsfixtures.Files(t, dir)
	rr := repair(t, dir, fsck.Options{})
	for _, a := range rr.Actions {
		if a.Result != fsck.ResultDone {
			t.Errorf("%s %s: %s (%s)", a.Code, a.Path, a.Result, a.Detail)
		}
	}
	if rr.After.Problems() != 0 {
		t.Fatalf("problems after repair: %+v", rr.After.Findings)
	}
	moved := map[string]string{}
	for to, n := range fsfixtures.LostFound(t, dir) {
		moved[n.From] = n.Code
		if n.From == link {
			if fi, err := os.Lstat(filepath.Join(dir, to)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("the link was not moved as a link: %v", err)
			}
		}
	}
	if len(moved) != 3 || moved[bad] != string(fsck.CodeBlobDigest) || moved[unknown] != string(fsck.CodeUnknownFile) || moved[link] != string(fsck.CodeSymlink) {
		t.Errorf("moved %v", moved)
	}
	for _, p := range []string{good, loose, tmp, part} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	for _, p := range []string{"blobs", loose} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %v (%v)", p, fi.Mode(), err)
		}
	}
	if data, err := os.ReadFile(outside); err != nil || string(data) != string(target) {
		t.Errorf("the link's target changed: %v", err)
	}
	fsfixtures.AssertKept(t, dir, files, func(string) bool { return false })
	if again := repair(t, dir, fsck.Options{}); len(again.Actions) != 0 || again.Before.Problems() != 0 {
		t.Fatalf("second repair not a no-op: %+v", again.Actions)
	}
}

// TestBlobsDirectory: blobs/ itself must be a real private directory.
func TestBlobsDirectory(t *testing.T) {
	t.Run("a symbolic link", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		elsewhere := t.TempDir()
		plantBlob(t, elsewhere, "", blobBytes(100), 0o600)
		if err := os.Symlink(filepath.Join(elsewhere, "blobs"), filepath.Join(dir, "blobs")); err != nil {
			t.Fatal(err)
		}
		rep := check(t, dir, fsck.Options{})
		mustFind(t, rep, "blobs", fsck.CodeSymlink)
		if len(rep.Findings) != 1 || rep.Blobs != 0 {
			t.Fatalf("the link was followed: %d blobs, %+v", rep.Blobs, rep.Findings)
		}
		repairedClean(t, dir)
		if _, err := os.Lstat(filepath.Join(elsewhere, "blobs")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a file", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		if err := os.WriteFile(filepath.Join(dir, "blobs"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		mustFind(t, check(t, dir, fsck.Options{}), "blobs", fsck.CodeWrongType)
		repairedClean(t, dir)
	})
	t.Run("not unknown-top", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		mkdir(t, filepath.Join(dir, "blobs"))
		if rep := check(t, dir, fsck.Options{}); len(rep.Findings) != 0 {
			t.Fatalf("%+v", rep.Findings)
		}
	})
	t.Run("a FIFO named like a blob", func(t *testing.T) {
		dir := fsfixtures.Build(t, "valid")
		mkdir(t, filepath.Join(dir, "blobs"))
		p := filepath.Join(dir, "blobs", strings.Repeat("ab", 32))
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
		mustFind(t, check(t, dir, fsck.Options{}), "blobs/"+strings.Repeat("ab", 32), fsck.CodeWrongType)
		repairedClean(t, dir)
	})
	t.Run("hard-linked blobs", func(t *testing.T) {
		// A blob and a partial one with a second name outside the store: each is
		// replaced by a private copy of its bytes; the other name keeps the old inode.
		dir := fsfixtures.Build(t, "valid")
		data := blobBytes(300 << 10)
		p := plantBlob(t, dir, "", data, 0o600)
		part := plantBlob(t, dir, "."+fsfixtures.ID("linked-part")+".part", data[:1000], 0o600)
		other := t.TempDir()
		for _, q := range []string{p, part} {
			if err := os.Link(filepath.Join(dir, q), filepath.Join(other, filepath.Base(q))); err != nil {
				t.Skip("hard links across these directories:", err)
			}
		}
		rep := check(t, dir, fsck.Options{})
		for _, q := range []string{p, part} {
			if f := mustFind(t, rep, q, fsck.CodeHardLink); !f.Repairable {
				t.Fatalf("%+v", f)
			}
		}
		repairedClean(t, dir)
		for q, want := range map[string][]byte{p: data, part: data[:1000]} {
			fi, err := os.Lstat(filepath.Join(dir, q))
			if err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 1 || fi.Mode().Perm() != 0o600 {
				t.Fatalf("%s: %v %v", q, fi, err)
			}
			if got, _ := os.ReadFile(filepath.Join(dir, q)); string(got) != string(want) {
				t.Errorf("%s: the copy's bytes differ", q)
			}
			if got, _ := os.ReadFile(filepath.Join(other, filepath.Base(q))); string(got) != string(want) {
				t.Errorf("%s: the other name's bytes changed", q)
			}
		}
	})
	t.Run("a hard-linked blob whose bytes change before the copy", func(t *testing.T) {
		// Written through its other name after the check: the copy is skipped (the
		// file is not the one checked), and the next check sees the damage.
		dir := fsfixtures.Build(t, "valid")
		p := plantBlob(t, dir, "", blobBytes(1000), 0o600)
		other := filepath.Join(t.TempDir(), "other")
		if err := os.Link(filepath.Join(dir, p), other); err != nil {
			t.Skip("hard links across these directories:", err)
		}
		calls := 0
		rr := repair(t, dir, fsck.Options{DaemonLive: func(string) (bool, string, error) {
			if calls++; calls == 2 { // the first recheck, after the check
				if err := os.WriteFile(other, blobBytes(999), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			return false, "", nil
		}})
		if len(rr.Actions) != 1 || rr.Actions[0].Code != fsck.CodeHardLink || rr.Actions[0].Result != fsck.ResultSkipped {
			t.Fatalf("%+v", rr.Actions)
		}
		mustFind(t, rr.After, p, fsck.CodeBlobDigest) // no record names a size: its hash tells
	})
}

// TestBlobHashStreams: hashing a blob reads it through a fixed buffer; a 64 MiB blob
// costs a check far less than 64 MiB of allocation (reading it whole would not).
func TestBlobHashStreams(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	const size = 64 << 20
	mkdir(t, filepath.Join(dir, "blobs"))
	tmp := filepath.Join(dir, "blobs", "."+fsfixtures.ID("sparse")+".tmp")
	if err := os.WriteFile(tmp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(tmp, size); err != nil { // sparse: zeros
		t.Fatal(err)
	}
	f, err := os.Open(tmp)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	name := filepath.Join(dir, "blobs", hex.EncodeToString(h.Sum(nil)))
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rep := check(t, dir, fsck.Options{Workers: 2})
	runtime.ReadMemStats(&after)
	if rep.Blobs != 1 || len(rep.Findings) != 1 || rep.Findings[0].Code != fsck.CodeBlobUnreferenced {
		t.Fatalf("%d blobs, %+v", rep.Blobs, rep.Findings)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Fatalf("a check of one %d MiB blob allocated %d MiB", size>>20, alloc>>20)
	}
	// One byte changed at the very end is seen: every byte is hashed.
	g, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAt([]byte{1}, size-1); err != nil {
		t.Fatal(err)
	}
	g.Close()
	mustFind(t, check(t, dir, fsck.Options{}), "blobs/"+filepath.Base(name), fsck.CodeBlobDigest)
}

// TestBlobRepairLeavesTheRecord: repair moves a damaged blob that a pending envelope
// needs to lost+found (bytes and note) and leaves the envelope's record byte for byte;
// the record then reports blob-missing, not repairable, saying where its blob went.
func TestBlobRepairLeavesTheRecord(t *testing.T) {
	for _, name := range []string{"blob-truncated", "blob-digest"} {
		t.Run(name, func(t *testing.T) {
			dir := fsfixtures.Build(t, name)
			before := check(t, dir, fsck.Options{})
			var blob, rec string
			for _, f := range before.Findings {
				if strings.HasPrefix(f.Path, "blobs/") {
					blob = f.Path
				}
			}
			for p := range fsfixtures.ValidRecords(t, dir) {
				if strings.HasPrefix(p, "outbox/") || strings.HasPrefix(p, "observations/") {
					if data, _ := os.ReadFile(filepath.Join(dir, p)); strings.Contains(string(data), strings.TrimPrefix(blob, "blobs/")) {
						rec = p
					}
				}
			}
			if blob == "" || rec == "" {
				t.Fatalf("blob %q, record %q", blob, rec)
			}
			recBytes, _ := os.ReadFile(filepath.Join(dir, rec))
			blobBytes, _ := os.ReadFile(filepath.Join(dir, blob))
			rr := repair(t, dir, fsck.Options{})
			f := mustFind(t, rr.After, rec, fsck.CodeBlobMissing)
			if f.Severity != fsck.Problem || f.Repairable || !strings.Contains(f.Explanation, "an earlier repair moved to lost+found") || !strings.HasPrefix(f.Action, "none: ") {
				t.Errorf("%+v", f)
			}
			if rr.After.Problems() != 1 {
				t.Errorf("after: %+v", rr.After.Findings)
			}
			if got, _ := os.ReadFile(filepath.Join(dir, rec)); string(got) != string(recBytes) {
				t.Error("the record changed")
			}
			found := false
			for to, n := range fsfixtures.LostFound(t, dir) {
				if n.From == blob {
					got, _ := os.ReadFile(filepath.Join(dir, to))
					found = string(got) == string(blobBytes) && n.Code == string(before.Findings[0].Code)
				}
			}
			if !found {
				t.Errorf("%s is not in lost+found with its bytes and note", blob)
			}
		})
	}
}

// TestBlobCheckWritesNothing: a check of every blob fixture makes no mutating call.
func TestBlobCheckWritesNothing(t *testing.T) {
	for _, name := range []string{"blobs-valid", "blob-missing", "blob-truncated", "blob-digest", "blob-unreferenced", "blob-partial", "blob-layout"} {
		dir := fsfixtures.Build(t, name)
		faulty := fsx.NewFaulty(fsx.NewOS(dir))
		check(t, dir, fsck.Options{WrapFS: func(fsx.FS) fsx.FS { return faulty }})
		if log := faulty.Log(); len(log) != 0 {
			t.Errorf("%s: a check made %d mutating calls, first %+v", name, len(log), log[0])
		}
	}
}

// cancelOnBlobOpen cancels a context when a blob is opened.
type cancelOnBlobOpen struct {
	fsx.FS
	cancel func()
}

func (c cancelOnBlobOpen) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	if strings.HasPrefix(name, "blobs/") {
		c.cancel()
	}
	return c.FS.OpenFile(name, flag, perm)
}

// TestBlobHashCancel: a check cancelled while it hashes a blob stops with ctx's error.
func TestBlobHashCancel(t *testing.T) {
	dir := fsfixtures.Build(t, "blobs-valid")
	c, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err := fsck.Check(c, dir, fsck.Options{WrapFS: func(inner fsx.FS) fsx.FS { return cancelOnBlobOpen{inner, cancel} }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

// TestBlobEnvelopeThatDoesNotParse: an outbox record the store accepts whose envelope
// holds a blob body but does not parse (here: its signature broken, the record signed
// again by the owner) is record-invalid — what it refers to cannot be told, and the
// carrier cannot send it — and its batch is unwound; the blob is then unreferenced.
func TestBlobEnvelopeThatDoesNotParse(t *testing.T) {
	dir := fsfixtures.Build(t, "blobs-valid")
	env, ref, _ := fsfixtures.ReadBlobTestdata(t, fsfixtures.BlobOut)
	p := record.Path(record.KindOutbox, env.ID())
	data, err := os.ReadFile(filepath.Join(dir, p))
	if err != nil {
		t.Fatal(err)
	}
	owner, _ := fsfixtures.OwnerDID().PublicKey()
	rec, err := record.Parse(record.KindOutbox, env.ID(), data, fsfixtures.OwnerDID(), owner)
	if err != nil {
		t.Fatal(err)
	}
	o := rec.(*record.Outbox)
	wire := []byte(string(o.Envelope))
	i := strings.Index(string(wire), `"sig":"`) + len(`"sig":"`) + 3
	wire[i] ^= 0x01 // still base64url: another signature
	o.Envelope, o.EnvelopeDigest = wire, envelope.Digest(wire)
	signed, err := record.Encode(fsfixtures.Owner().Signer(), fsfixtures.OwnerDID(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, p), signed, 0o600); err != nil {
		t.Fatal(err)
	}
	rep := check(t, dir, fsck.Options{})
	f := mustFind(t, rep, p, fsck.CodeRecordInvalid)
	if !strings.Contains(f.Explanation, "holds a blob body but does not parse") || !f.Repairable {
		t.Fatalf("%+v", f)
	}
	mustFind(t, rep, fsfixtures.BlobPath(ref.Digest), fsck.CodeBlobUnreferenced)
	rr := repairedClean(t, dir)
	mustFind(t, rr.After, fsfixtures.BlobPath(ref.Digest), fsck.CodeBlobUnreferenced)
}
