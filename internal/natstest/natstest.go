// Package natstest starts real NATS JetStream servers in the test's process (the
// nats-server module; nothing to install): one node that fsyncs every write, or
// a cluster whose nodes can be stopped and restarted on the same store and ports.
//
// Only tests and benchmarks import it (internal/archtest refuses it to every
// other package), so nats-server never becomes a dependency of a binary.
package natstest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// readyTimeout bounds the wait for a started server to take connections; a
// deadline, not a sleep.
const readyTimeout = 30 * time.Second

// start starts an in-process NATS server with o and waits until it takes
// connections.
func start(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	o.NoLog, o.NoSigs = true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats server %s: %v", o.ServerName, err)
	}
	s.Start()
	if !s.ReadyForConnections(readyTimeout) {
		s.Shutdown()
		t.Fatalf("nats server %s not ready", o.ServerName)
	}
	return s
}

// Node starts one JetStream server that fsyncs every write (sync_interval:
// always), its store in t.TempDir(), shut down when the test ends. Its client
// URL is s.ClientURL().
func Node(t testing.TB) *server.Server {
	t.Helper()
	s := start(t, &server.Options{
		ServerName: "single", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: t.TempDir(), SyncAlways: true,
	})
	t.Cleanup(s.Shutdown)
	return s
}

// NodeFromConfig starts one server from the nats-server configuration conf
// (the text of a configuration file, as an operator would write it), shut down
// when the test ends: a documented recipe is started as written. It may be
// called again with the same conf after the server returned by the first call
// is shut down (a restart on the same port and store).
func NodeFromConfig(t testing.TB, conf string) *server.Server {
	t.Helper()
	file := filepath.Join(t.TempDir(), "nats-server.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("nats-server configuration: %v\n%s", err, conf)
	}
	s := start(t, o)
	t.Cleanup(s.Shutdown)
	return s
}

// Connect connects to urls (comma-separated, tried in the order given) and
// reconnects without limit, as a relay would; the connection is closed when the
// test ends.
func Connect(t testing.TB, urls string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(urls, nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connect %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Nodes is a JetStream cluster of in-process servers, each with a fixed client
// and route port and a store dir that survive a restart. Its nodes use the
// default sync interval: durability comes from replication (R3).
type Nodes struct {
	t       testing.TB
	servers []*server.Server
	ports   []int
	cports  []int
	dirs    []string
}

// Cluster starts an n-node JetStream cluster (n ≥ 2) and shuts it down when the
// test ends.
func Cluster(t testing.TB, n int) *Nodes {
	t.Helper()
	if n < 2 {
		t.Fatalf("natstest.Cluster: %d nodes, want at least 2", n)
	}
	c := &Nodes{t: t, servers: make([]*server.Server, n), ports: make([]int, n), cports: make([]int, n), dirs: make([]string, n)}
	for i := range n {
		c.ports[i], c.cports[i], c.dirs[i] = freePort(t), freePort(t), t.TempDir()
	}
	t.Cleanup(func() {
		for _, s := range c.servers {
			if s != nil {
				s.Shutdown()
			}
		}
	})
	for i := range n {
		c.Start(i)
	}
	return c
}

// Start starts node i (again), with the store dir and ports it had. Call it only
// on a stopped node; it returns when the node takes client connections (the
// cluster may still be electing leaders).
func (c *Nodes) Start(i int) {
	c.t.Helper()
	if c.servers[i] != nil {
		c.t.Fatalf("natstest: node %d is running", i)
	}
	var routes []string
	for j := range c.cports {
		if j != i {
			routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", c.cports[j]))
		}
	}
	c.servers[i] = start(c.t, &server.Options{
		ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: c.ports[i],
		JetStream: true, StoreDir: c.dirs[i],
		Cluster: server.ClusterOpts{Name: "sealbridge", Host: "127.0.0.1", Port: c.cports[i]},
		Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
	})
}

// WaitReady waits until the running nodes have elected a JetStream meta
// leader and every one of them names it (MetaLeader), polling with a deadline
// (readyTimeout): until then a request to create a stream or bucket may wait
// for its whole timeout. Requests may still fail for a moment afterwards (the
// leader may not know a restarted node's resources yet, streams elect their
// own leaders), so callers retry them.
func (c *Nodes) WaitReady() {
	c.t.Helper()
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(10 * time.Millisecond) // polling the servers' state, not waiting for an event of ours
	defer tick.Stop()
	for {
		if _, ok := c.MetaLeader(); ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("natstest: no JetStream meta leader known to every running node within %v", readyTimeout)
		}
		<-tick.C
	}
}

// MetaLeader returns the running node that leads the JetStream meta group and
// true, if it says so and every running node names it as the leader.
func (c *Nodes) MetaLeader() (int, bool) {
	leader, name := -1, ""
	for i, s := range c.servers {
		if s == nil {
			continue
		}
		info, err := s.Jsz(nil)
		if err != nil || info.Meta == nil || info.Meta.Leader == "" || (name != "" && info.Meta.Leader != name) {
			return -1, false
		}
		name = info.Meta.Leader
		if s.JetStreamIsLeader() {
			if s.Name() != name {
				return -1, false
			}
			leader = i
		}
	}
	return leader, leader >= 0
}

// Stop shuts node i down and waits until it has.
func (c *Nodes) Stop(i int) {
	c.servers[i].Shutdown()
	c.servers[i].WaitForShutdown()
	c.servers[i] = nil
}

// URLs returns the comma-separated client URLs of the given nodes in that order,
// then of the others in ring order after the first given (URLs(1) of three
// nodes is 1,2,0), or of every node from 0 when none is given.
func (c *Nodes) URLs(first ...int) string {
	n := len(c.ports)
	var u []string
	seen := make([]bool, n)
	add := func(i int) {
		if !seen[i] {
			seen[i] = true
			u = append(u, c.URL(i))
		}
	}
	for _, i := range first {
		add(i)
	}
	from := 0
	if len(first) > 0 {
		from = first[0]
	}
	for k := range n {
		add((from + k) % n)
	}
	return strings.Join(u, ",")
}

// URL returns node i's client URL.
func (c *Nodes) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.ports[i]) }
