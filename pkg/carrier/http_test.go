package carrier

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

func relayIdentity(t testing.TB) *identity.Identity {
	seed := ownerSeed
	seed[0] = 42
	id, err := identity.FromSeed(seed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// wireEnvelope builds a real signed envelope.
func wireEnvelope(t testing.TB) (*envelope.Envelope, []byte) {
	t.Helper()
	e, data, err := envelope.NewMessage(owner(t), peer(), uuid.NewString(), []byte("hello"), time.Now().Add(time.Hour), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return e, data
}

func receiptFor(t testing.TB, id, digest string) []byte {
	t.Helper()
	r, err := envelope.SignRelayReceipt(relayIdentity(t), envelope.RelayReceipt{EnvelopeID: id, EnvelopeDigest: digest, ReceivedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestHTTPClassification(t *testing.T) {
	e, data := wireEnvelope(t)
	good := receiptFor(t, e.ID(), e.Digest())
	other := receiptFor(t, uuid.NewString(), e.Digest())
	httpDate := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	cases := []struct {
		name       string
		handler    http.HandlerFunc
		want       Outcome
		status     int
		retryAfter time.Duration // lower bound
	}{
		{"200 valid receipt", func(w http.ResponseWriter, r *http.Request) { w.Write(good) }, Accepted, 200, 0},
		{"200 bad receipt", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"ok":true}`)) }, Failed, 200, 0},
		{"200 other envelope's receipt", func(w http.ResponseWriter, r *http.Request) { w.Write(other) }, Failed, 200, 0},
		{"409", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(409)
			w.Write([]byte(`{"code":"ENVELOPE_CONFLICT"}`))
		}, Refused, 409, 0},
		{"400", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(400) }, Refused, 400, 0},
		{"429 Retry-After seconds", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "120")
			w.WriteHeader(429)
		}, Failed, 429, 120 * time.Second},
		{"503 Retry-After date", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", httpDate)
			w.WriteHeader(503)
		}, Failed, 503, 80 * time.Second},
		{"408", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(408) }, Failed, 408, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var path string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				path = r.URL.Path
				tc.handler(w, r)
			}))
			defer srv.Close()
			tr := NewHTTPTransport(HTTPOptions{SendTimeout: 5 * time.Second})
			res := tr.Send(context.Background(), srv.URL+"/", data)
			if res.Outcome != tc.want || res.Status != tc.status || res.RetryAfter < tc.retryAfter {
				t.Fatalf("got %v status %d retry %v err %v; want %v %d ≥%v", res.Outcome, res.Status, res.RetryAfter, res.Err, tc.want, tc.status, tc.retryAfter)
			}
			if path != "/v1/envelopes" {
				t.Fatalf("posted to %q", path)
			}
			if tc.want == Accepted && (res.ParsedReceipt == nil || !res.ParsedReceipt.Matches(e.ID(), e.Digest())) {
				t.Fatalf("receipt %+v", res.ParsedReceipt)
			}
			if res.Err != nil && strings.Contains(res.Err.Error(), "hello") {
				t.Fatalf("error text leaks payload: %v", res.Err)
			}
		})
	}
}

func TestHTTPConnectionRefusedIsUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a closed port: connection refused
	_, data := wireEnvelope(t)
	res := NewHTTPTransport(HTTPOptions{SendTimeout: 5 * time.Second}).Send(context.Background(), "http://"+addr, data)
	if res.Outcome != Unreachable || res.Status != 0 {
		t.Fatalf("got %v %d %v", res.Outcome, res.Status, res.Err)
	}
}

func TestHTTPDNSFailureIsUnreachable(t *testing.T) {
	_, data := wireEnvelope(t)
	res := NewHTTPTransport(HTTPOptions{SendTimeout: 5 * time.Second}).Send(context.Background(), "http://relay.invalid", data)
	if res.Outcome != Unreachable {
		t.Fatalf("got %v %v", res.Outcome, res.Err)
	}
}

func TestHTTPTLSFailureIsUnreachable(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	_, data := wireEnvelope(t)
	res := NewHTTPTransport(HTTPOptions{SendTimeout: 5 * time.Second}).Send(context.Background(), srv.URL, data)
	if res.Outcome != Unreachable {
		t.Fatalf("untrusted certificate: got %v %v", res.Outcome, res.Err)
	}
}

func TestHTTPTimeoutIsFailed(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	_, data := wireEnvelope(t)
	res := NewHTTPTransport(HTTPOptions{SendTimeout: 200 * time.Millisecond}).Send(context.Background(), srv.URL, data)
	if res.Outcome != Failed || res.Status != 0 || res.Err == nil {
		t.Fatalf("got %v %d %v", res.Outcome, res.Status, res.Err)
	}
}

// Connections are reused across attempts.
func TestHTTPConnectionReuse(t *testing.T) {
	e, data := wireEnvelope(t)
	good := receiptFor(t, e.ID(), e.Digest())
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(good) }))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	tr := NewHTTPTransport(HTTPOptions{})
	for range 20 {
		if res := tr.Send(context.Background(), srv.URL, data); res.Outcome != Accepted {
			t.Fatalf("%v %v", res.Outcome, res.Err)
		}
	}
	tr.CloseIdleConnections()
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 20 sequential sends", n)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"": 0, "0": 0, "-5": 0, "junk": 0, "30": 30 * time.Second,
		now.Add(time.Minute).Format(http.TimeFormat):  time.Minute,
		now.Add(-time.Minute).Format(http.TimeFormat): 0,
	} {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("%q: %v, want %v", in, got, want)
		}
	}
}
