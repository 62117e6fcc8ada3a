package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/client"
)

// fakeDaemon serves h on a unix socket until the test ends and returns a client of it.
func fakeDaemon(t *testing.T, h http.HandlerFunc) *client.Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return client.New(sock)
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// SendStream sends the metadata as headers, the body as is (with its
// Content-Length, or chunked for -1) and decodes the message; a refusal the daemon
// makes from the headers arrives before any of the body is read (100-continue), as
// the *Error with its code and hint.
func TestSendStream(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 20000)
	var got struct {
		hdr  http.Header
		cl   int64
		te   []string
		body []byte
	}
	c := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(client.HeaderTo) == "refuse" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			io.WriteString(w, `{"code":"BODY_TOO_LARGE","message":"over","hint":"raise --max-body"}`)
			return
		}
		got.hdr, got.cl, got.te = r.Header.Clone(), r.ContentLength, r.TransferEncoding
		got.body, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"messageId":"m1","status":"queued"}`)
	})
	ctx := context.Background()
	req := client.SendStreamRequest{To: "did:key:z6Mk", RelayURL: "http://r", DeadlineMs: 1767225600000, Key: "k"}
	for _, size := range []int64{int64(len(body)), -1} {
		m, err := c.SendStream(ctx, req, bytes.NewReader(body), size)
		if err != nil || m.MessageID != "m1" {
			t.Fatalf("size %d: %v %v", size, m, err)
		}
		h := got.hdr
		if h.Get("Content-Type") != client.ContentTypeStream || h.Get(client.HeaderTo) != req.To || h.Get(client.HeaderRelay) != req.RelayURL ||
			h.Get(client.HeaderDeadline) != "1767225600000" || h.Get("Idempotency-Key") != "k" || !bytes.Equal(got.body, body) {
			t.Fatalf("size %d: the daemon got headers %v and %d body bytes", size, h, len(got.body))
		}
		if size >= 0 && got.cl != size || size < 0 && (len(got.te) != 1 || got.te[0] != "chunked") {
			t.Fatalf("size %d: Content-Length %d, Transfer-Encoding %v", size, got.cl, got.te)
		}
	}
	src := &countingReader{r: bytes.NewReader(body)}
	req.To = "refuse"
	_, err := c.SendStream(ctx, req, src, int64(len(body)))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusRequestEntityTooLarge || ce.Code != "BODY_TOO_LARGE" || ce.Hint == "" {
		t.Fatalf("a refusal from the headers: %v", err)
	}
	if n := src.n.Load(); n != 0 {
		t.Fatalf("%d bytes of the body were read for a request refused from its headers", n)
	}
}

// Body's reader ends with io.EOF only for a whole body: a trailer naming a failure
// is that code, fewer bytes than announced or a connection cut mid-body is
// BODY_INCOMPLETE, more is BODY_SIZE_MISMATCH — each after the bytes that did
// arrive; a 404 is an *Error before any body.
func TestBody(t *testing.T) {
	full := bytes.Repeat([]byte("x"), 300<<10)
	c := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		mode := r.URL.Path[len("/v1/inbox/") : len(r.URL.Path)-len("/body")]
		if mode == "missing" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"code":"NOT_FOUND","message":"no received message"}`)
			return
		}
		announced := len(full)
		if mode == "more" {
			announced = len(full) - 1
		}
		w.Header().Set(client.HeaderBodySize, strconv.Itoa(announced))
		w.Header().Set("Trailer", client.TrailerBodyError)
		w.WriteHeader(http.StatusOK)
		switch mode {
		case "whole", "more":
			w.Write(full)
		case "trailer":
			w.Write(full[:128<<10])
			w.Header().Set(client.TrailerBodyError, "BODY_CHUNK_INVALID")
		case "short":
			w.Write(full[:128<<10])
		case "cut":
			w.Write(full[:128<<10])
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
	})
	ctx := context.Background()
	for mode, want := range map[string]string{"whole": "", "trailer": "BODY_CHUNK_INVALID", "short": "BODY_INCOMPLETE",
		"cut": "BODY_INCOMPLETE", "more": "BODY_SIZE_MISMATCH"} {
		rc, err := c.Body(ctx, mode)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		var ce *client.Error
		switch {
		case want == "" && (err != nil || !bytes.Equal(got, full)):
			t.Fatalf("%s: %d bytes, %v", mode, len(got), err)
		case want != "" && (!errors.As(err, &ce) || ce.Code != want):
			t.Fatalf("%s: %d bytes, then %v; want %s", mode, len(got), err, want)
		case want != "" && !strings.HasPrefix(err.Error(), "sealbridged: "+want+": "):
			t.Fatalf("%s: %q does not start with the code (a stream's 200 says nothing)", mode, err)
		case want != "" && want != "BODY_SIZE_MISMATCH" && !bytes.Equal(got, full[:128<<10]):
			t.Fatalf("%s: %d bytes before the error, want the %d sent", mode, len(got), 128<<10)
		}
	}
	if _, err := c.Body(ctx, "missing"); err == nil {
		t.Fatal("a missing message: no error")
	} else if ce := (*client.Error)(nil); !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
		t.Fatalf("a missing message: %v", err)
	}
}
