package relayproto_test

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// bob and eve are fixed identities.
var bob, eve = fromSeed(2), fromSeed(5)

func fromSeed(n byte) *identity.Identity {
	id, err := identity.FromSeed(bytes.Repeat([]byte{n}, 32))
	if err != nil {
		panic(err)
	}
	return id
}

var (
	signedAt = time.UnixMilli(1_767_225_600_000)
	started  = signedAt.Add(-time.Hour)
)

// signed is a request as the relay receives it: signed by the client at
// signedAt, then parsed back from its request line, headers and body.
type signed struct {
	method, target string
	header         http.Header
	body           []byte
}

func sign(t *testing.T, id *identity.Identity, method, url string, body []byte) *signed {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if err := relayproto.SignInboxRequest(req, id, signedAt); err != nil {
		t.Fatal(err)
	}
	if req.Body != nil {
		// The body was put back whole, for the transport to send.
		got, _ := io.ReadAll(req.Body)
		if !bytes.Equal(got, body) || req.ContentLength != int64(len(body)) {
			t.Fatalf("body after signing: %q (length %d), want %q", got, req.ContentLength, body)
		}
	}
	return &signed{method: method, target: req.URL.RequestURI(), header: req.Header.Clone(), body: body}
}

func (s *signed) verify(now time.Time) (*relayproto.InboxAuth, *relayproto.Error) {
	req := httptest.NewRequest(s.method, s.target, bytes.NewReader(s.body))
	req.Header = s.header
	return relayproto.VerifyInboxRequest(req, s.body, now, started)
}

func TestSignedInboxRequestVerifies(t *testing.T) {
	for _, s := range []*signed{
		sign(t, bob, http.MethodGet, "http://relay.test/v1/inbox?after=7&limit=3", nil),
		sign(t, bob, http.MethodPost, "http://relay.test/v1/inbox/ack", []byte(`{"envelopeIds":["x"]}`)),
	} {
		for _, now := range []time.Time{signedAt, signedAt.Add(relayproto.MaxClockSkew), signedAt.Add(-relayproto.MaxClockSkew)} {
			auth, e := s.verify(now)
			if e != nil {
				t.Fatalf("%s %s at %v: %v", s.method, s.target, now.Sub(signedAt), e)
			}
			if auth.DID != bob.DID() || auth.Nonce != s.header.Get(relayproto.HeaderNonce) {
				t.Fatalf("verified as %+v, want %s with the request's nonce", auth, bob.DID())
			}
		}
	}
	// Each signature has its own nonce.
	a := sign(t, bob, http.MethodGet, "http://relay.test/v1/inbox", nil)
	b := sign(t, bob, http.MethodGet, "http://relay.test/v1/inbox", nil)
	if a.header.Get(relayproto.HeaderNonce) == b.header.Get(relayproto.HeaderNonce) {
		t.Fatal("two signatures share a nonce")
	}
}

