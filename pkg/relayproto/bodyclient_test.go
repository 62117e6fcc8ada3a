package relayproto_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

const testEnvID = "0190f0a0-0000-7000-8000-000000000001"

// UploadBody streams: the relay receives the first bytes before the reader
// has given the rest (a client that buffered the body first would wait for
// the reader forever), with the Content-Length, offset and tus headers of the
// protocol, and UploadBody returns the relay's new offset.
func TestUploadBodyStreamsWithContentLength(t *testing.T) {
	const chunk = 64 << 10
	const n = 4 * chunk
	gotFirst := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPatch || req.URL.Path != relayproto.PathBodies+testEnvID ||
			req.ContentLength != n || req.Header.Get("Content-Type") != relayproto.ContentTypeOffsetOctetStream ||
			req.Header.Get(relayproto.HeaderUploadOffset) != "100" || req.Header.Get(relayproto.HeaderTusResumable) != relayproto.TusVersion {
			t.Errorf("request %s %s len %d headers %v", req.Method, req.URL.Path, req.ContentLength, req.Header)
		}
		buf := make([]byte, chunk)
		if _, err := io.ReadFull(req.Body, buf); err != nil {
			t.Errorf("first chunk: %v", err)
		}
		close(gotFirst)
		rest, _ := io.Copy(io.Discard, req.Body)
		w.Header().Set(relayproto.HeaderUploadOffset, strconv.FormatInt(100+chunk+rest, 10))
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	r := &gatedReader{first: chunk, gate: gotFirst, left: n + 1000} // more than n: only n are sent
	off, err := (&relayproto.Client{BaseURL: srv.URL}).UploadBody(context.Background(), testEnvID, 100, r, n)
	if err != nil || off != 100+n {
		t.Fatalf("UploadBody = %d, %v", off, err)
	}
	if r.timedOut {
		t.Fatal("the relay got nothing before the reader gave all the body: the client buffers it")
	}
}

// gatedReader gives first bytes, then waits for gate (at most 10 s) before
// giving the rest.
type gatedReader struct {
	first, left int64
	read        int64
	gate        <-chan struct{}
	timedOut    bool
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.left == 0 {
		return 0, io.EOF
	}
	if g.read >= g.first && g.gate != nil {
		select {
		case <-g.gate:
		case <-time.After(10 * time.Second):
			g.timedOut = true
		}
		g.gate = nil
	}
	if g.read < g.first {
		p = p[:min(int64(len(p)), g.first-g.read)]
	}
	p = p[:min(int64(len(p)), g.left)]
	for i := range p {
		p[i] = byte(g.read + int64(i))
	}
	g.read += int64(len(p))
	g.left -= int64(len(p))
	return len(p), nil
}

// A 409 returns the relay's offset with the *Error; an error without one
// returns the offset passed in; a 422 is the relay's code.
func TestUploadBodyRefusals(t *testing.T) {
	status, relayOffset := 0, ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		if relayOffset != "" {
			w.Header().Set(relayproto.HeaderUploadOffset, relayOffset)
		}
		w.WriteHeader(status)
		code := map[int]string{409: relayproto.CodeUploadOffsetMismatch, 422: relayproto.CodeBodyDigestMismatch}[status]
		_, _ = io.WriteString(w, `{"code":"`+code+`","message":"m"}`)
	}))
	defer srv.Close()
	c := &relayproto.Client{BaseURL: srv.URL}
	up := func() (int64, *relayproto.Error) {
		t.Helper()
		off, err := c.UploadBody(context.Background(), testEnvID, 10, bytes.NewReader(make([]byte, 5)), 5)
		var e *relayproto.Error
		if !errors.As(err, &e) {
			t.Fatalf("%d: %v is not an *Error", status, err)
		}
		return off, e
	}
	status, relayOffset = 409, "4096"
	if off, e := up(); off != 4096 || e.Code != relayproto.CodeUploadOffsetMismatch {
		t.Errorf("409: %d, %+v", off, e)
	}
	status, relayOffset = 422, ""
	if off, e := up(); off != 10 || e.Code != relayproto.CodeBodyDigestMismatch || e.Status != 422 {
		t.Errorf("422: %d, %+v", off, e)
	}
	if _, err := c.UploadBody(context.Background(), "../inbox", 0, bytes.NewReader(nil), 0); err == nil {
		t.Error("a path as an envelope id was sent")
	}
}

