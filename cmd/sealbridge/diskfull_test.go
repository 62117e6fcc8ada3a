package main

import (
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// On a full disk (every create and write of the store fails with ENOSPC) send
// makes one attempt and answers at once: exit 1, the daemon's words ("the disk
// holding DIR is full (ENOSPC…)") and its hint. (Before: five attempts over ~4 s
// of Retry-After waits, the store's error text and no hint.)
func TestSendOnAFullDiskAnswersAtOnce(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	var full atomic.Bool
	d := runDaemon(t, daemon.Options{Home: home, Identity: "alice", Store: store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if full.Load() && (op.Kind == fsx.OpCreate || op.Kind == fsx.OpWrite) {
				return syscall.ENOSPC
			}
			return nil
		}
		return f
	}}})
	full.Store(true)
	waits := noSleep(t)
	stdin = strings.NewReader("hello bob")
	t.Cleanup(func() { stdin = os.Stdin })
	code, _, errs := sb(t, "send", "--home", home, "--identity", "alice", "--to", bob, "--relay", "http://127.0.0.1:9")
	if code != exitFailure || len(*waits) != 0 || !strings.Contains(errs, "OUTBOX_STORE_UNWRITABLE") ||
		!strings.Contains(errs, "the disk holding "+d.Store().Dir()+" is full (ENOSPC") ||
		!strings.Contains(errs, "sealbridge: hint: free space on the file system holding it") {
		t.Fatalf("send on a full disk: exit %d, waits %v\n%s", code, *waits, errs)
	}
}
