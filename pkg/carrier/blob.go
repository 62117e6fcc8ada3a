package carrier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Large bodies (DESIGN §11, docs/CARRIER.md "Blob envelopes"). An envelope whose
// body is a blob (envelope.BlobRef: a sealed body kept in the store's blobs/, named
// by its digest) is sent alone, never in a batch: POST the envelope; the relay keeps
// it pending and answers BODY_INCOMPLETE with the offset it holds durably; the
// carrier uploads the rest from there, streaming the store's blob through an
// io.SectionReader in requests of at most Options.UploadChunk bytes (each one made
// durable by the relay before it answers, so a cut costs at most one request's
// unsynced tail), then posts again for the receipt, and settles as any envelope.
const (
	// defaultUploadChunk bounds one upload request: the relay syncs at least every
	// 4 MiB and at each request's end, so this bounds what a cut connection can
	// make the carrier send again beyond what the relay had synced.
	defaultUploadChunk = 64 << 20
	// maxBodyRounds bounds the posts of one attempt of a blob envelope: post,
	// upload, post again; a relay that forgot the upload (UPLOAD_UNKNOWN) or
	// discarded a wrong body gets another round, up to this many.
	maxBodyRounds = 4
	// maxUploadStalls bounds the upload requests in a row that move the relay's
	// offset no further than it was (409s naming an offset already passed or
	// answering a request of ours still running there, failed requests the relay
	// synced nothing of) before the attempt counts as failed; after each the next
	// waits stallPause, doubling (0.25 + 0.5 + 1 + 2 s).
	maxUploadStalls = 5
	stallPause      = 250 * time.Millisecond
)

// blobMark is a byte string every blob body's wire form holds (`"body":{"blob":"…`)
// and no inline one can (its values are base64): the cheap test before a parse.
var blobMark = []byte(`"blob":"`)

// blobOf returns the blob reference of a wire envelope whose body is a blob.
func blobOf(wire []byte) (envelope.BlobRef, bool) {
	if !bytes.Contains(wire, blobMark) {
		return envelope.BlobRef{}, false
	}
	e, err := envelope.Parse(wire)
	if err != nil {
		return envelope.BlobRef{}, false // the relay refuses it as it refuses any bad envelope
	}
	return e.Blob()
}

// sendOne sends one leased envelope: Send, or for a blob envelope sendBlob.
func (c *Carrier) sendOne(ctx context.Context, url string, l leased) Result {
	if l.blob != nil {
		return c.sendBlob(ctx, url, l, *l.blob)
	}
	sendCtx, cancel := context.WithTimeout(ctx, c.o.SendTimeout)
	defer cancel()
	return c.t.Send(sendCtx, url, l.env)
}

// sendBlob is one attempt of a blob envelope: the blob is opened first (missing, or
// not of the size the envelope names: refused by the carrier, for good, before the
// relay is asked anything), then post → upload from the relay's offset → post again,
// each post bounded by SendTimeout, each upload request by SendTimeout without
// progress, while the lease is renewed every LeaseFor/2.
// The result is the last post's, or the upload's failure.
func (c *Carrier) sendBlob(ctx context.Context, url string, l leased, ref envelope.BlobRef) Result {
	blob, err := c.s.OpenBlob(ref.Digest)
	if err != nil {
		if errors.Is(err, errcode.BodyMissing) {
			return Result{Outcome: Refused, local: true, Code: errcode.BodyMissing.String(),
				Err: fmt.Errorf("the blob of the body is not in the store: %w", err)}
		}
		return Result{Outcome: Failed, Err: fmt.Errorf("opening the blob of the body: %w", err)}
	}
	defer blob.Close()
	if blob.Size() != ref.Size {
		return Result{Outcome: Refused, local: true, Code: errcode.BodyMissing.String(),
			Err: fmt.Errorf("%s: the stored blob of the body is %d bytes, the envelope names %d", errcode.BodyMissing, blob.Size(), ref.Size)}
	}
	ctx, lost, stop := c.keepLease(ctx, l.e.EnvelopeID)
	defer stop()
	res := c.post(ctx, url, l.env)
	for round := 1; res.Body != nil; round++ {
		bt, ok := c.t.(BodyTransport)
		switch {
		case !ok:
			res.Err = fmt.Errorf("%w (this transport does not upload bodies)", res.Err)
			return res
		case res.Body.Size != ref.Size:
			return Result{Outcome: Failed, Status: res.Status, Code: res.Code,
				Err: fmt.Errorf("the relay names a body of %d bytes, the envelope %d", res.Body.Size, ref.Size)}
		case round > maxBodyRounds:
			res.Err = fmt.Errorf("%w (body still incomplete after %d uploads)", res.Err, maxBodyRounds)
			return res
		}
		if up := c.upload(ctx, bt, url, l.e.EnvelopeID, blob, res.Body.Offset, ref.Size); up.Outcome != Accepted {
			if lost() {
				up.Err = fmt.Errorf("the lease was lost during the upload: %w", up.Err)
			}
			return up
		}
		res = c.post(ctx, url, l.env)
	}
	return res
}

