package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// jsBodies is the JetStream storage's bodyStore: the bodies in a JetStream
// Object Store (jsstore.Bodies: 8 MiB segment objects, committed with a
// compare-and-set, so two relay processes never both append at one offset).
//
// Its pending envelopes are in the process's memory only: hold and unhold do
// nothing, and a relay process that did not see an envelope's POST (another
// process did, or this one restarted) learns of it from the sender's next
// POST, which the carrier sends first whenever it resumes, and takes its
// offset from the Object Store then (bodyStore.offset). A body its sender
// abandoned is removed when a process that holds its pending envelope expires
// it; one whose every such process stopped first stays in the Object Store (a
// limit: the file storage has none).
type jsBodies struct {
	b *jsstore.Bodies
}

func (j *jsBodies) pendingAtOpen() []pendingFound                          { return nil }
func (j *jsBodies) hold(context.Context, *envelope.Envelope, []byte) error { return nil }
func (j *jsBodies) unhold(context.Context, string) error                   { return nil }

func (j *jsBodies) offset(ctx context.Context, id string) (int64, error) {
	off, err := j.b.Offset(ctx, id)
	if err != nil {
		return 0, jsError(err)
	}
	return off, nil
}

func (j *jsBodies) append(ctx context.Context, id string, offset int64, r io.Reader) (int64, error) {
	d, err := j.b.Append(ctx, id, offset, r)
	var oe *jsstore.OffsetError
	if errors.Is(err, jsstore.ErrBodyCorrupt) {
		// Append read the partial last segment to extend it while another
		// process's Append replaced it (jsstore's limit 4): that Append won.
		if now, oerr := j.b.Offset(ctx, id); oerr == nil && now != offset {
			oe = &jsstore.OffsetError{Offset: offset, Durable: now}
			err = oe
		}
	}
	switch {
	case errors.As(err, &oe):
		// Another relay process appended first (the Object Store's
		// compare-and-set): the answer is the 409 of a busy upload.
		return oe.Durable, newError(http.StatusConflict, relayproto.CodeUploadOffsetMismatch,
			"the relay holds %d bytes of this body (another upload of it ran); upload from there", oe.Durable)
	case err != nil:
		return d, &relayproto.Error{Status: http.StatusServiceUnavailable, Code: relayproto.CodeRelayStorageUnavailable,
			Message: "the relay's JetStream storage did not take the body", RetryAfter: 5, Cause: err}
	}
	return d, nil
}

func (j *jsBodies) open(ctx context.Context, id string, offset int64) (io.ReadCloser, error) {
	rc, err := j.b.Open(ctx, id, offset)
	if errors.Is(err, jsstore.ErrBodyRange) {
		return nil, newError(http.StatusNotFound, relayproto.CodeBodyMissing, "the relay holds no body of %s from %d", id, offset)
	}
	if err != nil {
		return nil, jsError(err)
	}
	return rc, nil
}

// seal checks that the Object Store holds the whole body: its segments are
// what a download reads, so nothing moves.
func (j *jsBodies) seal(ctx context.Context, id string, size int64) error {
	off, err := j.b.Offset(ctx, id)
	if err != nil {
		return jsError(err)
	}
	if off != size {
		return jsError(fmt.Errorf("the body of %s holds %d bytes, not %d", id, off, size))
	}
	return nil
}

func (j *jsBodies) discard(ctx context.Context, id string) error {
	// Removed to the end even if the request goes away: a half-deleted body
	// would be read back as corrupt.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bodyDeleteTimeout)
	defer cancel()
	if err := j.b.Delete(dctx, id); err != nil {
		return jsError(err)
	}
	return nil
}

// bodyDeleteTimeout bounds the removal of one body from the Object Store.
const bodyDeleteTimeout = 30 * time.Second

// blobMarker is in the wire bytes of every blob envelope (the body's
// {"blob":…}) and of no other: an inline body's fields are base64url and the
// other fields ids, DIDs and numbers. It spares a Parse of every acknowledged
// envelope.
var blobMarker = []byte(`"blob":"`)

// isBlobWire reports whether wire is a blob envelope's.
func isBlobWire(wire []byte) bool {
	if !bytes.Contains(wire, blobMarker) {
		return false
	}
	env, err := envelope.Parse(wire)
	if err != nil {
		return false
	}
	_, ok := blobOf(env)
	return ok
}

// fetchable on JetStream: the inbox message of recipient and id, read from
// the stream (its wire names the body's size).
func (j *jsBackend) fetchable(ctx context.Context, recipient identity.DID, id string) (int64, bool, error) {
	wire, deadline, ok, err := j.st.Waiting(ctx, recipient, id)
	if err != nil {
		return 0, false, jsError(err)
	}
	if !ok || !deadline.After(j.now()) {
		return 0, false, nil
	}
	env, err := envelope.Parse(wire)
	if err != nil {
		return 0, false, internalError(err)
	}
	return blobSize(env), true, nil
}

// dropBody removes the body of an envelope that left its inbox; a failure is
// logged (the body stays in the Object Store).
func (j *jsBackend) dropBody(ctx context.Context, id string) {
	if j.bodies == nil {
		return
	}
	if err := j.bodies.discard(ctx, id); err != nil {
		j.log.Warn("relay: body of a removed envelope not removed", "envelopeId", id, "err", err)
	}
}
