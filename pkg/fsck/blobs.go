package fsck

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"sync"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The blob layout (docs/FORMAT.md, the store's blobs): a large body's sealed bytes in
// "blobs/<digest>" (digest: lower-case hex SHA-256 of the file's content,
// store.ValidBlobDigest), a staged write in "blobs/.<uuid>.tmp", an inbound partial
// download in "blobs/.<envelopeId>.part" (store.BlobPartEnvelope). blobs/ is a private
// directory like the kind directories; every blob a private regular file with one link.
const (
	blobsDir    = store.BlobDir
	hashBufSize = 256 << 10 // the read buffer of one hashing worker (and of a copy)
)

// blobRef is one record's reference to a blob: the outbox record whose envelope has
// a blob body, or the observation whose Blob names it.
type blobRef struct {
	path   string // the record that names the blob
	digest string
	size   int64 // the sealed size the record names
	// needed: the store still needs the body — a pending outbox envelope (the carrier
	// uploads it) or an observation (the recipient reads it). A relayed or closed
	// envelope is never sent again.
	needed bool
	state  string // the outbox envelope's state ("" for an observation)
}

// blobFile is a regular file in blobs/ named by a digest.
type blobFile struct {
	path   string
	digest string
	info   fsx.Info
}

// checkBlobsDir checks blobs/ and every name in it, and collects the blob files
// whose content checkBlobs examines against the records.
func (c *checker) checkBlobsDir() error {
	p := blobsDir
	info, err := c.fs.Lstat(p)
	if err != nil {
		return nil // gone since the listing
	}
	d := dep{path: p, fp: info.Fingerprint()}
	switch {
	case info.IsSymlink():
		c.add(problem(CodeSymlink, p, "the blobs directory is a symbolic link; the store never follows it, so it holds no blobs", actionMove+" (the link, not its target)", moveFix(phaseRoot, false, d)))
		return nil
	case !info.IsDir():
		c.add(problem(CodeWrongType, p, "the blobs directory is "+typeName(info.Mode), actionMove, moveFix(phaseRoot, false, d)))
		return nil
	}
	if err := fsx.CheckPrivateDir(p, info); err != nil {
		c.add(c.dirMetadata(p, "the blobs directory", info))
	}
	ents, err := c.fs.ReadDir(p)
	if err != nil {
		if fsx.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("fsck: listing %s: %w", path.Join(c.dir, p), err)
	}
	c.blobsListed = true
	sortEntries(ents)
	for _, e := range ents {
		name := path.Join(p, e.Name)
		switch {
		case store.ValidBlobDigest(e.Name):
			c.checkBlobFile(name, e.Name)
		case fsx.IsTempName(e.Name):
			c.checkBlobPartial(name, "a body being written (a staged blob): a send in progress, or one interrupted before it committed the blob; the store's maintenance removes it once abandoned")
		case isPart(e.Name):
			id, _ := store.BlobPartEnvelope(e.Name)
			c.checkBlobPartial(name, "a body being received (the partial download of envelope "+id+"): the daemon resumes it from its end; the store's maintenance removes it once abandoned")
		default:
			c.unknown(name, false)
		}
	}
	return nil
}

func isPart(base string) bool { _, ok := store.BlobPartEnvelope(base); return ok }

// checkBlobFile checks the type and metadata of blobs/<digest>; a regular file is
// kept for checkBlobs.
func (c *checker) checkBlobFile(p, digest string) {
	if info, ok := c.checkBlobEntry(p, "blob", digest); ok {
		c.blobFiles = append(c.blobFiles, blobFile{path: p, digest: digest, info: info})
	}
}

// checkBlobPartial notes a staged or partial blob (why), after the layout rules.
func (c *checker) checkBlobPartial(p, why string) {
	if _, ok := c.checkBlobEntry(p, "partial blob", ""); ok {
		c.add(note(CodeBlobPartial, p, why))
	}
}

// checkBlobEntry checks one name in blobs/ (what: "blob" or "partial blob"): a
// symbolic link or a file of another type is a problem (moved by repair) and ok is
// false; a regular file that is not private is reported (blobMetadata) and ok is
// true, with its metadata.
func (c *checker) checkBlobEntry(p, what, digest string) (fsx.Info, bool) {
	info, err := c.fs.Lstat(p)
	if err != nil {
		return info, false
	}
	d := dep{path: p, fp: info.Fingerprint()}
	switch {
	case info.IsSymlink():
		c.add(problem(CodeSymlink, p, "a "+what+" name that is a symbolic link; the store never follows it", actionMove+" (the link, not its target)", moveFix(phaseRecords, false, d)))
		return info, false
	case !info.IsRegular():
		d.dir = info.IsDir()
		c.add(problem(CodeWrongType, p, "a "+what+" name that is "+typeName(info.Mode)+", not a regular file", actionMove, moveFix(phaseRecords, false, d)))
		return info, false
	}
	if err := fsx.CheckPrivateFile(p, info); err != nil {
		c.add(blobMetadata(p, "the "+what, digest, info))
	}
	return info, true
}

// blobMetadata is the finding of a blob or partial blob that fsx.CheckPrivateFile
// refused. A wrong mode is set right in place; another owner or extra links are
// repaired as a record's are, by a private copy of the same bytes — streamed, and for
// a committed blob (digest set) only if they still hash to its name.
func blobMetadata(p, what, digest string, info fsx.Info) Finding {
	d := dep{path: p, fp: info.Fingerprint()}
	copyFix := &fix{kind: fixCopyBlob, phase: phaseMetadata, digest: digest, deps: []dep{d}}
	const copyAction = "replace it by a private copy of the same bytes"
	switch {
	case int(info.Uid) != os.Geteuid():
		return problem(CodeBadOwner, p, fmt.Sprintf("%s is owned by uid %d, not by the user running fsck (uid %d)", what, info.Uid, os.Geteuid()),
			copyAction, copyFix)
	case info.Nlink != 1:
		return problem(CodeHardLink, p, fmt.Sprintf("%s has %d links; a blob must have exactly one (another name can change its bytes)", what, info.Nlink),
			copyAction, copyFix)
	}
	return problem(CodeBadMode, p, fmt.Sprintf("%s has mode %04o: group or others have access (want 0600)", what, info.Perm()), "set mode 0600",
		&fix{kind: fixChmod, phase: phaseMetadata, perm: 0o600, deps: []dep{d}})
}

// checkBlobs relates the blob files to the records that name them: a record naming
// an absent blob (blob-missing, or blob-missing-settled for an envelope that is never
// sent again), a blob whose size is not what a record names (blob-truncated), a blob
// whose content's SHA-256 is not its name (blob-digest, hashed as a stream on
// opts.Workers goroutines), and a blob no record names (blob-unreferenced).
func (c *checker) checkBlobs(ctx context.Context, results []result) error {
	refs := map[string][]blobRef{}
	var all []blobRef
	for _, res := range results {
		if res.vanished || res.finding != nil {
			continue
		}
		for _, r := range res.refs {
			refs[r.digest] = append(refs[r.digest], r)
			all = append(all, r)
		}
	}
	files := map[string]bool{}
	var hash []blobFile
	for _, b := range c.blobFiles {
		c.rep.Blobs++
		files[b.digest] = true
		if r, ok := sizeMismatch(b, refs[b.digest]); ok {
			how := "shorter than"
			if b.info.Size > r.size {
				how = "longer than"
			}
			c.add(problem(CodeBlobTruncated, b.path, fmt.Sprintf("%d bytes, %s the %d bytes that %s names: the body cannot be sent or read", b.info.Size, how, r.size, r.path),
				actionMove+" (the records naming it then report blob-missing)", moveFix(phaseRecords, false, dep{path: b.path, fp: b.info.Fingerprint()})))
			continue
		}
		hash = append(hash, b)
	}
	sums, err := c.hashAll(ctx, hash)
	if err != nil {
		return err
	}
	for i, b := range hash {
		rs := refs[b.digest]
		named := "no record names it"
		if len(rs) > 0 {
			named = rs[0].path + " names it"
		}
		fx := moveFix(phaseRecords, false, dep{path: b.path, fp: b.info.Fingerprint()})
		switch s := sums[i]; {
		case s.vanished:
		case s.err != nil:
			c.add(problem(CodeBlobDigest, b.path, "the blob cannot be read to check its digest: "+errnoText(s.err)+"; "+named,
				actionMove+" (the records naming it then report blob-missing)", fx))
		case s.changed:
			// Replaced or rewritten while it was read: a snapshot cannot judge it.
		case s.sum != b.digest:
			c.add(problem(CodeBlobDigest, b.path, "the SHA-256 of its content is not its name: its bytes changed after it was written; "+named,
				actionMove+" (the records naming it then report blob-missing)", fx))
		case len(rs) == 0:
			c.add(note(CodeBlobUnreferenced, b.path, "no record names this blob: a send interrupted between writing its body and its record, or a received body whose records were not written, leaves one; the store's maintenance removes it after its grace time"))
		}
	}
	for _, r := range all {
		if files[r.digest] {
			continue
		}
		bp := path.Join(blobsDir, r.digest)
		where := "which is absent"
		switch {
		case c.quarantined[bp]:
			where = "which an earlier repair moved to lost+found (it was damaged)"
		case c.blobNamePresent(bp):
			where = "which is not a usable blob (see its finding)"
		case !c.blobsListed:
			where = "which is absent (the store has no usable blobs directory)"
		}
		switch {
		case !r.needed:
			c.add(note(CodeBlobMissingSettled, r.path, fmt.Sprintf("a %s envelope names the body blob %s (%d bytes), %s; the envelope is never sent again, so nothing needs it", r.state, bp, r.size, where)))
		case r.state != "":
			c.add(problem(CodeBlobMissing, r.path, fmt.Sprintf("a pending envelope names the body blob %s (%d bytes), %s: the body cannot be sent", bp, r.size, where),
				"none: the daemon closes the envelope with BODY_MISSING when it comes to it (its message fails); to deliver the body, send it again", nil))
		default:
			c.add(problem(CodeBlobMissing, r.path, fmt.Sprintf("a received message names the body blob %s (%d bytes), %s: its body cannot be read (BODY_MISSING)", bp, r.size, where),
				"none: the body is lost from this store; ask its sender to send it again", nil))
		}
	}
	return nil
}

// blobNamePresent reports whether blobs/<digest> exists as anything (a symbolic
// link, a directory, …): named, but not a usable blob.
func (c *checker) blobNamePresent(p string) bool {
	_, err := c.fs.Lstat(p)
	return err == nil
}

// sizeMismatch returns the first reference whose size is not the blob file's.
func sizeMismatch(b blobFile, refs []blobRef) (blobRef, bool) {
	for _, r := range refs {
		if r.size != b.info.Size {
			return r, true
		}
	}
	return blobRef{}, false
}

// hashResult is the streamed SHA-256 of one blob file.
type hashResult struct {
	sum      string
	vanished bool  // gone since the listing
	changed  bool  // not the file listed, or it changed while read
	err      error // it could not be read
}

// hashAll hashes the blob files on opts.Workers goroutines, each reading through one
// fixed buffer: memory does not grow with a blob's size.
func (c *checker) hashAll(ctx context.Context, files []blobFile) ([]hashResult, error) {
	out := make([]hashResult, len(files))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(c.opts.Workers, len(files)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, hashBufSize)
			for i := range jobs {
				out[i] = hashBlob(ctx, c.fs, files[i], buf)
			}
		}()
	}
