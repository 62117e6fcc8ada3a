package carrier

import (
	"context"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// TestResumedSingleIsSent: a one-envelope message whose enqueue stopped between
// its outbox record and its message record is not sent; once ResumeEnqueue
// finishes it (a resend with its key, after a daemon restart) the carrier sends
// it on the next kick — whether its index was built before the interrupted
// enqueue or after it (a restarted daemon's carrier).
func TestResumedSingleIsSent(t *testing.T) {
	for _, startFirst := range []bool{true, false} {
		var failing atomic.Bool
		h := newHarness(t, Options{}, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
			f := fsx.NewFaulty(inner)
			f.Inject = func(op fsx.Op) error {
				if failing.Load() && op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, string(record.KindMessages)+"/") {
					return syscall.EIO
				}
				return nil
			}
			return f
		}})
		if startFirst {
			h.start()
			h.settle()
		}
		req := request("https://relay.example", 1, h.clock.Now().Add(time.Hour))
		failing.Store(true)
		if _, err := h.s.Enqueue(context.Background(), req); err == nil {
			t.Fatal("enqueue succeeded")
		}
		failing.Store(false)
		if !startFirst {
			h.start()
		}
		h.kick()
		if n := h.tr.count(); n != 0 {
			t.Fatalf("uncommitted single sent: %d", n)
		}
		if _, ok, err := h.s.ResumeEnqueue(context.Background(), req.MessageID); err != nil || !ok {
			t.Fatal(ok, err)
		}
		h.kick()
		if n := h.tr.count(); n != 1 {
			t.Fatalf("startFirst=%v: resumed single sent %d times", startFirst, n)
		}
		h.stop()
	}
}
