package relay_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// The relay's request bodies are strict JSON: duplicate keys, case-variant keys
// and unknown fields are refused with 400 BAD_REQUEST (never "last wins" or a
// case-insensitive match), on the ack endpoint and on the envelope endpoint.
func TestStrictRequestBodies(t *testing.T) {
	e := newEnv(t)
	bob := ident(t, 2)
	e.clock.Add(time.Second)
	id := uuid.NewString()
	ack := func(body string) (int, []byte) {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+relayproto.PathInboxAck, strings.NewReader(body))
		if err := relayproto.SignInboxRequest(req, bob, e.clock.Now()); err != nil {
			t.Fatal(err)
		}
		return do(t, req)
	}
	for name, body := range map[string]string{
		"duplicate key":    `{"envelopeIds":["not-a-uuid"],"envelopeIds":["` + id + `"]}`,
		"case-variant key": `{"EnvelopeIds":["` + id + `"]}`,
		"unknown field":    `{"envelopeIds":["` + id + `"],"all":true}`,
		"trailing data":    `{"envelopeIds":["` + id + `"]}{}`,
	} {
		t.Run("ack/"+name, func(t *testing.T) {
			status, resp := ack(body)
			wantCode(t, status, resp, http.StatusBadRequest, relayproto.CodeBadRequest)
		})
	}
	if status, resp := ack(`{"envelopeIds":["` + id + `"]}`); status != http.StatusOK {
		t.Fatalf("a strict ack body: %d %s", status, resp)
	}

	// An envelope with a duplicated or case-varied key is not accepted either.
	_, wire := e.message(bob.DID())
	for name, bad := range map[string][]byte{
		"duplicate key":    bytes.Replace(wire, []byte(`{"v":`), []byte(`{"v":1,"v":`), 1),
		"case-variant key": bytes.Replace(wire, []byte(`"v":`), []byte(`"V":`), 1),
	} {
		t.Run("envelope/"+name, func(t *testing.T) {
			if bytes.Equal(bad, wire) {
				t.Fatalf("the envelope has no \"v\" key to vary: %s", wire)
			}
			status, resp, _ := e.post(bad)
			if status != http.StatusBadRequest {
				t.Fatalf("got %d %s, want 400", status, resp)
			}
		})
	}
}
