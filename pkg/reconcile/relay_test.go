package reconcile_test

import (
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

// realRelay is the reference relay (pkg/relay, file storage) in process; it
// counts every post of an envelope that reached it, new or duplicate.
type realRelay struct {
	srv   *httptest.Server
	mu    sync.Mutex
	posts map[string]int
}

func newRealRelay(t *testing.T) *realRelay {
	t.Helper()
	seed := [32]byte{43}
	id, err := identity.FromSeed(seed[:])
	if err != nil {
		t.Fatal(err)
	}
	rr := &realRelay{posts: map[string]int{}}
	r, err := relay.New(relay.Options{Identity: id, Home: t.TempDir(), Logger: slog.New(slog.DiscardHandler),
		OnAccept: func(envelopeID, _ string, _ bool) {
			rr.mu.Lock()
			rr.posts[envelopeID]++
			rr.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	rr.srv = httptest.NewServer(r.Handler())
	t.Cleanup(rr.srv.Close)
	return rr
}

func (r *realRelay) url() string { return r.srv.URL }

func (r *realRelay) postCounts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.posts))
	for k, v := range r.posts {
		out[k] = v
	}
	return out
}

// The restore story against the reference relay: it witnesses the heads the
// carrier's posts carry, answers the sender's head and receipts, and receives
// every envelope once across the copy, the restore, reconcile and the carrier.
func TestRestoreReconcileWithTheRelay(t *testing.T) {
	restoreStory(t, newRealRelay(t))
}
