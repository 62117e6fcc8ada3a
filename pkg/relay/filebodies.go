package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// bodiesDir holds, in the inbox directory, the bodies of blob envelopes and
// the envelopes pending them, all named by envelope id:
//
//	<id>.pending  the wire envelope, pending its body (fsx.CreateFile)
//	<id>.part     the body's bytes so far (fsx.Appender: checkpointed at least
//	              every bodySyncEvery bytes and at the end of each append)
//	<id>.blob     the complete, verified body (.part renamed, directory fsynced)
//
// An envelope enters its inbox only after its .blob is durable, and its
// .pending is removed only after (a crash in between leaves a .pending whose
// envelope has its receipt record: forgotten at the next start). After a
// restart a .part's durable offset is its size: every byte in it was written
// by an append of the body's bytes in order (pwrite writes a prefix of what it
// is given); a power cut that left garbage past the last fsync is caught by
// the digest check, which discards the body. Acknowledgement and expiry of an
// inbox entry remove its .blob; expiry of a pending envelope all three.
const bodiesDir = "bodies"

// fileBodies is the file storage's bodyStore.
type fileBodies struct {
	f     *fileStore
	found []pendingFound
}

func partName(id string) string    { return id + ".part" }
func blobName(id string) string    { return id + ".blob" }
func pendingName(id string) string { return id + ".pending" }

func bodiesUnwritable(err error) *relayproto.Error {
	return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its bodies", err)
}

// openFileBodies loads bodiesDir (the inboxes are loaded): the pending
// envelopes with their bodies' offsets; temps, parts without a pending
// envelope, and blobs of no inbox entry (a crash between an acknowledgement
// and the body's removal) are removed.
func openFileBodies(f *fileStore) (*fileBodies, error) {
	b := &fileBodies{f: f}
	ents, err := f.fs.ReadDir(bodiesDir)
	if fsx.IsNotExist(err) {
		return b, nil
	}
	if err != nil {
		return nil, fmt.Errorf("relay: read the bodies: %w", err)
	}
	names := map[string]bool{}
	for _, d := range ents {
		if d.Type == 0 {
			names[d.Name] = true
		}
	}
	removed := 0
	remove := func(name string) {
		if err := f.fs.Remove(path.Join(bodiesDir, name)); err == nil {
			removed++
		}
	}
	for name := range names {
		id, ext, _ := strings.Cut(name, ".")
		if fsx.IsTempName(name) {
			remove(name)
			continue
		}
		if !uuid.Valid(id) {
			f.log.Warn("relay: ignoring unexpected file in bodies", "file", name)
			continue
		}
		switch ext {
		case "pending":
			p, err := b.loadPending(id, names)
			if err != nil {
				return nil, err
			}
			b.found = append(b.found, p)
		case "part":
			if !names[pendingName(id)] {
				remove(name)
			}
		case "blob":
			if !names[pendingName(id)] && f.byID[id] == nil {
				remove(name)
			}
		default:
			f.log.Warn("relay: ignoring unexpected file in bodies", "file", name)
		}
	}
	if removed > 0 {
		if err := f.fs.SyncDir(bodiesDir); err != nil {
			return nil, fmt.Errorf("relay: bodies: %w", err)
		}
	}
	f.log.Info("relay: bodies loaded", "pending", len(b.found), "removed", removed)
	return b, nil
}

func (b *fileBodies) loadPending(id string, names map[string]bool) (pendingFound, error) {
	data, _, err := fsx.ReadFile(b.f.fs, path.Join(bodiesDir, pendingName(id)), envelope.MaxSize)
	if err != nil {
		return pendingFound{}, fmt.Errorf("relay: read pending envelope %s: %w", id, err)
	}
	env, err := envelope.Parse(data)
	var ref envelope.BlobRef
	ok := false
	if err == nil {
		ref, ok = blobOf(env)
	}
	if err != nil || env.ID() != id || !ok {
		return pendingFound{}, fmt.Errorf("relay: pending file %s is not the blob envelope its name says: %v", pendingName(id), err)
	}
	p := pendingFound{env: env, wire: data}
	if names[blobName(id)] {
		p.offset, p.sealed = ref.Size, true
		return p, nil
	}
	if names[partName(id)] {
		info, err := b.f.fs.Lstat(path.Join(bodiesDir, partName(id)))
		if err != nil {
			return pendingFound{}, fmt.Errorf("relay: body of %s: %w", id, err)
		}
		p.offset = info.Size
		if p.offset > ref.Size { // not this body's bytes: start again
			_ = b.f.fs.Remove(path.Join(bodiesDir, partName(id)))
			p.offset = 0
		}
	}
	return p, nil
}

func (b *fileBodies) pendingAtOpen() []pendingFound {
	found := b.found
	b.found = nil
	return found
}

func (b *fileBodies) hold(_ context.Context, env *envelope.Envelope, wire []byte) error {
	if err := b.f.dirs.Ensure(b.f.fs, bodiesDir); err != nil {
		return bodiesUnwritable(err)
	}
	if err := fsx.CreateFile(b.f.fs, bodiesDir, pendingName(env.ID()), wire); err != nil {
		return bodiesUnwritable(err)
	}
	return nil
}

func (b *fileBodies) offset(_ context.Context, id string) (int64, error) {
	for _, name := range []string{blobName(id), partName(id)} {
		info, err := b.f.fs.Lstat(path.Join(bodiesDir, name))
		if err == nil {
			return info.Size, nil
		}
		if !fsx.IsNotExist(err) {
			return 0, unavailable(relayproto.CodeInboxUnreadable, "the relay cannot read its bodies", err)
		}
	}
	return 0, nil
}

