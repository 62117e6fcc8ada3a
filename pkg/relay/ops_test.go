package relay_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/internal/promtest"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// get GETs path on e's relay: its status and body.
func (e *env) get(path string) (int, []byte) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
	return do(e.t, req)
}

// scrape GETs /metrics, checks it as promtool would, and returns it.
func (e *env) scrape() string {
	e.t.Helper()
	status, body := e.get(relay.PathMetrics)
	if status != 200 {
		e.t.Fatalf("/metrics: %d %s", status, body)
	}
	promtest.Check(e.t, body)
	return string(body)
}

func wantMetrics(t *testing.T, body string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(body, "\n"+l+"\n") {
			t.Errorf("/metrics lacks %q", l)
		}
	}
}

// GET /livez, /readyz and /metrics on the relay's handler: live, ready with its
// storage answering, and Prometheus metrics that parse and lint as promtool's
// check does, counting accepts, duplicates, quota refusals (alone and in a
// batch), error answers by code, held polls and their refusals, the inbox depth
// and the storage's state.
func TestOpsEndpoints(t *testing.T) { eachBackend(t, testOpsEndpoints) }

func testOpsEndpoints(t *testing.T, backend string) {
	e := &env{t: t, home: t.TempDir(), clock: newFakeClock(time.UnixMilli(1_767_225_600_000)), relID: ident(t, 9),
		limits: relay.Limits{QuotaEnvelopes: 1, HeldPollsPerAddress: 1}, backend: backend, opts: relay.Options{Version: "v1.2.3-test"}}
	if backend == jetStreamBackend {
		e.nats = natstest.Node(t)
	}
	e.start()
	t.Cleanup(e.stop)
	bob, carol := ident(t, 2), ident(t, 3)

	for path, want := range map[string]string{relay.PathLivez: "live", relay.PathReadyz: "ready"} {
		status, body := e.get(path)
		var v struct{ Status, DID string }
		if status != 200 || json.Unmarshal(body, &v) != nil || v.Status != want || v.DID != string(e.relID.DID()) {
			t.Fatalf("%s: %d %s", path, status, body)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+relay.PathReadyz, nil)
	if status, _ := do(t, req); status != http.StatusMethodNotAllowed {
		t.Fatalf("POST /readyz: %d", status)
	}
	e.scrape() // before any traffic, too

	_, data := e.message(bob.DID())
	for range 2 { // accepted, then a duplicate
		if status, body, _ := e.post(data); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
	}
	_, over := e.message(bob.DID())
	status, body, _ := e.post(over)
	wantCode(t, status, body, 429, relayproto.CodeRelayQuota)
	_, over2 := e.message(bob.DID())
	_, forCarol := e.message(carol.DID())
	res, err := e.client.PostBatch(context.Background(), [][]byte{over2, forCarol})
	if err != nil || res[0].Refusal == nil || res[0].Refusal.Code != relayproto.CodeRelayQuota || res[1].Outcome != relayproto.BatchAccepted {
		t.Fatalf("batch: %+v %v", res, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		waitFor(t, "the waiters freed", func() bool { return e.relay.Waiting() == 0 })
	}()
	dave := ident(t, 4)
	longPoll(t, ctx, e, e.client, dave, "", relayproto.MaxInboxWait)
	if _, err := e.client.FetchWait(ctx, ident(t, 5), "", 0, relayproto.MaxInboxWait); err == nil {
		t.Fatal("a second held poll from one address with a bound of 1")
	}

	m := e.scrape()
	wantMetrics(t, m,
		`sealbridge_relay_envelopes_total{outcome="accepted"} 2`,
		`sealbridge_relay_envelopes_total{outcome="duplicate"} 1`,
		`sealbridge_relay_envelope_refusals_total{code="RELAY_QUOTA"} 2`,
		`sealbridge_relay_envelope_refusals_total{code="RELAY_RATE_LIMITED"} 0`,
		`sealbridge_relay_request_errors_total{code="RELAY_QUOTA"} 1`,
		`sealbridge_relay_request_errors_total{code="RELAY_BUSY"} 1`,
		`sealbridge_relay_held_polls 1`,
		`sealbridge_relay_held_polls_limit{scope="address"} 1`,
		`sealbridge_relay_held_poll_refusals_total{bound="address"} 1`,
		`sealbridge_relay_inbox_envelopes 2`,
		`sealbridge_relay_storage_ready 1`,
		fmt.Sprintf(`sealbridge_relay_build_info{backend="%s",did="%s",version="v1.2.3-test"} 1`, backend, e.relID.DID()),
	)
	if backend == jetStreamBackend {
		wantMetrics(t, m, `sealbridge_relay_nats_connected 1`, `sealbridge_relay_nats_reconnects_total 0`)
	} else if strings.Contains(m, "sealbridge_relay_nats_") {
		t.Error("NATS series on the file storage")
	}
	for _, fam := range []string{"go_goroutines", "process_start_time_seconds"} {
		if !strings.Contains(m, "\n"+fam+" ") {
			t.Errorf("/metrics lacks %s", fam)
		}
	}
}

// /readyz answers 503 with the reason while the file storage cannot write its
// inbox directory (here: ENOSPC injected), and 200 again once it can; the
// metrics say so too.
func TestReadyzFileStorageUnwritable(t *testing.T) {
	var full atomic.Bool
	e := &env{t: t, home: t.TempDir(), clock: newFakeClock(time.UnixMilli(1_767_225_600_000)), relID: ident(t, 9),
		opts: relay.Options{WrapFS: func(inner fsx.FS) fsx.FS {
			f := fsx.NewFaulty(inner)
			f.Inject = func(op fsx.Op) error {
				if full.Load() && op.Kind == fsx.OpCreate {
					return syscall.ENOSPC
				}
				return nil
			}
			return f
		}}}
	e.start()
	t.Cleanup(e.stop)
	if status, body := e.get(relay.PathReadyz); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	full.Store(true)
	var body []byte
	waitFor(t, "not ready", func() bool {
		var status int
		status, body = e.get(relay.PathReadyz)
		return status == 503
	})
	var v struct{ Status, Code, Message string }
	if json.Unmarshal(body, &v) != nil || v.Status != "not ready" || v.Code != relayproto.CodeRelayStorageUnavailable ||
		!strings.Contains(v.Message, "no space left on device") {
		t.Fatalf("/readyz: %s", body)
	}
	wantMetrics(t, e.scrape(), "sealbridge_relay_storage_ready 0")
	full.Store(false)
	waitFor(t, "ready again", func() bool { status, _ := e.get(relay.PathReadyz); return status == 200 })
}

// On JetStream /readyz follows the NATS connection: 503 while the server is
// down, 200 once the connection is back; the metrics show the connection's
// state and its reconnects.
func TestReadyzJetStreamDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q, sync_interval: always }\n", port, t.TempDir())
	s := natstest.NodeFromConfig(t, conf)
	e := &env{t: t, home: t.TempDir(), clock: newFakeClock(time.UnixMilli(1_767_225_600_000)), relID: ident(t, 9), backend: jetStreamBackend, nats: s}
	e.start()
	t.Cleanup(e.stop)
	if status, body := e.get(relay.PathReadyz); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	s.Shutdown()
	s.WaitForShutdown()
	var body []byte
	waitFor(t, "not ready", func() bool {
		var status int
		status, body = e.get(relay.PathReadyz)
		return status == 503
	})
	if !strings.Contains(string(body), "NATS connection is") {
		t.Fatalf("/readyz: %s", body)
	}
	wantMetrics(t, e.scrape(), "sealbridge_relay_storage_ready 0", "sealbridge_relay_nats_connected 0")
	natstest.NodeFromConfig(t, conf)
	waitFor(t, "ready again", func() bool { status, _ := e.get(relay.PathReadyz); return status == 200 })
	wantMetrics(t, e.scrape(), "sealbridge_relay_storage_ready 1", "sealbridge_relay_nats_connected 1", "sealbridge_relay_nats_reconnects_total 1")
}

