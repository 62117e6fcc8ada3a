package relay

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Two writers on one heads directory, as two relay processes sharing a home
// would be (each its own file system handle, so its own flocks), raising one
// sender's head with every seq at once: the head kept is the highest, each
// raise returns a seq at least its own, and none lowers it.
func TestFileHeadsNeverLowered(t *testing.T) {
	alice, err := identity.FromSeed(bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	writers := []*fileHeads{{}, {}}
	const n = 64
	heads := make([][]byte, n+1)
	parsed := make([]*envelope.StoreHead, n+1)
	for seq := 1; seq <= n; seq++ {
		h, err := envelope.SignStoreHead(alice.Signer(), envelope.StoreHead{Owner: alice.DID(), Format: 2, Seq: int64(seq),
			Time: time.UnixMilli(1_767_225_600_000)})
		if err != nil {
			t.Fatal(err)
		}
		heads[seq] = h
		parsed[seq], _ = envelope.ParseStoreHead(h)
	}
	for round := range 4 {
		sub := t.TempDir()
		writers[0].fs, writers[1].fs = fsx.NewOS(sub), fsx.NewOS(sub)
		writers[0].dirs, writers[1].dirs = &fsx.DirsMade{}, &fsx.DirsMade{}
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, n+1)
		for _, seq := range rand.Perm(n) {
			seq++
			w := writers[seq%2]
			wg.Go(func() {
				<-start
				kept, err := w.raise(heads[seq], parsed[seq])
				if err == nil && kept < int64(seq) {
					t.Errorf("round %d: raise of %d kept %d", round, seq, kept)
				}
				errs[seq] = err
				// Whatever happens meanwhile, the kept head is never below
				// what this raise made durable.
				if _, now, err := w.read(alice.DID()); err == nil && now < int64(seq) {
					t.Errorf("round %d: after raising %d the head is %d", round, seq, now)
				}
			})
		}
		close(start)
		wg.Wait()
		for seq, err := range errs {
			if err != nil {
				t.Fatalf("raise %d: %v", seq, err)
			}
		}
		for _, w := range writers {
			data, seq, err := w.read(alice.DID())
			if err != nil || seq != n || !bytes.Equal(data, heads[n]) {
				t.Fatalf("round %d: kept %d, %v; want %d", round, seq, err, n)
			}
		}
	}
}
