package store

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"path"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// Blobs (DESIGN §5, §7; FORMAT.md §9). A large message body is kept, sealed, in a blob
// file outside the record directories: blobs/<digest>, where digest is the lower-case
// hex SHA-256 of the file's bytes, a private regular file with one link. The signed
// envelope (and so the outbox record that embeds it, or the observation of an inbound
// message) names the digest and the size. A blob is written before any record that
// refers to it: BlobWriter.Commit (or Partial.Commit) returns only once it is durable,
// and Enqueue refuses an envelope whose blob is not there with its size. Maintenance
// removes a blob no record refers to once it is older than Limits.BlobGrace.

// BlobDir is the directory of a store's blobs, beside the kind directories.
const BlobDir = "blobs"

// DefaultBlobGrace is Limits.BlobGrace's default: how old (by mtime) an unreferenced
// blob, a leftover staged blob (.<uuid>.tmp) or a partial download (.<envelopeId>.part)
// must be before maintenance removes it.
const DefaultBlobGrace = time.Hour

// partSuffix ends the name of a partial inbound blob: .<envelopeId>.part.
const partSuffix = ".part"

// blobReadChunk is how much of a blob Partial.Commit reads at a time to hash it.
const blobReadChunk = 1 << 20

// ValidBlobDigest reports whether s is a blob's name: 64 lower-case hex digits.
func ValidBlobDigest(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// BlobPartEnvelope returns the envelope id of a partial download's name
// (".<envelopeId>.part", the id a lower-case UUID), or false for any other name.
func BlobPartEnvelope(base string) (string, bool) {
	id, ok := strings.CutPrefix(base, ".")
	if !ok {
		return "", false
	}
	id, ok = strings.CutSuffix(id, partSuffix)
	if !ok || !uuid.Valid(id) {
		return "", false
	}
	return id, true
}

func blobPath(digest string) string { return BlobDir + "/" + digest }

func partBase(envelopeID string) string { return "." + envelopeID + partSuffix }

// ensureBlobDir makes blobs/ (and the store directory) exist, private and durable.
func (s *Store) ensureBlobDir() error {
	if err := s.ensureStoreDir(); err != nil {
		return err
	}
	if err := s.kindDirs.Ensure(s.fs, BlobDir); err != nil {
		return writeError(BlobDir, err)
	}
	return nil
}

// BlobWriter writes one blob: the bytes go to a fresh staged temp in blobs/ as they
// come (constant memory), hashed and counted; Commit makes the blob durable under its
// digest. A BlobWriter is not safe for concurrent use; call Commit or Abort once done
// (Abort after Commit does nothing, so it can be deferred).
type BlobWriter struct {
	s    *Store
	w    *fsx.StagedWriter
	h    hash.Hash
	done bool
}

// CreateBlob starts a blob: it makes blobs/ (0700, durable) if needed and creates a
// staged temp there (fsx.StageStream: .<uuid>.tmp, O_EXCL, 0600, no symlink followed).
// It takes no lock. An abandoned temp is removed by maintenance after Limits.BlobGrace.
// A rolled-back Store refuses it (STORE_ROLLED_BACK).
func (s *Store) CreateBlob() (*BlobWriter, error) {
	if err := s.checkWritable(); err != nil {
		return nil, err
	}
	if err := s.ensureBlobDir(); err != nil {
		return nil, err
	}
	w, err := fsx.StageStream(s.fs, BlobDir)
	if err != nil {
		return nil, writeError(BlobDir, err)
	}
	return &BlobWriter{s: s, w: w, h: sha256.New()}, nil
}

// Write appends p to the blob, hashing it. It writes all of p or returns an
// OUTBOX_STORE_UNWRITABLE error, after which only Abort is useful.
func (w *BlobWriter) Write(p []byte) (int, error) {
	if w.done {
		return 0, errcode.New(errcode.OutboxStoreUnwritable, w.w.Temp(), errors.New("blob already committed or aborted"))
	}
	n, err := w.w.Write(p)
	w.h.Write(p[:n])
	if err != nil {
		return n, writeError(w.w.Temp(), err)
	}
	return n, nil
}

// Size returns the number of bytes written so far.
func (w *BlobWriter) Size() int64 { return w.w.Size() }

// Commit makes the blob durable: it fsyncs and closes the temp, renames it to
// blobs/<digest> and fsyncs blobs/. When it returns nil the blob survives a crash
// under its name, and digest (lower-case hex SHA-256 of the bytes written) and size
// are what a record refers to it by. A blob already there under that name is
// replaced by this one: the same bytes (their digest is the name), dated now, so the
// grace time protects it until a record refers to it. On error nothing is
// acknowledged: the temp is removed (before the rename) or the blob may or may not
// survive a crash (a failed directory fsync). A failed fsync is never retried.
func (w *BlobWriter) Commit() (digest string, size int64, err error) {
	if w.done {
		return "", 0, errcode.New(errcode.OutboxStoreUnwritable, w.w.Temp(), errors.New("blob already committed or aborted"))
	}
	w.done = true
	size = w.w.Size()
	st, err := w.w.Finish()
	if err != nil {
		return "", 0, writeError(w.w.Temp(), err)
	}
	digest = hex.EncodeToString(w.h.Sum(nil))
	if err := st.Publish(digest); err != nil {
		_ = st.Cleanup()
		return "", 0, writeError(blobPath(digest), err)
	}
	if err := w.s.fs.SyncDir(BlobDir); err != nil {
		return "", 0, writeError(BlobDir, err)
	}
	return digest, size, nil
}

// Abort removes the temp of a blob not committed; after Commit it does nothing.
func (w *BlobWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	if err := w.w.Abort(); err != nil {
		return writeError(w.w.Temp(), err)
	}
	return nil
}

// Blob is an open blob file: read it sequentially (io.Reader) or at offsets
// (io.ReaderAt, e.g. through an io.SectionReader). Close it when done. A Blob is not
// safe for concurrent use through Read; ReadAt is (pread).
type Blob struct {
	f    fsx.File
	name string
	size int64
	off  int64
}

// OpenBlob opens blobs/<digest> for reading. The file must be a private regular file
// with one link (the blob rules of DESIGN §5), opened without following a link and
// without blocking on a FIFO. It fails with BODY_MISSING if there is no such blob and
// OUTBOX_STORE_INVALID if digest is not a valid blob name or the file breaks the
// rules. It does not hash the file: whoever reads it checks it against its reference
// (envelope.OpenBlob checks the digest and every chunk as it reads).
func (s *Store) OpenBlob(digest string) (*Blob, error) {
	if !ValidBlobDigest(digest) {
		return nil, invalidAt(BlobDir+"/"+digest, errors.New("a blob's name is 64 lower-case hex digits"))
	}
	name := blobPath(digest)
	f, info, err := fsx.OpenRegular(s.fs, name, -1)
	if err != nil {
		if fsx.IsNotExist(err) {
			return nil, errcode.New(errcode.BodyMissing, name, nil)
		}
		return nil, invalidAt(name, err)
	}
	if err := fsx.CheckPrivateFile(name, info); err != nil {
		f.Close()
		return nil, invalidAt(name, err)
	}
	return &Blob{f: f, name: name, size: info.Size}, nil
}

// Size returns the blob's length when it was opened.
func (b *Blob) Size() int64 { return b.size }

// Read reads the next bytes of the blob; io.EOF at its end.
func (b *Blob) Read(p []byte) (int, error) {
	n, err := b.ReadAt(p, b.off)
	b.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// ReadAt reads len(p) bytes at off (io.ReaderAt: io.EOF when fewer are there).
func (b *Blob) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := b.f.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, invalidAt(b.name, err)
	}
	return n, err
}

