package relayproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// maxBodyAnswer bounds what a Client reads of a 202 or of an upload's answer.
const maxBodyAnswer = 4 << 10

func (c *Client) bodyURL(base, envelopeID string) (string, error) {
	if !uuid.Valid(envelopeID) {
		return "", fmt.Errorf("relay: %q is not an envelope id", envelopeID)
	}
	return strings.TrimRight(c.BaseURL, "/") + base + envelopeID, nil
}

// refusal reads a non-success answer into an *Error (as do does), the body
// bounded by maxBodyAnswer. A HEAD's answer has no body: its 404 is
// CodeUploadUnknown.
func refusal(resp *http.Response) *Error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBodyAnswer))
	e := &Error{Status: resp.StatusCode}
	if json.Unmarshal(body, e) != nil || e.Code == "" {
		e.Code, e.Message = "HTTP_"+strconv.Itoa(resp.StatusCode), "relay answered "+resp.Status
		if resp.Request != nil && resp.Request.Method == http.MethodHead && resp.StatusCode == http.StatusNotFound {
			e.Code, e.Message = CodeUploadUnknown, "no envelope with this id is pending at the relay"
		}
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		e.RetryAfter, _ = strconv.Atoi(s)
	}
	return e
}

// BodyOffset asks the relay how much of a pending envelope's body it holds
// durably (HEAD PathBodies+envelopeID): the offset to upload from, and the
// body's size. An envelope that is not pending (never posted, or complete:
// post it for its receipt) is an *Error with CodeUploadUnknown.
func (c *Client) BodyOffset(ctx context.Context, envelopeID string) (offset, size int64, err error) {
	u, err := c.bodyURL(PathBodies, envelopeID)
	if err != nil {
		return 0, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, u, nil)
	if err != nil {
		return 0, 0, err
	}
	tusHeaders(req.Header)
	resp, err := c.http().Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, refusal(resp)
	}
	offset, ok1 := ParseUploadOffset(resp.Header.Get(HeaderUploadOffset))
	size, ok2 := ParseUploadOffset(resp.Header.Get(HeaderUploadLength))
	if !ok1 || !ok2 || offset > size {
		return 0, 0, errors.New("relay: the answer has no valid Upload-Offset and Upload-Length")
	}
	return offset, size, nil
}

// UploadBody appends the next n bytes of r to a pending envelope's body at
// offset, which must be the relay's durable offset (PATCH PathBodies+
// envelopeID). It streams r: nothing of it is buffered beyond the HTTP
// client's own copy buffer, and r must yield n bytes (a shorter r fails the
// request). It returns the relay's new durable offset.
//
// On an error the returned offset is the relay's if its answer said it (a 409
// CodeUploadOffsetMismatch carries the relay's Upload-Offset: continue from
// there; so do the relay's other refusals of a PATCH it began, such as a 503
// after a write failed), else the offset passed in — the relay may hold more (a connection
// cut after the relay synced): BodyOffset, or another UploadBody that will be
// answered 409 with the right one, finds out. A 422 CodeBodyDigestMismatch
// means the relay discarded the body: it starts again at 0.
func (c *Client) UploadBody(ctx context.Context, envelopeID string, offset int64, r io.Reader, n int64) (int64, error) {
	if offset < 0 || n < 0 {
		return offset, fmt.Errorf("relay: upload at offset %d of %d bytes", offset, n)
	}
	u, err := c.bodyURL(PathBodies, envelopeID)
	if err != nil {
		return offset, err
	}
	var body io.Reader = http.NoBody
	if n > 0 {
		body = io.LimitReader(r, n)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, body)
	if err != nil {
		return offset, err
	}
	req.ContentLength = n
	req.GetBody = nil // never replayed: the reader is consumed once
	tusHeaders(req.Header)
	req.Header.Set("Content-Type", ContentTypeOffsetOctetStream)
	req.Header.Set(HeaderUploadOffset, strconv.FormatInt(offset, 10))
	if n > 0 {
		// A refusal (409 at another offset, 413) then comes before any byte
		// of the body is sent, where the client's transport waits for it
		// (http.Transport.ExpectContinueTimeout; the carrier's does).
		req.Header.Set("Expect", "100-continue")
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return offset, err
	}
	defer resp.Body.Close()
	relayOffset, hasOffset := ParseUploadOffset(resp.Header.Get(HeaderUploadOffset))
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		e := refusal(resp)
		if hasOffset {
			return relayOffset, e
		}
		return offset, e
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBodyAnswer))
	if !hasOffset || relayOffset < offset {
		return offset, errors.New("relay: the upload's answer has no valid Upload-Offset")
	}
	return relayOffset, nil
}

// FetchBody downloads the body of an envelope fetchable in id's inbox from
// offset on (a signed GET PathInboxBodies+envelopeID with "Range:
// bytes=offset-", from 0 too, so every download names where it starts). The returned stream is the body's bytes from offset
// to its end, checked against the answer's Content-Range (206) or to start at
// 0 (200); it reports io.ErrUnexpectedEOF if the connection ends early. Offset
// equal to the size yields an empty stream. The caller closes it. An envelope
// not fetchable by id is an *Error (404 CodeBodyMissing).
func (c *Client) FetchBody(ctx context.Context, id *identity.Identity, envelopeID string, offset int64) (io.ReadCloser, error) {
	if offset < 0 {
		return nil, fmt.Errorf("relay: download from offset %d", offset)
	}
	u, err := c.bodyURL(PathInboxBodies, envelopeID)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	// Always ranged, from 0 too: every download says where it starts.
	req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	if err := SignInboxRequest(req, id, c.now()); err != nil {
		return nil, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (io.ReadCloser, error) {
		resp.Body.Close()
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if offset > 0 {
			return fail(errors.New("relay: a ranged body download was answered with the whole body"))
		}
		return resp.Body, nil
	case http.StatusPartialContent:
		first, last, size, ok := ParseContentRange(resp.Header.Get("Content-Range"))
		if !ok || first != offset || last != size-1 {
			return fail(fmt.Errorf("relay: the body download's Content-Range %q is not bytes %d-…", resp.Header.Get("Content-Range"), offset))
		}
		if resp.ContentLength >= 0 && resp.ContentLength != last-first+1 {
			return fail(errors.New("relay: the body download's length is not its Content-Range's"))
		}
		return resp.Body, nil
	case http.StatusRequestedRangeNotSatisfiable:
		if _, _, size, ok := ParseContentRange(resp.Header.Get("Content-Range")); ok && size == offset {
			resp.Body.Close()
			return io.NopCloser(strings.NewReader("")), nil
		}
	}
	e := refusal(resp)
	resp.Body.Close()
	return nil, e
}
