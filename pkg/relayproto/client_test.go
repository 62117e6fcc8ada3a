package relayproto_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// The client's fetch and ack are signed requests the verifier accepts, on the
// paths and with the query and body of the protocol, and it reads the answers.
func TestClientFetchAndAckAreVerifiable(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		auth, e := relayproto.VerifyInboxRequest(req, body, signedAt, started)
		if e != nil {
			t.Errorf("%s %s: %v", req.Method, req.RequestURI, e)
			w.WriteHeader(e.Status)
			return
		}
		if auth.DID != bob.DID() {
			t.Errorf("signed by %s", auth.DID)
		}
		seen = append(seen, req.Method+" "+req.RequestURI+" "+string(body))
		switch req.URL.Path {
		case relayproto.PathInbox:
			_, _ = io.WriteString(w, `{"envelopes":[{"cursor":"9","envelopeId":"e","envelopeDigest":"d","receivedAt":5,"envelope":{"v":1}}],"cursor":"9","more":true}`)
		case relayproto.PathInboxAck:
			_, _ = io.WriteString(w, `{"acknowledged":2}`)
		}
	}))
	defer srv.Close()
	c := &relayproto.Client{BaseURL: srv.URL + "/", Now: func() time.Time { return signedAt }}
	page, err := c.Fetch(context.Background(), bob, "7", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Envelopes) != 1 || page.Cursor != "9" || !page.More || string(page.Envelopes[0].Envelope) != `{"v":1}` ||
		page.Envelopes[0].ReceivedAt != 5 {
		t.Fatalf("page %+v", page)
	}
	n, err := c.Ack(context.Background(), bob, []string{"a", "b"})
	if err != nil || n != 2 {
		t.Fatalf("ack: %d, %v", n, err)
	}
	want := []string{
		"GET /v1/inbox?after=7&limit=100 ",
		`POST /v1/inbox/ack {"envelopeIds":["a","b"]}`,
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

// A refusal comes back as the relay's *Error: its status, code, message and
// Retry-After; an answer that is not an error body is named by its status.
func TestClientReturnsTheRelaysError(t *testing.T) {
	answer := func(status int, retry, body string) *relayproto.Error {
		t.Helper()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if retry != "" {
				w.Header().Set("Retry-After", retry)
			}
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
		defer srv.Close()
		_, err := (&relayproto.Client{BaseURL: srv.URL}).Fetch(context.Background(), bob, "", 0)
		var e *relayproto.Error
		if !errors.As(err, &e) {
			t.Fatalf("%d: %v is not a *relayproto.Error", status, err)
		}
		return e
	}
	if e := answer(503, "5", `{"code":"RELAY_BUSY","message":"too many"}`+"\n"); e.Status != 503 ||
		e.Code != relayproto.CodeRelayBusy || e.Message != "too many" || e.RetryAfter != 5 {
		t.Errorf("503: %+v", e)
	}
	if e := answer(502, "", "<html>bad gateway</html>"); e.Status != 502 || e.Code != "HTTP_502" ||
		e.Message != "relay answered 502 Bad Gateway" || e.RetryAfter != 0 {
		t.Errorf("502: %+v", e)
	}
	// What a relay sends is what a client reads: the error body round-trips.
	sent := &relayproto.Error{Status: 401, Code: relayproto.CodeAuthSignature, Message: "no", Cause: errors.New("secret")}
	data, _ := json.Marshal(sent)
	if string(data) != `{"code":"AUTH_SIGNATURE","message":"no"}` {
		t.Errorf("error body %s", data)
	}
	if e := answer(401, "", string(data)); e.Code != sent.Code || e.Message != sent.Message || e.Cause != nil {
		t.Errorf("401: %+v", e)
	}
}

func TestClientRefusesOversizedAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"acknowledged":1}`+strings.Repeat(" ", 4<<10))
	}))
	defer srv.Close()
	if n, err := (&relayproto.Client{BaseURL: srv.URL}).Ack(context.Background(), bob, []string{"a"}); err == nil {
		t.Fatalf("an oversized ack answer was read: %d", n)
	}
}
