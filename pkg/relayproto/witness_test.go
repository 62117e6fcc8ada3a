package relayproto_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Client.Head's bytes go with every post, single and batch, and with no
// other request; a Head that returns nothing sends no header.
func TestClientSendsTheHeadOnPosts(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		got = append(got, req.URL.Path+" "+strings.Join(req.Header.Values(relayproto.HeaderHead), "|"))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	head := []byte(`{"v":1,"payload":{"owner":"x"},"sig":"y"}`)
	c := &relayproto.Client{BaseURL: srv.URL, Now: func() time.Time { return signedAt }, Head: func() []byte { return head }}
	ctx := context.Background()
	_, _, _ = c.Post(ctx, []byte(`{}`))
	_, _ = c.PostBatch(ctx, [][]byte{[]byte(`{}`)})
	_, _ = c.Fetch(ctx, bob, "", 0)
	c.Head = func() []byte { return nil }
	_, _, _ = c.Post(ctx, []byte(`{}`))
	want := []string{
		relayproto.PathEnvelopes + " " + string(head),
		relayproto.PathEnvelopesBatch + " " + string(head),
		relayproto.PathInbox + " ",
		relayproto.PathEnvelopes + " ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// SenderHead, SenderReceipts and InboxStatuses are signed requests the
// verifier accepts, on their paths; SenderHead is nil on a 404 and refuses a
// head that is not the signer's; SenderReceipts refuses an answer that does
// not match the ids asked for.
func TestClientWitnessRequests(t *testing.T) {
	bobHead, err := envelope.SignStoreHead(bob.Signer(), envelope.StoreHead{Owner: bob.DID(), Format: 2, Seq: 3, Time: signedAt})
	if err != nil {
		t.Fatal(err)
	}
	var headAnswer []byte
	var receiptsAnswer string
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if _, e := relayproto.VerifyInboxRequest(req, body, signedAt, started); e != nil {
			t.Errorf("%s %s: %v", req.Method, req.RequestURI, e)
			w.WriteHeader(e.Status)
			return
		}
		seen = append(seen, req.Method+" "+req.RequestURI+" "+string(body))
		switch req.URL.Path {
		case relayproto.PathSenderHead:
			if headAnswer == nil {
				w.WriteHeader(404)
				_, _ = io.WriteString(w, `{"code":"HEAD_UNKNOWN","message":"none"}`)
				return
			}
			_, _ = w.Write(headAnswer)
		case relayproto.PathSenderReceipts:
			_, _ = io.WriteString(w, receiptsAnswer)
		case relayproto.PathInboxStatuses:
			_, _ = io.WriteString(w, `{"envelopes":[],"cursor":"5","more":false}`)
		}
	}))
	defer srv.Close()
	c := &relayproto.Client{BaseURL: srv.URL, Now: func() time.Time { return signedAt }}
	ctx := context.Background()
	if h, err := c.SenderHead(ctx, bob); err != nil || h != nil {
		t.Fatalf("404: %s, %v", h, err)
	}
	headAnswer = bobHead
	if h, err := c.SenderHead(ctx, bob); err != nil || string(h) != string(bobHead) {
		t.Fatalf("bob's head: %s, %v", h, err)
	}
	if h, err := c.SenderHead(ctx, eve); err == nil {
		t.Fatalf("bob's head answered to eve was taken: %s", h)
	}
	id1, id2 := uuid.NewString(), uuid.NewString()
	answer := func(rs ...relayproto.SenderReceipt) string {
		data, _ := json.Marshal(relayproto.SenderReceiptsAnswer{Receipts: rs})
		return string(data)
	}
	receiptsAnswer = answer(relayproto.SenderReceipt{EnvelopeID: id1, State: relayproto.SenderReceiptUnknown},
		relayproto.SenderReceipt{EnvelopeID: id2, State: relayproto.SenderReceiptUnknown})
	got, err := c.SenderReceipts(ctx, bob, []string{id1, id2})
	if err != nil || len(got) != 2 || got[1].EnvelopeID != id2 {
		t.Fatalf("receipts: %+v, %v", got, err)
	}
	for what, a := range map[string]string{
		"another order": answer(relayproto.SenderReceipt{EnvelopeID: id2, State: relayproto.SenderReceiptUnknown},
			relayproto.SenderReceipt{EnvelopeID: id1, State: relayproto.SenderReceiptUnknown}),
		"one missing": answer(relayproto.SenderReceipt{EnvelopeID: id1, State: relayproto.SenderReceiptUnknown}),
		"held, no receipt": answer(relayproto.SenderReceipt{EnvelopeID: id1, State: relayproto.SenderReceiptHeld},
			relayproto.SenderReceipt{EnvelopeID: id2, State: relayproto.SenderReceiptUnknown}),
		"a strange state": answer(relayproto.SenderReceipt{EnvelopeID: id1, State: "gone"},
			relayproto.SenderReceipt{EnvelopeID: id2, State: relayproto.SenderReceiptUnknown}),
	} {
		receiptsAnswer = a
		if _, err := c.SenderReceipts(ctx, bob, []string{id1, id2}); err == nil {
			t.Errorf("%s: taken", what)
		}
	}
	if _, err := c.SenderReceipts(ctx, bob, nil); err == nil {
		t.Fatal("no ids: sent")
	}
	page, err := c.InboxStatuses(ctx, bob, 1767225600000, "4")
	if err != nil || page.Cursor != "5" {
		t.Fatalf("statuses: %+v, %v", page, err)
	}
	if !strings.HasPrefix(seen[len(seen)-1], "GET "+relayproto.PathInboxStatuses+"?after=4&since=1767225600000 ") {
		t.Fatalf("statuses request %q", seen[len(seen)-1])
	}
}
