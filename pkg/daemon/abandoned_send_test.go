package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// A client that goes away while its POST /v1/messages is being staged leaves no
// staged temp in the store, and nothing is accepted. net/http cancels a request's
// context when its client's connection closes; the test cancels it itself while the
// enqueue's first staged write is held, so the order is fixed. The handler answers
// 503 NOT_READY, as for every cancelled request. Before, the enqueue's temps stayed
// behind (until maintenance removes temps an hour old).
func TestAbandonedSendLeavesNoTemp(t *testing.T) {
	for _, key := range []string{"", "k-abandoned"} {
		t.Run("key="+key, func(t *testing.T) {
			var armed atomic.Bool
			var once sync.Once
			blocked, release := make(chan struct{}), make(chan struct{})
			d, _ := apiDaemon(t, func(op fsx.Op) error {
				dir, base, _ := strings.Cut(op.Path, "/")
				if armed.Load() && op.Kind == fsx.OpCreate && dir == "outbox" && fsx.IsTempName(base) {
					once.Do(func() {
						close(blocked)
						<-release
					})
				}
				return nil
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(sendBody(t, "hi"))).WithContext(ctx)
			req.Header.Set("Content-Type", "application/json")
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			rec := httptest.NewRecorder()
			armed.Store(true)
			done := make(chan struct{})
			go func() { d.handler().ServeHTTP(rec, req); close(done) }()
			select {
			case <-blocked:
			case <-done:
				t.Fatalf("answered without staging: %d %s", rec.Code, rec.Body)
			}
			cancel() // the client is gone
			close(release)
			<-done
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusServiceUnavailable || body["code"] != codeNotReady {
				t.Fatalf("abandoned send answered %d %s, want 503 %s", rec.Code, rec.Body, codeNotReady)
			}
			var left []string
			filepath.WalkDir(d.Store().Dir(), func(p string, e os.DirEntry, err error) error {
				if err == nil && fsx.IsTempName(e.Name()) {
					left = append(left, p)
				}
				return nil
			})
			if len(left) > 0 {
				t.Fatalf("temps left behind: %v", left)
			}
			if n := countMessages(t, d); n != 0 {
				t.Fatalf("%d messages stored by an abandoned send", n)
			}
		})
	}
}
