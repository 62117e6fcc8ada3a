package daemon

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
)

// One limit answers a large body: a message body over envelope.MaxBodySize, and a
// request too large to hold a body within it, are both 413 BODY_TOO_LARGE with the
// limit and a hint stating it; a body of exactly the limit is accepted. (Before:
// 400 REQUEST_TOO_LARGE "body over 97280 bytes" and 413 "request body over 137898
// bytes", without a hint.)
func TestSendBodyLimit(t *testing.T) {
	d, hc := apiDaemon(t, nil)
	limit := fmt.Sprint(envelope.MaxBodySize)
	for name, body := range map[string]string{
		"body one byte over": sendBody(t, strings.Repeat("x", envelope.MaxBodySize+1)),
		"request over":       sendBody(t, strings.Repeat("x", maxRequestBytes)),
	} {
		t.Run(name, func(t *testing.T) {
			for _, key := range []string{"", "k-" + name} {
				a := post(t, hc, key, body)
				hint, _ := a.body["hint"].(string)
				if a.status != http.StatusRequestEntityTooLarge || a.body["code"] != "BODY_TOO_LARGE" ||
					a.body["limit"] != float64(envelope.MaxBodySize) || !strings.Contains(hint, limit+" bytes") {
					t.Fatalf("key %q: %d %s, want 413 BODY_TOO_LARGE with the limit %s and a hint stating it", key, a.status, a.raw, limit)
				}
			}
		})
	}
	if n := countMessages(t, d); n != 0 {
		t.Fatalf("%d messages stored from refused requests", n)
	}
	if a := post(t, hc, "", sendBody(t, strings.Repeat("x", envelope.MaxBodySize))); a.status != http.StatusCreated {
		t.Fatalf("a body of exactly the limit: %d %s", a.status, a.raw)
	}
}
