package bench

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
)

// largeBody is the body of the large-body rows: 256 MiB (the smoke run: 4 MiB).
var largeBody = sized{full: 256 << 20, quick: 64 << 20, smoke: 4 << 20}

// randomReader yields n bytes: one pseudo-random MiB over and over, so that
// making the body costs the benchmark nothing (a body's bytes are opaque to
// every step: sealed, hashed, written, sent).
type randomReader struct {
	block []byte
	off   int64
	left  int64
}

func newRandomReader(n int64) *randomReader {
	block := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(uint64(n), 256))
	for i := 0; i < len(block); i += 8 {
		binary.LittleEndian.PutUint64(block[i:], r.Uint64())
	}
	return &randomReader{block: block, left: n}
}

func (g *randomReader) Read(p []byte) (int, error) {
	if g.left == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(int64(len(p)), g.left)], g.block[g.off%int64(len(g.block)):])
	g.off += int64(k)
	g.left -= int64(k)
	return k, nil
}

// benchDaemon is one in-process sealbridged following the bench relay's inbox.
type benchDaemon struct {
	did  string
	c    *client.Client
	stop func()
}

func startBenchDaemon(b *testing.B, url string) *benchDaemon {
	b.Helper()
	home := benchDir(b) // the disk every other row writes to
	id, err := daemon.InitIdentity(home, "")
	if err != nil {
		b.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "sbs-") // short: a socket path has at most 107 bytes
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(sockDir, "d.sock")
	d, err := daemon.New(daemon.Options{Home: home, SocketPath: sock, Logger: slog.New(slog.DiscardHandler),
		InboxRelay: url, PollEvery: 20 * time.Millisecond, Carrier: carrier.Options{}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-d.Ready():
	case err := <-done:
		b.Fatalf("daemon: %v", err)
	case <-time.After(time.Minute):
		b.Fatal("daemon not ready")
	}
	return &benchDaemon{did: string(id.DID()), c: client.New(sock), stop: func() {
		cancel()
		<-done
		os.RemoveAll(home)
		os.RemoveAll(sockDir)
	}}
}

// BenchmarkLargeBodyDelivered sends one body of largeBody bytes from alice's
// daemon to bob's through the reference relay over HTTP, all in this process
// and on this disk, per iteration: from the first byte streamed to alice's
// daemon until alice's message is delivered (bob stored the verified blob,
// acknowledged it and his delivery-status came back). Every copy of the body
// is durable on the way: alice's sealed blob, the relay's, bob's.
func BenchmarkLargeBodyDelivered(b *testing.B) {
	n := int64(largeBody.get())
	_, stop := startRelay(b)
	defer stop()
	url := relayURL()
	alice, bob := startBenchDaemon(b, url), startBenchDaemon(b, url)
	defer alice.stop()
	defer bob.stop()
	ctx := context.Background()
	b.SetBytes(n)
	b.ResetTimer()
	for range b.N {
		m, err := alice.c.SendStream(ctx, client.SendStreamRequest{To: bob.did, RelayURL: url, Key: uuid.NewString()}, newRandomReader(n), n)
		if err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Minute)
		for {
			got, err := alice.c.Message(ctx, m.MessageID)
			if err == nil && got.Status == "delivered" {
				break
			}
			if err == nil && got.Status == "closed" {
				b.Fatalf("closed: %s", got.LastError)
			}
			if time.Now().After(deadline) {
				b.Fatalf("not delivered in 10 minutes: %+v %v", got, err)
			}
			<-time.After(5 * time.Millisecond)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N)*float64(n)/(1<<20), "MiB/s")
}

// BenchmarkFloorLargeBodyTwice is the floor of a large body's delivery: its
// bytes written and fsynced twice on the same disk — the sender's copy, then
// the relay's — in 1 MiB writes, the files removed after.
func BenchmarkFloorLargeBodyTwice(b *testing.B) {
	n := int64(largeBody.get())
	dir := benchDir(b)
	buf := make([]byte, 1<<20)
	newRandomReader(int64(len(buf))).Read(buf)
	b.SetBytes(n)
	b.ResetTimer()
	for range b.N {
		for range 2 {
			p := filepath.Join(dir, uuid.NewString())
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			for left := n; left > 0; left -= int64(len(buf)) {
				if _, err := f.Write(buf[:min(left, int64(len(buf)))]); err != nil {
					b.Fatal(err)
				}
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			f.Close()
			b.StopTimer()
			os.Remove(p)
			b.StartTimer()
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N)*float64(n)/(1<<20), "MiB/s")
}
