package carrier

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// cutBody is a request body that breaks after n bytes (a connection lost in the
// middle of an upload, as the relay sees it).
type cutBody struct {
	r    io.ReadCloser
	n    int64
	read *atomic.Int64
}

func (c *cutBody) Read(p []byte) (int, error) {
	if c.n <= 0 {
		return 0, errors.New("connection reset by peer")
	}
	if int64(len(p)) > c.n {
		p = p[:c.n]
	}
	n, err := c.r.Read(p)
	c.n -= int64(n)
	c.read.Add(int64(n))
	return n, err
}

func (c *cutBody) Close() error { return c.r.Close() }

// The HTTPTransport against a pkg/relay server: a blob envelope posted, its body
// uploaded in requests of UploadChunk, the second request cut after k bytes (the
// relay keeps what it synced of it), resumed from the relay's offset, and relayed
// with the relay's receipt; the recipient then fetches the envelope and its body,
// equal to the sealed blob. The bytes the relay read again are fewer than one
// request.
func TestBlobUploadThroughHTTPToARelay(t *testing.T) {
	const chunk, k = 8 << 20, 6<<20 + 1234
	r, err := relay.New(relay.Options{Identity: relayIdentity(t), Home: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := r.Handler()
	var patches atomic.Int64
	var patchBytes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodPatch {
			if patches.Add(1) == 2 {
				// The connection breaks after k bytes: the relay sees its body end
				// in an error, and the carrier never sees the relay's answer.
				req.Body = &cutBody{r: req.Body, n: k, read: &patchBytes}
				h.ServeHTTP(httptest.NewRecorder(), req)
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
				return
			}
			req.Body = &cutBody{r: req.Body, n: 1 << 62, read: &patchBytes}
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(func() { srv.Close(); r.Close() })

	hr := newHarnessOn(t, Options{UploadChunk: chunk}, store.Options{}, func(*scripted) Transport {
		return NewHTTPTransport(HTTPOptions{})
	})
	env, sealed := hr.enqueueBlob(srv.URL, "", 20<<20)
	hr.start()
	hr.c.Kick()
	waitFor(t, "the blob envelope relayed", func() bool {
		o := hr.outbox(env.ID())
		if o.LastError != "" {
			t.Fatalf("attempt failed: %s (after %d upload requests)", o.LastError, patches.Load())
		}
		return o.State == record.StateRelayed
	})
	if resent := patchBytes.Load() - int64(len(sealed)); resent < 0 || resent >= chunk {
		t.Fatalf("the relay read %d body bytes for a %d-byte body: %d again, want fewer than one request (%d)",
			patchBytes.Load(), len(sealed), resent, chunk)
	}
	if patches.Load() < 3 {
		t.Fatalf("%d upload requests, want at least 3 (the first, the cut one, the rest)", patches.Load())
	}
	t.Logf("%d upload requests, %d bytes read again by the relay", patches.Load(), patchBytes.Load()-int64(len(sealed)))
	// The recipient sees it, and its body is the sealed blob.
	rc := &relayproto.Client{BaseURL: srv.URL}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	page, err := rc.Fetch(ctx, peerIdentity(t), "", 0)
	if err != nil || len(page.Envelopes) != 1 || page.Envelopes[0].EnvelopeID != env.ID() {
		t.Fatalf("inbox %+v (%v), want the blob envelope", page, err)
	}
	body, err := rc.FetchBody(ctx, peerIdentity(t), env.ID(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	got, err := io.ReadAll(body)
	if err != nil || !bytes.Equal(got, sealed) {
		t.Fatalf("the recipient downloads %d bytes (%v), not the %d sealed", len(got), err, len(sealed))
	}
}
