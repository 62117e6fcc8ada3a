package daemon

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/carrier"
)

// stuckSend is a transport whose Send announces itself and then blocks, ignoring
// its context, until release is closed: an attempt that outlives every timeout.
type stuckSend struct {
	started chan struct{}
	release chan struct{}
}

func (s *stuckSend) Send(context.Context, string, []byte) carrier.Result {
	select {
	case s.started <- struct{}{}:
	default:
	}
	<-s.release
	return carrier.Result{Outcome: carrier.Accepted, Status: http.StatusOK}
}

// While the carrier still has an attempt in flight after the drain timeout and the
// grace that follows it, the pid lock stays held: Run returns an error (and logs
// one), a second daemon for the identity is refused, and only once the attempt
// ends is the lock released and a second daemon can start.
func TestPIDLockHeldWhileCarrierSends(t *testing.T) {
	tr := &stuckSend{started: make(chan struct{}, 1), release: make(chan struct{})}
	released := false
	defer func() {
		if !released {
			close(tr.release)
		}
	}()
	d, logs, _ := healthDaemon(t, Options{Transport: tr, DrainTimeout: 20 * time.Millisecond,
		Carrier: carrier.Options{Watch: carrier.WatchOff}})
	home := d.opts.Home
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("not ready")
	}
	enqueue(t, d)
	select {
	case <-tr.started:
	case <-time.After(60 * time.Second):
		t.Fatal("no attempt started")
	}
	cancel()
	// Run may return (the carrier overran its bound) but the lock must outlive it.
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return after the drain timeout and its grace")
	}
	if d2, err := New(Options{Home: home, Logger: quiet}); err == nil {
		d2.Close()
		t.Fatal("a second daemon took the pid lock while the first one's carrier was sending")
	} else if !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second daemon: %v, want already running", err)
	}
	if runErr == nil || !strings.Contains(runErr.Error(), "did not stop") {
		t.Fatalf("Run returned %v, want the carrier's overrun", runErr)
	}
	if got := logs.lines("level=ERROR", "did not stop within the drain timeout"); len(got) != 1 {
		t.Fatalf("%d overrun errors logged, want 1", len(got))
	}
	d.Close() // a no-op after Run: it must not release the lock either
	if d2, err := New(Options{Home: home, Logger: quiet}); err == nil {
		d2.Close()
		t.Fatal("Close after Run released the pid lock while the carrier was sending")
	}
	close(tr.release)
	released = true
	eventually(t, 60*time.Second, "the pid lock released once the carrier stopped", func() (bool, string) {
		d2, err := New(Options{Home: home, Logger: quiet})
		if err != nil {
			return false, err.Error()
		}
		d2.Close()
		return true, ""
	})
}
