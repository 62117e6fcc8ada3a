package fsx

import (
	"testing"

	"golang.org/x/sys/unix"
)

// An interrupted system call is retried, never reported: EINTR twice, then success.
func TestRetryEINTR(t *testing.T) {
	calls := 0
	err := retryEINTR(func() error {
		calls++
		if calls <= 2 {
			return unix.EINTR
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("retryEINTR: %v after %d calls, want nil after 3", err, calls)
	}
	// Any other error is returned at once.
	calls = 0
	if err := retryEINTR(func() error { calls++; return unix.EIO }); err != unix.EIO || calls != 1 {
		t.Fatalf("EIO: %v after %d calls", err, calls)
	}
}
