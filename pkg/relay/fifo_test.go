package relay_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// fifoDeadline bounds how long a relay call may take before the test calls it
// blocked. It is generous: a busy machine must never fail the test, and a call that
// blocks on a FIFO never returns at all.
const fifoDeadline = 60 * time.Second

// plantFIFO accepts one envelope (to the identity of seed 2) on r, which keeps its
// inbox in home, and replaces the envelope's inbox file with a FIFO that no one
// writes. It returns the FIFO's path.
func plantFIFO(t *testing.T, r *relay.Relay, home string) string {
	t.Helper()
	e := &env{t: t, clock: newFakeClock(time.UnixMilli(1_767_225_600_000))}
	_, data := e.message(ident(t, 2).DID())
	if _, err := r.Accept(context.Background(), data); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(home, "relay", "*", "*", "*.env"))
	if err != nil || len(files) != 1 {
		t.Fatalf("inbox files %v, %v: want one", files, err)
	}
	if err := os.Remove(files[0]); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(files[0], 0o600); err != nil {
		t.Fatal(err)
	}
	return files[0]
}

// within runs f in a goroutine and fails the test if it does not return within
// fifoDeadline. On failure it opens the FIFO for writing, which releases an open
// blocked on it, so the goroutine ends with the test.
func within(t *testing.T, fifo, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(fifoDeadline):
		if fd, err := syscall.Open(fifo, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			syscall.Close(fd)
		}
		t.Fatalf("%s did not return within %v: blocked on the FIFO planted in its inbox", what, fifoDeadline)
		return nil
	}
}

func fifoOptions(t *testing.T, home string) relay.Options {
	return relay.Options{Identity: ident(t, 9), Home: home, Logger: quiet,
		Now: func() time.Time { return time.UnixMilli(1_767_225_600_000) }}
}

// TestFIFOInInboxDoesNotBlockLoad: a FIFO where the relay expects an envelope file
// makes New fail with an error (the file is not an envelope), promptly, instead of
// blocking in open(2) forever.
func TestFIFOInInboxDoesNotBlockLoad(t *testing.T) {
	home := t.TempDir()
	r, err := relay.New(fifoOptions(t, home))
	if err != nil {
		t.Fatal(err)
	}
	fifo := plantFIFO(t, r, home)
	r.Close()
	err = within(t, fifo, "relay.New", func() error {
		r, err := relay.New(fifoOptions(t, home))
		if err == nil {
			r.Close()
		}
		return err
	})
	if !errors.Is(err, fsx.ErrNotRegular) {
		t.Fatalf("relay.New with a FIFO as an envelope file: %v, want fsx.ErrNotRegular", err)
	}
	t.Logf("relay.New: %v", err)
}

// TestFIFOInInboxDoesNotBlockFetch: an envelope file replaced by a FIFO while the
// relay runs makes Fetch fail (the relay cannot read its inbox), promptly.
func TestFIFOInInboxDoesNotBlockFetch(t *testing.T) {
	home := t.TempDir()
	r, err := relay.New(fifoOptions(t, home))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fifo := plantFIFO(t, r, home)
	err = within(t, fifo, "Relay.Fetch", func() error {
		_, err := r.Fetch(context.Background(), ident(t, 2).DID(), "", 0)
		return err
	})
	var re *relayproto.Error
	if !errors.As(err, &re) || re.Code != "INBOX_UNREADABLE" || !errors.Is(err, fsx.ErrNotRegular) {
		t.Fatalf("Fetch with a FIFO as an envelope file: %v, want INBOX_UNREADABLE wrapping fsx.ErrNotRegular", err)
	}
	t.Logf("Relay.Fetch: %v", err)
}
