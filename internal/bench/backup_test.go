package bench

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/store"
)

// BenchmarkLockHoldBackup is the store-lock holds of one Store.Backup of a store that
// holds a backlog of pending envelopes (10,000 in the full report: their outbox
// records, message records and batch markers) while 8 senders enqueue one-envelope
// messages as fast as they can on another Store of the same directory — as
// `sealbridge backup` runs beside a daemon (the two Stores exclude each other by the
// flock, as two processes do). Every hold of the backup's Store, from its start to
// its return, is observed (store.Options.LockHoldObserver): max-hold-ms is the
// longest, holds how many there were; also the backup's wall time (backup-s), the
// files copied and the messages the senders enqueued meanwhile (sent).
func BenchmarkLockHoldBackup(b *testing.B) {
	n := cycleSize.get()
	bl := pendingBacklog(b, n)
	var all latencies
	var files, sent, secs float64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		rec := &holdRecorder{}
		senders := backlogStore(b, bl, store.Options{})
		bs := openStore(b, store.Options{Dir: senders.Dir(), Limits: noLimits, LockHoldObserver: rec.observe})
		dest := filepath.Join(benchDir(b), "copy")
		ctx, cancel := context.WithCancel(context.Background())
		gate := make(chan struct{})
		errs := make(chan error, writers)
		var wg sync.WaitGroup
		var mu sync.Mutex
		count := 0
		for range writers {
			wg.Go(func() {
				<-gate
				for ctx.Err() == nil {
					if _, err := senders.Enqueue(ctx, sendRequest(1)); err != nil {
						if ctx.Err() == nil {
							errs <- err
						}
						return
					}
					mu.Lock()
					count++
					mu.Unlock()
				}
			})
		}
		close(gate)
		rec.on.Store(true)
		t0 := time.Now()
		b.StartTimer()
		rep, err := bs.Backup(ctx, dest, store.BackupOptions{})
		b.StopTimer()
		secs += time.Since(t0).Seconds()
		rec.on.Store(false)
		cancel()
		wg.Wait()
		close(errs)
		if err != nil {
			b.Fatal(err)
		}
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
		if rep.Watch != "inotify" {
			b.Logf("backup watched by %s", rep.Watch)
		}
		files += float64(rep.Files)
		sent += float64(count)
		rec.mu.Lock()
		all = append(all, rec.holds...)
		rec.mu.Unlock()
	}
	if len(all) == 0 {
		b.Fatal("no lock hold observed")
	}
	slices.Sort(all)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(all[len(all)-1]), "max-hold-ms")
	b.ReportMetric(float64(len(all))/float64(b.N), "holds")
	b.ReportMetric(files/float64(b.N), "files")
	b.ReportMetric(sent/float64(b.N), "sent")
	b.ReportMetric(secs/float64(b.N), "backup-s")
	b.ReportMetric(float64(n), "envelopes")
}
