package natstest

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestURLsOrder(t *testing.T) {
	c := &Nodes{ports: []int{4001, 4002, 4003}}
	for _, tc := range []struct {
		first []int
		want  string
	}{
		{nil, "nats://127.0.0.1:4001,nats://127.0.0.1:4002,nats://127.0.0.1:4003"},
		{[]int{1}, "nats://127.0.0.1:4002,nats://127.0.0.1:4003,nats://127.0.0.1:4001"},
		{[]int{2}, "nats://127.0.0.1:4003,nats://127.0.0.1:4001,nats://127.0.0.1:4002"},
		{[]int{2, 0}, "nats://127.0.0.1:4003,nats://127.0.0.1:4001,nats://127.0.0.1:4002"},
		{[]int{1, 0}, "nats://127.0.0.1:4002,nats://127.0.0.1:4001,nats://127.0.0.1:4003"},
	} {
		if got := c.URLs(tc.first...); got != tc.want {
			t.Errorf("URLs(%v) = %s, want %s", tc.first, got, tc.want)
		}
	}
}

func TestNodeSyncsEveryWrite(t *testing.T) {
	s := Node(t)
	if cfg := s.JetStreamConfig(); cfg == nil || !cfg.SyncAlways {
		t.Fatalf("JetStream config %+v, want JetStream with SyncAlways", cfg)
	}
}

// A stopped node started again is the same node on the same port, back in the
// cluster: once WaitReady returns, every node names the one meta leader, and
// an R3 stream, which needs all three nodes, can be created.
func TestClusterStopStart(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster: a few seconds")
	}
	c := Cluster(t, 3)
	c.Stop(2)
	c.Start(2)
	c.WaitReady()
	leader, ok := c.MetaLeader()
	if !ok {
		t.Fatal("no meta leader known to every node after WaitReady")
	}
	for i, s := range c.servers {
		if info, err := s.Jsz(nil); err != nil || info.Meta == nil || info.Meta.Leader != fmt.Sprintf("n%d", leader) {
			t.Errorf("node %d: meta %+v, %v; want leader n%d", i, info.Meta, err, leader)
		}
	}
	nc := Connect(t, c.URL(2))
	if got := nc.ConnectedServerName(); got != "n2" {
		t.Fatalf("URL(2) reached %q, want n2", got)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond) // polling the placement with a deadline
	defer tick.Stop()
	for { // the meta leader may not have the restarted node's resources yet
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Replicas: 3})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create R3 stream: %v", err)
		}
		<-tick.C
	}
}
