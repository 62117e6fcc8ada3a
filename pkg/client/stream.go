package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// The headers of a streamed send (POST /v1/messages with Content-Type
// application/octet-stream: the request body is the plaintext message body) and of
// a body download (GET /v1/inbox/{messageId}/body). docs/DAEMON.md describes them.
const (
	// HeaderTo is the recipient's did:key (one).
	HeaderTo = "Sealbridge-To"
	// HeaderRelay is the relay URL.
	HeaderRelay = "Sealbridge-Relay"
	// HeaderDeadline is the delivery deadline in Unix milliseconds (absent: now + 24 h).
	HeaderDeadline = "Sealbridge-Deadline-Ms"
	// HeaderBodySize, on a body download, is the length of the plaintext the answer
	// carries.
	HeaderBodySize = "Sealbridge-Body-Size"
	// TrailerBodyError, a trailer of a body download, is set to a stable error code
	// (BODY_CHUNK_INVALID, …) when the daemon could not send all of the body: the bytes
	// before it are verified, the rest is missing.
	TrailerBodyError = "Sealbridge-Body-Error"
	// ContentTypeStream is the Content-Type of a streamed send and of a body.
	ContentTypeStream = "application/octet-stream"
)

// SendStreamRequest is the metadata of a streamed send: the recipient's did:key
// (one), the relay URL, the delivery deadline in Unix milliseconds (0: the daemon
// uses now + 24 h) and the Idempotency-Key (empty: none).
type SendStreamRequest struct {
	To         string
	RelayURL   string
	DeadlineMs int64
	Key        string
}

// SendStream sends a message whose body is read from body, streamed to the daemon
// without being held in memory: size is its length (sent as Content-Length) or -1
// when it is not known (the request is then chunked). The daemon seals a body over
// envelope.MaxBodySize as a blob and keeps a smaller one inline, as Send does; a
// body over the daemon's --max-body is refused with 413 BODY_TOO_LARGE. The request
// asks for 100-continue, so that a refusal the daemon can make from the headers
// (a bad recipient, a size over the limit, a key in flight) comes before any of the
// body is sent. SendStream reads body to its end (or to the refusal) and never
// closes it. With r.Key, a retry must stream the same bytes: the daemon compares
// the body's SHA-256 with the first request's (DAEMON.md).
func (c *Client) SendStream(ctx context.Context, r SendStreamRequest, body io.Reader, size int64) (*Message, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://sealbridged/v1/messages", io.NopCloser(body))
	if err != nil {
		return nil, err
	}
	req.ContentLength = size
	if size < 0 {
		req.ContentLength = -1
	}
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", ContentTypeStream)
	req.Header.Set("Expect", "100-continue")
	req.Header.Set(HeaderTo, r.To)
	req.Header.Set(HeaderRelay, r.RelayURL)
	if r.DeadlineMs != 0 {
		req.Header.Set(HeaderDeadline, strconv.FormatInt(r.DeadlineMs, 10))
	}
	if r.Key != "" {
		req.Header.Set("Idempotency-Key", r.Key)
	}
	var m Message
	if err := c.roundTrip(req, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Body returns the plaintext body of received message messageID
// (GET /v1/inbox/{messageId}/body), streamed. Every chunk of a large body is verified
// by the daemon before it is sent. The reader's Read returns io.EOF only after the
// whole body arrived: a body the daemon could not finish (a chunk that does not
// verify) ends with an *Error carrying the daemon's code (BODY_CHUNK_INVALID, …), and
// one cut short (the connection lost) with an *Error BODY_INCOMPLETE. A missing
// message answers an *Error with Status 404.
func (c *Client) Body(ctx context.Context, messageID string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sealbridged/v1/inbox/"+url.PathEscape(messageID)+"/body", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("sealbridged at %s: %w", c.socketPath(), err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, c.answerError(resp)
	}
	size, err := strconv.ParseInt(resp.Header.Get(HeaderBodySize), 10, 64)
	if err != nil || size < 0 {
		resp.Body.Close()
		return nil, fmt.Errorf("sealbridged: bad response: %s %q", HeaderBodySize, resp.Header.Get(HeaderBodySize))
	}
	return &bodyReader{resp: resp, size: size}, nil
}

// bodyReader is a body download: it counts the bytes and, at the end, checks the
// trailer and the count.
type bodyReader struct {
	resp *http.Response
	size int64 // the announced length
	n    int64 // bytes read so far
	err  error // the final error, once met
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.resp.Body.Read(p)
	b.n += int64(n)
	switch {
	case err == nil && b.n > b.size:
		err = b.fail("BODY_SIZE_MISMATCH", fmt.Sprintf("the daemon sent more than the %d bytes it announced", b.size))
	case errors.Is(err, io.EOF):
		// The trailer is read once the body is: it says why the daemon stopped.
		if code := b.resp.Trailer.Get(TrailerBodyError); code != "" {
			err = b.fail(code, fmt.Sprintf("the body could not be sent whole: %d of %d bytes arrived (each verified)", b.n, b.size))
		} else if b.n != b.size {
			err = b.fail("BODY_INCOMPLETE", fmt.Sprintf("the body ended after %d of %d bytes", b.n, b.size))
		}
	case err != nil:
		err = b.fail("BODY_INCOMPLETE", fmt.Sprintf("the body broke off after %d of %d bytes: %v", b.n, b.size, err))
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *bodyReader) fail(code, msg string) error {
	return &Error{Status: b.resp.StatusCode, Code: code, Message: msg}
}

func (b *bodyReader) Close() error { return b.resp.Body.Close() }

// roundTrip sends req and decodes a 2xx answer into out (nil: none) or returns the
// answer's *Error.
func (c *Client) roundTrip(req *http.Request, out any) error {
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("sealbridged at %s: %w", c.socketPath(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return c.answerError(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("sealbridged at %s: %w", c.socketPath(), err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("sealbridged: bad response: %w", err)
	}
	return nil
}
