package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
)

// The relay's JetStream storage (pkg/relay/jsstore) putting new envelopes, beside the
// raw JetStream publish rate of the same bytes with the same servers and sync setting:
// a plain publish to a plain stream, no key-value bucket, no expected-sequence check,
// so the ratio is what de-duplication costs on top of JetStream. Two topologies, each
// started once per process on 127.0.0.1, their store directories under cacheRoot: one
// server with sync_interval: always (every write fsynced), and a three-node cluster
// with R3 stream and bucket and the default sync interval (a quorum of two holds every
// acknowledged write). The relay does not use jsstore yet: these rows measure the
// storage alone, not an HTTP accept.

// jsWriters is the number of concurrent puts of the concurrent rows.
const jsWriters = 16

// jsTarget is one topology: the jsstore Store and, on the same connection, the raw
// stream (subjects rawSubject.<recipient>.<id>, the shape of jsstore's).
type jsTarget struct {
	nc    *nats.Conn      // for a relay on this JetStream
	opts  jsstore.Options // how jsstore was opened on it
	store *jsstore.Store
	js    jetstream.JetStream
	built time.Duration // servers started, stream and bucket created
}

const (
	rawStream  = "BENCH_RAW"
	rawSubject = "bench.raw"
)

var (
	jsOnce, jsClusterOnce sync.Once
	jsSingle, jsCluster   *jsTarget
	jsErr, jsClusterErr   error
)

// startNATS starts an in-process NATS server with o and waits until it takes
// connections; onClose shuts it down when the process ends.
func startNATS(o *server.Options) (*server.Server, error) {
	o.NoLog, o.NoSigs = true, true
	s, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("nats server %s: %w", o.ServerName, err)
	}
	s.Start()
	onClose(s.Shutdown)
	if !s.ReadyForConnections(30 * time.Second) {
		return nil, fmt.Errorf("nats server %s not ready after 30s", o.ServerName)
	}
	return s, nil
}

// openTarget connects to urls and opens jsstore (opts) and the raw stream with
// replicas, retrying while a cluster elects its leaders (polling with a deadline).
func openTarget(urls string, opts jsstore.Options, replicas int) (*jsTarget, error) {
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", urls, err)
	}
	onClose(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	t := &jsTarget{nc: nc, opts: opts, js: js}
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond) // a cluster electing its leaders has no event to wait on
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if t.store == nil {
			t.store, err = jsstore.Open(ctx, nc, opts)
		}
		if err == nil {
			_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
				Name: rawStream, Subjects: []string{rawSubject + ".>"}, Storage: jetstream.FileStorage,
				Replicas: replicas, Discard: jetstream.DiscardNew, MaxMsgs: -1, MaxBytes: -1,
			})
		}
		cancel()
		if err == nil {
			return t, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		<-tick.C
	}
}

// singleJS returns the one-node topology (sync_interval: always), starting it on
// first use.
func singleJS(b *testing.B) *jsTarget {
	jsOnce.Do(func() {
		t0 := time.Now()
		s, err := startNATS(&server.Options{ServerName: "bench1", Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: filepath.Join(cacheRoot, "nats1"), SyncAlways: true})
		if err != nil {
			jsErr = err
			return
		}
		jsSingle, jsErr = openTarget(s.ClientURL(), jsstore.Options{Replicas: 1, SyncAlways: true}, 1)
		if jsSingle != nil {
			jsSingle.built = time.Since(t0)
		}
	})
	if jsErr != nil {
		b.Fatalf("one-node JetStream: %v", jsErr)
	}
	return jsSingle
}