func (b *fileBodies) unhold(_ context.Context, id string) error {
	if err := fsx.RemoveFile(b.f.fs, bodiesDir, pendingName(id)); err != nil && !fsx.IsNotExist(err) {
		return bodiesUnwritable(err)
	}
	return nil
}

// append copies r to the end of the .part (fsx.Appender) through a
// bodyBuffer buffer, persisting it every bodySyncEvery bytes and at the end
// (or when r fails: what arrived is kept). A failed fsync discards the part.
// A part longer than offset — a write that failed after some of its bytes,
// each a byte of the body in order — is made durable and answered as a 409 at
// its length.
func (b *fileBodies) append(_ context.Context, id string, offset int64, r io.Reader) (int64, error) {
	fsys := b.f.fs
	if offset == 0 {
		// Whatever a part holds at 0 is not this upload's.
		if err := fsys.Remove(path.Join(bodiesDir, partName(id))); err != nil && !fsx.IsNotExist(err) {
			return 0, bodiesUnwritable(err)
		}
	}
	var held int64
	if info, err := fsys.Lstat(path.Join(bodiesDir, partName(id))); err == nil {
		held = info.Size // OpenAppend checks what it opens: private, regular, one link
	} else if !fsx.IsNotExist(err) {
		return offset, bodiesUnwritable(err)
	}
	a, err := fsx.OpenAppend(fsys, bodiesDir, partName(id), held, true)
	if err != nil {
		return offset, bodiesUnwritable(err)
	}
	defer a.Close()
	if a.Offset() != offset {
		if a.Offset() < offset {
			return b.lost(id, fmt.Errorf("the part holds %d bytes, not the %d answered", a.Offset(), offset))
		}
		if err := a.Checkpoint(); err != nil {
			return b.lost(id, err)
		}
		return a.Offset(), newError(http.StatusConflict, relayproto.CodeUploadOffsetMismatch,
			"the relay holds %d bytes of this body; upload from there", a.Offset())
	}
	durable := offset
	buf := make([]byte, bodyBuffer)
	since := 0
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, werr := a.Write(buf[:n]); werr != nil {
				// The Appender is unusable; what the last Checkpoint made durable
				// stands (the next append finds the rest).
				return durable, bodiesUnwritable(werr)
			}
			if since += n; since >= bodySyncEvery {
				if err := a.Checkpoint(); err != nil {
					return b.lost(id, err)
				}
				durable, since = a.Offset(), 0
			}
		}
		if rerr != nil && rerr != io.EOF {
			if err := a.Checkpoint(); err != nil {
				return b.lost(id, err)
			}
			return a.Offset(), rerr
		}
		if rerr == io.EOF {
			break
		}
	}
	if err := a.Checkpoint(); err != nil {
		return b.lost(id, err)
	}
	return a.Offset(), nil
}

// lost discards a part whose fsync failed: its state is unknown.
func (b *fileBodies) lost(id string, err error) (int64, error) {
	_ = b.f.fs.Remove(path.Join(bodiesDir, partName(id)))
	_ = b.f.fs.SyncDir(bodiesDir)
	return 0, bodiesUnwritable(err)
}

// sectionFile is a body opened for reading from an offset.
type sectionFile struct {
	*io.SectionReader
	f fsx.File
}

func (s *sectionFile) Close() error { return s.f.Close() }

func (b *fileBodies) open(_ context.Context, id string, offset int64) (io.ReadCloser, error) {
	var f fsx.File
	var err error
	for _, name := range []string{blobName(id), partName(id)} {
		f, err = b.f.fs.OpenFile(path.Join(bodiesDir, name), syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		if !fsx.IsNotExist(err) {
			break
		}
	}
	if err != nil {
		if fsx.IsNotExist(err) {
			return nil, newError(404, relayproto.CodeBodyMissing, "the relay holds no body of %s", id)
		}
		return nil, unavailable(relayproto.CodeInboxUnreadable, "the relay cannot read its bodies", err)
	}
	info, err := f.Stat()
	if err == nil && !info.IsRegular() {
		err = &fs.PathError{Op: "open", Path: f.Name(), Err: fsx.ErrNotRegular}
	}
	if err == nil && info.Size < offset {
		err = fmt.Errorf("the body holds %d bytes, not %d", info.Size, offset)
	}
	if err != nil {
		f.Close()
		return nil, unavailable(relayproto.CodeInboxUnreadable, "the relay cannot read its bodies", err)
	}
	return &sectionFile{SectionReader: io.NewSectionReader(f, offset, info.Size-offset), f: f}, nil
}

func (b *fileBodies) seal(_ context.Context, id string, size int64) error {
	part := path.Join(bodiesDir, partName(id))
	info, err := b.f.fs.Lstat(part)
	if err == nil && info.Size != size {
		err = fmt.Errorf("the part holds %d bytes, not %d", info.Size, size)
	}
	if err == nil {
		err = b.f.fs.Rename(part, path.Join(bodiesDir, blobName(id)))
	}
	if err == nil {
		err = b.f.fs.SyncDir(bodiesDir)
	}
	if err != nil {
		return bodiesUnwritable(err)
	}
	return nil
}

func (b *fileBodies) discard(_ context.Context, id string) error {
	var errs []error
	for _, name := range []string{partName(id), blobName(id)} {
		if err := b.f.fs.Remove(path.Join(bodiesDir, name)); err != nil && !fsx.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	if err := b.f.fs.SyncDir(bodiesDir); err != nil && !fsx.IsNotExist(err) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return bodiesUnwritable(err)
	}
	return nil
}
