package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// A batch is answered envelope by envelope, in its order: new envelopes are
// accepted (their inbox order is the batch's), one already held and one sent
// twice in the batch are duplicates with the first receipt bytes, and a bad,
// a conflicting and an expired envelope are refused with the codes the single
// endpoint gives them, without refusing the others.
func TestBatchAcceptPerEnvelope(t *testing.T) { eachBackend(t, testBatchAcceptPerEnvelope) }

func testBatchAcceptPerEnvelope(t *testing.T, backend string) {
	e := newEnvOn(t, backend, relay.Limits{})
	bob, carol := ident(t, 2), ident(t, 3)
	ctx := context.Background()
	held, heldData := e.message(bob.DID())
	status, heldReceipt, _ := e.post(heldData)
	if status != 200 {
		t.Fatalf("single accept: %d %s", status, heldReceipt)
	}
	var news []*envelope.Envelope
	var wires [][]byte
	for i := range 4 {
		to := bob.DID()
		if i == 2 {
			to = carol.DID()
		}
		en, data := e.message(to)
		news = append(news, en)
		wires = append(wires, data)
	}
	bad := bytes.Clone(wires[1])
	bad = bytes.Replace(bad, []byte(`"v":1`), []byte(`"v":2`), 1)
	conflict := forgeSameID(t, held, ident(t, 4), bob.DID(), e.clock.Now())
	_, expired, err := envelope.NewMessage(ident(t, 1), bob.DID(), uuid.NewString(), []byte("x"),
		e.clock.Now().Add(time.Minute), e.clock.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Add(2 * time.Minute)
	batch := [][]byte{wires[0], bad, heldData, wires[1], conflict, wires[2], expired, wires[1], wires[3]}
	answers, err := e.client.PostBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"accepted", "refused ENVELOPE_VERSION", "duplicate", "accepted", "refused ENVELOPE_CONFLICT",
		"accepted", "refused ENVELOPE_EXPIRED", "duplicate", "accepted"}
	var got []string
	for i, a := range answers {
		if a.Err != nil {
			t.Fatalf("answer %d: %v", i, a.Err)
		}
		s := a.Outcome
		if a.Refusal != nil {
			s += " " + a.Refusal.Code
			if a.Refusal.Status < 400 || a.Refusal.Status > 499 || a.Refusal.Message == "" {
				t.Errorf("answer %d: refusal %+v", i, a.Refusal)
			}
		}
		got = append(got, s)
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("answers:\n %s\nwant\n %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
	if !bytes.Equal(answers[2].Receipt, heldReceipt) {
		t.Error("the held envelope's duplicate answer is not its first receipt")
	}
	if !bytes.Equal(answers[7].Receipt, answers[3].Receipt) {
		t.Error("the envelope sent twice in the batch got two different receipts")
	}
	// The single endpoint agrees with what the batch stored.
	for i, w := range [][]byte{wires[0], wires[1], wires[2], wires[3]} {
		status, receipt, _ := e.post(w)
		if status != 200 || !bytes.Equal(receipt, answers[[]int{0, 3, 5, 8}[i]].Receipt) {
			t.Fatalf("envelope %d again on the single endpoint: %d, same receipt %v", i, status, bytes.Equal(receipt, answers[0].Receipt))
		}
	}
	st := e.relay.Stats()
	if st.Accepted != 5 || st.Duplicates != 2+4 || st.Conflicts != 1 || st.Refused != 2 {
		t.Fatalf("stats %+v", st)
	}
	// Bob's inbox holds the held envelope then the batch's, in the batch's order.
	page, err := e.client.Fetch(ctx, bob, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, pe := range page.Envelopes {
		order = append(order, pe.EnvelopeID)
	}
	wantOrder := []string{held.ID(), news[0].ID(), news[1].ID(), news[3].ID()}
	if strings.Join(order, " ") != strings.Join(wantOrder, " ") {
		t.Fatalf("bob's inbox %v, want %v", order, wantOrder)
	}
	// After a restart the batch's envelopes are still held and de-duplicated.
	e.restart()
	answers, err = e.client.PostBatch(ctx, [][]byte{wires[3], wires[2]})
	if err != nil {
		t.Fatal(err)
	}
	if answers[0].Outcome != relayproto.BatchDuplicate || !bytes.Equal(answers[0].Receipt, want8(t, e, wires[3])) ||
		answers[1].Outcome != relayproto.BatchDuplicate {
		t.Fatalf("after restart: %+v", answers)
	}
}

// want8 is the receipt the single endpoint answers for data now.
func want8(t *testing.T, e *env, data []byte) []byte {
	t.Helper()
	status, receipt, _ := e.post(data)
	if status != 200 {
		t.Fatalf("%d %s", status, receipt)
	}
	return receipt
}

// The batch request itself is bounded and strictly decoded.
func TestBatchRequestRefusals(t *testing.T) {
	e := newEnv(t)
	post := func(body []byte) (int, []byte) {
		t.Helper()
		resp, err := http.Post(e.srv.URL+relayproto.PathEnvelopesBatch, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	_, one := e.message(ident(t, 2).DID())
	for _, c := range []struct {
		name string
		body string
	}{
		{"not an object", `[` + string(one) + `]`},
		{"unknown key", `{"envelopes":[` + string(one) + `],"more":1}`},
		{"duplicate key", `{"envelopes":[],"envelopes":[` + string(one) + `]}`},
		{"empty", `{"envelopes":[]}`},
		{"trailing data", `{"envelopes":[` + string(one) + `]}{}`},
		{"too many", `{"envelopes":[` + strings.TrimSuffix(strings.Repeat(string(one)+",", relayproto.MaxBatchEnvelopes+1), ",") + `]}`},
	} {
		status, body := post([]byte(c.body))
		t.Run(c.name, func(t *testing.T) { wantCode(t, status, body, 400, relayproto.CodeBadRequest) })
	}
	status, body := post(bytes.Repeat([]byte(" "), relayproto.MaxBatchBodySize+1))
	wantCode(t, status, body, 413, relayproto.CodeBodyTooLarge)
	resp, err := http.Get(e.srv.URL + relayproto.PathEnvelopesBatch)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantCode(t, resp.StatusCode, b, 405, relayproto.CodeMethodNotAllowed)
	if st := e.relay.Stats(); st.Accepted != 0 {
		t.Fatalf("stats %+v", st)
	}
	// An element that is not an envelope is refused alone.
	answers, err := e.client.PostBatch(context.Background(), [][]byte{[]byte(`"text"`), one})
	if err != nil {
		t.Fatal(err)
	}
	if answers[0].Refusal == nil || answers[0].Refusal.Code != relayproto.CodeEnvelopeMalformed || answers[1].Outcome != relayproto.BatchAccepted {
		t.Fatalf("answers %+v", answers)
	}
}

// Two batches sharing envelopes, sent at once in opposite orders, neither
// deadlock nor store an envelope twice.
func TestConcurrentOverlappingBatches(t *testing.T) {
	e := newEnv(t)
	var wires [][]byte
	for range 16 {
		_, data := e.message(ident(t, 2).DID())
		wires = append(wires, data)
	}
	rev := make([][]byte, len(wires))
	for i := range wires {
		rev[len(wires)-1-i] = wires[i]
	}
	errs := make(chan error, 4)
	for i := range 4 {
		w := wires
		if i%2 == 1 {
			w = rev
		}
		go func() {
			answers, err := e.client.PostBatch(context.Background(), w)
			for j, a := range answers {
				if err == nil && a.Outcome != relayproto.BatchAccepted && a.Outcome != relayproto.BatchDuplicate {
					err = fmt.Errorf("answer %d: %+v", j, a)
				}
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if st := e.relay.Stats(); st.Accepted != 16 || st.Duplicates != 3*16 {
		t.Fatalf("stats %+v", st)
	}
}

// A client of an old relay learns from the whole request's 404 that it must
// send one envelope at a time.
func TestPostBatchToRelayWithoutIt(t *testing.T) {
	e := newEnv(t)
	_, one := e.message(ident(t, 2).DID())
	old := &relayproto.Client{BaseURL: e.srv.URL + "/old"}
	_, err := old.PostBatch(context.Background(), [][]byte{one})
	var re *relayproto.Error
	if !errors.As(err, &re) || re.Status != 404 {
		t.Fatalf("got %v, want a 404 *relayproto.Error", err)
	}
}