// clusterJS returns the three-node R3 topology (default sync interval), starting it
// on first use.
func clusterJS(b *testing.B) *jsTarget {
	jsClusterOnce.Do(func() {
		t0 := time.Now()
		var ports, cports [3]int
		for i := range 3 {
			var err error
			if ports[i], err = freePort(); err == nil {
				cports[i], err = freePort()
			}
			if err != nil {
				jsClusterErr = err
				return
			}
		}
		var urls []string
		for i := range 3 {
			var routes []string
			for j := range 3 {
				if j != i {
					routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", cports[j]))
				}
			}
			_, err := startNATS(&server.Options{ServerName: fmt.Sprintf("bench-n%d", i), Host: "127.0.0.1", Port: ports[i],
				JetStream: true, StoreDir: filepath.Join(cacheRoot, fmt.Sprintf("nats-n%d", i)),
				Cluster: server.ClusterOpts{Name: "sealbridge-bench", Host: "127.0.0.1", Port: cports[i]},
				Routes:  server.RoutesFromStr(strings.Join(routes, ","))})
			if err != nil {
				jsClusterErr = err
				return
			}
			urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
		}
		jsCluster, jsClusterErr = openTarget(strings.Join(urls, ","), jsstore.Options{Replicas: 3}, 3)
		if jsCluster != nil {
			jsCluster.built = time.Since(t0)
		}
	})
	if jsClusterErr != nil {
		b.Fatalf("three-node JetStream: %v", jsClusterErr)
	}
	return jsCluster
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// jsWire is the envelope every JetStream row stores: one signed wire envelope of the
// relay rows' shape, its digest and recipient. Each put gives it a fresh id (jsstore
// keeps bytes, it does not parse them), so every put is of a new envelope.
func jsWire(b *testing.B) (wire []byte, digest string, recipient identity.DID) {
	wire = acceptEnvelopes(b, 1)[0]
	env, err := envelope.Parse(wire)
	if err != nil {
		b.Fatal(err)
	}
	return wire, env.Digest(), env.Recipient()
}

// runJS runs op(id) b.N times in total from n goroutines, each with a fresh
// envelope id, and reports env/s.
func runJS(b *testing.B, n int, op func(ctx context.Context, id string) error) {
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	ctx := context.Background()
	var next atomic.Int64
	b.ResetTimer()
	runWriters(b, n, func() error { return op(ctx, ids[next.Add(1)-1]) })
	b.StopTimer()
	reportRate(b, float64(b.N), "env/s")
}

// jsPut is one jsstore Put of a new envelope (a miss on the de-duplication bucket, a
// publish expecting no earlier message on its subject, the record created).
func jsPut(b *testing.B, t *jsTarget, writers int) {
	wire, digest, to := jsWire(b)
	runJS(b, writers, func(ctx context.Context, id string) error {
		now := time.Now()
		_, dup, err := t.store.Put(ctx, to, id, digest, wire, now, now.Add(24*time.Hour))
		if err == nil && dup {
			err = errors.New("a fresh envelope id was answered as a duplicate")
		}
		return err
	})
}

// jsPublish is the floor: a plain JetStream publish of the same bytes to a plain
// stream, on a subject of jsstore's shape, acknowledged by the server.
func jsPublish(b *testing.B, t *jsTarget, writers int) {
	wire, _, to := jsWire(b)
	prefix := rawSubject + "." + jsstore.RecipientKey(to) + "."
	runJS(b, writers, func(ctx context.Context, id string) error {
		_, err := t.js.Publish(ctx, prefix+id, wire)
		return err
	})
}

// BenchmarkJetStreamPut1 is jsstore.Put of new envelopes, one at a time, on one
// server with sync_interval: always: env/s.
func BenchmarkJetStreamPut1(b *testing.B) { jsPut(b, singleJS(b), 1) }

// BenchmarkJetStreamPut16 is jsstore.Put of new envelopes from 16 goroutines on one
// Store, one server with sync_interval: always: env/s.
func BenchmarkJetStreamPut16(b *testing.B) { jsPut(b, singleJS(b), jsWriters) }

// BenchmarkFloorJetStreamPublish1 is the floor of BenchmarkJetStreamPut1: a plain
// publish of the same bytes to a plain stream on the same server, one at a time.
func BenchmarkFloorJetStreamPublish1(b *testing.B) { jsPublish(b, singleJS(b), 1) }

// BenchmarkFloorJetStreamPublish16 is the floor of BenchmarkJetStreamPut16: plain
// publishes from 16 goroutines.
func BenchmarkFloorJetStreamPublish16(b *testing.B) { jsPublish(b, singleJS(b), jsWriters) }

// BenchmarkJetStreamClusterPut1 is jsstore.Put on the three-node cluster, R3, one
// at a time: env/s.
func BenchmarkJetStreamClusterPut1(b *testing.B) { jsPut(b, clusterJS(b), 1) }

// BenchmarkJetStreamClusterPut16 is jsstore.Put on the three-node cluster, R3, from
// 16 goroutines: env/s.
func BenchmarkJetStreamClusterPut16(b *testing.B) { jsPut(b, clusterJS(b), jsWriters) }

// BenchmarkFloorJetStreamClusterPublish1 is the floor of
// BenchmarkJetStreamClusterPut1: a plain publish to an R3 stream, one at a time.
func BenchmarkFloorJetStreamClusterPublish1(b *testing.B) { jsPublish(b, clusterJS(b), 1) }

// BenchmarkFloorJetStreamClusterPublish16 is the floor of
// BenchmarkJetStreamClusterPut16: plain publishes to an R3 stream from 16 goroutines.
func BenchmarkFloorJetStreamClusterPublish16(b *testing.B) {
	jsPublish(b, clusterJS(b), jsWriters)
}

// BenchmarkRelayAcceptJetStream1 is the relay on the JetStream backend (one node,
// sync_interval: always) accepting new envelopes one at a time, in process
// (Relay.Accept: parse and verify, jsstore Put, receipt signed): env/s.
func BenchmarkRelayAcceptJetStream1(b *testing.B) { relayOnJS(b, singleJS, 1) }

// BenchmarkRelayAcceptJetStreamBatch64 is the same in batches of 64 (Relay.AcceptBatch,
// which puts them one by one, in order): env/s.
func BenchmarkRelayAcceptJetStreamBatch64(b *testing.B) { relayOnJS(b, singleJS, relayBatch) }

// BenchmarkRelayAcceptJetStreamCluster1 and …Batch64 are the same on the three-node
// R3 cluster (default sync interval): env/s.
func BenchmarkRelayAcceptJetStreamCluster1(b *testing.B) { relayOnJS(b, clusterJS, 1) }

func BenchmarkRelayAcceptJetStreamClusterBatch64(b *testing.B) {
	relayOnJS(b, clusterJS, relayBatch)
}

// relayOnJS runs a relay on target's JetStream accepting b.N calls of per new envelopes.
// The stream outlives the runs, so every run signs envelopes of its own (outside the
// clock): the pool's would be duplicates.
func relayOnJS(b *testing.B, target func(*testing.B) *jsTarget, per int) {
	b.StopTimer()
	t := target(b) // started (once per process) off the clock
	o, _, peer := owner()
	now := time.Now()
	body := bytes.Repeat([]byte("x"), 512)
	envs := make([][]byte, b.N*per)
	if err := onAllCores(len(envs), func(i int) (err error) {
		_, envs[i], err = envelope.NewMessage(o, identity.DID(peer), uuid.NewString(), body, now.Add(24*time.Hour), now)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	id, err := identity.FromSeed(relaySeed[:])
	if err != nil {
		b.Fatal(err)
	}
	r, err := relay.New(relay.Options{Identity: id, Home: benchDir(b), Logger: slog.New(slog.DiscardHandler),
		JetStream: t.nc, JetStreamOptions: t.opts})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	b.StartTimer()
	for i := range b.N {
		batch := envs[i*per : (i+1)*per]
		if per == 1 {
			if _, err := r.Accept(ctx, batch[0]); err != nil {
				b.Fatal(err)
			}
			continue
		}
		acceptBatch(b, r, batch)
	}
	b.StopTimer()
	reportRate(b, float64(b.N*per), "env/s")
	if got := r.Stats().Accepted; got != int64(b.N*per) {
		b.Fatalf("the relay accepted %d envelopes, want %d", got, b.N*per)
	}
}
