package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// fullDisk makes every create and write of the store's file system fail with
// ENOSPC while it is set, as a full disk does.
func fullDisk(full *atomic.Bool) store.Options {
	return store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if full.Load() && (op.Kind == fsx.OpCreate || op.Kind == fsx.OpWrite) {
				return syscall.ENOSPC
			}
			return nil
		}
		return f
	}}
}

func serve(h http.Handler, method, path, body string) (int, http.Header, map[string]any, string) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	var m map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &m)
	return rec.Code, rec.Header(), m, rec.Body.String()
}

// A full disk (every create and write fails with ENOSPC): each send is answered at
// once 503 OUTBOX_STORE_UNWRITABLE saying "the disk holding DIR is full (ENOSPC…)"
// with a hint and no Retry-After; 50 sends in 40 s log one warning, and a minute
// later one more (with the repeats counted); /readyz is 503 with the reason and the
// hint while writes fail, and ready again once the write prober's probe succeeds
// after space is freed, with one "work again" line. (Before: the store's text, no
// hint, Retry-After 1, a warning per send, /readyz ready throughout.)
func TestDiskFullSaysSoLogsOnceAMinuteAndIsNotReady(t *testing.T) {
	var full atomic.Bool
	d, logs, clk := healthDaemon(t, Options{Store: fullDisk(&full)})
	enqueue(t, d) // the store directory exists: the disk fills up after the first message
	h := d.handler()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.probeWrites(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	if code, _, body, _ := serve(h, http.MethodGet, "/readyz", ""); code != http.StatusOK {
		t.Fatalf("before: /readyz %d %v", code, body)
	}

	full.Store(true)
	dir := d.Store().Dir()
	for i := range 50 { // 50 sends in 40 s
		code, hdr, body, raw := serve(h, http.MethodPost, "/v1/messages", sendBody(t, "hi"))
		msg, _ := body["message"].(string)
		hint, _ := body["hint"].(string)
		if code != http.StatusServiceUnavailable || body["code"] != "OUTBOX_STORE_UNWRITABLE" ||
			!strings.Contains(msg, "the disk holding "+dir+" is full (ENOSPC") || !strings.Contains(hint, "free space") ||
			hdr.Get("Retry-After") != "" {
			t.Fatalf("send %d on a full disk: %d Retry-After %q %s", i, code, hdr.Get("Retry-After"), raw)
		}
		clk.advance(800 * time.Millisecond)
	}
	if warns := logs.lines("level=WARN"); len(warns) != 1 || !strings.Contains(warns[0], "store: writes fail") ||
		!strings.Contains(warns[0], "is full (ENOSPC") {
		t.Fatalf("%d warnings for 50 sends in 40 s, want 1:\n%s", len(warns), strings.Join(warns, "\n"))
	}
	code, _, body, raw := serve(h, http.MethodGet, "/readyz", "")
	if msg, _ := body["message"].(string); code != http.StatusServiceUnavailable || body["code"] != codeNotReady ||
		!strings.Contains(msg, "the store cannot be written: the disk holding "+dir+" is full") ||
		!strings.Contains(fmt.Sprint(body["hint"]), "free space") || !strings.Contains(raw, `"source":"store writes"`) {
		t.Fatalf("/readyz on a full disk: %d %s", code, raw)
	}
	clk.advance(21 * time.Second) // a minute after the first warning
	serve(h, http.MethodPost, "/v1/messages", sendBody(t, "hi"))
	if warns := logs.lines("level=WARN", "store: writes fail"); len(warns) != 2 || !strings.Contains(warns[1], "repeated=49") {
		t.Fatalf("a minute on: %d warnings, want 2, the second with repeated=49:\n%s", len(warns), strings.Join(warns, "\n"))
	}

	// The prober: still full at its first probe, freed before its second.
	next := func() *fakeTimer {
		t.Helper()
		select {
		case tm := <-clk.timers:
			if tm.d != writeProbeEvery {
				t.Fatalf("the prober waits %s, want %s", tm.d, writeProbeEvery)
			}
			return tm
		case <-time.After(60 * time.Second):
			t.Fatal("the write prober armed no timer")
			return nil
		}
	}
	next().fire()
	tm := next() // the first probe failed: still not ready
	if code, _, _, _ := serve(h, http.MethodGet, "/readyz", ""); code != http.StatusServiceUnavailable {
		t.Fatalf("after a failed probe: /readyz %d", code)
	}
	full.Store(false)
	tm.fire()
	eventually(t, 30*time.Second, "ready after space is freed", func() (bool, string) {
		code, _, _, raw := serve(h, http.MethodGet, "/readyz", "")
		return code == http.StatusOK, raw
	})
	if got := logs.lines("level=INFO", "store: writes work again"); len(got) != 1 {
		t.Fatalf("%d 'work again' lines, want 1", len(got))
	}
	if code, _, _, raw := serve(h, http.MethodPost, "/v1/messages", sendBody(t, "hi")); code != http.StatusCreated {
		t.Fatalf("a send after space is freed: %d %s", code, raw)
	}
}

// Many sends at once on a full disk (a start gate, 16 workers): every one is
// answered with the full disk, one warning is logged for all of them (the clock
// stands still), and the prober is woken without blocking any of them.
func TestDiskFullConcurrentSendsLogOnce(t *testing.T) {
	var full atomic.Bool
	d, logs, _ := healthDaemon(t, Options{Store: fullDisk(&full)})
	enqueue(t, d)
	h := d.handler()
	full.Store(true)
	const workers, each = 16, 5
	start := make(chan struct{})
	errs := make(chan string, workers*each)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			<-start
			for range each {
				code, _, body, raw := serve(h, http.MethodPost, "/v1/messages", sendBody(t, "hi"))
				if msg, _ := body["message"].(string); code != http.StatusServiceUnavailable || !strings.Contains(msg, "is full (ENOSPC") {
					errs <- fmt.Sprintf("%d %s", code, raw)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if warns := logs.lines("level=WARN"); len(warns) != 1 {
		t.Fatalf("%d warnings for %d concurrent sends, want 1:\n%s", len(warns), workers*each, strings.Join(warns, "\n"))
	}
	if code, _, _, _ := serve(h, http.MethodGet, "/readyz", ""); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d", code)
	}
}

// A disk that fills up at any point of a keyed send (after its k-th file-system
// call, for every k a send makes): whatever step meets it — taking the key,
// enqueueing, releasing or completing the operation — the failure is the one
// condition: one warning in all, on a clock that stands still.
func TestDiskFillingDuringKeyedSendsLogsOnce(t *testing.T) {
	var ops, failAt atomic.Int64
	d, logs, _ := healthDaemon(t, Options{Store: store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if n := ops.Add(1); failAt.Load() > 0 && n >= failAt.Load() && (op.Kind == fsx.OpCreate || op.Kind == fsx.OpWrite) {
				return syscall.ENOSPC
			}
			return nil
		}
		return f
	}}})
	close(d.leasesOK) // startup (not run here) would have expired leftover leases
	h := d.handler()
	post := func(key string) (int, string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(sendBody(t, "hi")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	// How many calls a keyed send makes on a disk with room.
	ops.Store(0)
	if code, raw := post("room"); code != http.StatusCreated {
		t.Fatalf("a send with room: %d %s", code, raw)
	}
	calls := ops.Load()
	failed := 0
	for k := int64(1); k <= calls; k++ {
		ops.Store(0)
		failAt.Store(k)
		code, raw := post(fmt.Sprint("k", k))
		failAt.Store(0)
		if code != http.StatusCreated {
			failed++
			if code != http.StatusServiceUnavailable || !strings.Contains(raw, "is full (ENOSPC") {
				t.Errorf("disk full at call %d: %d %s", k, code, raw)
			}
		}
	}
	if failed == 0 {
		t.Fatal("no send met the full disk")
	}
	if warns := logs.lines("level=WARN"); len(warns) != 1 {
		t.Fatalf("%d warnings for %d sends that met a full disk, want 1:\n%s", len(warns), failed, strings.Join(warns, "\n"))
	}
}
