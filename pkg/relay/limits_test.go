package relay_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// messageFrom builds a message from sender to recipient with payload bytes of
// padding, due by deadline.
func (e *env) messageFrom(sender *identity.Identity, recipient identity.DID, payload int, deadline time.Time) (*envelope.Envelope, []byte) {
	e.t.Helper()
	en, data, err := envelope.NewMessage(sender, recipient, uuid.NewString(), bytes.Repeat([]byte("x"), payload), deadline, e.clock.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	return en, data
}

// wantLimited checks a 429 with code and Retry-After retry.
func wantLimited(t *testing.T, status int, body []byte, h http.Header, code, retry string) {
	t.Helper()
	wantCode(t, status, body, http.StatusTooManyRequests, code)
	if got := h.Get("Retry-After"); got != retry {
		t.Fatalf("Retry-After %q, want %q", got, retry)
	}
}

// wantRefused checks one batch answer is a refusal with status, code and Retry-After.
func wantRefused(t *testing.T, a relayproto.BatchAnswer, status int, code string, retry int) {
	t.Helper()
	if a.Outcome != relayproto.BatchRefused || a.Refusal == nil || a.Refusal.Status != status ||
		a.Refusal.Code != code || a.Refusal.RetryAfter != retry {
		t.Fatalf("batch answer %+v (refusal %+v), want refused %d %s retry %d", a, a.Refusal, status, code, retry)
	}
}

func TestQuotaEnvelopes(t *testing.T) { eachBackend(t, testQuotaEnvelopes) }

func testQuotaEnvelopes(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{QuotaEnvelopes: 2})
	ctx := context.Background()
	bob, carol := ident(t, 2), ident(t, 3)
	var first []byte
	var firstID string
	for i := range 2 {
		en, data := e.message(bob.DID())
		if status, body, _ := e.post(data); status != 200 {
			t.Fatalf("envelope %d: %d %s", i, status, body)
		}
		if i == 0 {
			first, firstID = data, en.ID()
		}
	}
	_, over := e.message(bob.DID())
	status, body, h := e.post(over)
	wantLimited(t, status, body, h, relayproto.CodeRelayQuota, "60")
	// A duplicate is answered whatever the quota.
	if status, body, _ := e.post(first); status != 200 {
		t.Fatalf("duplicate at quota: %d %s", status, body)
	}
	// In a batch, bob's envelope is refused alone; carol's inbox has room.
	_, toCarol := e.message(carol.DID())
	answers, err := e.client.PostBatch(ctx, [][]byte{over, toCarol})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, answers[0], http.StatusTooManyRequests, relayproto.CodeRelayQuota, relay.QuotaRetryAfter)
	if answers[1].Outcome != relayproto.BatchAccepted {
		t.Fatalf("carol's envelope: %+v", answers[1])
	}
	// Once bob fetched and acknowledged one, there is room again.
	if n, err := e.client.Ack(ctx, bob, []string{firstID}); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	if status, body, _ := e.post(over); status != 200 {
		t.Fatalf("after ack: %d %s", status, body)
	}
	if st := e.relay.Stats(); st.OverQuota != 2 || st.Accepted != 4 {
		t.Fatalf("stats %+v", st)
	}
	// The quota counts what a restart loads.
	e.restart()
	_, again := e.message(bob.DID())
	status, body, h = e.post(again)
	wantLimited(t, status, body, h, relayproto.CodeRelayQuota, "60")
}

func TestQuotaBytes(t *testing.T) { eachBackend(t, testQuotaBytes) }

