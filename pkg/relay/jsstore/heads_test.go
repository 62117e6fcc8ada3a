package jsstore_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
)

// Two Stores (two relay processes) on one server raising one sender's head
// with every seq at once: the head kept is the highest, each raise returns a
// seq at least its own, and none lowers it; a lower head later leaves it.
func TestRaiseHeadNeverLowers(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	var stores []*jsstore.Store
	for range 2 {
		st, err := jsstore.Open(ctx, natstest.Connect(t, s.ClientURL()), jsstore.Options{Replicas: 1, SyncAlways: true})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, st)
	}
	id, err := identity.FromSeed(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	if h, err := stores[0].Head(ctx, id.DID()); err != nil || h != nil {
		t.Fatalf("before any: %s, %v", h, err)
	}
	const n = 48
	heads := make([][]byte, n+1)
	for seq := 1; seq <= n; seq++ {
		if heads[seq], err = envelope.SignStoreHead(id.Signer(), envelope.StoreHead{Owner: id.DID(), Format: 2, Seq: int64(seq), Time: t0}); err != nil {
			t.Fatal(err)
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, seq := range rand.Perm(n) {
		seq++
		st := stores[seq%2]
		wg.Go(func() {
			<-start
			kept, err := st.RaiseHead(ctx, heads[seq])
			if err != nil || kept < int64(seq) {
				t.Errorf("raise %d: kept %d, %v", seq, kept, err)
				return
			}
			h, err := st.Head(ctx, id.DID())
			if p, perr := envelope.ParseStoreHead(h); err != nil || perr != nil || p.Seq < int64(seq) {
				t.Errorf("after raising %d: %s, %v", seq, h, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if kept, err := stores[1].RaiseHead(ctx, heads[3]); err != nil || kept != n {
		t.Fatalf("a lower head: kept %d, %v", kept, err)
	}
	for _, st := range stores {
		if h, err := st.Head(ctx, id.DID()); err != nil || !bytes.Equal(h, heads[n]) {
			t.Fatalf("kept %s, %v; want seq %d", h, err, n)
		}
	}
	if _, err := stores[0].RaiseHead(ctx, []byte("not a head")); err == nil {
		t.Fatal("a malformed head was raised")
	}
}
