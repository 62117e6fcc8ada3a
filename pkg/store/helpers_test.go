package store_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// testSeed gives every test the same owner key.
var testSeed = [32]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}

func ownerIdentity(t testing.TB) *identity.Identity {
	t.Helper()
	id, err := identity.FromSeed(testSeed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func peerDID(t testing.TB) identity.DID {
	t.Helper()
	seed := testSeed
	seed[0] = 99
	return identity.FormatDID(ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey))
}

// openStore opens a store in a fresh directory.
func openStore(t testing.TB, opts store.Options) *store.Store {
	t.Helper()
	if opts.Dir == "" && opts.Home == "" {
		opts.Home = t.TempDir()
	}
	s, err := store.Open(ownerIdentity(t).Signer(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sendRequest builds a message with n envelopes.
func sendRequest(t testing.TB, n int) store.SendRequest {
	t.Helper()
	req := store.SendRequest{
		MessageID:        uuid.NewString(),
		PeerOwnerDID:     peerDID(t),
		RelayURL:         "http://127.0.0.1:9/relay",
		DeliveryDeadline: time.Now().Add(time.Hour),
	}
	for i := 0; i < n; i++ {
		id := uuid.NewString()
		env, _ := json.Marshal(map[string]any{"envelopeId": id, "body": fmt.Sprintf("hello %d", i)})
		kind := record.EnvelopeMessage
		if i > 0 {
			kind = record.EnvelopeDeliveryStatus
		}
		req.Envelopes = append(req.Envelopes, store.OutgoingEnvelope{EnvelopeID: id, Kind: kind, Envelope: env})
	}
	return req
}

func enqueue(t testing.TB, s *store.Store, n int) (store.SendRequest, *record.Message) {
	t.Helper()
	req := sendRequest(t, n)
	m, err := s.Enqueue(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return req, m
}

// dirSyncFailing opens a store whose fsyncs of directory dir fail with EIO while the
// returned flag is set; every call is recorded in the returned Faulty.
func dirSyncFailing(t testing.TB, dir record.Kind) (*store.Store, *atomic.Bool, *fsx.Faulty) {
	t.Helper()
	failing := new(atomic.Bool)
	var faulty *fsx.Faulty
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		faulty.Inject = func(op fsx.Op) error {
			if failing.Load() && op.Kind == fsx.OpSyncDir && op.Path == string(dir) {
				return syscall.EIO
			}
			return nil
		}
		return faulty
	}})
	return s, failing, faulty
}
