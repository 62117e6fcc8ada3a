package carrier

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Every post of the HTTP transport carries the head its context carries
// (WithHead): single and batch; a context without one sends no header.
// SenderHead asks the relay signed by the owner and returns its head's bytes.
func TestHTTPPostsCarryHead(t *testing.T) {
	id := owner(t)
	head, err := envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: 2, Seq: 7, Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.URL.Path] = append(got[r.URL.Path], r.Header.Get(relayproto.HeaderHead))
		mu.Unlock()
		if r.URL.Path == relayproto.PathSenderHead {
			if r.Header.Get(relayproto.HeaderDID) != string(id.DID()) || r.Header.Get(relayproto.HeaderSignature) == "" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			w.Write(head)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	tr := NewHTTPTransport(HTTPOptions{SendTimeout: 10 * time.Second})
	_, env := wireEnvelope(t)
	_, env2 := wireEnvelope(t)
	ctx := WithHead(context.Background(), head)
	tr.Send(ctx, srv.URL, env)
	tr.SendBatch(ctx, srv.URL, [][]byte{env, env2})
	tr.Send(context.Background(), srv.URL, env)
	b, err := tr.SenderHead(context.Background(), srv.URL, id)
	if err != nil || !bytes.Equal(b, head) {
		t.Fatalf("SenderHead = %q, %v", b, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if s := got[relayproto.PathEnvelopes]; len(s) != 2 || s[0] != string(head) || s[1] != "" {
		t.Fatalf("single posts carried %q", s)
	}
	if s := got[relayproto.PathEnvelopesBatch]; len(s) != 1 || s[0] != string(head) {
		t.Fatalf("batch posts carried %q", s)
	}
}

// A relay that refuses the head a post carries (400 HEAD_INVALID) has not
// refused the envelope: the attempt failed and is retried, the envelope is not
// closed.
func TestHTTPHeadInvalidIsFailed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"code":"` + relayproto.CodeHeadInvalid + `","message":"the head is not the sender's"}`))
	}))
	defer srv.Close()
	_, env := wireEnvelope(t)
	res := NewHTTPTransport(HTTPOptions{}).Send(context.Background(), srv.URL, env)
	if res.Outcome != Failed || res.Status != http.StatusBadRequest {
		t.Fatalf("outcome %v status %d, want failed 400", res.Outcome, res.Status)
	}
}
