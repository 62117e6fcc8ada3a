package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// isStagedTemp reports whether path is a staged temp in a kind directory.
func isStagedTemp(path string) bool {
	dir, base, ok := strings.Cut(path, "/")
	return ok && record.Kind(dir).Valid() && fsx.IsTempName(base)
}

// blockFirstStage returns a WrapFS whose first create of a staged temp, once armed,
// reports on blocked and waits for release before it runs.
func blockFirstStage(armed *atomic.Bool, blocked, release chan struct{}) func(fsx.FS) fsx.FS {
	var once sync.Once
	return func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if op.Kind == fsx.OpCreate && armed.Load() && isStagedTemp(op.Path) {
				once.Do(func() {
					close(blocked)
					<-release
				})
			}
			return nil
		}
		return f
	}
}

// A transaction whose context is cancelled while its writes are being staged (one
// staged write is held until the test has cancelled) removes every temp it staged,
// publishes nothing and fails with OUTBOX_STORE_BUSY whose cause is the
// cancellation. Before, the temps stayed behind (until maintenance removes temps an
// hour old) and the error was a bare "context canceled".
func TestCancelledStagingLeavesNoTemp(t *testing.T) {
	cases := []struct {
		name string
		// setup runs before the hold is armed; op runs with the cancellable ctx;
		// unchanged checks afterwards that nothing was published.
		run func(t *testing.T, s *store.Store, arm func(), ctx context.Context) (err error, unchanged func() bool)
	}{
		{"Enqueue", func(t *testing.T, s *store.Store, arm func(), ctx context.Context) (error, func() bool) {
			req := sendRequest(t, 3)
			arm()
			_, err := s.Enqueue(ctx, req)
			return err, func() bool {
				m, gerr := s.Message(req.MessageID)
				ids, lerr := s.List(record.KindOutbox)
				return m == nil && gerr == nil && len(ids) == 0 && lerr == nil
			}
		}},
		{"PreparedTransaction", func(t *testing.T, s *store.Store, arm func(), ctx context.Context) (error, func() bool) {
			arm()
			err := s.PreparedTransaction(ctx, func(tx *store.Tx) error {
				return tx.PutAll(newMessage(t, time.Now()), newMessage(t, time.Now()), newMessage(t, time.Now()))
			})
			return err, func() bool { ids, err := s.List(record.KindMessages); return len(ids) == 0 && err == nil }
		}},
		{"Update", func(t *testing.T, s *store.Store, arm func(), ctx context.Context) (error, func() bool) {
			m := newMessage(t, time.Now())
			mustPut(t, s, m)
			arm()
			err := s.Update(ctx, record.KindMessages, m.MessageID, func(cur record.Record) (record.Record, error) {
				next := cur.(*record.Message)
				next.Attempts++
				return next, nil
			})
			return err, func() bool {
				got, err := store.GetAs[*record.Message](s, m.MessageID)
				return err == nil && got != nil && got.Attempts == m.Attempts
			}
		}},
		{"Transaction", func(t *testing.T, s *store.Store, arm func(), ctx context.Context) (error, func() bool) {
			arm()
			err := s.Transaction(ctx, func(tx *store.Tx) error {
				return tx.PutAll(newMessage(t, time.Now()), newMessage(t, time.Now()))
			})
			return err, func() bool { ids, err := s.List(record.KindMessages); return len(ids) == 0 && err == nil }
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var armed atomic.Bool
			blocked, release := make(chan struct{}), make(chan struct{})
			s := openStore(t, store.Options{WrapFS: blockFirstStage(&armed, blocked, release)})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type result struct {
				err       error
				unchanged func() bool
			}
			done := make(chan result, 1)
			go func() {
				err, unchanged := c.run(t, s, func() { armed.Store(true) }, ctx)
				done <- result{err, unchanged}
			}()
			select {
			case <-blocked:
			case r := <-done:
				t.Fatalf("finished without staging: %v", r.err)
			}
			cancel()
			close(release)
			r := <-done
			if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, errcode.OutboxStoreBusy) {
				t.Fatalf("cancelled while staging: %v (code %q), want OUTBOX_STORE_BUSY caused by context.Canceled", r.err, errcode.Of(r.err))
			}
			if left := tempFiles(t, s.Dir()); len(left) > 0 {
				t.Fatalf("temps left behind: %v", left)
			}
			if !r.unchanged() {
				t.Fatal("a cancelled transaction published something")
			}
		})
	}
}

// Staging a transaction of many records runs on a bounded pool: at no moment are
// more than StageWorkers staged temps open (created, not yet closed), and the pool is
// used fully. Staged writes are held at their fsync and let go one at a time, only
// while StageWorkers temps are open (and all at once when every write has been
// created), so a pool that starts more writes than its bound shows them as open at
// once. Before, every staged write had its own goroutine: here 8 times the bound, in
// a settle of a large backlog about 10,000.
func TestStagingPoolIsBounded(t *testing.T) {
	n := 8 * store.StageWorkers(1<<20)
	bound := store.StageWorkers(n)
	var (
		mu                             sync.Mutex
		armed                          bool
		open, most, created, releasing int
		held                           []chan struct{}
	)
	// letGo releases held fsyncs by the rule above. Caller holds mu.
	letGo := func() {
		for len(held) > 0 && (created == n || open >= bound && releasing == 0) {
			close(held[0])
			held = held[1:]
			releasing++
		}
	}
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if !isStagedTemp(op.Path) {
				return nil
			}
			mu.Lock()
			if !armed {
				mu.Unlock()
				return nil
			}
			var wait chan struct{}
			switch op.Kind {
			case fsx.OpCreate:
				created++
				open++
				most = max(most, open)
			case fsx.OpSync:
				wait = make(chan struct{})
				held = append(held, wait)
			case fsx.OpClose:
				open--
				releasing--
			}
			letGo()
			mu.Unlock()
			if wait != nil {
				<-wait
			}
			return nil
		}
		return f
	}})
	recs := make([]record.Record, n)
	for i := range recs {
		recs[i] = newMessage(t, time.Now())
	}
	mu.Lock()
	armed = true
	mu.Unlock()
	if err := s.PreparedTransaction(context.Background(), func(tx *store.Tx) error { return tx.PutAll(recs...) }); err != nil {
		t.Fatal(err)
	}
	if most != bound {
		t.Fatalf("at most %d staged temps were open at once, want exactly the bound %d (GOMAXPROCS-derived) of %d writes", most, bound, n)
	}
	if ids, err := s.List(record.KindMessages); err != nil || len(ids) != n {
		t.Fatalf("%d records published, want %d (%v)", len(ids), n, err)
	}
}
