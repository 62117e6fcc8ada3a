package jsstore_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
)

// startServer starts an in-process NATS server with o and waits until it takes
// connections.
func startServer(t *testing.T, o *server.Options) *server.Server {
	t.Helper()
	o.NoLog, o.NoSigs = true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		t.Fatalf("nats server %s not ready", o.ServerName)
	}
	return s
}

// singleNode starts one JetStream server that fsyncs every write
// (sync_interval: always), its store in a temp dir.
func singleNode(t *testing.T) *server.Server {
	t.Helper()
	s := startServer(t, &server.Options{
		ServerName: "single", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: t.TempDir(), SyncAlways: true,
	})
	t.Cleanup(s.Shutdown)
	return s
}

func connect(t *testing.T, urls string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(urls, nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connect %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// cluster is three JetStream servers in one cluster, each with a fixed client
// and route port and a store dir that survive a restart.
type cluster struct {
	t       *testing.T
	servers [3]*server.Server
	ports   [3]int
	cports  [3]int
	dirs    [3]string
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t}
	for i := range 3 {
		c.ports[i], c.cports[i], c.dirs[i] = freePort(t), freePort(t), t.TempDir()
	}
	for i := range 3 {
		c.start(i)
	}
	t.Cleanup(func() {
		for _, s := range c.servers {
			if s != nil {
				s.Shutdown()
			}
		}
	})
	return c
}

func (c *cluster) start(i int) {
	var routes []string
	for j := range 3 {
		if j != i {
			routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", c.cports[j]))
		}
	}
	c.servers[i] = startServer(c.t, &server.Options{
		ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: c.ports[i],
		JetStream: true, StoreDir: c.dirs[i],
		Cluster: server.ClusterOpts{Name: "sealbridge", Host: "127.0.0.1", Port: c.cports[i]},
		Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
	})
}

func (c *cluster) stop(i int) {
	c.servers[i].Shutdown()
	c.servers[i].WaitForShutdown()
	c.servers[i] = nil
}

// urls lists the client URLs, node first first.
func (c *cluster) urls(first int) string {
	var u []string
	for k := range 3 {
		u = append(u, fmt.Sprintf("nats://127.0.0.1:%d", c.ports[(first+k)%3]))
	}
	return strings.Join(u, ",")
}

// openRetry opens a Store, retrying while the cluster elects its leaders.
func openRetry(t *testing.T, nc *nats.Conn, opts jsstore.Options) *jsstore.Store {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := jsstore.Open(ctx, nc, opts)
		cancel()
		if err == nil {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("open on the cluster: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling a cluster that is electing; not waiting for an event of ours
	}
}