// Whatever the signature covers, changed after signing, is refused with the
// code that says why.
func TestTamperedInboxRequestRefused(t *testing.T) {
	body := []byte(`{"envelopeIds":["0b7e9f3c-4a1d-4c2e-9f00-5d6a7b8c9d0e"]}`)
	fresh := func() *signed { return sign(t, bob, http.MethodPost, "http://relay.test/v1/inbox/ack", body) }
	for _, c := range []struct {
		name   string
		change func(s *signed)
		now    time.Time
		code   string
	}{
		{"body", func(s *signed) {
			s.body = bytes.Replace(s.body, []byte("0b7e"), []byte("1b7e"), 1)
		}, signedAt, relayproto.CodeAuthSignature},
		{"path", func(s *signed) { s.target = "/v1/inbox/ack/" }, signedAt, relayproto.CodeAuthSignature},
		{"query", func(s *signed) { s.target += "?all=1" }, signedAt, relayproto.CodeAuthSignature},
		{"method", func(s *signed) { s.method = http.MethodPut }, signedAt, relayproto.CodeAuthSignature},
		{"did header", func(s *signed) { s.header.Set(relayproto.HeaderDID, string(eve.DID())) }, signedAt, relayproto.CodeAuthSignature},
		{"nonce header", func(s *signed) {
			s.header.Set(relayproto.HeaderNonce, strings.Repeat("A", 24))
		}, signedAt, relayproto.CodeAuthSignature},
		{"timestamp header", func(s *signed) {
			s.header.Set(relayproto.HeaderTimestamp, strconv.FormatInt(signedAt.UnixMilli()+1, 10))
		}, signedAt, relayproto.CodeAuthSignature},
		{"signature header", func(s *signed) {
			sig, err := base64.RawURLEncoding.DecodeString(s.header.Get(relayproto.HeaderSignature))
			if err != nil {
				t.Fatal(err)
			}
			sig[10] ^= 1
			s.header.Set(relayproto.HeaderSignature, base64.RawURLEncoding.EncodeToString(sig))
		}, signedAt, relayproto.CodeAuthSignature},
		{"missing signature", func(s *signed) { s.header.Del(relayproto.HeaderSignature) }, signedAt, relayproto.CodeAuthMissing},
		{"bad did", func(s *signed) { s.header.Set(relayproto.HeaderDID, "did:key:z6Mk") }, signedAt, relayproto.CodeAuthDID},
		{"timestamp not decimal ms", func(s *signed) {
			s.header.Set(relayproto.HeaderTimestamp, "0"+s.header.Get(relayproto.HeaderTimestamp))
		}, signedAt, relayproto.CodeAuthMalformed},
		{"short nonce", func(s *signed) { s.header.Set(relayproto.HeaderNonce, "abc") }, signedAt, relayproto.CodeAuthMalformed},
		{"padded signature", func(s *signed) {
			s.header.Set(relayproto.HeaderSignature, s.header.Get(relayproto.HeaderSignature)+"==")
		}, signedAt, relayproto.CodeAuthMalformed},
		{"too old", nil, signedAt.Add(relayproto.MaxClockSkew + time.Millisecond), relayproto.CodeAuthTimestamp},
		{"too new", nil, signedAt.Add(-relayproto.MaxClockSkew - time.Millisecond), relayproto.CodeAuthTimestamp},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := fresh()
			if _, e := s.verify(signedAt); e != nil {
				t.Fatalf("the untampered request is refused: %v", e)
			}
			if c.change != nil {
				c.change(s)
			}
			auth, e := s.verify(c.now)
			if e == nil {
				t.Fatalf("verified as %+v", auth)
			}
			if e.Status != http.StatusUnauthorized || e.Code != c.code {
				t.Fatalf("refused with %d %s (%s), want 401 %s", e.Status, e.Code, e.Message, c.code)
			}
		})
	}
}

// A request signed before the verifier's notBefore (a relay's start) is
// refused even inside the clock window: its nonce may have been spent before.
func TestInboxRequestBeforeNotBeforeRefused(t *testing.T) {
	s := sign(t, bob, http.MethodGet, "http://relay.test/v1/inbox", nil)
	req := httptest.NewRequest(s.method, s.target, nil)
	req.Header = s.header
	_, e := relayproto.VerifyInboxRequest(req, nil, signedAt, signedAt.Add(time.Millisecond))
	if e == nil || e.Code != relayproto.CodeAuthTimestamp || !strings.Contains(e.Message, "before the relay started") {
		t.Fatalf("got %v, want AUTH_TIMESTAMP: before the relay started", e)
	}
	if _, e := relayproto.VerifyInboxRequest(req, nil, signedAt, signedAt); e != nil {
		t.Fatalf("signed at notBefore: %v", e)
	}
}

func TestSignInboxRequestRefusesOversizedBody(t *testing.T) {
	req, _ := http.NewRequest(http.MethodPost, "http://relay.test/v1/inbox/ack",
		bytes.NewReader(make([]byte, relayproto.MaxAckBodySize+1)))
	if err := relayproto.SignInboxRequest(req, bob, signedAt); err == nil {
		t.Fatal("an oversized body was signed")
	}
	if req.Header.Get(relayproto.HeaderSignature) != "" {
		t.Fatal("a signature header was set")
	}
}