// Close closes the file.
func (b *Blob) Close() error { return b.f.Close() }

// Partial is a blob being received (a resumable download of the sealed body of an
// inbound envelope): blobs/.<envelopeId>.part, grown by Write, made durable by
// Persist, and turned into blobs/<digest> by Commit once whole. Only one Partial of an
// envelope may be open at a time. It is not safe for concurrent use.
type Partial struct {
	s    *Store
	name string
	a    *fsx.Appender
	err  error // the first failure of Write or Persist: the part's end is unknown
	done bool  // closed, committed or discarded
}

// PartialBlob opens the partial blob of envelopeID, or creates it (0600, blobs/ made
// if needed): its Offset, the file's length, is where the download resumes. It takes
// no lock. A partial blob left alone is removed by maintenance after Limits.BlobGrace.
// A rolled-back Store refuses it (STORE_ROLLED_BACK).
func (s *Store) PartialBlob(envelopeID string) (*Partial, error) {
	if !uuid.Valid(envelopeID) {
		return nil, invalidAt(BlobDir+"/"+partBase(envelopeID), errors.New("envelope id is not a lower-case UUID"))
	}
	if err := s.checkWritable(); err != nil {
		return nil, err
	}
	if err := s.ensureBlobDir(); err != nil {
		return nil, err
	}
	base := partBase(envelopeID)
	name := path.Join(BlobDir, base)
	var size int64
	info, err := s.fs.Lstat(name)
	switch {
	case err == nil:
		size = info.Size // OpenAppend checks what it opens: private, regular, one link
	case !fsx.IsNotExist(err):
		return nil, invalidAt(name, err)
	}
	a, err := fsx.OpenAppend(s.fs, BlobDir, base, size, true)
	if err != nil {
		return nil, writeError(name, err)
	}
	return &Partial{s: s, name: name, a: a}, nil
}

