package jsstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
)

// Two relay processes (two Stores on two connections to two nodes) share an
// R3 stream and bucket on a three-node cluster. 1,000 envelopes are put across
// both, each retried until acknowledged as a carrier would, while the node one
// of them is connected to is shut down and restarted. Every acknowledged
// envelope is then fetched exactly once by its recipient, in the order it was
// acknowledged; a re-Put through either store returns the same Held; another
// digest under a used id is a conflict from either store.
func TestClusterTwoRelaysNodeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster: a few seconds")
	}
	c := natstest.Cluster(t, 3)
	c.WaitReady()
	stores := []*jsstore.Store{
		openRetry(t, natstest.Connect(t, c.URLs(0)), jsstore.Options{}),
		openRetry(t, natstest.Connect(t, c.URLs(1)), jsstore.Options{}),
	}

	const recipients, perRecipient = 8, 125
	const total = recipients * perRecipient
	var dids []identity.DID
	for i := range recipients {
		dids = append(dids, identity.DID(fmt.Sprintf("did:key:z6MkTestRecipient%02d", i)))
	}
	acked := make([][]wire, recipients)
	held := make([][]jsstore.Held, recipients)
	var count, retries atomic.Int64
	down, up := make(chan struct{}), make(chan struct{})
	restarted := make(chan struct{})
	go func() { // the node of the second store goes down after 300 acks, up after 600
		<-down
		c.Stop(1)
		<-up
		c.Start(1)
		close(restarted)
	}()
	var downOnce, upOnce sync.Once
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, recipients)
	for r := range recipients {
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond) // the carrier's backoff, not a wait for an event
			defer tick.Stop()
			for i := range perRecipient {
				w := newWire(fmt.Sprintf("r%d-%d", r, i))
				st := stores[(r+i)%2]
				for {
					if ctx.Err() != nil {
						errs <- fmt.Errorf("recipient %d envelope %d never acknowledged", r, i)
						return
					}
					actx, acancel := context.WithTimeout(ctx, 5*time.Second)
					now := time.Now()
					h, _, err := st.Put(actx, dids[r], w.id, w.digest, w.data, now, now.Add(time.Hour))
					acancel()
					if errors.Is(err, jsstore.ErrConflict) {
						errs <- fmt.Errorf("envelope %s: conflict with itself", w.id)
						return
					}
					if err == nil {
						acked[r] = append(acked[r], w)
						held[r] = append(held[r], h)
						break
					}
					retries.Add(1)
					<-tick.C
					st = stores[(r+i+int(retries.Load()))%2] // a carrier may try the other relay
				}
				switch n := count.Add(1); {
				case n == 300:
					downOnce.Do(func() { close(down) })
				case n == 600:
					upOnce.Do(func() { close(up) })
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	select {
	case <-restarted:
	case <-ctx.Done():
		t.Fatal("node 1 did not restart")
	}
	if n := count.Load(); n != total {
		t.Fatalf("%d acknowledged, want %d", n, total)
	}
	t.Logf("%d envelopes acknowledged, %d retried attempts", total, retries.Load())

	for r, did := range dids {
		got := fetchAllRetry(t, stores, did)
		want := make([]string, len(acked[r]))
		for i, w := range acked[r] {
			want[i] = w.id
		}
		if !slices.Equal(got, want) {
			t.Fatalf("recipient %d fetched %d envelopes, want its %d acknowledged ones exactly once in order", r, len(got), len(want))
		}
	}
	// Duplicates (a carrier that crashed before it saw its receipt) get the
	// same Held from either relay; another digest is a conflict from either.
	for r := range recipients {
		for i := 0; i < perRecipient; i += 25 {
			w, want := acked[r][i], held[r][i]
			for s, st := range stores {
				h, dup, err := st.Put(ctx, dids[r], w.id, w.digest, w.data, time.Now(), time.Now().Add(time.Hour))
				if err != nil || !dup || h != want {
					t.Fatalf("re-Put through store %d = %+v, %t, %v; want %+v", s, h, dup, err, want)
				}
				o := w.other()
				if _, _, err := st.Put(ctx, dids[r], o.id, o.digest, o.data, time.Now(), time.Now().Add(time.Hour)); !errors.Is(err, jsstore.ErrConflict) {
					t.Fatalf("other digest through store %d: %v, want ErrConflict", s, err)
				}
			}
		}
	}
	for r, did := range dids {
		if got := fetchAllRetry(t, stores, did); len(got) != perRecipient {
			t.Fatalf("recipient %d: %d envelopes after the re-Puts, want %d", r, len(got), perRecipient)
		}
	}
}

// fetchAllRetry is fetchAll through both stores, retrying a page that fails
// while the cluster settles after the restart.
func fetchAllRetry(t *testing.T, stores []*jsstore.Store, to identity.DID) []string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var ids []string
	cursor := ""
	tick := time.NewTicker(10 * time.Millisecond) // a recipient's backoff after a failed page
	defer tick.Stop()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		page, err := stores[i%2].Fetch(ctx, to, cursor, 50)
		cancel()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("Fetch: %v", err)
			}
			<-tick.C
			continue
		}
		for _, e := range page.Envelopes {
			ids = append(ids, e.EnvelopeID)
		}
		if !page.More {
			return ids
		}
		cursor = page.Cursor
	}
}