func testQuotaBytes(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{QuotaBytes: envelope.MaxSize})
	bob := ident(t, 2)
	deadline := e.clock.Now().Add(time.Hour)
	_, a := e.messageFrom(ident(t, 1), bob.DID(), 40_000, deadline)
	if 2*len(a) > envelope.MaxSize || 3*len(a) <= envelope.MaxSize {
		t.Fatalf("envelope of %d bytes: the test needs two to fit %d bytes and three not", len(a), envelope.MaxSize)
	}
	for range 2 {
		_, data := e.messageFrom(ident(t, 1), bob.DID(), 40_000, deadline)
		if status, body, _ := e.post(data); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
	}
	status, body, h := e.post(a)
	wantLimited(t, status, body, h, relayproto.CodeRelayQuota, "60")
	// A small one still fits.
	_, small := e.messageFrom(ident(t, 1), bob.DID(), 10, deadline)
	if status, body, _ := e.post(small); status != 200 {
		t.Fatalf("small envelope: %d %s", status, body)
	}
}

func TestSenderRateLimit(t *testing.T) { eachBackend(t, testSenderRateLimit) }

func testSenderRateLimit(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{SenderRate: 0.5, SenderBurst: 2})
	ctx := context.Background()
	alice, dave, bob := ident(t, 1), ident(t, 4), ident(t, 2)
	deadline := e.clock.Now().Add(time.Hour)
	var sent [][]byte
	for range 2 {
		_, data := e.messageFrom(alice, bob.DID(), 10, deadline)
		if status, body, _ := e.post(data); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		sent = append(sent, data)
	}
	_, third := e.messageFrom(alice, bob.DID(), 10, deadline)
	status, body, h := e.post(third)
	wantLimited(t, status, body, h, relayproto.CodeRelayRateLimited, "2") // a token every 2 s
	// Another sender has its own bucket; a duplicate spends no token.
	_, fromDave := e.messageFrom(dave, bob.DID(), 10, deadline)
	if status, body, _ := e.post(fromDave); status != 200 {
		t.Fatalf("other sender: %d %s", status, body)
	}
	if status, body, _ := e.post(sent[0]); status != 200 {
		t.Fatalf("duplicate while limited: %d %s", status, body)
	}
	e.clock.Add(time.Second)
	status, body, h = e.post(third)
	wantLimited(t, status, body, h, relayproto.CodeRelayRateLimited, "1")
	e.clock.Add(time.Second)
	if status, body, _ := e.post(third); status != 200 {
		t.Fatalf("after the wait: %d %s", status, body)
	}
	// A batch spends a token per new envelope: the burst goes through, the rest is refused.
	e.clock.Add(10 * time.Second)
	var batch [][]byte
	for range 3 {
		_, data := e.messageFrom(alice, bob.DID(), 10, deadline)
		batch = append(batch, data)
	}
	answers, err := e.client.PostBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if answers[i].Outcome != relayproto.BatchAccepted {
			t.Fatalf("batch envelope %d: %+v", i, answers[i])
		}
	}
	wantRefused(t, answers[2], http.StatusTooManyRequests, relayproto.CodeRelayRateLimited, 2)
	if st := e.relay.Stats(); st.RateLimited != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestAllowList(t *testing.T) { eachBackend(t, testAllowList) }

func testAllowList(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{AllowList: true})
	ctx := context.Background()
	bob, carol := ident(t, 2), ident(t, 3)
	_, toBob := e.message(bob.DID())
	status, body, _ := e.post(toBob)
	wantCode(t, status, body, http.StatusForbidden, relayproto.CodeRecipientNotAllowed)

	// Registration is a signed request: unsigned, or signed by someone else for
	// a body, it is refused.
	resp, err := http.Post(e.srv.URL+relayproto.PathRecipientsRegister, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unsigned registration: %d", resp.StatusCode)
	}
	if err := e.client.Register(ctx, bob); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Register(ctx, bob); err != nil {
		t.Fatalf("registering again: %v", err)
	}
	if status, body, _ := e.post(toBob); status != 200 {
		t.Fatalf("registered: %d %s", status, body)
	}
	// Durable: a restart keeps bob and still refuses carol, in a batch too.
	e.restart()
	_, toBob2 := e.message(bob.DID())
	_, toCarol := e.message(carol.DID())
	answers, err := e.client.PostBatch(ctx, [][]byte{toCarol, toBob2})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, answers[0], http.StatusForbidden, relayproto.CodeRecipientNotAllowed, 0)
	if answers[1].Outcome != relayproto.BatchAccepted {
		t.Fatalf("bob's envelope after restart: %+v", answers[1])
	}
	// Unregistered: refused again, after a restart as well; the inbox stays fetchable.
	if err := e.client.Unregister(ctx, bob); err != nil {
		t.Fatal(err)
	}
	e.restart()
	_, toBob3 := e.message(bob.DID())
	status, body, _ = e.post(toBob3)
	wantCode(t, status, body, http.StatusForbidden, relayproto.CodeRecipientNotAllowed)
	if page, err := e.client.Fetch(ctx, bob, "", 0); err != nil || len(page.Envelopes) != 2 {
		t.Fatalf("bob's inbox after unregistering: %v %v", page, err)
	}
	if st := e.relay.Stats(); st.NotAllowed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestExpiry(t *testing.T) { eachBackend(t, testExpiry) }