// Probes, scrapes and accepts at once (run under -race): every probe answers
// ready, every scrape is served or refused as over the two in flight (503),
// never wrong, and the counts add up afterwards.
func TestOpsConcurrent(t *testing.T) {
	e := newEnv(t)
	const workers = 16
	// call is one request from a worker goroutine (no t.Fatal off the test's).
	call := func(method, path string, body []byte) (int, []byte, error) {
		req, err := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		return resp.StatusCode, data, err
	}
	type answer struct {
		path   string
		status int
		body   []byte
		err    error
	}
	gate := make(chan struct{})
	answers := make(chan answer, 3*workers)
	for i := range workers {
		_, data := e.message(ident(t, byte(40+i%4)).DID())
		for _, r := range []struct {
			method, path string
			body         []byte
		}{{http.MethodGet, relay.PathReadyz, nil}, {http.MethodGet, relay.PathMetrics, nil}, {http.MethodPost, relayproto.PathEnvelopes, data}} {
			go func() {
				<-gate
				status, body, err := call(r.method, r.path, r.body)
				answers <- answer{r.path, status, body, err}
			}()
		}
	}
	close(gate)
	for range 3 * workers {
		a := <-answers
		switch {
		case a.err != nil:
			t.Errorf("%s: %v", a.path, a.err)
		case a.path == relay.PathMetrics && a.status == 503: // promhttp: more than two scrapes in flight
		case a.status != 200:
			t.Errorf("%s: %d %s", a.path, a.status, a.body)
		case a.path == relay.PathMetrics:
			promtest.Check(t, a.body)
		}
	}
	wantMetrics(t, e.scrape(), fmt.Sprintf(`sealbridge_relay_envelopes_total{outcome="accepted"} %d`, workers),
		fmt.Sprintf("sealbridge_relay_inbox_envelopes %d", workers), "sealbridge_relay_storage_ready 1")
}

// A readiness probe's file that a crash left in the inbox directory is removed
// when the relay opens it again.
func TestProbeLeftoverRemovedAtOpen(t *testing.T) {
	e := newEnv(t)
	sum := sha256.Sum256([]byte(e.relID.DID()))
	leftover := filepath.Join(e.home, dataroot.RelayDir, hex.EncodeToString(sum[:]), fsx.TempName())
	if err := os.WriteFile(leftover, []byte("ready\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.start()
	if _, err := os.Lstat(leftover); !os.IsNotExist(err) {
		t.Fatalf("the probe's leftover is still there: %v", err)
	}
	if status, body := e.get(relay.PathReadyz); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
}
