package daemon

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// serveInboxBody answers GET /v1/inbox/{messageId}/body: the plaintext body of a
// received message, streamed, as application/octet-stream with its length in
// client.HeaderBodySize. An inline body comes from the observation's fact; a blob
// body is opened from the store's blob through envelope.OpenBlob, which verifies
// every chunk before it is sent. The answer is chunked, with the trailer
// client.TrailerBodyError: a blob that fails part-way (a chunk that does not verify,
// a blob cut short or of another digest) ends the answer early with the trailer set
// to the failure's stable code (BODY_CHUNK_INVALID), so that the client never takes
// a partial body for a whole one; the bytes before it were verified.
func (d *Daemon) serveInboxBody(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("messageId")
	if !uuid.Valid(id) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "message id must be a lower-case UUID")
		return
	}
	o, err := store.GetAs[*record.Observation](d.st, id)
	if err != nil {
		d.writeStoreError(w, err)
		return
	}
	if o == nil {
		writeErrorHint(w, http.StatusNotFound, codeNotFound, "no received message "+id, "list received messages with GET /v1/inbox (sealbridge inbox)")
		return
	}
	if o.Blob == nil {
		body, _ := inlineBody(o)
		w.Header().Set("Content-Type", client.ContentTypeStream)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set(client.HeaderBodySize, strconv.Itoa(len(body)))
		w.Header().Set("Trailer", client.TrailerBodyError)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
		return
	}
	ref := envelope.BlobRef{EnvelopeID: o.Blob.EnvelopeID, MessageID: o.MessageID, Sender: identity.DID(o.SenderDID),
		Recipient: d.id.DID(), Digest: o.Blob.Digest, Size: o.Blob.Size}
	sealed, err := d.st.OpenBlob(o.Blob.Digest)
	if err != nil {
		if errors.Is(err, errcode.BodyMissing) {
			d.log.Warn("api: a received message's blob is missing", "message", id, "digest", o.Blob.Digest, "err", err)
			writeErrorHint(w, http.StatusInternalServerError, errcode.BodyMissing.String(), "the sealed body of message "+id+" is missing from the store",
				"check the store with sealbridge-fsck")
			return
		}
		d.writeStoreError(w, err)
		return
	}
	defer sealed.Close()
	plain, err := envelope.OpenBlob(d.id, ref, sealed)
	if err != nil {
		d.log.Warn("api: a received message's blob does not open", "message", id, "digest", o.Blob.Digest, "err", err)
		writeErrorHint(w, http.StatusInternalServerError, errcode.BodyChunkInvalid.String(), "the sealed body of message "+id+" does not open",
			"check the store with sealbridge-fsck")
		return
	}
	w.Header().Set("Content-Type", client.ContentTypeStream)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set(client.HeaderBodySize, strconv.FormatInt(o.Blob.BodySize, 10))
	w.Header().Set("Trailer", client.TrailerBodyError)
	w.WriteHeader(http.StatusOK)
	out := &idleWriter{w: w, rc: http.NewResponseController(w)}
	n, rerr, werr := copyVerified(out, plain)
	d.m.bodyBytes.WithLabelValues("got").Add(float64(n))
	switch {
	case werr != nil:
		d.log.Debug("api: a body download broke off", "message", id, "bytes", n, "err", werr)
	case rerr != nil:
		// Not one byte past the failing chunk was sent; the trailer says why the
		// answer ends here.
		d.log.Warn("api: a received message's blob does not verify", "message", id, "digest", o.Blob.Digest, "bytes", n, "err", rerr)
		w.Header().Set(client.TrailerBodyError, errcode.BodyChunkInvalid.String())
	case n != o.Blob.BodySize:
		d.log.Warn("api: a received message's blob has another length than observed", "message", id, "bytes", n, "observed", o.Blob.BodySize)
		w.Header().Set(client.TrailerBodyError, errcode.BodySizeMismatch.String())
	}
}

// inlineBody is the opened body an observation's first fact holds (inbound.go's
// fact).
func inlineBody(o *record.Observation) ([]byte, bool) {
	if len(o.Facts) == 0 {
		return []byte{}, false
	}
	var fc fact
	if json.Unmarshal(o.Facts[0], &fc) != nil {
		return []byte{}, false
	}
	body, err := base64.StdEncoding.DecodeString(fc.Body)
	if err != nil || body == nil {
		return []byte{}, false
	}
	return body, true
}

// copyVerified copies r to w through one chunk's buffer and returns the bytes
// written, the read error (the blob's) and the write error (the client's), the
// first that ended the copy.
func copyVerified(w io.Writer, r io.Reader) (n int64, rerr, werr error) {
	buf := make([]byte, streamCopyBuffer)
	for {
		k, err := r.Read(buf)
		if k > 0 {
			m, err := w.Write(buf[:k])
			n += int64(m)
			if err != nil {
				return n, nil, err
			}
		}
		switch {
		case err == io.EOF:
			return n, nil, nil
		case err != nil:
			return n, err, nil
		}
	}
}

// idleWriter writes a body download, moving the connection's write deadline to
// streamIdle ahead at most once a second while the client takes bytes.
type idleWriter struct {
	w     io.Writer
	rc    *http.ResponseController
	moved time.Time
}

func (b *idleWriter) Write(p []byte) (int, error) {
	if now := time.Now(); now.Sub(b.moved) >= time.Second {
		b.moved = now
		_ = b.rc.SetWriteDeadline(now.Add(streamIdle))
	}
	return b.w.Write(p)
}