// post sends the envelope once, bounded by SendTimeout.
func (c *Carrier) post(ctx context.Context, url string, env []byte) Result {
	sendCtx, cancel := context.WithTimeout(ctx, c.o.SendTimeout)
	defer cancel()
	return c.t.Send(sendCtx, url, env)
}

// upload sends the body from offset off to size in requests of at most UploadChunk
// bytes, each a section of the blob (constant memory), each cut when it moves no
// byte for SendTimeout (idleBounded: a request of 64 MiB takes what the link needs).
// It continues from the relay's offset whenever the relay names one (a 409
// UPLOAD_OFFSET_MISMATCH, or BodyOffset after a request that broke: the relay keeps
// what it synced of it). It returns Accepted when the relay holds all of it or says
// no upload of that id is pending (UPLOAD_UNKNOWN: complete, or forgotten — the next
// post says which); otherwise the failure to end the attempt with: a refusal, an
// unreachable relay, a digest mismatch (the relay discarded the body), or
// maxUploadStalls requests in a row that moved nothing.
func (c *Carrier) upload(ctx context.Context, bt BodyTransport, url, envelopeID string, blob io.ReaderAt, off, size int64) Result {
	stalls := 0
	for off < size {
		if ctx.Err() != nil {
			return Result{Outcome: Failed, Err: ctx.Err()}
		}
		n := min(c.o.UploadChunk, size-off)
		rctx, body, stop := c.idleBounded(ctx, io.NewSectionReader(blob, off, n))
		r := bt.UploadBody(rctx, url, envelopeID, off, body, n)
		stop()
		next, known := int64(-1), r.Body != nil
		if known {
			next = r.Body.Offset
		}
		switch {
		case r.Outcome == Accepted && known:
		case r.Code == relayproto.CodeUploadUnknown:
			return Result{Outcome: Accepted}
		case r.Code == relayproto.CodeUploadOffsetMismatch && known:
		case r.Outcome == Refused || r.Outcome == Unreachable || r.Code == relayproto.CodeBodyDigestMismatch || ctx.Err() != nil:
			return r
		default:
			// A broken request: the relay may have synced part of it. Ask.
			hctx, cancel := context.WithTimeout(ctx, c.o.SendTimeout)
			h := bt.BodyOffset(hctx, url, envelopeID)
			cancel()
			switch {
			case h.Outcome == Accepted && h.Body != nil:
				next = h.Body.Offset
			case h.Code == relayproto.CodeUploadUnknown:
				return Result{Outcome: Accepted}
			case h.Outcome == Unreachable:
				return h // the relay went away (killed, restarting): the target waits and is probed
			default:
				return r
			}
		}
		if next < 0 || next > size {
			return Result{Outcome: Failed, Status: r.Status, Err: fmt.Errorf("the relay names body offset %d of %d bytes", next, size)}
		}
		if next > off {
			c.st.uploaded.Add(uint64(next - off))
			stalls = 0
		} else if stalls++; stalls >= maxUploadStalls {
			if r.Err == nil {
				r.Err = errors.New("the upload makes no progress")
			}
			return Result{Outcome: Failed, Status: r.Status, Code: r.Code, RetryAfter: r.RetryAfter,
				Err: fmt.Errorf("%d upload requests in a row moved the relay's offset no further: %w", stalls, r.Err)}
		} else if !c.pause(ctx, stallPause<<(stalls-1)) {
			// The relay may still be finishing a request of ours that broke (it
			// answers 409 while one runs): give it a moment, growing.
			return Result{Outcome: Failed, Err: ctx.Err()}
		}
		off = next
	}
	return Result{Outcome: Accepted}
}

