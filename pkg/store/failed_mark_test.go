package store_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// outboxIDs returns the envelope ids of s's outbox index.
func outboxIDs(t *testing.T, s *store.Store) []string {
	t.Helper()
	sums, err := s.OutboxSummaries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(sums))
	for _, e := range sums {
		ids = append(ids, e.EnvelopeID)
	}
	slices.Sort(ids)
	return ids
}

// A publication whose generation mark fails (the rename done, the append to
// .generation refused) never hides the record it published from any process: the
// other process's index and listing agree with a fresh scan, and so do the failing
// process's. The generation file is replaced, or, when the disk refuses that too,
// removed.
func TestFailedGenerationMarkHidesNothing(t *testing.T) {
	for _, c := range []struct {
		name   string
		errno  syscall.Errno
		refuse func(op fsx.Op) bool // besides the mark
	}{
		{"mark EIO", syscall.EIO, nil},
		{"mark ENOSPC", syscall.ENOSPC, nil},
		{"mark and replacement ENOSPC", syscall.ENOSPC, func(op fsx.Op) bool {
			return op.Kind == fsx.OpWrite && !strings.Contains(op.Path, "/") && fsx.IsTempName(op.Path)
		}},
	} {
		home := t.TempDir()
		failing := new(atomic.Bool)
		a := openStore(t, store.Options{Home: home, WrapFS: func(inner fsx.FS) fsx.FS {
			f := fsx.NewFaulty(inner)
			f.Inject = func(op fsx.Op) error {
				mark := op.Kind == fsx.OpWrite && op.Path == store.GenerationFile
				if failing.Load() && (mark || c.refuse != nil && c.refuse(op)) {
					return c.errno
				}
				return nil
			}
			return f
		}})
		b := openStore(t, store.Options{Home: home})
		enqueue(t, a, 1) // the generation file exists, both indexes are built
		outboxIDs(t, a)
		outboxIDs(t, b)

		failing.Store(true)
		if _, err := a.Enqueue(context.Background(), sendRequest(t, 1)); err == nil {
			t.Fatalf("%s: Enqueue with its generation marks failing reported success", c.name)
		}
		fresh := outboxIDs(t, openStore(t, store.Options{Home: home, CacheEntries: -1}))
		if len(fresh) != 2 {
			t.Fatalf("%s: the failed enqueue's member should be on disk: %v", c.name, fresh)
		}
		for name, s := range map[string]*store.Store{"other process": b, "failing process": a} {
			listed, err := s.List(record.KindOutbox)
			if err != nil {
				t.Fatal(err)
			}
			if got := outboxIDs(t, s); !slices.Equal(got, fresh) || !slices.Equal(listed, fresh) {
				t.Errorf("%s: %s: index %v, listing %v, fresh scan %v", c.name, name, got, listed, fresh)
			}
		}
		// The marks work again: each process sees the other's next publication
		// through its index.
		failing.Store(false)
		enqueue(t, b, 1)
		if got := outboxIDs(t, a); len(got) != 3 {
			t.Errorf("%s: the failing process's index holds %d envelopes, want 3", c.name, len(got))
		}
		enqueue(t, a, 1)
		if got := outboxIDs(t, b); len(got) != 4 {
			t.Errorf("%s: the other process's index holds %d envelopes, want 4", c.name, len(got))
		}
	}
}