// openRetry opens a Store, retrying while the cluster elects its leaders.
func openRetry(t *testing.T, nc *nats.Conn, opts jsstore.Options) *jsstore.Store {
	t.Helper()
	var st *jsstore.Store
	retry(t, func(ctx context.Context) (err error) {
		st, err = jsstore.Open(ctx, nc, opts)
		return err
	})
	return st
}

// On an R3 cluster, buckets made as nats.go makes them (with direct gets, as an
// older relay left them) are changed at Open to allow_direct false, and every
// read of the store — records, the allow-list, inbox pages — is a
// STREAM.MSG.GET, which only a stream's leader answers, never a direct get,
// which any replica answers (a lagging one with "no record"). Fails on the old
// code, whose buckets kept direct gets.
func TestReadsGoToTheLeaders(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster: a few seconds")
	}
	c := natstest.Cluster(t, 3)
	c.WaitReady()
	nc := natstest.Connect(t, c.URLs(0))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The buckets as an older relay created them.
	for _, cfg := range []jetstream.KeyValueConfig{
		{Bucket: jsstore.DefaultBucket, History: 1, Storage: jetstream.FileStorage, Replicas: 3, LimitMarkerTTL: time.Minute},
		{Bucket: jsstore.DefaultRecipientsBucket, History: 1, Storage: jetstream.FileStorage, Replicas: 3},
	} {
		retry(t, func(ctx context.Context) error {
			_, err := js.CreateKeyValue(ctx, cfg)
			return err
		})
		if !streamConfig(t, js, "KV_"+cfg.Bucket).AllowDirect {
			t.Fatalf("nats.go made bucket %s without direct gets; this test no longer starts from an old bucket", cfg.Bucket)
		}
	}
	// Every JetStream get request of the store, seen on a connection of its own
	// to the store's node (a subscription there is in place once Flush returns;
	// the other nodes learn of it later), delivered into a channel by the
	// connection's reader (so every request before its Flush is in it).
	watch := natstest.Connect(t, c.URLs(0))
	seen := make(chan *nats.Msg, 4096)
	for _, subj := range []string{"$JS.API.DIRECT.GET.>", "$JS.API.STREAM.MSG.GET.>"} {
		if _, err := watch.ChanSubscribe(subj, seen); err != nil {
			t.Fatal(err)
		}
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}

	st := openRetry(t, nc, jsstore.Options{})
	for _, b := range []string{jsstore.DefaultBucket, jsstore.DefaultRecipientsBucket} {
		if streamConfig(t, js, "KV_"+b).AllowDirect {
			t.Fatalf("bucket %s still allows direct gets after Open", b)
		}
	}
	w := newWire("leader reads")
	var h jsstore.Held
	retry(t, func(ctx context.Context) (err error) {
		h, _, err = st.Put(ctx, bob, w.id, w.digest, w.data, t0, t0.Add(time.Hour))
		return err
	})
	if got, ok, err := st.Lookup(context.Background(), w.id); err != nil || !ok || got != h {
		t.Fatalf("Lookup = %+v, %t, %v; want %+v", got, ok, err, h)
	}
	if h2, dup, err := st.Put(context.Background(), bob, w.id, w.digest, w.data, t0, t0.Add(time.Hour)); err != nil || !dup || h2 != h {
		t.Fatalf("Put again = %+v, %t, %v", h2, dup, err)
	}
	retry(t, func(ctx context.Context) error { return st.Register(ctx, bob) })
	if ok, err := st.Registered(context.Background(), bob); err != nil || !ok {
		t.Fatalf("Registered = %t, %v", ok, err)
	}
	if got := fetchAllRetry(t, []*jsstore.Store{st, st}, bob); !slices.Equal(got, []string{w.id}) {
		t.Fatalf("inbox = %v", got)
	}
	// The watcher has seen every request sent before this round trip of its own.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	gets := map[string]int{}
	for len(seen) > 0 {
		gets[(<-seen).Subject]++
	}
	for subj, n := range gets {
		if strings.HasPrefix(subj, "$JS.API.DIRECT.GET.") {
			t.Errorf("%d direct gets on %s", n, subj)
		}
	}
	for _, want := range []string{"KV_" + jsstore.DefaultBucket, "KV_" + jsstore.DefaultRecipientsBucket, jsstore.DefaultStream} {
		if gets["$JS.API.STREAM.MSG.GET."+want] == 0 {
			t.Errorf("no leader get on %s (seen: %v)", want, gets)
		}
	}
}

// streamConfig reads the configuration of stream name.
func streamConfig(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	var info *jetstream.StreamInfo
	retry(t, func(ctx context.Context) error {
		s, err := js.Stream(ctx, name)
		if err == nil {
			info, err = s.Info(ctx)
		}
		return err
	})
	return info.Config
}

// retry runs fn until it succeeds, while the cluster elects its leaders.
func retry(t *testing.T, fn func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond) // polling a cluster that is electing; not waiting for an event of ours
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := fn(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("on the cluster: %v", err)
		}
		<-tick.C
	}
}
