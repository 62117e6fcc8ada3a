package relayproto

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Large bodies (docs/RELAY.md "Bodies"). An envelope whose message body is a
// blob (envelope.BlobRef: the digest and sealed size of a body carried beside
// the envelope) is posted to PathEnvelopes as any other; while the relay does
// not hold all of its body it keeps the envelope pending (not fetchable) and
// answers 202 with a BodyIncomplete. The sender uploads the body with the
// resumable upload of tus 1.0 core at PathBodies + envelopeId, then posts the
// envelope again for its receipt. The recipient downloads a fetchable
// envelope's body, resumably, from PathInboxBodies + envelopeId.
const (
	// PathBodies + envelopeId is the upload of a pending envelope's body:
	//
	//   - HEAD → 200 with Upload-Offset (the bytes the relay holds durably)
	//     and Upload-Length (the sealed size); 404 UPLOAD_UNKNOWN when no
	//     envelope with that id is pending (never posted, or already
	//     complete: post it for its receipt).
	//   - PATCH, Content-Type application/offset+octet-stream, Upload-Offset
	//     O and a Content-Length: O must be the relay's durable offset, else
	//     409 UPLOAD_OFFSET_MISMATCH with the relay's Upload-Offset. The
	//     relay appends the bytes, makes them durable, and answers 204 with
	//     the new Upload-Offset. Bytes past Upload-Length: 413 BODY_TOO_LARGE,
	//     nothing appended. When the offset reaches Upload-Length the relay
	//     checks the SHA-256: a mismatch discards what it held (the upload
	//     starts again at 0) and answers 422 BODY_DIGEST_MISMATCH.
	//
	// Neither is signed: the envelope is, and it names the digest the body
	// must have.
	PathBodies = "/v1/bodies/"
	// PathInboxBodies + envelopeId is the body of an envelope fetchable in
	// the caller's inbox: a signed GET (as GET /v1/inbox) by its recipient,
	// answered 200 with all of it, or, with "Range: bytes=O-", 206 with its
	// bytes from O (Content-Range "bytes O-LAST/SIZE"); O = SIZE is 416 with
	// "Content-Range: bytes */SIZE". Acknowledging the envelope removes it.
	PathInboxBodies = "/v1/inbox/bodies/"

	// Headers of the upload (tus 1.0 core).
	HeaderUploadOffset = "Upload-Offset"
	HeaderUploadLength = "Upload-Length"
	HeaderTusResumable = "Tus-Resumable"
	// TusVersion is the tus protocol version a relay speaks; a request that
	// names another gets 412.
	TusVersion = "1.0.0"
	// ContentTypeOffsetOctetStream is the Content-Type of a PATCH.
	ContentTypeOffsetOctetStream = "application/offset+octet-stream"
)

// Error codes of the bodies.
const (
	// CodeBodyIncomplete: the envelope's body is not all held by the relay
	// yet (the code of a 202 BodyIncomplete, and of a batch member that is a
	// blob envelope: batches never carry them).
	CodeBodyIncomplete = "BODY_INCOMPLETE"
	// CodeBodyDigestMismatch (422): the uploaded body does not have the
	// digest the envelope names; the relay discarded it.
	CodeBodyDigestMismatch = "BODY_DIGEST_MISMATCH"
	// CodeUploadOffsetMismatch (409): a PATCH at an offset other than the
	// relay's durable one; the answer's Upload-Offset is the relay's.
	CodeUploadOffsetMismatch = "UPLOAD_OFFSET_MISMATCH"
	// CodeUploadUnknown (404): no envelope with that id is pending.
	CodeUploadUnknown = "UPLOAD_UNKNOWN"
	// CodeBodyMissing (404): no body of a fetchable envelope with that id in
	// the caller's inbox.
	CodeBodyMissing = "BODY_MISSING"
	// CodeBodyUnsupported (501): this relay's storage does not keep blob
	// bodies.
	CodeBodyUnsupported = "BODY_UNSUPPORTED"
)

// BodyIncomplete is the 202 answer to POST /v1/envelopes for an envelope whose
// body the relay does not hold in full yet: Code is CodeBodyIncomplete, Upload
// the path of its upload (PathBodies + envelopeId), Offset the bytes held
// durably, Size the sealed size the envelope names.
type BodyIncomplete struct {
	Code   string `json:"code"`
	Upload string `json:"upload"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
}

// BodyIncompleteError is what Client.Post returns for a 202: upload the body
// from Offset (Client.UploadBody), then post again.
type BodyIncompleteError struct {
	Offset, Size int64
	Upload       string
}

func (e *BodyIncompleteError) Error() string {
	return fmt.Sprintf("relay: 202 %s: the relay holds %d of the body's %d bytes; upload the rest to %s",
		CodeBodyIncomplete, e.Offset, e.Size, e.Upload)
}

// ParseUploadOffset parses an Upload-Offset or Upload-Length value: a
// non-negative decimal integer without sign or leading zeros.
func ParseUploadOffset(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || strconv.FormatInt(v, 10) != s {
		return 0, false
	}
	return v, true
}

// ParseContentRange parses the Content-Range of a 206 ("bytes FIRST-LAST/SIZE")
// or of a 416 ("bytes */SIZE": first and last are -1).
func ParseContentRange(s string) (first, last, size int64, ok bool) {
	rest, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return 0, 0, 0, false
	}
	rng, sz, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, 0, false
	}
	if size, ok = ParseUploadOffset(sz); !ok {
		return 0, 0, 0, false
	}
	if rng == "*" {
		return -1, -1, size, true
	}
	a, b, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, 0, false
	}
	first, ok1 := ParseUploadOffset(a)
	last, ok2 := ParseUploadOffset(b)
	if !ok1 || !ok2 || first > last || last >= size {
		return 0, 0, 0, false
	}
	return first, last, size, true
}

// RangeFrom parses a Range header of the form "bytes=O-" (the only form a
// body download uses): its offset, ok false for anything else.
func RangeFrom(s string) (int64, bool) {
	rest, found := strings.CutPrefix(s, "bytes=")
	if !found {
		return 0, false
	}
	o, found := strings.CutSuffix(rest, "-")
	if !found {
		return 0, false
	}
	return ParseUploadOffset(o)
}

// tusHeaders sets the tus version header on a request.
func tusHeaders(h http.Header) { h.Set(HeaderTusResumable, TusVersion) }
