package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Receiving a blob body (DESIGN §13, docs/DAEMON.md "Large bodies"). A message
// envelope whose body is a blob (envelope.BlobRef) is only recorded once its sealed
// body is durable in the store's blobs/ and every chunk of it verified: the
// follower downloads it from the relay (FetchBody) into the store's partial file
// of the envelope, resuming from what that file holds durably, commits it under its
// digest (size and SHA-256 checked), opens it with envelope.VerifyBlob, and only
// then writes the receipt and the observation (with Blob) in one transaction and
// acknowledges the envelope. Memory does not grow with the body: it streams
// through one buffer.
const (
	// blobSyncEvery bounds the downloaded bytes not yet made durable: a follower
	// that is killed downloads at most this much again (plus what the relay had
	// sent that the file system had not taken).
	blobSyncEvery = 4 << 20
	// blobCopyBuffer is the download's one buffer.
	blobCopyBuffer = 256 << 10
	// blobDownloadTries bounds the downloads of one body that end with a complete
	// file of the wrong size or digest (each discards the part and starts again
	// from 0) before the envelope is refused with that code.
	blobDownloadTries = 3
	// blobStallTimeout cuts a body download that brings no byte for this long
	// (the next poll resumes it from what is durable).
	blobStallTimeout = 60 * time.Second
	// blobHeaderTimeout bounds the wait for a body download's answer headers.
	blobHeaderTimeout = 30 * time.Second
)

// bodyHTTPClient is the follower's client for body downloads: no overall timeout
// (a body of gigabytes takes its time), its answer's headers within
// blobHeaderTimeout, and a stall cut by the download itself (stallReader).
func bodyHTTPClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // relays are addressed directly
	tr.ResponseHeaderTimeout = blobHeaderTimeout
	return &http.Client{Transport: tr}
}

func (f *follower) bodyClient() *relayproto.Client {
	if f.bodies != nil {
		return f.bodies
	}
	return f.rc
}

// blobRefusal is a body refused for good: reason is the refusal record's, err says
// why (its errcode is the stable code).
type blobRefusal struct {
	reason string
	err    error
}

func (r *blobRefusal) Error() string { return r.err.Error() }
func (r *blobRefusal) Unwrap() error { return r.err }

// blobLocks serializes, within this process, the downloads of one envelope's body
// into one store (the store's partial file of an envelope has one writer).
var blobLocks sync.Map // store dir + "/" + envelope id → *sync.Mutex

func lockBlob(st *store.Store, envelopeID string) func() {
	v, _ := blobLocks.LoadOrStore(st.Dir()+"/"+envelopeID, new(sync.Mutex))
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// receiveBlob makes ref's sealed body durable in the store and verifies it,
// returning the plaintext length. A *blobRefusal is a refusal for good (too large,
// the wrong size or digest blobDownloadTries times, a chunk or header that does not
// verify); any other error leaves the envelope at the relay, and the next poll
// resumes the download from what is durable. The caller holds lockBlob of the
// envelope.
func (f *follower) receiveBlob(ctx context.Context, ref envelope.BlobRef) (int64, error) {
	d := f.d
	if limit := d.maxBody(); ref.Size > limit {
		return 0, &blobRefusal{record.RefusedBodyTooLarge, errcode.New(errcode.BodyTooLarge,
			fmt.Sprintf("a body of %d bytes, over the limit of %d", ref.Size, limit), nil)}
	}
	if err := f.haveBlob(ctx, ref); err != nil {
		return 0, err
	}
	b, err := d.st.OpenBlob(ref.Digest)
	if err != nil {
		return 0, err
	}
	defer b.Close()
	n, err := envelope.VerifyBlob(d.id, ref, b)
	switch {
	case errors.Is(err, envelope.ErrOpen):
		return 0, &blobRefusal{record.RefusedBody, errcode.New(errcode.BodyChunkInvalid, "the body's header does not open with our key", err)}
	case errors.Is(err, envelope.ErrBlob):
		return 0, &blobRefusal{record.RefusedBodyChunk, errcode.New(errcode.BodyChunkInvalid, "a chunk of the body does not verify", err)}
	case err != nil:
		return 0, err
	}
	return n, nil
}

// haveBlob returns once ref's blob is durable in blobs/ under its digest: at once if
// it is there with its size (a previous run, or another follower, committed it),
// else after downloading it.
func (f *follower) haveBlob(ctx context.Context, ref envelope.BlobRef) error {
	st := f.d.st
	if b, err := st.OpenBlob(ref.Digest); err == nil {
		size := b.Size()
		b.Close()
		if size == ref.Size {
			return nil
		}
	} else if !errors.Is(err, errcode.BodyMissing) {
		return err
	}
	var last error
	for try := 1; try <= blobDownloadTries; try++ {
		err := f.download(ctx, ref)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errcode.BodySizeMismatch) && !errors.Is(err, errcode.BodyDigestMismatch) {
			return err
		}
		// The store removed the part: the next try starts from 0.
		last = err
		f.redownloads.Add(1)
		f.d.log.Warn("inbox: a downloaded body does not match its envelope; downloading it again",
			"envelope", ref.EnvelopeID, "try", try, "err", err)
	}
	reason := record.RefusedBodyDigest
	if errors.Is(last, errcode.BodySizeMismatch) {
		reason = record.RefusedBodySize
	}
	return &blobRefusal{reason, fmt.Errorf("%d downloads of the body did not match its envelope: %w", blobDownloadTries, last)}
}

