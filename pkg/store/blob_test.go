package store_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// blobBytes returns n deterministic bytes.
func blobBytes(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
	return b
}

// writeBlob writes data as a blob in pieces of at most piece bytes and commits it.
func writeBlob(t testing.TB, s *store.Store, data []byte, piece int) (string, int64) {
	t.Helper()
	w, err := s.CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	for rest := data; len(rest) > 0; {
		n := min(piece, len(rest))
		if k, err := w.Write(rest[:n]); err != nil || k != n {
			t.Fatalf("Write = %d, %v", k, err)
		}
		rest = rest[n:]
	}
	digest, size, err := w.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return digest, size
}

// A committed blob is blobs/<sha256 of its bytes>, 0600 in a 0700 blobs/, readable
// sequentially and at offsets; its temp is gone. Committing the same bytes again keeps
// one blob with those bytes.
func TestBlobWriteCommitOpen(t *testing.T) {
	s := openStore(t, store.Options{})
	data := blobBytes(3<<20+17, 1)
	digest, size := writeBlob(t, s, data, 64<<10+3)
	if digest != sha(data) || size != int64(len(data)) {
		t.Fatalf("Commit = %s %d, want %s %d", digest, size, sha(data), len(data))
	}
	dir := filepath.Join(s.Dir(), store.BlobDir)
	if fi, err := os.Lstat(dir); err != nil || fi.Mode().Perm() != 0o700 || !fi.IsDir() {
		t.Fatalf("blobs/: %v %v", fi, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != digest {
		t.Fatalf("blobs/ holds %v, want only %s", ents, digest)
	}
	if fi, _ := os.Lstat(filepath.Join(dir, digest)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("blob mode %v", fi.Mode())
	}
	b, err := s.OpenBlob(digest)
	if err != nil {
		t.Fatal(err)
	}
	if b.Size() != size {
		t.Fatalf("Size = %d", b.Size())
	}
	got, err := io.ReadAll(b)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadAll: %v, equal %v", err, bytes.Equal(got, data))
	}
	sec := make([]byte, 100)
	if n, err := b.ReadAt(sec, 1<<20); n != 100 || err != nil || !bytes.Equal(sec, data[1<<20:1<<20+100]) {
		t.Fatalf("ReadAt = %d %v", n, err)
	}
	if n, err := b.ReadAt(sec, size-10); n != 10 || err != io.EOF {
		t.Fatalf("ReadAt at the end = %d %v, want 10, EOF", n, err)
	}
	got, err = io.ReadAll(io.NewSectionReader(b, 5, 20))
	if err != nil || !bytes.Equal(got, data[5:25]) {
		t.Fatalf("SectionReader: %v", err)
	}
	b.Close()
	if d2, _ := writeBlob(t, s, data, 1<<20); d2 != digest {
		t.Fatal("same bytes, another digest")
	}
	ents, _ = os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("after a second commit of the same bytes blobs/ holds %v", ents)
	}
	b, _ = s.OpenBlob(digest)
	got, _ = io.ReadAll(b)
	b.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("the blob changed")
	}
}

// The blob is durable when Commit returns: its temp was fsynced before the rename and
// blobs/ after it, and nothing else happens after the directory's fsync.
func TestBlobCommitOrder(t *testing.T) {
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS { faulty = fsx.NewFaulty(inner); return faulty }})
	if _, err := s.CreateBlob(); err != nil { // blobs/ made
		t.Fatal(err)
	}
	faulty.Reset()
	digest, _ := writeBlob(t, s, []byte("sealed bytes"), 5)
	var got []string
	for _, op := range faulty.Log() {
		got = append(got, string(op.Kind)+" "+op.Path+op.Path2)
	}
	log := faulty.Log()
	tmp := log[0].Path
	want := []string{"create " + tmp, "write " + tmp, "write " + tmp, "write " + tmp, "fsync " + tmp, "close " + tmp,
		"rename " + tmp + "blobs/" + digest, "syncdir blobs"}
	if !slices.Equal(got, want) {
		t.Fatalf("calls\n%v\nwant\n%v", got, want)
	}
}