// keepLease renews this holder's lease on envelopeID every LeaseFor/2 until stop is
// called, so that an upload longer than a lease keeps the envelope to this holder.
// The returned context ends, and lost reports true, if a renewal finds the lease
// gone (the record settled, closed, or taken over by another holder): the upload
// stops. A renewal that fails on a store error is tried again at the next tick.
func (c *Carrier) keepLease(ctx context.Context, envelopeID string) (_ context.Context, lost func() bool, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	gone := false
	done := make(chan struct{})
	var wg sync.WaitGroup
	t := c.o.Clock.NewTimer(c.o.LeaseFor / 2)
	wg.Go(func() {
		defer func() { t.Stop() }()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C():
			}
			ok, err := c.renewLease(ctx, envelopeID)
			if err == nil && !ok {
				mu.Lock()
				gone = true
				mu.Unlock()
				cancel()
			}
			if err != nil && ctx.Err() == nil {
				c.storeError(err)
				c.storeWarn("carrier: renewing a lease during an upload", "envelope", envelopeID, "err", err)
			}
			t = c.o.Clock.NewTimer(c.o.LeaseFor / 2) // before the hook: a test moves the clock after it
			if c.onRenew != nil && err == nil {
				c.onRenew(envelopeID, ok)
			}
			if err == nil && !ok {
				return
			}
		}
	})
	return ctx, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return gone
		}, func() {
			close(done)
			wg.Wait()
			cancel()
		}
}

// renewLease extends this holder's lease on envelopeID to now + LeaseFor, in a
// prepared transaction on the record as it is; false if it is not pending under this
// holder's lease any more.
func (c *Carrier) renewLease(ctx context.Context, envelopeID string) (bool, error) {
	ok := false
	err := c.s.PreparedTransaction(ctx, func(tx *store.Tx) error {
		ok = false
		o, err := store.TxGet[*record.Outbox](tx, envelopeID)
		if err != nil || o == nil || o.State != record.StatePending || o.Lease == nil || o.Lease.Holder != c.o.HolderID {
			return err
		}
		ok = true
		o.Lease = &record.Lease{Holder: c.o.HolderID, Until: c.nowMs() + c.o.LeaseFor.Milliseconds()}
		return tx.Put(o)
	})
	return ok, err
}

// pause waits d on the carrier's clock; false if ctx ended first.
func (c *Carrier) pause(ctx context.Context, d time.Duration) bool {
	t := c.o.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// idleBounded returns a context derived from ctx that ends when body has not been
// read for SendTimeout — while the request streams, and after its last byte while
// the relay makes it durable and answers — and body, which counts as progress. stop
// releases it. It runs on the wall clock, as the send timeout does.
func (c *Carrier) idleBounded(ctx context.Context, body io.Reader) (context.Context, io.Reader, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(c.o.SendTimeout, func() {
		cancel(fmt.Errorf("the upload request moved no byte for %s", c.o.SendTimeout))
	})
	return ctx, &progressReader{r: body, t: t, d: c.o.SendTimeout}, func() { t.Stop(); cancel(nil) }
}

// progressReader pushes its timer back at every read that returns bytes.
type progressReader struct {
	r io.Reader
	t *time.Timer
	d time.Duration
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.t.Reset(p.d)
	}
	return n, err
}