func testExpiry(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	ctx := context.Background()
	bob := ident(t, 2)
	short, shortData := e.messageFrom(ident(t, 1), bob.DID(), 10, e.clock.Now().Add(time.Minute))
	longEnv, longData := e.messageFrom(ident(t, 1), bob.DID(), 10, e.clock.Now().Add(time.Hour))
	status, receipt, _ := e.post(shortData)
	if status != 200 {
		t.Fatal(status)
	}
	if status, _, _ := e.post(longData); status != 200 {
		t.Fatal(status)
	}
	ids := func() []string {
		page, err := e.client.Fetch(ctx, bob, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range page.Envelopes {
			out = append(out, en.EnvelopeID)
		}
		return out
	}
	if got := ids(); len(got) != 2 {
		t.Fatalf("before the deadline: %v", got)
	}
	e.clock.Add(time.Minute) // the short one's deadline: never served from now on
	if got := ids(); !slices.Equal(got, []string{longEnv.ID()}) {
		t.Fatalf("at the deadline: %v, want only %s", got, longEnv.ID())
	}
	n, err := e.relay.Expire(ctx)
	if err != nil || n != 1 {
		t.Fatalf("expire: %d %v", n, err)
	}
	if n, err := e.relay.Expire(ctx); err != nil || n != 0 {
		t.Fatalf("expire again: %d %v", n, err)
	}
	if st := e.relay.Stats(); st.Expired != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The file is gone, a restart does not bring it back, and the envelope
	// sent again gets its receipt without re-entering the inbox.
	files, _ := filepath.Glob(filepath.Join(e.home, "relay", "*", "*", "*-"+short.ID()+".env"))
	if len(files) != 0 {
		t.Fatalf("expired envelope still on disk: %v", files)
	}
	e.restart()
	status, again, _ := e.post(shortData)
	if status != 200 || !bytes.Equal(again, receipt) {
		t.Fatalf("expired envelope sent again: %d %s", status, again)
	}
	if got := ids(); !slices.Equal(got, []string{longEnv.ID()}) {
		t.Fatalf("after restart: %v", got)
	}
}

// The periodic pass (Limits.ExpireEvery) removes expired envelopes by itself.
func TestExpiryPass(t *testing.T) { eachBackend(t, testExpiryPass) }

func testExpiryPass(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{ExpireEvery: 5 * time.Millisecond})
	bob := ident(t, 2)
	_, data := e.messageFrom(ident(t, 1), bob.DID(), 10, e.clock.Now().Add(time.Minute))
	if status, _, _ := e.post(data); status != 200 {
		t.Fatal(status)
	}
	e.clock.Add(time.Minute)
	waitFor(t, "the expiry pass removing the expired envelope", func() bool { return e.relay.Stats().Expired == 1 })
}