// Offset returns the bytes the partial blob holds; after Persist they are durable.
func (p *Partial) Offset() int64 { return p.a.Offset() }

func (p *Partial) usable() error {
	if p.done {
		return unwritable(p.name, errors.New("partial blob already closed, committed or discarded"))
	}
	return p.err
}

// Write appends b. It writes all of b or fails with OUTBOX_STORE_UNWRITABLE; after
// an error only Close or Discard is useful (a new PartialBlob resumes from what the
// file holds).
func (p *Partial) Write(b []byte) (int, error) {
	if err := p.usable(); err != nil {
		return 0, err
	}
	n, err := p.a.Write(b)
	if err != nil {
		p.err = writeError(p.name, err)
		return n, p.err
	}
	return n, nil
}

// Persist makes every byte written so far durable (the file's fsync and, after it was
// created, its directory's). A failed fsync is never retried: the Partial is unusable,
// and the download must start again from what a new PartialBlob finds (or from 0,
// after Discard).
func (p *Partial) Persist() error {
	if err := p.usable(); err != nil {
		return err
	}
	if err := p.a.Checkpoint(); err != nil {
		p.err = writeError(p.name, err)
		return p.err
	}
	return nil
}

// Close closes the partial blob, keeping it for a later resume.
func (p *Partial) Close() error {
	if p.done {
		return nil
	}
	p.done = true
	if err := p.a.Close(); err != nil {
		return writeError(p.name, err)
	}
	return nil
}

// Commit turns the whole partial blob into blobs/<digest>: it checks that the file
// holds exactly size bytes (else BODY_SIZE_MISMATCH) whose SHA-256 is digest (else
// BODY_DIGEST_MISMATCH), reading it back from the file; on a mismatch it removes the
// partial blob (a download starts again from 0). Then it fsyncs the file, renames it
// to blobs/<digest> (replacing a blob there: the same bytes) and fsyncs blobs/: when
// it returns nil the blob is durable. The Partial is done afterwards, whatever the
// outcome.
func (p *Partial) Commit(digest string, size int64) error {
	if err := p.usable(); err != nil {
		p.Close()
		return err
	}
	if !ValidBlobDigest(digest) {
		p.Close()
		return invalidAt(BlobDir+"/"+digest, errors.New("a blob's name is 64 lower-case hex digits"))
	}
	got, gotDigest, err := p.hash()
	switch {
	case err != nil:
		p.Close()
		return err
	case got != size:
		p.Discard()
		return errcode.New(errcode.BodySizeMismatch, p.name, fmt.Errorf("holds %d bytes, the reference says %d", got, size))
	case gotDigest != digest:
		p.Discard()
		return errcode.New(errcode.BodyDigestMismatch, p.name, errors.New("the bytes do not hash to the reference's digest"))
	}
	p.done = true
	st, err := p.a.Stage()
	if err != nil {
		return writeError(p.name, err)
	}
	if err := st.Publish(digest); err != nil {
		return writeError(blobPath(digest), err)
	}
	if err := p.s.fs.SyncDir(BlobDir); err != nil {
		return writeError(BlobDir, err)
	}
	return nil
}

// hash reads the partial blob back from its file (not from what Write was given) and
// returns its length and SHA-256.
func (p *Partial) hash() (int64, string, error) {
	f, _, err := fsx.OpenRegular(p.s.fs, p.name, -1)
	if err != nil {
		return 0, "", invalidAt(p.name, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, make([]byte, blobReadChunk))
	if err != nil {
		return 0, "", invalidAt(p.name, err)
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// Discard removes the partial blob durably.
func (p *Partial) Discard() error {
	p.done = true
	if err := p.a.Remove(); err != nil {
		return writeError(p.name, err)
	}
	return nil
}