// A blob that failed anywhere before its rename leaves no temp and is not there;
// Abort removes an unfinished one; a failed directory fsync is reported.
func TestBlobWriteFailures(t *testing.T) {
	for _, tc := range []struct {
		kind fsx.OpKind
		err  syscall.Errno
	}{{fsx.OpWrite, syscall.ENOSPC}, {fsx.OpSync, syscall.EIO}, {fsx.OpRename, syscall.EIO}, {fsx.OpSyncDir, syscall.EIO}} {
		t.Run(string(tc.kind), func(t *testing.T) {
			var faulty *fsx.Faulty
			s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS { faulty = fsx.NewFaulty(inner); return faulty }})
			w, err := s.CreateBlob()
			if err != nil {
				t.Fatal(err)
			}
			faulty.Inject = func(op fsx.Op) error {
				if op.Kind == tc.kind && (op.Kind != fsx.OpSyncDir || op.Path == store.BlobDir) {
					return tc.err
				}
				return nil
			}
			_, werr := w.Write([]byte("body"))
			_, _, cerr := w.Commit()
			w.Abort()
			err = errors.Join(werr, cerr)
			if !errors.Is(err, errcode.OutboxStoreUnwritable) || fsx.Errno(err) != tc.err {
				t.Fatalf("error %v, want OUTBOX_STORE_UNWRITABLE with %v", err, tc.err)
			}
			ents, _ := os.ReadDir(filepath.Join(s.Dir(), store.BlobDir))
			switch {
			case tc.kind == fsx.OpSyncDir && len(ents) != 1:
				t.Fatalf("after a failed directory fsync blobs/ holds %v, want the renamed blob", ents)
			case tc.kind != fsx.OpSyncDir && len(ents) != 0:
				t.Fatalf("blobs/ holds %v after a failure before the rename", ents)
			}
		})
	}
	s := openStore(t, store.Options{})
	w, err := s.CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("half"))
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.Dir(), store.BlobDir)); len(ents) != 0 {
		t.Fatalf("Abort left %v", ents)
	}
	if _, _, err := w.Commit(); err == nil {
		t.Fatal("Commit after Abort succeeded")
	}
}