feed:
	for i := range files {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// hashBlob streams one blob file through SHA-256: opened beneath the store without
// following links (O_NOFOLLOW, O_NONBLOCK: a FIFO put in its place never blocks), the
// same inode as listed, read in buf-sized pieces.
func hashBlob(ctx context.Context, fsys fsx.FS, b blobFile, buf []byte) hashResult {
	f, err := fsys.OpenFile(b.path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	switch {
	case fsx.IsNotExist(err):
		return hashResult{vanished: true}
	case fsx.Errno(err) == syscall.ELOOP:
		return hashResult{changed: true}
	case err != nil:
		return hashResult{err: err}
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return hashResult{err: err}
	}
	if info.Fingerprint() != b.info.Fingerprint() {
		return hashResult{changed: true}
	}
	h := sha256.New()
	n, err := io.CopyBuffer(h, ctxReader{ctx, f}, buf)
	if err != nil {
		if ctx.Err() != nil {
			return hashResult{changed: true} // the check is cancelled; its report is dropped
		}
		return hashResult{err: err}
	}
	if after, err := f.Stat(); err != nil || n != info.Size || after.Fingerprint() != info.Fingerprint() {
		return hashResult{changed: true}
	}
	return hashResult{sum: hex.EncodeToString(h.Sum(nil))}
}

// ctxReader reads r until ctx is done (checked before every read), and hides r's
// other methods so io.CopyBuffer uses the buffer it is given.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// copyBlob replaces the blob (or staged or partial blob) f.Path by a private copy of
// its bytes: it opens the file beneath the store without following links, confirms it
// is the file the check saw, streams it through one buffer into a staged temp in the
// same directory (fsx.StageStream: O_EXCL, 0600, fsynced by Finish) while hashing it,
// refuses (errChanged) bytes of another length or, for a committed blob, a SHA-256
// other than its name, then renames the copy over the name and fsyncs the directory.
// The old inode is not deleted: its other links (or its owner's) keep it.
func (r *repairer) copyBlob(f Finding) error {
	fx := f.fix
	src, err := r.fs.OpenFile(f.Path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	defer src.Close()
	info, err := src.Stat()
	if err != nil {
		return err
	}
	if info.Fingerprint() != fx.deps[0].fp {
		return errChanged
	}
	dir := path.Dir(f.Path)
	w, err := fsx.StageStream(r.fs, dir)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(w, h), struct{ io.Reader }{src}, make([]byte, hashBufSize))
	switch {
	case err != nil:
	case n != info.Size:
		err = fmt.Errorf("%w: its length changed while it was copied", errChanged)
	case fx.digest != "" && hex.EncodeToString(h.Sum(nil)) != fx.digest:
		err = fmt.Errorf("%w: its bytes no longer hash to its name", errChanged)
	}
	if err != nil {
		_ = w.Abort()
		return err
	}
	st, err := w.Finish()
	if err != nil {
		return err
	}
	if err := st.Publish(path.Base(f.Path)); err != nil {
		_ = st.Cleanup()
		return err
	}
	return r.fs.SyncDir(dir)
}
