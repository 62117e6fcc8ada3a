// Package e2e holds end-to-end tests of the carrier against real relays over
// loopback HTTP. It has only test files.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

var quiet = slog.New(slog.DiscardHandler)

func ident(t testing.TB, n byte) *identity.Identity {
	id, err := identity.FromSeed(bytes.Repeat([]byte{n}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestMain re-executes the test binary as a carrier process when asked.
func TestMain(m *testing.M) {
	if dir := os.Getenv("SEALBRIDGE_E2E_CARRIER_STORE"); dir != "" {
		os.Exit(carrierMain(dir))
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// fastOptions are carrier options that make an hour of schedule take a second.
func fastOptions() carrier.Options {
	return carrier.Options{
		SendTimeout: 5 * time.Second, LeaseFor: 2 * time.Second,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		ProbeEvery: 100 * time.Millisecond, SweepEvery: 500 * time.Millisecond,
		StoreFailureDelay: 200 * time.Millisecond, Watch: carrier.WatchPoll, PollEvery: 50 * time.Millisecond,
		Logger: quiet,
	}
}

// carrierMain runs a carrier over the store dir of identity seed 1 until killed.
func carrierMain(dir string) int {
	alice, _ := identity.FromSeed(bytes.Repeat([]byte{1}, 32))
	st, err := store.Open(alice.Signer(), store.Options{Dir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	c := carrier.New(st, carrier.NewHTTPTransport(carrier.HTTPOptions{SendTimeout: 5 * time.Second}), fastOptions())
	c.Kick()
	_ = c.Run(ctx)
	return 0
}

type relayInstance struct {
	r    *relay.Relay
	addr string
	srv  *http.Server
}

// startRelay serves a relay on addr ("127.0.0.1:0" or a reserved port).
func startRelay(t *testing.T, seed byte, home, addr string, onAccept func(string, string, bool)) *relayInstance {
	t.Helper()
	r, err := relay.New(relay.Options{Identity: ident(t, seed), Home: home, Logger: quiet, OnAccept: onAccept})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	ri := &relayInstance{r: r, addr: ln.Addr().String(), srv: srv}
	t.Cleanup(func() { srv.Close(); r.Close() })
	return ri
}

// reservePort returns a loopback address nobody listens on (yet), for a relay that
// starts late. The port is freed until then, so it is taken on an address of its own
// in 127.0.0.0/8 (random, never 127.0.0.1): every other listener of this and other
// processes binds 127.0.0.1:0, and the kernel's next ephemeral port there is this
// one's, so on 127.0.0.1 another test run could take the port meanwhile — accepting
// envelopes meant for a relay that is down, or leaving the late relay unable to bind.
func reservePort(t *testing.T) string {
	t.Helper()
	for range 16 {
		ip := net.IPv4(127, byte(1+rand.IntN(254)), byte(rand.IntN(256)), byte(1+rand.IntN(254)))
		ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		if err != nil {
			continue // an address this machine's loopback does not route: try another
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	t.Skip("no loopback address in 127.0.0.0/8 other than 127.0.0.1 can be bound here")
	return ""
}

func enqueue(t *testing.T, st *store.Store, to identity.DID, relayURL string) string {
	t.Helper()
	now := time.Now()
	en, data, err := envelope.NewMessage(ident(t, 1), to, uuid.NewString(), []byte("e2e"), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Enqueue(context.Background(), store.SendRequest{
		MessageID: en.MessageID(), PeerOwnerDID: to, RelayURL: relayURL, DeliveryDeadline: en.DeliveryDeadline(),
		Envelopes: []store.OutgoingEnvelope{{EnvelopeID: en.ID(), Kind: record.EnvelopeMessage, Envelope: data}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return en.ID()
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v: %s", what, d, state)
		}
		<-tick.C
	}
}

func relayedCount(t *testing.T, st *store.Store) (relayed, total int) {
	sums, err := st.OutboxSummaries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sums {
		if s.State == record.StateRelayed {
			relayed++
		}
	}
	return relayed, len(sums)
}

// inboxIDs fetches every envelope id waiting for id at a relay.
func inboxIDs(t *testing.T, addr string, id *identity.Identity) map[string]int {
	c := &relayproto.Client{BaseURL: "http://" + addr}
	got := map[string]int{}
	after := ""
	for {
		page, err := c.Fetch(context.Background(), id, after, relayproto.MaxFetchLimit)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Envelopes {
			got[e.EnvelopeID]++
		}
		after = page.Cursor
		if !page.More {
			return got
		}
	}
}

func TestThousandEnvelopesTwentyRelaysFiveLate(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e")
	}
	const nRelays, nLate, nEnvelopes = 20, 5, 1000
	bob := ident(t, 2)
	addrs := make([]string, nRelays)
	relays := make([]*relayInstance, nRelays)
	homes := make([]string, nRelays)
	for i := range nRelays {
		homes[i] = t.TempDir()
		if i < nLate {
			addrs[i] = reservePort(t) // refuses connections until started below
			continue
		}
		relays[i] = startRelay(t, byte(10+i), homes[i], "127.0.0.1:0", nil)
		addrs[i] = relays[i].addr
	}
	alice := ident(t, 1)
	st, err := store.Open(alice.Signer(), store.Options{Dir: t.TempDir() + "/store"})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]map[string]bool, nRelays)
	for i := range want {
		want[i] = map[string]bool{}
	}
	start := time.Now()
	for n := range nEnvelopes {
		i := n % nRelays
		want[i][enqueue(t, st, bob.DID(), "http://"+addrs[i])] = true
	}
	enqueued := time.Since(start)

	ctx, cancel := context.WithCancel(context.Background())
	c := carrier.New(st, carrier.NewHTTPTransport(carrier.HTTPOptions{SendTimeout: 5 * time.Second}), fastOptions())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	c.Kick()

	live := (nRelays - nLate) * nEnvelopes / nRelays
	waitFor(t, "live relays accept their envelopes", 60*time.Second, func() (bool, string) {
		n := int64(0)
		for _, r := range relays[nLate:] {
			n += r.r.Stats().Accepted
		}
		return n == int64(live), fmt.Sprintf("%d/%d accepted", n, live)
	})
	if r, _ := relayedCount(t, st); r != live {
		t.Logf("relayed while %d relays were down: %d", nLate, r)
	}
	// The late relays come back on their reserved ports.
	for i := range nLate {
		relays[i] = startRelay(t, byte(10+i), homes[i], addrs[i], nil)
	}
	waitFor(t, "all outbox records relayed", 60*time.Second, func() (bool, string) {
		r, total := relayedCount(t, st)
		return r == nEnvelopes && total == nEnvelopes, fmt.Sprintf("%d/%d relayed", r, total)
	})
	elapsed := time.Since(start)
	var accepted, dups int64
	for i, r := range relays {
		s := r.r.Stats()
		accepted += s.Accepted
		dups += s.Duplicates
		if s.Accepted != int64(len(want[i])) || s.Conflicts != 0 {
			t.Errorf("relay %d: %+v, want %d accepted", i, s, len(want[i]))
		}
		got := inboxIDs(t, r.addr, bob)
		for id := range want[i] {
			if got[id] != 1 {
				t.Errorf("relay %d holds envelope %s %d times", i, id, got[id])
			}
		}
		if len(got) != len(want[i]) {
			t.Errorf("relay %d holds %d envelopes, want %d", i, len(got), len(want[i]))
		}
	}
	t.Logf("%d envelopes, %d relays (%d late): enqueue %v, all relayed after %v; accepted %d, duplicates %d",
		nEnvelopes, nRelays, nLate, enqueued.Round(time.Millisecond), elapsed.Round(time.Millisecond), accepted, dups)
}

func TestCrashBetweenSendAndSettle(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e")
	}
	bob := ident(t, 2)
	storeDir := t.TempDir() + "/store"
	st, err := store.Open(ident(t, 1).Signer(), store.Options{Dir: storeDir})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var child *exec.Cmd
	killed := make(chan struct{})
	var once sync.Once
	startChild := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "SEALBRIDGE_E2E_CARRIER_STORE="+storeDir)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	// The relay kills the carrier process after the envelope is durable and
	// before the receipt goes out: the carrier never settles this attempt.
	onAccept := func(id, digest string, dup bool) {
		if dup {
			return
		}
		once.Do(func() {
			mu.Lock()
			cmd := child
			mu.Unlock()
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
			close(killed)
		})
	}
	ri := startRelay(t, 30, t.TempDir(), "127.0.0.1:0", onAccept)
	id := enqueue(t, st, bob.DID(), "http://"+ri.addr)

	mu.Lock()
	child = startChild()
	mu.Unlock()
	select {
	case <-killed:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay never accepted the envelope")
	}
	if r, _ := relayedCount(t, st); r != 0 {
		t.Fatalf("outbox settled although the carrier was killed before the receipt: %d", r)
	}
	// Restart the carrier: once the dead holder's lease expires it sends again.
	restarted := startChild()
	waitFor(t, "outbox relayed after the restart", 60*time.Second, func() (bool, string) {
		r, total := relayedCount(t, st)
		return r == 1, fmt.Sprintf("%d/%d relayed, relay %+v", r, total, ri.r.Stats())
	})
	_ = restarted.Process.Signal(syscall.SIGTERM)
	s := ri.r.Stats()
	if s.Accepted != 1 || s.Duplicates != 1 {
		t.Fatalf("relay stats %+v: want 1 accepted and 1 de-duplicated re-send", s)
	}
	got := inboxIDs(t, ri.addr, bob)
	if len(got) != 1 || got[id] != 1 {
		t.Fatalf("relay holds %v, want %s once", got, id)
	}
}