func TestLimitsChecked(t *testing.T) {
	for _, l := range []relay.Limits{
		{QuotaEnvelopes: -1}, {QuotaBytes: 1000}, {SenderRate: -1}, {SenderBurst: 3}, {ExpireEvery: -time.Second},
	} {
		if _, err := relay.New(relay.Options{Identity: ident(t, 9), Home: t.TempDir(), Limits: l}); err == nil {
			t.Errorf("limits %+v accepted", l)
		}
	}
}

func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := relay.LimitListener(inner, 1)
	defer ln.Close()
	for range 2 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			second <- c
		}
		close(second)
	}()
	// (One-sided: a second Accept that returned at once would usually be seen here.)
	select {
	case <-second:
		t.Fatal("a second connection was accepted while the first is open")
	default:
	}
	first.Close()
	first.Close() // a second Close releases nothing more
	c, ok := <-second
	if !ok {
		t.Fatal("the second connection was not accepted after the first closed")
	}
	c.Close()
	if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Fatal(err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after close: %v", err)
	}
}

// The expiry pass also maintains the file backend's store: a receipt record past its
// retainUntil (the deadline + 24 h) is removed, after which the envelope sent again is
// refused as expired, never taken in again.
func TestExpiryRemovesOldReceipts(t *testing.T) {
	e := newEnvOn(t, "file", relay.Limits{})
	ctx := context.Background()
	bob := ident(t, 2)
	en, data := e.messageFrom(ident(t, 1), bob.DID(), 10, e.clock.Now().Add(time.Minute))
	if status, _, _ := e.post(data); status != 200 {
		t.Fatal(status)
	}
	receipts := func() int {
		files, _ := filepath.Glob(filepath.Join(e.home, "delivery", "*", "receipts", "*.json"))
		return len(files)
	}
	if receipts() != 1 {
		t.Fatalf("%d receipt records after the accept", receipts())
	}
	e.clock.Add(time.Minute + 24*time.Hour - time.Millisecond) // just before its receipt's retainUntil
	if _, err := e.relay.Expire(ctx); err != nil || receipts() != 1 {
		t.Fatalf("before its retainUntil: %v, %d receipt records; want it kept", err, receipts())
	}
	e.clock.Add(time.Millisecond)
	if _, err := e.relay.Expire(ctx); err != nil || receipts() != 0 {
		t.Fatalf("at its retainUntil: %v, %d receipt records; want none", err, receipts())
	}
	if status, body, _ := e.post(data); status != http.StatusUnprocessableEntity && status != http.StatusBadRequest ||
		!strings.Contains(string(body), relayproto.CodeEnvelopeExpired) {
		t.Fatalf("%s sent again after its receipt expired: %d %s, want refused as expired", en.ID(), status, body)
	}
}

// An envelope past its deadline takes no room in its recipient's quota and is not in
// the status: it is never served again, so nobody could acknowledge it to make room.
func TestQuotaIgnoresExpired(t *testing.T) { eachBackend(t, testQuotaIgnoresExpired) }

func testQuotaIgnoresExpired(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{QuotaEnvelopes: 1})
	bob := ident(t, 2)
	_, short := e.messageFrom(ident(t, 1), bob.DID(), 10, e.clock.Now().Add(time.Minute))
	if status, _, _ := e.post(short); status != 200 {
		t.Fatal(status)
	}
	_, next := e.messageFrom(ident(t, 1), bob.DID(), 10, e.clock.Now().Add(time.Hour))
	if status, _, _ := e.post(next); status != http.StatusTooManyRequests {
		t.Fatalf("over the quota: %d, want 429", status)
	}
	e.clock.Add(time.Minute) // the first one's deadline: never served from now on
	if st, err := e.client.Status(context.Background(), bob); err != nil || st.Count != 0 {
		t.Fatalf("status at the deadline: %+v %v, want nothing waiting", st, err)
	}
	if status, body, _ := e.post(next); status != 200 {
		t.Fatalf("after the first one expired: %d %s, want accepted (no expiry pass ran)", status, body)
	}
}