// download fetches ref's body into the envelope's partial file from the offset it
// holds, persisting at least every blobSyncEvery bytes and when the stream ends or
// breaks, and commits it once it holds ref.Size bytes (Commit checks size and
// digest). A relay that sends more than the body's size, or ends its answer short of
// it, makes a part that Commit refuses as the wrong size.
func (f *follower) download(ctx context.Context, ref envelope.BlobRef) (err error) {
	p, err := f.d.st.PartialBlob(ref.EnvelopeID)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			if cerr := p.Close(); err == nil {
				err = cerr
			}
		}
	}()
	off := p.Offset()
	if off > ref.Size {
		// More than the body: nothing of it can be right.
		if err := p.Discard(); err != nil {
			return err
		}
		committed = true
		return errcode.New(errcode.BodySizeMismatch, fmt.Sprintf("a partial body of %d bytes, more than its %d", off, ref.Size), nil)
	}
	if off < ref.Size {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		body, err := f.bodyClient().FetchBody(ctx, f.d.id, ref.EnvelopeID, off)
		if err != nil {
			return err
		}
		stall := newStallReader(body, blobStallTimeout, cancel)
		// One byte more than the rest may come: then the part is too long, and
		// Commit says so.
		n, cerr := copyPersisted(p, io.LimitReader(stall, ref.Size-off+1), blobSyncEvery)
		stall.stop()
		body.Close()
		f.downloaded.Add(n)
		if cerr != nil {
			if c := context.Cause(ctx); c != nil && ctx.Err() != nil {
				cerr = fmt.Errorf("%w: %w", c, cerr)
			}
			return cerr
		}
		// A stream that ended cleanly short of the size (the relay says the
		// body ends there: a cut connection is an error, not io.EOF) is a body
		// of the wrong size: Commit refuses it as one.
	}
	committed = true // Commit ends the part either way
	return p.Commit(ref.Digest, ref.Size)
}

// persister is what copyPersisted writes to: the store's partial file.
type persister interface {
	io.Writer
	Persist() error
}

// copyPersisted copies r to w through one buffer, calling w.Persist whenever every
// bytes were written since the last Persist, and once more at the end, also when r
// fails: what was written before a failure is durable.
func copyPersisted(w persister, r io.Reader, every int) (int64, error) {
	buf := make([]byte, blobCopyBuffer)
	var total int64
	unsynced := 0
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return total, err
			}
			total += int64(n)
			unsynced += n
			if unsynced >= every {
				if err := w.Persist(); err != nil {
					return total, err
				}
				unsynced = 0
			}
		}
		if rerr != nil {
			if unsynced > 0 {
				if err := w.Persist(); err != nil {
					return total, err
				}
			}
			if rerr == io.EOF {
				return total, nil
			}
			return total, rerr
		}
	}
}

// errBodyStalled is the cause of a body download cut for bringing nothing for
// blobStallTimeout.
var errBodyStalled = errors.New("the body download brought nothing for " + blobStallTimeout.String())

// stallReader cancels its download when no Read returns a byte for the timeout.
type stallReader struct {
	r io.Reader
	d time.Duration
	t *time.Timer
}

func newStallReader(r io.Reader, d time.Duration, cancel context.CancelCauseFunc) *stallReader {
	return &stallReader{r: r, d: d, t: time.AfterFunc(d, func() { cancel(errBodyStalled) })}
}

func (s *stallReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.t.Reset(s.d)
	}
	return n, err
}

func (s *stallReader) stop() { s.t.Stop() }
