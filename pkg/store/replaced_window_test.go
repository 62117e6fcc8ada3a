package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// renameWindowFS reports, for one path, the inode a rename is replacing (one with
// no link left) to every Lstat for window after the first one it sees once armed:
// what a reader meets while the writer's rename is still moving the name.
type renameWindowFS struct {
	fsx.FS
	path   string
	window time.Duration
	mu     sync.Mutex
	armed  bool
	since  time.Time
	stale  int
}

func (f *renameWindowFS) Lstat(name string) (fsx.Info, error) {
	info, err := f.FS.Lstat(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil || !f.armed || name != f.path {
		return info, err
	}
	if f.since.IsZero() {
		f.since = time.Now()
	}
	if time.Since(f.since) < f.window {
		info.Nlink = 0
		f.stale++
	}
	return info, err
}

// A read that meets a record whose replacement is still in progress for a
// millisecond (every lstat in that time shows the replaced inode) waits for it and
// returns the record, rather than OUTBOX_STORE_BUSY: the old reader retried 8 times
// at once, all within the one rename, and failed.
func TestReadWaitsOutAReplacementInProgress(t *testing.T) {
	var wrapped *renameWindowFS
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		wrapped = &renameWindowFS{FS: inner, path: record.Path(record.KindMessages, "")}
		return wrapped
	}})
	req := sendRequest(t, 1)
	if _, err := s.Enqueue(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	fresh := openStore(t, store.Options{Dir: s.Dir(), WrapFS: func(inner fsx.FS) fsx.FS {
		wrapped = &renameWindowFS{FS: inner, path: record.Path(record.KindMessages, req.MessageID), window: time.Millisecond}
		return wrapped
	}})
	wrapped.mu.Lock()
	wrapped.armed = true
	wrapped.mu.Unlock()
	m, err := fresh.Message(req.MessageID)
	if err != nil || m == nil || m.MessageID != req.MessageID {
		t.Fatalf("read during a replacement in progress: %+v, %v; want the message", m, err)
	}
	if wrapped.stale == 0 {
		t.Fatal("the read never met the replaced inode: the test tests nothing")
	}
}
