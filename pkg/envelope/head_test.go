package envelope_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
)

func TestStoreHeadRoundTrip(t *testing.T) {
	h := envelope.StoreHead{Owner: alice(t).DID(), Format: 2, Seq: 42, Time: testNow}
	data, err := envelope.SignStoreHead(alice(t).Signer(), h)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"v":1,"payload":{"owner":"` + string(h.Owner) + `","format":2,"seq":42,"time":` +
		"1767225600000" + `},"sig":"`
	if !strings.HasPrefix(string(data), want) {
		t.Fatalf("head shape:\n%s\nwant prefix\n%s", data, want)
	}
	got, err := envelope.ParseStoreHead(data)
	if err != nil {
		t.Fatal(err)
	}
	if *got != h {
		t.Fatalf("parsed %+v, want %+v", got, h)
	}
	// A head whose seq was raised or lowered no longer verifies.
	for _, seq := range []string{`"seq":43`, `"seq":41`} {
		if _, err := envelope.ParseStoreHead(replaceOnce(t, data, `"seq":42`, seq)); !errors.Is(err, envelope.ErrSignature) {
			t.Fatalf("%s: %v, want ErrSignature", seq, err)
		}
	}
	// Signed by another key than its owner's: refused.
	if _, err := envelope.SignStoreHead(bob(t).Signer(), h); !errors.Is(err, envelope.ErrSignature) {
		t.Fatalf("signed by bob: %v", err)
	}
	for _, bad := range []envelope.StoreHead{
		{Owner: h.Owner, Format: 0, Seq: 1, Time: testNow},
		{Owner: h.Owner, Format: 2, Seq: 0, Time: testNow},
	} {
		if _, err := envelope.SignStoreHead(alice(t).Signer(), bad); !errors.Is(err, envelope.ErrMalformed) {
			t.Fatalf("%+v: %v, want ErrMalformed", bad, err)
		}
	}
}

func TestRelayReceiptSenderSeq(t *testing.T) {
	r, old := testReceipt(t)
	if strings.Contains(string(old), "senderSeq") {
		t.Fatalf("a receipt without a witnessed head names senderSeq: %s", old)
	}
	r.SenderSeq = 7
	data, err := envelope.SignRelayReceipt(carol(t), r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `,"senderSeq":7}`) {
		t.Fatalf("receipt: %s", data)
	}
	got, err := envelope.ParseRelayReceipt(data)
	if err != nil || got.SenderSeq != 7 {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	if _, err := envelope.ParseRelayReceipt(replaceOnce(t, data, `"senderSeq":7`, `"senderSeq":0`)); !errors.Is(err, envelope.ErrMalformed) {
		t.Fatalf("explicit senderSeq 0 (not canonical): %v", err)
	}
}