// OpenBlob: BODY_MISSING for an absent blob; OUTBOX_STORE_INVALID for a bad name and
// for a file that breaks the blob rules (a symlink, group-readable, two links, a FIFO).
func TestOpenBlobRefusals(t *testing.T) {
	s := openStore(t, store.Options{})
	digest, _ := writeBlob(t, s, []byte("x"), 1)
	dir := filepath.Join(s.Dir(), store.BlobDir)
	missing := sha([]byte("nothing"))
	if _, err := s.OpenBlob(missing); !errors.Is(err, errcode.BodyMissing) {
		t.Fatalf("absent: %v", err)
	}
	for _, bad := range []string{"", "ABC", strings.ToUpper(digest), digest + "0", "../" + digest[3:], ".x.part"} {
		if _, err := s.OpenBlob(bad); !errors.Is(err, errcode.OutboxStoreInvalid) {
			t.Fatalf("name %q: %v", bad, err)
		}
	}
	target := filepath.Join(dir, digest)
	mk := func(name string, f func(p string) error) string {
		d := sha([]byte(name))
		if err := f(filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	cases := map[string]string{
		"symlink":   mk("symlink", func(p string) error { return os.Symlink(target, p) }),
		"0640":      mk("0640", func(p string) error { os.WriteFile(p, []byte("y"), 0o600); return os.Chmod(p, 0o640) }),
		"hard link": mk("link", func(p string) error { return os.Link(target, p) }),
		"fifo":      mk("fifo", func(p string) error { return syscall.Mkfifo(p, 0o600) }),
		"directory": mk("dir", func(p string) error { return os.Mkdir(p, 0o700) }),
	}
	for what, d := range cases {
		if b, err := s.OpenBlob(d); !errors.Is(err, errcode.OutboxStoreInvalid) {
			t.Errorf("%s: %v, want OUTBOX_STORE_INVALID", what, err)
			if b != nil {
				b.Close()
			}
		}
	}
}

// A partial blob resumes where it stopped (Offset = what it holds, across a reopen),
// and Commit turns it into blobs/<digest> once it verifies: its size and its SHA-256,
// read back from the file. A wrong size or digest is refused with its code and the
// partial blob is removed (the download starts again from 0).
func TestPartialBlobResumeAndCommit(t *testing.T) {
	s := openStore(t, store.Options{})
	env := uuid.NewString()
	data := blobBytes(2<<20+5, 7)
	p, err := s.PartialBlob(env)
	if err != nil {
		t.Fatal(err)
	}
	if p.Offset() != 0 {
		t.Fatalf("new partial at %d", p.Offset())
	}
	p.Write(data[:1<<20])
	if err := p.Persist(); err != nil {
		t.Fatal(err)
	}
	p.Write(data[1<<20 : 1<<20+100])
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	part := filepath.Join(s.Dir(), store.BlobDir, "."+env+".part")
	if fi, err := os.Lstat(part); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("part file: %v %v", fi, err)
	}
	if id, ok := store.BlobPartEnvelope("." + env + ".part"); !ok || id != env {
		t.Fatal("BlobPartEnvelope does not know the part's name")
	}
	p, err = s.PartialBlob(env)
	if err != nil {
		t.Fatal(err)
	}
	if p.Offset() != 1<<20+100 {
		t.Fatalf("reopened at %d, want %d", p.Offset(), 1<<20+100)
	}
	p.Write(data[p.Offset():])
	if err := p.Commit(sha(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	b, err := s.OpenBlob(sha(data))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(b)
	b.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("committed blob differs")
	}
	if _, err := os.Lstat(part); !os.IsNotExist(err) {
		t.Fatalf("part left after Commit: %v", err)
	}

	for _, tc := range []struct {
		name   string
		digest string
		size   int64
		code   *errcode.Code
	}{
		{"short", sha(data), int64(len(data)) + 1, errcode.BodySizeMismatch},
		{"long", sha(data[:10]), 10, errcode.BodySizeMismatch},
		{"digest", sha([]byte("other")), int64(len(data)), errcode.BodyDigestMismatch},
	} {
		env := uuid.NewString()
		p, err := s.PartialBlob(env)
		if err != nil {
			t.Fatal(err)
		}
		p.Write(data)
		if err := p.Commit(tc.digest, tc.size); !errors.Is(err, tc.code) {
			t.Fatalf("%s: Commit = %v, want %v", tc.name, err, tc.code)
		}
		if _, err := os.Lstat(filepath.Join(s.Dir(), store.BlobDir, "."+env+".part")); !os.IsNotExist(err) {
			t.Fatalf("%s: the refused part is still there (%v)", tc.name, err)
		}
		if ents, _ := os.ReadDir(filepath.Join(s.Dir(), store.BlobDir)); len(ents) != 1 || ents[0].Name() != sha(data) {
			t.Fatalf("%s: after a refused commit blobs/ holds %v, want only the first blob", tc.name, ents)
		}
		p, err = s.PartialBlob(env)
		if err != nil || p.Offset() != 0 {
			t.Fatalf("%s: after the refusal the download restarts at %d (%v), want 0", tc.name, p.Offset(), err)
		}
		p.Discard()
	}
	// The bytes are verified from the file, not from what Write was given: a part
	// altered on disk is refused.
	env = uuid.NewString()
	p, _ = s.PartialBlob(env)
	p.Write(data[:1000])
	f, err := os.OpenFile(filepath.Join(s.Dir(), store.BlobDir, "."+env+".part"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{data[500] ^ 1}, 500)
	f.Close()
	if err := p.Commit(sha(data[:1000]), 1000); !errors.Is(err, errcode.BodyDigestMismatch) {
		t.Fatalf("part altered on disk: Commit = %v", err)
	}
	if _, err := s.PartialBlob("not-a-uuid"); !errors.Is(err, errcode.OutboxStoreInvalid) {
		t.Fatalf("bad envelope id: %v", err)
	}
}

// Persist makes what was written durable: the part's fsync, and its directory's the
// first time (the part's name is new).
func TestPartialPersistCalls(t *testing.T) {
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS { faulty = fsx.NewFaulty(inner); return faulty }})
	env := uuid.NewString()
	if _, err := s.CreateBlob(); err != nil { // blobs/ made
		t.Fatal(err)
	}
	faulty.Reset()
	p, err := s.PartialBlob(env)
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("abc"))
	p.Persist()
	p.Write([]byte("def"))
	p.Persist()
	if err := p.Commit(sha([]byte("abcdef")), 6); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range faulty.Log() {
		got = append(got, string(op.Kind))
	}
	want := []string{"create", "write", "fsync", "syncdir", "write", "fsync", "fsync", "close", "rename", "syncdir"}
	if !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
}
