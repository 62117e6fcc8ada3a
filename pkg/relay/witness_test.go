package relay_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// headOf signs a store head of id with seq.
func headOf(t testing.TB, id *identity.Identity, seq int64, now time.Time) []byte {
	t.Helper()
	h, err := envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: 2, Seq: seq, Time: now})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// withHead is a client of e's relay that sends head with every post.
func (e *env) withHead(head []byte) *relayproto.Client {
	return &relayproto.Client{BaseURL: e.srv.URL, Now: e.clock.Now, Head: func() []byte { return head }}
}

func headSeq(t testing.TB, data []byte) int64 {
	t.Helper()
	if data == nil {
		return 0
	}
	h, err := envelope.ParseStoreHead(data)
	if err != nil {
		t.Fatal(err)
	}
	return h.Seq
}

// Many posts of one sender at once, each with another head (single posts and
// batches, started together): the head the relay keeps is the highest, and
// every receipt names a senderSeq at least that of its own request's head and
// at most the highest. A duplicate posted later with a higher head answers
// the first receipt's bytes.
func TestHeadsWitnessedConcurrently(t *testing.T) { eachBackend(t, testHeadsWitnessedConcurrently) }

func testHeadsWitnessedConcurrently(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	ctx := context.Background()
	alice, bob := ident(t, 1), ident(t, 2)
	const n = 24
	seqs := rand.Perm(n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	type sent struct {
		head    int64
		receipt []byte
		wire    []byte
	}
	results := make([][]sent, n)
	errs := make([]error, n)
	for i := range n {
		seq := int64(seqs[i] + 1)
		c := e.withHead(headOf(t, alice, seq, e.clock.Now()))
		_, w1 := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
		_, w2 := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
		wg.Go(func() {
			<-start
			if i%2 == 0 {
				rc, _, err := c.Post(ctx, w1)
				errs[i] = err
				results[i] = []sent{{seq, rc, w1}}
				return
			}
			ans, err := c.PostBatch(ctx, [][]byte{w1, w2})
			if err != nil {
				errs[i] = err
				return
			}
			for j, a := range ans {
				if a.Outcome != relayproto.BatchAccepted {
					errs[i] = errors.New("batch envelope " + a.Outcome)
					return
				}
				results[i] = append(results[i], sent{seq, a.Receipt, [][]byte{w1, w2}[j]})
			}
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	var first sent
	for _, rs := range results {
		for _, s := range rs {
			rc, err := envelope.ParseRelayReceipt(s.receipt)
			if err != nil {
				t.Fatal(err)
			}
			if rc.SenderSeq < s.head || rc.SenderSeq > n {
				t.Fatalf("a post with head %d got senderSeq %d (highest %d)", s.head, rc.SenderSeq, n)
			}
			first = s
		}
	}
	kept, err := e.relay.SenderHead(ctx, alice.DID())
	if err != nil || headSeq(t, kept) != n {
		t.Fatalf("kept head %d, %v; want %d", headSeq(t, kept), err, n)
	}
	if st := e.relay.Stats(); st.HeadsWitnessed != n {
		t.Fatalf("heads witnessed %d, want %d", st.HeadsWitnessed, n)
	}
	// Restarted: still the highest, from the storage.
	e.restart()
	if kept, err := e.relay.SenderHead(ctx, alice.DID()); err != nil || headSeq(t, kept) != n {
		t.Fatalf("after a restart: %d, %v", headSeq(t, kept), err)
	}
	again, _, err := e.withHead(headOf(t, alice, n+5, e.clock.Now())).Post(ctx, first.wire)
	if err != nil || !bytes.Equal(again, first.receipt) {
		t.Fatalf("duplicate with a higher head: %v, same bytes %v", err, bytes.Equal(again, first.receipt))
	}
	// A new envelope now names the higher head; one with a lower head too.
	_, w := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	_, rc, err := e.withHead(headOf(t, alice, 3, e.clock.Now())).Post(ctx, w)
	if err != nil || rc.SenderSeq != n+5 {
		t.Fatalf("a post with an older head: %v, senderSeq %d, want %d", err, rc.SenderSeq, n+5)
	}
	if st := e.relay.Stats(); st.HeadsBehind != 1 {
		t.Fatalf("heads behind %d, want 1", st.HeadsBehind)
	}
	// Without a head (an older carrier): the witnessed seq all the same.
	_, w = e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	if _, rc, err := e.client.Post(ctx, w); err != nil || rc.SenderSeq != n+5 {
		t.Fatalf("a post without a head: %v, senderSeq %d", err, rc.SenderSeq)
	}
	// Another sender without heads: no senderSeq at all.
	_, w = e.messageFrom(ident(t, 3), bob.DID(), 10, e.clock.Now().Add(time.Hour))
	if b, rc, err := e.client.Post(ctx, w); err != nil || rc.SenderSeq != 0 || strings.Contains(string(b), "senderSeq") {
		t.Fatalf("a sender without heads: %v, %s", err, b)
	}
}

// A head that does not parse, or is not the head of every envelope's sender,
// or comes twice, refuses the whole request with 400 HEAD_INVALID: nothing of
// it is accepted, and the head is not kept.
func TestHeadInvalidRefusesTheRequest(t *testing.T) { eachBackend(t, testHeadInvalidRefusesTheRequest) }

func testHeadInvalidRefusesTheRequest(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	ctx := context.Background()
	alice, bob, carol := ident(t, 1), ident(t, 2), ident(t, 3)
	wantInvalid := func(what string, err error) {
		t.Helper()
		var re *relayproto.Error
		if !errors.As(err, &re) || re.Status != 400 || re.Code != relayproto.CodeHeadInvalid {
			t.Fatalf("%s: %v, want 400 %s", what, err, relayproto.CodeHeadInvalid)
		}
	}
	_, w1 := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	_, w2 := e.messageFrom(carol, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	aliceHead := headOf(t, alice, 7, e.clock.Now())
	_, _, err := e.withHead(headOf(t, carol, 7, e.clock.Now())).Post(ctx, w1)
	wantInvalid("carol's head on alice's envelope", err)
	bad := bytes.Replace(aliceHead, []byte(`"seq":7`), []byte(`"seq":8`), 1)
	_, _, err = e.withHead(bad).Post(ctx, w1)
	wantInvalid("a head whose signature does not verify", err)
	_, err = e.withHead(aliceHead).PostBatch(ctx, [][]byte{w1, w2})
	wantInvalid("alice's head on a batch with carol's envelope", err)
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+relayproto.PathEnvelopes, bytes.NewReader(w1))
	req.Header.Add(relayproto.HeaderHead, string(aliceHead))
	req.Header.Add(relayproto.HeaderHead, string(aliceHead))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("two heads: %d", resp.StatusCode)
	}
	if page, err := e.client.Fetch(ctx, bob, "", 0); err != nil || len(page.Envelopes) != 0 {
		t.Fatalf("refused requests left %v, %v", page, err)
	}
	for _, who := range []*identity.Identity{alice, carol} {
		if h, err := e.client.SenderHead(ctx, who); err != nil || h != nil {
			t.Fatalf("a refused head was kept for %s: %s, %v", who.DID(), h, err)
		}
	}
	if st := e.relay.Stats(); st.HeadsInvalid != 4 || st.Accepted != 0 {
		t.Fatalf("stats %+v", st)
	}
	// The same envelopes with the right heads are accepted.
	if _, _, err := e.withHead(aliceHead).Post(ctx, w1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.withHead(headOf(t, carol, 1, e.clock.Now())).Post(ctx, w2); err != nil {
		t.Fatal(err)
	}
}

// Two JetStream relay processes witnessing one sender's heads at once never
// lower what they keep: the kept head is the highest either saw, and a lower
// head posted later at either leaves it.
func TestHeadsNeverLoweredAcrossJetStreamRelays(t *testing.T) {
	a := newEnvOn(t, jetStreamBackend, relay.Limits{})
	_, b := a.second()
	ctx := context.Background()
	alice, bob := ident(t, 1), ident(t, 2)
	const n = 24
	seqs := rand.Perm(n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		seq := int64(seqs[i] + 1)
		e := []*env{a, b}[i%2]
		c := e.withHead(headOf(t, alice, seq, e.clock.Now()))
		_, w := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
		wg.Go(func() {
			<-start
			_, rc, err := c.Post(ctx, w)
			if err == nil && (rc.SenderSeq < seq || rc.SenderSeq > n) {
				err = errors.New("senderSeq out of bounds")
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	for _, e := range []*env{a, b} {
		if h, err := e.client.SenderHead(ctx, alice); err != nil || headSeq(t, h) != n {
			t.Fatalf("kept head %d, %v; want %d", headSeq(t, h), err, n)
		}
	}
	_, w := b.messageFrom(alice, bob.DID(), 10, b.clock.Now().Add(time.Hour))
	if _, _, err := b.withHead(headOf(t, alice, 2, b.clock.Now())).Post(ctx, w); err != nil {
		t.Fatal(err)
	}
	if h, err := a.client.SenderHead(ctx, alice); err != nil || headSeq(t, h) != n {
		t.Fatalf("after a lower head at b: %d, %v", headSeq(t, h), err)
	}
}

// GET /v1/senders/head answers the signer's own head only (404 HEAD_UNKNOWN
// before any, and to another sender), and refuses unsigned and replayed
// requests.
func TestSenderHeadEndpoint(t *testing.T) { eachBackend(t, testSenderHeadEndpoint) }

func testSenderHeadEndpoint(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	ctx := context.Background()
	alice, bob := ident(t, 1), ident(t, 2)
	if h, err := e.client.SenderHead(ctx, alice); err != nil || h != nil {
		t.Fatalf("before any head: %s, %v", h, err)
	}
	head := headOf(t, alice, 4, e.clock.Now())
	_, w := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	if _, _, err := e.withHead(head).Post(ctx, w); err != nil {
		t.Fatal(err)
	}
	if h, err := e.client.SenderHead(ctx, alice); err != nil || !bytes.Equal(h, head) {
		t.Fatalf("alice's head: %s, %v", h, err)
	}
	if h, err := e.client.SenderHead(ctx, bob); err != nil || h != nil {
		t.Fatalf("bob asking: %s, %v", h, err)
	}
	// The answer's code, unsigned, and a replay.
	req := signedGet(t, e, alice, relayproto.PathSenderHead)
	if status, body := send(t, req); status != 200 || !bytes.Equal(body, head) {
		t.Fatalf("signed: %d %s", status, body)
	}
	status, body := send(t, req)
	wantCode(t, status, body, 401, relayproto.CodeAuthNonceReplayed)
	unsigned, _ := http.NewRequest(http.MethodGet, e.srv.URL+relayproto.PathSenderHead, nil)
	status, body = send(t, unsigned)
	wantCode(t, status, body, 401, relayproto.CodeAuthMissing)
	status, body = send(t, signedGet(t, e, bob, relayproto.PathSenderHead))
	wantCode(t, status, body, 404, relayproto.CodeHeadUnknown)
}

func signedGet(t *testing.T, e *env, id *identity.Identity, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := relayproto.SignInboxRequest(req, id, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	return req
}

// send sends req (again, for a replay: its body is a GET's) and returns the
// status and body.
func send(t *testing.T, req *http.Request) (int, []byte) {
	t.Helper()
	r := req.Clone(context.Background())
	if req.GetBody != nil {
		r.Body, _ = req.GetBody()
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

// POST /v1/senders/receipts answers per id: held while the envelope waits,
// acked once its recipient acknowledged it (the receipt first answered, both
// times), unknown for an id never accepted and for another sender's
// envelope; unsigned and replayed requests are refused.
func TestSenderReceipts(t *testing.T) { eachBackend(t, testSenderReceipts) }

func testSenderReceipts(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	ctx := context.Background()
	alice, bob, carol := ident(t, 1), ident(t, 2), ident(t, 3)
	a1, w1 := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	a2, w2 := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	c1, w3 := e.messageFrom(carol, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	head := headOf(t, alice, 3, e.clock.Now())
	var receipts [][]byte
	for _, w := range [][]byte{w1, w2, w3} {
		c := e.client
		if !bytes.Equal(w, w3) {
			c = e.withHead(head)
		}
		rc, _, err := c.Post(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		receipts = append(receipts, rc)
	}
	if n, err := e.client.Ack(ctx, bob, []string{a1.ID()}); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	never := uuid.NewString()
	got, err := e.client.SenderReceipts(ctx, alice, []string{a1.ID(), a2.ID(), never, c1.ID()})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		state   string
		receipt []byte
	}{{relayproto.SenderReceiptAcked, receipts[0]}, {relayproto.SenderReceiptHeld, receipts[1]},
		{relayproto.SenderReceiptUnknown, nil}, {relayproto.SenderReceiptUnknown, nil}}
	for i, w := range want {
		if got[i].State != w.state || !bytes.Equal(got[i].Receipt, w.receipt) {
			t.Fatalf("%d: %s %s, want %s %s", i, got[i].State, got[i].Receipt, w.state, w.receipt)
		}
		if w.receipt != nil && (got[i].Parsed == nil || got[i].Parsed.SenderSeq != 3) {
			t.Fatalf("%d: parsed %+v", i, got[i].Parsed)
		}
	}
	// Carol asks about alice's envelopes and her own.
	got, err = e.client.SenderReceipts(ctx, carol, []string{a1.ID(), a2.ID(), c1.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].State != relayproto.SenderReceiptUnknown || got[1].State != relayproto.SenderReceiptUnknown ||
		got[2].State != relayproto.SenderReceiptHeld || !bytes.Equal(got[2].Receipt, receipts[2]) {
		t.Fatalf("carol: %+v", got)
	}
	// Survives a restart.
	e.restart()
	got, err = e.client.SenderReceipts(ctx, alice, []string{a1.ID(), a2.ID()})
	if err != nil || got[0].State != relayproto.SenderReceiptAcked || got[1].State != relayproto.SenderReceiptHeld {
		t.Fatalf("after a restart: %+v, %v", got, err)
	}
	// Unsigned, replayed, malformed.
	body := []byte(`{"envelopeIds":["` + a1.ID() + `"]}`)
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+relayproto.PathSenderReceipts, bytes.NewReader(body))
	status, resp := send(t, req)
	wantCode(t, status, resp, 401, relayproto.CodeAuthMissing)
	req, _ = http.NewRequest(http.MethodPost, e.srv.URL+relayproto.PathSenderReceipts, bytes.NewReader(body))
	if err := relayproto.SignInboxRequest(req, alice, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if status, resp := send(t, req); status != 200 || !bytes.Contains(resp, []byte(`"state":"acked"`)) {
		t.Fatalf("signed: %d %s", status, resp)
	}
	status, resp = send(t, req)
	wantCode(t, status, resp, 401, relayproto.CodeAuthNonceReplayed)
	req, _ = http.NewRequest(http.MethodPost, e.srv.URL+relayproto.PathSenderReceipts, strings.NewReader(`{"envelopeIds":["x"]}`))
	_ = relayproto.SignInboxRequest(req, alice, e.clock.Now())
	status, resp = send(t, req)
	wantCode(t, status, resp, 400, relayproto.CodeBadRequest)
}

// A delivery status its recipient acknowledged is retained for the status
// retention and served by GET /v1/inbox/statuses (only to that recipient, from
// since, paged by cursor), across a restart; a message acknowledged is not;
// the expiry pass removes the statuses once their retention ends.
func TestRetainedStatuses(t *testing.T) { eachBackend(t, testRetainedStatuses) }

func testRetainedStatuses(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	ctx := context.Background()
	alice, bob := ident(t, 1), ident(t, 2)
	msg, _ := e.messageFrom(alice, bob.DID(), 10, e.clock.Now().Add(time.Hour))
	var statuses [][]byte
	var ids []string
	for range 3 {
		st, w, err := envelope.NewDeliveryStatus(bob, alice.DID(), envelope.ConfirmationOf(msg), e.clock.Now().Add(time.Hour), e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.client.Post(ctx, w); err != nil {
			t.Fatal(err)
		}
		statuses, ids = append(statuses, w), append(ids, st.ID())
		e.clock.Add(time.Second)
	}
	m, mw := e.messageFrom(bob, alice.DID(), 10, e.clock.Now().Add(time.Hour))
	if _, _, err := e.client.Post(ctx, mw); err != nil {
		t.Fatal(err)
	}
	page, err := e.client.InboxStatuses(ctx, alice, 0, "")
	if err != nil || len(page.Envelopes) != 0 {
		t.Fatalf("before any ack: %+v, %v", page, err)
	}
	// Acknowledged out of order, with the message.
	if n, err := e.client.Ack(ctx, alice, []string{ids[1], m.ID()}); err != nil || n != 2 {
		t.Fatalf("ack: %d %v", n, err)
	}
	if n, err := e.client.Ack(ctx, alice, []string{ids[0], ids[2]}); err != nil || n != 2 {
		t.Fatalf("ack: %d %v", n, err)
	}
	if page, err := e.client.Fetch(ctx, alice, "", 0); err != nil || len(page.Envelopes) != 0 {
		t.Fatalf("the inbox after the acks: %+v, %v", page, err)
	}
	all := func(c *relayproto.Client, id *identity.Identity, since int64) []string {
		t.Helper()
		var got []string
		cursor := ""
		for {
			page, err := c.InboxStatuses(ctx, id, since, cursor)
			if err != nil {
				t.Fatal(err)
			}
			for _, en := range page.Envelopes {
				i := indexOf(ids, en.EnvelopeID)
				if i < 0 || !bytes.Equal(en.Envelope, statuses[i]) || en.EnvelopeDigest != envelope.Digest(statuses[i]) {
					t.Fatalf("a retained status that is not one of those acknowledged: %+v", en)
				}
				got = append(got, en.EnvelopeID)
			}
			if !page.More {
				return got
			}
			cursor = page.Cursor
		}
	}
	wantIDs := func(what string, got []string, want ...string) {
		t.Helper()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
	// In the order they were retained.
	wantIDs("retained", all(e.client, alice, 0), ids[1], ids[0], ids[2])
	wantIDs("bob's", all(e.client, bob, 0))
	t0 := e.clock.Now().Add(-3 * time.Second).UnixMilli()
	wantIDs("since the second", all(e.client, alice, t0+1000), ids[1], ids[2])
	// A cursor from the first page resumes after it.
	page, err = e.client.InboxStatuses(ctx, alice, 0, "")
	if err != nil || len(page.Envelopes) != 3 {
		t.Fatalf("one page: %+v, %v", page, err)
	}
	if p2, err := e.client.InboxStatuses(ctx, alice, 0, page.Envelopes[0].Cursor); err != nil || len(p2.Envelopes) != 2 ||
		p2.Envelopes[0].EnvelopeID != ids[0] {
		t.Fatalf("after the first: %+v, %v", p2, err)
	}
	e.restart()
	wantIDs("after a restart", all(e.client, alice, 0), ids[1], ids[0], ids[2])
	// Past the retention: never served, removed by the expiry pass.
	e.clock.Add(relay.DefaultStatusRetention)
	wantIDs("past the retention", all(e.client, alice, 0))
	if _, err := e.relay.Expire(ctx); err != nil {
		t.Fatal(err)
	}
	if st := e.relay.Stats(); st.Expired != 0 {
		t.Fatalf("statuses counted as expired envelopes: %+v", st)
	}
	e.restart()
	wantIDs("expired, after a restart", all(e.client, alice, 0))
	// Unsigned and replayed.
	unsigned, _ := http.NewRequest(http.MethodGet, e.srv.URL+relayproto.PathInboxStatuses, nil)
	status, body := send(t, unsigned)
	wantCode(t, status, body, 401, relayproto.CodeAuthMissing)
	req := signedGet(t, e, alice, relayproto.PathInboxStatuses+"?since=0")
	if status, body := send(t, req); status != 200 {
		t.Fatalf("signed: %d %s", status, body)
	}
	status, body = send(t, req)
	wantCode(t, status, body, 401, relayproto.CodeAuthNonceReplayed)
	status, body = send(t, signedGet(t, e, alice, relayproto.PathInboxStatuses+"?since=x"))
	wantCode(t, status, body, 400, relayproto.CodeBadRequest)
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// A blob envelope posted with a head: its receipt, signed when its body is
// complete, names the seq witnessed then.
func TestBlobReceiptNamesTheWitnessedHead(t *testing.T) {
	eachBackend(t, testBlobReceiptNamesTheWitnessedHead)
}

func testBlobReceiptNamesTheWitnessedHead(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	ctx := context.Background()
	alice, bob := ident(t, 1), ident(t, 2)
	en, wire, sealed := e.blobMessage(bob.DID(), 100<<10, time.Hour)
	c := e.withHead(headOf(t, alice, 6, e.clock.Now()))
	var bi *relayproto.BodyIncompleteError
	if _, _, err := c.Post(ctx, wire); !errors.As(err, &bi) {
		t.Fatalf("post: %v, want a 202", err)
	}
	if off, err := e.upload(en.ID(), 0, sealed); err != nil || off != int64(len(sealed)) {
		t.Fatalf("upload: %d, %v", off, err)
	}
	_, rc, err := e.client.Post(ctx, wire)
	if err != nil || rc.SenderSeq != 6 {
		t.Fatalf("receipt after the body: %v, senderSeq %+v", err, rc)
	}
}
