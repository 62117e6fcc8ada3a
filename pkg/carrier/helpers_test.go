package carrier

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// ---- fake clock ----

type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	fired  []*fakeTimer // fired, maybe not yet received
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	ch      chan time.Time
	armed   bool
	stopped bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Now().Truncate(time.Millisecond)}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{c: f, at: f.now.Add(d), ch: make(chan time.Time, 1), armed: true}
	if d <= 0 {
		t.armed = false
		t.ch <- f.now
		f.fired = append(f.fired, t)
		return t
	}
	f.timers = append(f.timers, t)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

// Stop disarms the timer and drains a fired, unreceived value (Go 1.23 semantics).
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed, t.stopped = false, true
	t.c.timers = slices.DeleteFunc(t.c.timers, func(x *fakeTimer) bool { return x == t })
	select {
	case <-t.ch:
	default:
	}
	return was
}

// next returns the earliest armed timer's time.
func (f *fakeClock) next() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var at time.Time
	for _, t := range f.timers {
		if at.IsZero() || t.at.Before(at) {
			at = t.at
		}
	}
	return at, !at.IsZero()
}

// set moves the clock to at (never back) and fires every timer due by then; it
// returns how many fired.
func (f *fakeClock) set(at time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if at.After(f.now) {
		f.now = at
	}
	keep, n := f.timers[:0], 0
	for _, t := range f.timers {
		if !t.at.After(f.now) {
			t.armed = false
			t.ch <- f.now
			f.fired = append(f.fired, t)
			n++
			continue
		}
		keep = append(keep, t)
	}
	f.timers = keep
	return n
}

// pending reports whether a fired timer's value has not been received yet.
func (f *fakeClock) pending() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fired = slices.DeleteFunc(f.fired, func(t *fakeTimer) bool { return t.stopped || len(t.ch) == 0 })
	return len(f.fired) > 0
}

// ---- scripted transport ----

type sendRec struct {
	url, envelopeID string
	at              time.Time
}

type scripted struct {
	clock *fakeClock
	mu    sync.Mutex
	sends []sendRec
	// answer decides a send's result; it may block (honouring ctx).
	answer  func(ctx context.Context, url, envelopeID string, n int) Result
	started chan sendRec // if set, every send is announced here
}

func (s *scripted) Send(ctx context.Context, url string, env []byte) Result {
	var e struct {
		EnvelopeID string `json:"envelopeId"`
	}
	_ = json.Unmarshal(env, &e)
	var now time.Time
	if s.clock != nil {
		now = s.clock.Now()
	}
	s.mu.Lock()
	rec := sendRec{url: url, envelopeID: e.EnvelopeID, at: now}
	s.sends = append(s.sends, rec)
	n := len(s.sends)
	s.mu.Unlock()
	if s.started != nil {
		s.started <- rec
	}
	if s.answer == nil {
		return Result{Outcome: Accepted, Status: 200}
	}
	return s.answer(ctx, url, e.EnvelopeID, n)
}

func (s *scripted) log() []sendRec {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sends)
}

func (s *scripted) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sends)
}

// ---- store and harness ----

var ownerSeed = [32]byte{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 1}

