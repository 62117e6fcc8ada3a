package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// apiDaemon runs a daemon on a fresh home whose store file system is wrapped by
// inject (nil: none), on a short socket path, and returns it with an HTTP client
// of its socket.
func apiDaemon(t *testing.T, inject func(fsx.Op) error) (*Daemon, *http.Client) {
	t.Helper()
	home := t.TempDir()
	if _, err := InitIdentity(home, ""); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "sbapi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	opts := Options{Home: home, Logger: quiet, SocketPath: filepath.Join(sockDir, "s.sock")}
	if inject != nil {
		opts.Store.WrapFS = func(inner fsx.FS) fsx.FS {
			f := fsx.NewFaulty(inner)
			f.Inject = inject
			return f
		}
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.SocketPath())
	}}}
	t.Cleanup(hc.CloseIdleConnections)
	return d, hc
}

type apiAnswer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func post(t *testing.T, hc *http.Client, key, body string) apiAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://sealbridged/v1/messages", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	a := apiAnswer{status: resp.StatusCode, header: resp.Header, raw: string(data)}
	if err := json.Unmarshal(data, &a.body); err != nil {
		t.Fatalf("answer %d is not JSON: %s", resp.StatusCode, data)
	}
	return a
}

func sendBody(t *testing.T, body string) string {
	t.Helper()
	peer, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"to": string(peer.DID()), "relayUrl": "http://127.0.0.1:9", "body": []byte(body)})
	return string(b)
}

func countMessages(t *testing.T, d *Daemon) int {
	t.Helper()
	ids, err := d.Store().List(record.KindMessages)
	if err != nil {
		t.Fatal(err)
	}
	return len(ids)
}

// POST /v1/messages decodes strictly: a duplicate key (which encoding/json
// resolves "last wins"), a key in another case ("TO", which it matches to "to"),
// an unknown field and trailing data are 400 BAD_REQUEST, and nothing is stored.
func TestStrictSendRequest(t *testing.T) {
	d, hc := apiDaemon(t, nil)
	good := sendBody(t, "hi")
	for name, body := range map[string]string{
		"duplicate key":    strings.Replace(good, `"relayUrl":`, `"relayUrl":"ftp://nowhere","relayUrl":`, 1),
		"case-variant key": strings.Replace(good, `"to":`, `"TO":`, 1),
		"unknown field":    strings.Replace(good, `{`, `{"cc":"x",`, 1),
		"trailing data":    good + `{}`,
	} {
		t.Run(name, func(t *testing.T) {
			if body == good {
				t.Fatal("the request was not varied")
			}
			for _, key := range []string{"", "k-" + name} {
				a := post(t, hc, key, body)
				if a.status != http.StatusBadRequest || a.body["code"] != codeBadRequest {
					t.Fatalf("key %q: got %d %s, want 400 %s", key, a.status, a.raw, codeBadRequest)
				}
			}
		})
	}
	if n := countMessages(t, d); n != 0 {
		t.Fatalf("%d messages stored from refused requests", n)
	}
	if a := post(t, hc, "", good); a.status != http.StatusCreated {
		t.Fatalf("a strict request: %d %s", a.status, a.raw)
	}
}

// A send whose commit (a one-envelope message's message record, DESIGN §7) was
// renamed into place but whose directory fsync failed is answered 503 OUTBOX_STORE_UNWRITABLE with outcome "unknown", the
// message id and a hint to retry with the same key; the retry with the same key
// answers 201 with that message at once, and there is one message.
func TestIdempotentSendAfterFailedCommitSync(t *testing.T) {
	// Every messages fsync fails while fail is set (the carrier's writes too: they
	// are retried), so the send's commit fails whatever the carrier does meanwhile.
	var fail atomic.Bool
	d, hc := apiDaemon(t, func(op fsx.Op) error {
		if op.Kind == fsx.OpSyncDir && op.Path == string(record.KindMessages) && fail.Load() {
			return syscall.EIO
		}
		return nil
	})
	body := sendBody(t, "hi")
	fail.Store(true)
	a := post(t, hc, "k1", body)
	fail.Store(false)
	if a.status != http.StatusServiceUnavailable || a.body["code"] != "OUTBOX_STORE_UNWRITABLE" ||
		a.body["outcome"] != "unknown" || a.body["messageId"] == nil || !strings.Contains(a.raw, "same Idempotency-Key") {
		t.Fatalf("first attempt: %d %s", a.status, a.raw)
	}
	id := a.body["messageId"]
	b := post(t, hc, "k1", body)
	if b.status != http.StatusCreated || b.body["messageId"] != id {
		t.Fatalf("retry: %d %s (want 201 with %v)", b.status, b.raw, id)
	}
	if n := countMessages(t, d); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
	// Without a key the answer still says the message may be accepted, and which.
	fail.Store(true)
	c := post(t, hc, "", sendBody(t, "ho"))
	fail.Store(false)
	if c.status != http.StatusServiceUnavailable || c.body["outcome"] != "unknown" || c.body["messageId"] == nil {
		t.Fatalf("keyless: %d %s", c.status, c.raw)
	}
}

// When storing an operation's response fails after its message was accepted, a
// retry with the same key answers 201 with that message at once — whether ending
// the lease worked (the retry takes the operation over) or failed too (the retry
// finds the accepted message) — never 409 IDEMPOTENCY_IN_PROGRESS until the lease
// runs out.
func TestIdempotentSendAfterFailedResponseStore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int32 // operations writes to fail once the message record (the commit) is renamed
	}{{"lease released", 1}, {"lease kept", 1 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			var committed atomic.Bool
			var fail atomic.Int32
			d, hc := apiDaemon(t, func(op fsx.Op) error {
				if op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, string(record.KindMessages)+"/") {
					committed.Store(true)
				}
				if committed.Load() && strings.HasPrefix(op.Path, string(record.KindOperations)+"/") && fail.Add(-1) >= 0 {
					return syscall.EIO
				}
				return nil
			})
			fail.Store(tc.failures)
			body := sendBody(t, "hi")
			a := post(t, hc, "k1", body)
			if a.status != http.StatusCreated {
				t.Fatalf("first attempt: %d %s", a.status, a.raw)
			}
			b := post(t, hc, "k1", body)
			if b.status != http.StatusCreated || b.body["messageId"] != a.body["messageId"] {
				t.Fatalf("retry: %d %s (want 201 with %v)", b.status, b.raw, a.body["messageId"])
			}
			if n := countMessages(t, d); n != 1 {
				t.Fatalf("%d messages, want 1", n)
			}
			if tc.failures == 1 {
				// The lease was ended, so the retry took the operation over and
				// stored its response.
				op, err := store.GetAs[*record.Operation](d.Store(), a.body["messageId"].(string))
				if err != nil || op == nil || op.State != record.OperationDone {
					t.Fatalf("operation after the retry: %+v %v", op, err)
				}
			}
			// Another request with the key is still refused.
			if c := post(t, hc, "k1", sendBody(t, "other")); c.status != http.StatusUnprocessableEntity {
				t.Fatalf("key reuse: %d %s", c.status, c.raw)
			}
		})
	}
}
