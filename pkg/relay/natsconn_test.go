package relay

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sealbridge/sealbridge/internal/natstest"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A relay command's NATS connection logs each disconnect and each reconnect
// once — not every failed attempt in between —, naming the server without the
// credentials; its own close at shutdown says nothing.
func TestNATSConnectionChangesLogged(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\nauthorization { user: relay, password: s3cret-pw }\njetstream { store_dir: %q, sync_interval: always }\n", port, t.TempDir())
	s := natstest.NodeFromConfig(t, conf)

	var logs syncBuffer
	f := &BackendFlags{Backend: "jetstream", NATSURL: fmt.Sprintf("nats://127.0.0.1:%d", port), Replicas: 1, SyncAlways: true,
		getenv: func(k string) string {
			return map[string]string{EnvNATSUser: "relay", EnvNATSPassword: "s3cret-pw"}[k]
		},
		natsOptions: []nats.Option{nats.ReconnectWait(5 * time.Millisecond), nats.ReconnectJitter(0, 0)}}
	if err := f.Check(); err != nil {
		t.Fatal(err)
	}
	o := Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	closeConn, err := f.Open(&o, "test")
	if err != nil {
		t.Fatal(err)
	}
	count := func(what string) int { return strings.Count(logs.String(), what) }
	waitLog := func(what string, n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for count(what) < n {
			if time.Now().After(deadline) {
				t.Fatalf("no %d× %q within 30s; log:\n%s", n, what, logs.String())
			}
			<-tick.C
		}
	}
	for round := 1; round <= 2; round++ {
		s.Shutdown()
		s.WaitForShutdown()
		waitLog("NATS disconnected", round)
		s = natstest.NodeFromConfig(t, conf)
		waitLog("NATS reconnected", round)
		if !o.JetStream.IsConnected() {
			t.Fatal("not connected after the reconnect line")
		}
	}
	closeConn()
	t.Logf("log:\n%s", logs.String())
	if d, r := count("NATS disconnected"), count("NATS reconnected"); d != 2 || r != 2 {
		t.Fatalf("%d disconnect and %d reconnect lines for 2 of each; log:\n%s", d, r, logs.String())
	}
	if count("closed") != 0 {
		t.Fatalf("the command's own close was logged:\n%s", logs.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, "s3cret") || !strings.Contains(line, fmt.Sprintf("server=nats://127.0.0.1:%d", port)) {
			t.Errorf("line %q: want the server named, no credential", line)
		}
	}
}
