package store_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// ProbeWrite: nil before the store directory exists and on a writable store, leaving
// nothing behind; OutboxStoreUnwritable wrapping ENOSPC while creates and writes fail
// (a full disk), and nil again once they work.
func TestProbeWrite(t *testing.T) {
	var full atomic.Bool
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if full.Load() && (op.Kind == fsx.OpCreate || op.Kind == fsx.OpWrite) {
				return syscall.ENOSPC
			}
			return nil
		}
		return f
	}})
	if err := s.ProbeWrite(); err != nil {
		t.Fatalf("no store directory yet: %v", err)
	}
	if _, err := s.Enqueue(context.Background(), sendRequest(t, 1)); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ProbeWrite(); err != nil {
		t.Fatalf("a writable store: %v", err)
	}
	full.Store(true)
	if err := s.ProbeWrite(); !errors.Is(err, errcode.OutboxStoreUnwritable) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a full disk: %v, want OUTBOX_STORE_UNWRITABLE wrapping ENOSPC", err)
	}
	full.Store(false)
	if err := s.ProbeWrite(); err != nil {
		t.Fatalf("space freed: %v", err)
	}
	after, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("the probes left files: %v, before %v", after, before)
	}
}