// Post's 202 is a *BodyIncompleteError with the relay's offset, size and
// upload path; a 202 that is not a BodyIncomplete is an error too.
func TestPostBodyIncomplete(t *testing.T) {
	answer := `{"code":"BODY_INCOMPLETE","upload":"/v1/bodies/` + testEnvID + `","offset":8388608,"size":9000000}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, answer)
	}))
	defer srv.Close()
	c := &relayproto.Client{BaseURL: srv.URL}
	_, _, err := c.Post(context.Background(), []byte(`{}`))
	var bi *relayproto.BodyIncompleteError
	if !errors.As(err, &bi) || bi.Offset != 8388608 || bi.Size != 9000000 || bi.Upload != relayproto.PathBodies+testEnvID {
		t.Fatalf("Post: %v (%+v)", err, bi)
	}
	answer = `{"code":"SOMETHING","offset":1,"size":2}`
	if _, _, err := c.Post(context.Background(), []byte(`{}`)); err == nil || errors.As(err, &bi) {
		t.Fatalf("a foreign 202: %v", err)
	}
}

// BodyOffset reads Upload-Offset and Upload-Length; a 404 to the HEAD (which
// has no body) is UPLOAD_UNKNOWN.
func TestBodyOffset(t *testing.T) {
	known := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodHead {
			t.Errorf("method %s", req.Method)
		}
		if !known {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.Header().Set(relayproto.HeaderUploadOffset, "12")
		w.Header().Set(relayproto.HeaderUploadLength, "99")
	}))
	defer srv.Close()
	c := &relayproto.Client{BaseURL: srv.URL}
	if o, s, err := c.BodyOffset(context.Background(), testEnvID); o != 12 || s != 99 || err != nil {
		t.Fatalf("BodyOffset = %d, %d, %v", o, s, err)
	}
	known = false
	_, _, err := c.BodyOffset(context.Background(), testEnvID)
	var e *relayproto.Error
	if !errors.As(err, &e) || e.Code != relayproto.CodeUploadUnknown {
		t.Fatalf("404: %v", err)
	}
}

// FetchBody signs its request, sends Range from the offset, and checks the
// answer: a 206 whose Content-Range starts elsewhere, or a 200 to a ranged
// request, is refused; a 416 at the size is an empty body.
func TestFetchBodyRanges(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 100)
	mode := "honest"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if _, e := relayproto.VerifyInboxRequest(req, nil, signedAt, started); e != nil {
			t.Errorf("unsigned: %v", e)
		}
		if req.URL.Path != relayproto.PathInboxBodies+testEnvID {
			t.Errorf("path %s", req.URL.Path)
		}
		off, ranged := relayproto.RangeFrom(req.Header.Get("Range"))
		switch {
		case mode == "whole" || !ranged:
			_, _ = w.Write(body)
		case mode == "shifted":
			off++
			fallthrough
		default:
			if off == int64(len(body)) {
				w.Header().Set("Content-Range", "bytes */1000")
				w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
				return
			}
			w.Header().Set("Content-Range", "bytes "+strconv.FormatInt(off, 10)+"-999/1000")
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(body[off:])
		}
	}))
	defer srv.Close()
	c := &relayproto.Client{BaseURL: srv.URL, Now: func() time.Time { return signedAt }}
	get := func(off int64) ([]byte, error) {
		rc, err := c.FetchBody(context.Background(), bob, testEnvID, off)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	for _, off := range []int64{0, 1, 999, 1000} {
		got, err := get(off)
		if err != nil || !bytes.Equal(got, body[off:]) {
			t.Errorf("from %d: %d bytes, %v", off, len(got), err)
		}
	}
	mode = "shifted"
	if _, err := get(5); err == nil {
		t.Error("a Content-Range from another offset was taken")
	}
	mode = "whole"
	if _, err := get(5); err == nil {
		t.Error("a 200 to a ranged request was taken")
	}
}