func owner(t testing.TB) *identity.Identity {
	t.Helper()
	id, err := identity.FromSeed(ownerSeed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func peer() identity.DID {
	seed := ownerSeed
	seed[0] = 99
	return identity.FormatDID(ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey))
}

// openStore opens the store directory "store" under dir, created 0700 if needed (the
// store refuses a store directory with group or other permissions).
func openStore(t testing.TB, dir string, opts store.Options) *store.Store {
	t.Helper()
	opts.Dir = filepath.Join(dir, "store")
	if err := os.Mkdir(opts.Dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	s, err := store.Open(owner(t).Signer(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// request builds a message of n envelopes to relayURL.
func request(relayURL string, n int, deadline time.Time) store.SendRequest {
	req := store.SendRequest{MessageID: uuid.NewString(), PeerOwnerDID: peer(), RelayURL: relayURL, DeliveryDeadline: deadline}
	for i := range n {
		id := uuid.NewString()
		env, _ := json.Marshal(map[string]any{"envelopeId": id, "body": fmt.Sprintf("part %d", i)})
		kind := record.EnvelopeMessage
		if i > 0 {
			kind = record.EnvelopeDeliveryStatus
		}
		req.Envelopes = append(req.Envelopes, store.OutgoingEnvelope{EnvelopeID: id, Kind: kind, Envelope: env})
	}
	return req
}

type harness struct {
	t      testing.TB
	clock  *fakeClock
	s      *store.Store
	tr     *scripted
	c      *Carrier
	cancel context.CancelFunc
	done   chan error
}

// newHarness opens a store in a fresh directory with a fake clock and a carrier on a
// scripted transport (not started).
func newHarness(t testing.TB, opts Options, sopts store.Options) *harness {
	t.Helper()
	return newHarnessOn(t, opts, sopts, nil)
}

// newHarnessOn is newHarness with the carrier on transport wrap(the scripted one)
// (wrap nil: the scripted one itself), and, if sopts.Home is set, the store in that
// data root (a store directory fsck accepts) instead of a bare directory.
func newHarnessOn(t testing.TB, opts Options, sopts store.Options, wrap func(*scripted) Transport) *harness {
	t.Helper()
	h := &harness{t: t, clock: newFakeClock()}
	sopts.Now = h.clock.Now
	if sopts.Home != "" {
		s, err := store.Open(owner(t).Signer(), sopts)
		if err != nil {
			t.Fatal(err)
		}
		h.s = s
	} else {
		h.s = openStore(t, t.TempDir(), sopts)
	}
	h.tr = &scripted{clock: h.clock}
	var tr Transport = h.tr
	if wrap != nil {
		tr = wrap(h.tr)
	}
	opts.Clock = h.clock
	if opts.Watch == WatchAuto {
		opts.Watch = WatchOff
	}
	if opts.Jitter == nil {
		opts.Jitter = func() float64 { return 0.5 } // exactly the nominal delay
	}
	if opts.HolderID == "" {
		opts.HolderID = "test-carrier"
	}
	h.c = New(h.s, tr, opts)
	return h
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.c.Run(ctx) }()
	h.t.Cleanup(h.stop)
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case <-h.done:
	case <-time.After(60 * time.Second):
		h.t.Error("carrier did not stop")
	}
}

func (h *harness) enqueue(relayURL string, n int, deadline time.Duration) store.SendRequest {
	h.t.Helper()
	req := request(relayURL, n, h.clock.Now().Add(deadline))
	if _, err := h.s.Enqueue(context.Background(), req); err != nil {
		h.t.Fatal(err)
	}
	return req
}

// waitFor polls cond until it holds, failing the test after 20 s of real time.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(200 * time.Microsecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
		<-tick.C
	}
}

// quiet reports whether the loop, past iteration gen, waits for an event with
// inflight targets in flight and nothing queued for it.
func (c *Carrier) quiet(gen uint64, inflight int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loopIdle && c.loopGen > gen && c.nInflight == inflight && len(c.kick) == 0 && len(c.done) == 0
}

func (c *Carrier) gen() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loopGen
}

// settleAfter waits until the loop has gone idle after iteration gen with nothing in
// flight or pending.
func (h *harness) settleAfter(gen uint64) {
	h.t.Helper()
	waitFor(h.t, "the carrier to be quiet", func() bool { return h.c.quiet(gen, 0) && !h.clock.pending() })
}

func (h *harness) settle() { h.t.Helper(); h.settleAfter(0) }

// kick tells the carrier about a write and waits for it to act on it.
func (h *harness) kick() {
	h.t.Helper()
	g := h.c.gen()
	h.c.Kick()
	h.settleAfter(g)
}

// runUntil moves the fake clock timer by timer up to end, letting the carrier settle
// at every step.
func (h *harness) runUntil(end time.Time) {
	h.t.Helper()
	for {
		h.settle()
		next, ok := h.clock.next()
		if !ok || next.After(end) {
			g := h.c.gen()
			if h.clock.set(end) > 0 {
				h.settleAfter(g)
			}
			return
		}
		g := h.c.gen()
		h.clock.set(next)
		h.settleAfter(g)
	}
}

func (h *harness) outbox(id string) *record.Outbox {
	h.t.Helper()
	o, err := store.GetAs[*record.Outbox](h.s, id)
	if err != nil || o == nil {
		h.t.Fatalf("outbox %s: %v %v", id, o, err)
	}
	return o
}

func (h *harness) message(id string) *record.Message {
	h.t.Helper()
	m, err := store.GetAs[*record.Message](h.s, id)
	if err != nil || m == nil {
		h.t.Fatalf("message %s: %v %v", id, m, err)
	}
	return m
}
