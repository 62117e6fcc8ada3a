package carrier

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

const relayA = "http://relay-a.test"

func failed(ctx context.Context, url, id string, n int) Result {
	return Result{Outcome: Failed, Status: 503, Err: errors.New("HTTP 503")}
}

func unreachable(ctx context.Context, url, id string, n int) Result {
	return Result{Outcome: Unreachable, Err: syscall.ECONNREFUSED}
}

func gaps(sends []sendRec) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(sends); i++ {
		out = append(out, sends[i].at.Sub(sends[i-1].at))
	}
	return out
}

func TestBackoffBounds(t *testing.T) {
	want := []time.Duration{2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300}
	for _, j := range []float64{0, 0.25, 0.5, 0.75, 0.99999} {
		c := New(nil, nil, Options{Jitter: func() float64 { return j }})
		for i, nominal := range want {
			nominal *= time.Second
			d := c.backoff(i+1, 0)
			lo := max(time.Duration(float64(nominal)*0.8), 2*time.Second)
			hi := min(time.Duration(float64(nominal)*1.2), 300*time.Second)
			if d < lo || d > hi {
				t.Errorf("jitter %v attempt %d: %v not in [%v, %v]", j, i+1, d, lo, hi)
			}
			if j == 0.5 && d != nominal {
				t.Errorf("attempt %d: %v, want %v", i+1, d, nominal)
			}
		}
		if d := c.backoff(1000, 0); d > 300*time.Second {
			t.Errorf("attempt 1000: %v", d)
		}
	}
	c := New(nil, nil, Options{Jitter: func() float64 { return 0.5 }})
	for _, tc := range []struct {
		attempts int
		ra, want time.Duration
	}{
		{1, 60 * time.Second, 60 * time.Second},   // honoured
		{1, time.Hour, 300 * time.Second},         // capped
		{1, time.Second, 2 * time.Second},         // at least the minimum
		{6, 10 * time.Second, 64 * time.Second},   // never sooner than the backoff
		{9, 299 * time.Second, 300 * time.Second}, // backoff is the cap
	} {
		if d := c.backoff(tc.attempts, tc.ra); d != tc.want {
			t.Errorf("attempts %d Retry-After %v: %v, want %v", tc.attempts, tc.ra, d, tc.want)
		}
	}
}

// The backoff sequence as scheduled: 2, 4, 8, … 256, 300, 300 s between attempts.
func TestBackoffSequence(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = failed
	req := h.enqueue(relayA, 1, 24*time.Hour)
	t0 := h.clock.Now()
	h.start()
	h.runUntil(t0.Add(1200 * time.Second))
	got := gaps(h.tr.log())
	want := []time.Duration{2, 4, 8, 16, 32, 64, 128, 256, 300, 300}
	if len(got) < len(want) {
		t.Fatalf("gaps %v", got)
	}
	for i, w := range want {
		if got[i] != w*time.Second {
			t.Fatalf("gap %d = %v, want %v (all %v)", i, got[i], w*time.Second, got)
		}
	}
	o := h.outbox(req.Envelopes[0].EnvelopeID)
	if o.State != record.StatePending || o.Attempts != h.tr.count() || o.Lease != nil || !strings.Contains(o.LastError, "503") {
		t.Fatalf("outbox after failures: %+v", o)
	}
	if m := h.message(req.MessageID); m.Attempts != o.Attempts || m.Status != record.StatusQueued {
		t.Fatalf("message %+v", m)
	}
	if st := h.c.Stats(); st.Attempts["failed"] != uint64(h.tr.count()) {
		t.Fatalf("stats %+v", st)
	}
}

// Jitter stays within its bounds on the real schedule too.
func TestBackoffJitterScheduled(t *testing.T) {
	var k atomic.Int64
	h := newHarness(t, Options{Jitter: func() float64 { return float64(k.Add(1)%10) / 10 }}, store.Options{})
	h.tr.answer = failed
	h.enqueue(relayA, 1, 24*time.Hour)
	h.start()
	h.runUntil(h.clock.Now().Add(2000 * time.Second))
	nominal := 2 * time.Second
	for i, g := range gaps(h.tr.log()) {
		lo, hi := max(nominal*8/10, 2*time.Second), min(nominal*12/10, 300*time.Second)
		if g < lo || g > hi {
			t.Fatalf("gap %d = %v not in [%v, %v]", i, g, lo, hi)
		}
		nominal = min(2*nominal, 300*time.Second)
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		switch n {
		case 1:
			return Result{Outcome: Failed, Status: 429, RetryAfter: 45 * time.Second}
		case 2:
			return Result{Outcome: Failed, Status: 503, RetryAfter: 2 * time.Hour}
		case 3:
			return Result{Outcome: Failed, Status: 503, RetryAfter: time.Millisecond}
		}
		return Result{Outcome: Accepted, Status: 200}
	}
	req := h.enqueue(relayA, 1, 24*time.Hour)
	h.start()
	h.runUntil(h.clock.Now().Add(time.Hour))
	got := gaps(h.tr.log())
	want := []time.Duration{45 * time.Second, 300 * time.Second, 8 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("gaps %v, want %v", got, want)
	}
	if o := h.outbox(req.Envelopes[0].EnvelopeID); o.State != record.StateRelayed || o.Attempts != 4 {
		t.Fatalf("outbox %+v", o)
	}
	if m := h.message(req.MessageID); m.Status != record.StatusRelayed {
		t.Fatalf("message %+v", m)
	}
}

// gate blocks sends to some targets until released.
type gate struct {
	open map[string]chan struct{}
}

func (g *gate) answer(ctx context.Context, url, id string, n int) Result {
	if ch := g.open[url]; ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return Result{Outcome: Failed, Err: ctx.Err()}
		}
	}
	return Result{Outcome: Accepted, Status: 200}
}

func relayN(i int) string { return "http://relay-" + string(rune('a'+i)) + ".test" }

// At most 16 targets in flight: the 17th waits until one of the 16 finishes.
func TestSeventeenthTargetWaits(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	g := &gate{open: map[string]chan struct{}{}}
	for i := range 17 {
		g.open[relayN(i)] = make(chan struct{})
		h.enqueue(relayN(i), 1, time.Hour)
	}
	h.tr.answer = g.answer
	h.start()
	waitFor(t, "16 sends", func() bool { return h.tr.count() == 16 })
	waitFor(t, "the loop to wait with 16 in flight", func() bool { return h.c.quiet(0, 16) })
	if h.tr.count() != 16 || h.c.Stats().InFlight != 16 {
		t.Fatalf("%d sends, stats %+v", h.tr.count(), h.c.Stats())
	}
	started := map[string]bool{}
	for _, s := range h.tr.log() {
		started[s.url] = true
	}
	var first, last string
	for i := range 17 {
		if started[relayN(i)] && first == "" {
			first = relayN(i)
		}
		if !started[relayN(i)] {
			last = relayN(i)
		}
	}
	h.kick2(16) // a kick while full dispatches nothing more
	if h.tr.count() != 16 {
		t.Fatalf("a 17th target started while 16 were in flight")
	}
	close(g.open[first])
	waitFor(t, "the 17th send", func() bool { return h.tr.count() == 17 })
	if got := h.tr.log()[16].url; got != last {
		t.Fatalf("17th send went to %s, want %s", got, last)
	}
	for _, ch := range g.open {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
	h.settle()
	if st := h.c.Stats(); st.Attempts["accepted"] != 17 || st.InFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// kick2 kicks and waits for the loop to be quiet with inflight targets in flight.
func (h *harness) kick2(inflight int) {
	g := h.c.gen()
	h.c.Kick()
	waitFor(h.t, "the kick", func() bool { return h.c.quiet(g, inflight) })
}

// A target that never answers does not delay the other 15.
func TestSlowTargetDoesNotDelayOthers(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	stuck := relayN(0)
	g := &gate{open: map[string]chan struct{}{stuck: make(chan struct{})}}
	h.tr.answer = g.answer
	var reqs []store.SendRequest
	for i := range 16 {
		for range 3 {
			reqs = append(reqs, h.enqueue(relayN(i), 2, time.Hour))
		}
	}
	h.start()
	waitFor(t, "every other target delivered", func() bool { return h.c.quiet(0, 1) && h.tr.count() == 1+15*6 })
	for _, r := range reqs {
		want := record.StateRelayed
		if r.RelayURL == stuck {
			want = record.StatePending
		}
		for _, e := range r.Envelopes {
			if o := h.outbox(e.EnvelopeID); o.State != want {
				t.Fatalf("%s: %s, want %s", r.RelayURL, o.State, want)
			}
		}
	}
	close(g.open[stuck])
	h.settle()
	if n := h.tr.count(); n != 16*6 {
		t.Fatalf("%d sends", n)
	}
}

// An unreachable target gets one probe at a time carrying one envelope, the first
// 1.5 s (nominal jitter) after it stopped answering and each next one 1.5 times the
// wait's length so far further, up to one per 300 s; its other envelopes keep
// attempts = 0; an answer clears the wait.
func TestUnreachableProbe(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	var up atomic.Bool
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		if up.Load() {
			return Result{Outcome: Accepted, Status: 200}
		}
		return unreachable(ctx, url, id, n)
	}
	r1 := h.enqueue(relayA, 2, 24*time.Hour)
	r2 := h.enqueue(relayA, 1, 24*time.Hour)
	t0 := h.clock.Now()
	h.start()
	h.runUntil(t0.Add(3600 * time.Second))
	sends := h.tr.log()
	var want []time.Time
	for at := t0; !at.After(t0.Add(3600 * time.Second)); {
		want = append(want, at)
		gap := min(time.Duration(1.5*float64(max(at.Sub(t0), time.Second))), 300*time.Second)
		at = at.Add(gap.Truncate(time.Millisecond))
	}
	if len(want) != 18 || want[1].Sub(t0) != 1500*time.Millisecond || want[17].Sub(want[16]) != 300*time.Second {
		t.Fatalf("the test's schedule: %v", want)
	}
	if len(sends) != len(want) {
		t.Fatalf("%d probes in an hour, want %d", len(sends), len(want))
	}
	for i, s := range sends {
		if !s.at.Equal(want[i]) || s.envelopeID != sends[0].envelopeID {
			t.Fatalf("probe %d at +%v, want +%v: %+v (first %+v)", i, s.at.Sub(t0), want[i].Sub(t0), s, sends[0])
		}
	}
	probes := len(sends)
	// A message enqueued during the wait does not trigger an extra probe.
	r3 := h.enqueue(relayA, 1, 24*time.Hour)
	h.kick()
	if h.tr.count() != probes {
		t.Fatalf("an enqueue during the wait sent at once")
	}
	if st := h.c.Stats(); st.TargetsWaiting != 1 || st.Attempts["unreachable"] != uint64(probes) {
		t.Fatalf("stats %+v", st)
	}
	probed := sends[0].envelopeID
	for _, r := range []store.SendRequest{r1, r2} {
		for _, e := range r.Envelopes {
			o := h.outbox(e.EnvelopeID)
			wantAttempts := 0
			if e.EnvelopeID == probed {
				wantAttempts = probes
			}
			if o.Attempts != wantAttempts || o.UnreachableSince != t0.UnixMilli() || o.State != record.StatePending {
				t.Fatalf("envelope %s: attempts %d since %d, want %d since %d", e.EnvelopeID, o.Attempts, o.UnreachableSince, wantAttempts, t0.UnixMilli())
			}
		}
	}
	up.Store(true)
	h.runUntil(h.clock.Now().Add(300 * time.Second))
	if n := h.tr.count(); n != probes+4 {
		t.Fatalf("%d sends after the relay came back, want %d", n, probes+4)
	}
	for _, r := range []store.SendRequest{r1, r2, r3} {
		for _, e := range r.Envelopes {
			if o := h.outbox(e.EnvelopeID); o.State != record.StateRelayed || o.UnreachableSince != 0 {
				t.Fatalf("after recovery: %+v", o)
			}
		}
	}
	if st := h.c.Stats(); st.TargetsWaiting != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Offline for 30 days: every waiting envelope expires with a recorded reason.
func TestOfflineExpiry(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = unreachable
	r1 := h.enqueue(relayA, 2, 60*24*time.Hour)
	r2 := h.enqueue(relayA, 1, 60*24*time.Hour)
	other := h.enqueue(relayN(5), 1, 60*24*time.Hour)
	t0 := h.clock.Now()
	h.start()
	h.settle()
	// Fast-forward: the wait began 30 days ago less 10 minutes (as a restarted
	// daemon would find it on disk).
	since := t0.Add(-30*24*time.Hour + 10*time.Minute).UnixMilli()
	h.stop()
	for _, r := range []store.SendRequest{r1, r2} {
		for _, e := range r.Envelopes {
			err := h.s.Update(context.Background(), record.KindOutbox, e.EnvelopeID, func(cur record.Record) (record.Record, error) {
				o := cur.(*record.Outbox)
				o.UnreachableSince, o.NextAttemptAt = since, t0.UnixMilli()
				return o, nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	before := len(h.tr.log())
	h.start()
	h.runUntil(t0.Add(15 * time.Minute))
	// Probes at 0 and 5 minutes; at 10 minutes the 30 days are over.
	var probes []time.Duration
	for _, s := range h.tr.log()[before:] {
		if s.url == relayA {
			probes = append(probes, s.at.Sub(t0))
		}
	}
	if !slices.Equal(probes, []time.Duration{0, 5 * time.Minute}) {
		t.Fatalf("probes at %v", probes)
	}
	for _, r := range []store.SendRequest{r1, r2} {
		if m := h.message(r.MessageID); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByExpired || !strings.Contains(m.LastError, "30 days") {
			t.Fatalf("message %+v", m)
		}
		for _, e := range r.Envelopes {
			o := h.outbox(e.EnvelopeID)
			if o.State != record.StateClosed || !strings.Contains(o.LastError, "unreachable for 30 days") || !strings.Contains(o.LastError, relayA) {
				t.Fatalf("outbox %+v", o)
			}
		}
	}
	if o := h.outbox(other.Envelopes[0].EnvelopeID); o.State != record.StatePending {
		t.Fatalf("another target's envelope expired: %+v", o)
	}
	if st := h.c.Stats(); st.Closed["expired"] != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// A 4xx closes the envelope and its message (refused).
func TestRefusedCloses(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		return Result{Outcome: Refused, Status: 400, Err: errors.New("HTTP 400 ENVELOPE_INVALID")}
	}
	req := h.enqueue(relayA, 1, time.Hour)
	h.start()
	h.runUntil(h.clock.Now().Add(time.Hour))
	if h.tr.count() != 1 {
		t.Fatalf("%d sends", h.tr.count())
	}
	o := h.outbox(req.Envelopes[0].EnvelopeID)
	if o.State != record.StateClosed || !strings.Contains(o.LastError, "400") || o.Lease != nil {
		t.Fatalf("outbox %+v", o)
	}
	if m := h.message(req.MessageID); m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByRefused || !strings.Contains(m.LastError, "400") {
		t.Fatalf("message %+v", m)
	}
	h.settle()
	if at := h.armed(); !at.IsZero() {
		t.Fatalf("timer armed at %v with nothing due", at)
	}
}

func (h *harness) armed() time.Time {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.c.armedAt
}

// Past the deadline the envelope closes with OUTBOX_DEADLINE_EXPIRED.
func TestDeadlineCloses(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = failed
	req := h.enqueue(relayA, 1, 20*time.Second)
	t0 := h.clock.Now()
	h.start()
	h.runUntil(t0.Add(time.Hour))
	sends := h.tr.log()
	if len(sends) != 4 { // at 0, 2, 6, 14 s; the next (30 s) is past the 20 s deadline
		t.Fatalf("%d sends: %v", len(sends), sends)
	}
	o := h.outbox(req.Envelopes[0].EnvelopeID)
	if o.State != record.StateClosed || !strings.Contains(o.LastError, errcode.OutboxDeadlineExpired.String()) {
		t.Fatalf("outbox %+v", o)
	}
	m := h.message(req.MessageID)
	if m.Status != record.StatusClosed || m.ClosedBy != record.ClosedByDeadline || m.LastError != errcode.OutboxDeadlineExpired.String() {
		t.Fatalf("message %+v", m)
	}
	if at := m.UpdatedAt; at != t0.Add(20*time.Second).UnixMilli() {
		t.Fatalf("closed at %v, want at the deadline", time.UnixMilli(at).Sub(t0))
	}
	if st := h.c.Stats(); st.Closed["deadline"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A failing store is tried again after 1 s, the delay doubling (jittered) per
// failure in a row up to 300 s: never a tight loop, never a 300 s wait for a first
// failure. Once it works again the next try delivers.
func TestStoreFailureDelaysTarget(t *testing.T) {
	var failing atomic.Bool
	var faulty *fsx.Faulty
	sopts := store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		faulty = fsx.NewFaulty(inner)
		faulty.Inject = func(op fsx.Op) error {
			if failing.Load() && op.Kind == fsx.OpCreate && (strings.HasPrefix(op.Path, "outbox/") || strings.HasPrefix(op.Path, "messages/")) {
				return syscall.EIO
			}
			return nil
		}
		return faulty
	}}
	h := newHarness(t, Options{}, sopts)
	var mu sync.Mutex
	var failedAt []time.Time // when a store write failed
	inner := faulty.Inject
	faulty.Inject = func(op fsx.Op) error {
		err := inner(op)
		if err != nil {
			mu.Lock()
			failedAt = append(failedAt, h.clock.Now())
			mu.Unlock()
		}
		return err
	}
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		if n == 1 {
			failing.Store(true) // the store breaks while the first send is out
		}
		return Result{Outcome: Accepted, Status: 200}
	}
	req := h.enqueue(relayA, 1, 24*time.Hour)
	t0 := h.clock.Now()
	h.start()
	h.runUntil(t0.Add(3600 * time.Second))
	if n := h.tr.count(); n != 1 {
		t.Fatalf("%d sends while the store failed", n)
	}
	st := h.c.Stats()
	errs := st.StoreErrors[errcode.OutboxStoreUnwritable.String()]
	// The failed settlement at 0, then lease attempts 1.25 s, 2.5 s, … 160 s apart (8),
	// then 300 s apart (10): 19.
	if errs != 19 {
		t.Fatalf("%d store errors in an hour, want 19: %+v", errs, st)
	}
	mu.Lock()
	times := slices.Compact(slices.Clone(failedAt)) // one transaction may fail two writes
	mu.Unlock()
	for i := 1; i < len(times); i++ {
		gap := times[i].Sub(times[i-1])
		want := min(1250*time.Millisecond<<(i-1), 300*time.Second)
		if gap != want {
			t.Fatalf("store attempts %d and %d %v apart, want %v", i-1, i, gap, want)
		}
	}
	failing.Store(false)
	h.runUntil(h.clock.Now().Add(300 * time.Second))
	if n := h.tr.count(); n != 2 {
		t.Fatalf("%d sends after the store recovered, want 2 (one re-send)", n)
	}
	if o := h.outbox(req.Envelopes[0].EnvelopeID); o.State != record.StateRelayed {
		t.Fatalf("outbox %+v", o)
	}
}

// A lease whose holder died is ignored once it runs out: the envelope is sent again.
func TestStaleLeaseResent(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	req := h.enqueue(relayA, 1, time.Hour)
	t0 := h.clock.Now()
	id := req.Envelopes[0].EnvelopeID
	err := h.s.Update(context.Background(), record.KindOutbox, id, func(cur record.Record) (record.Record, error) {
		o := cur.(*record.Outbox)
		o.Lease = &record.Lease{Holder: "carrier:4242:dead", Until: t0.Add(100 * time.Second).UnixMilli()}
		return o, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	h.runUntil(t0.Add(99 * time.Second))
	if h.tr.count() != 0 {
		t.Fatal("sent while another holder's lease was live")
	}
	h.runUntil(t0.Add(101 * time.Second))
	if h.tr.count() != 1 {
		t.Fatalf("%d sends after the lease ran out", h.tr.count())
	}
	if s := h.tr.log()[0]; s.at != t0.Add(100*time.Second) {
		t.Fatalf("re-sent at %v", s.at.Sub(t0))
	}
	if o := h.outbox(id); o.State != record.StateRelayed || o.Lease != nil {
		t.Fatalf("outbox %+v", o)
	}
}

// Per target, envelopes go in (message, ordinal) order.
func TestPerTargetOrder(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	var reqs []store.SendRequest
	for range 5 {
		reqs = append(reqs, h.enqueue(relayA, 3, time.Hour))
	}
	slices.SortFunc(reqs, func(a, b store.SendRequest) int { return strings.Compare(a.MessageID, b.MessageID) })
	var want []string
	for _, r := range reqs {
		for _, e := range r.Envelopes {
			want = append(want, e.EnvelopeID)
		}
	}
	h.start()
	h.settle()
	var got []string
	for _, s := range h.tr.log() {
		got = append(got, s.envelopeID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// The one timer: armed at the earliest due time, replaced by an earlier one, clamped
// to the sweep interval, disarmed when nothing is due.
func TestTimer(t *testing.T) {
	h := newHarness(t, Options{}, store.Options{})
	h.tr.answer = failed
	t0 := h.clock.Now()
	h.start()
	h.settle()
	if at := h.armed(); !at.IsZero() {
		t.Fatalf("armed at %v with an empty outbox", at)
	}
	req := h.enqueue(relayA, 1, 24*time.Hour)
	h.kick()
	if h.tr.count() != 1 || !h.armed().Equal(t0.Add(2*time.Second)) {
		t.Fatalf("sends %d, armed %v", h.tr.count(), h.armed().Sub(t0))
	}
	// A far date is clamped to the sweep interval.
	err := h.s.Update(context.Background(), record.KindOutbox, req.Envelopes[0].EnvelopeID, func(cur record.Record) (record.Record, error) {
		o := cur.(*record.Outbox)
		o.NextAttemptAt = t0.Add(10 * time.Hour).UnixMilli()
		return o, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.kick()
	if got := h.armed().Sub(t0); got != defaultSweepEvery {
		t.Fatalf("armed %v ahead, want the clamp %v", got, defaultSweepEvery)
	}
	// An earlier due time replaces it.
	h.enqueue(relayN(3), 1, 24*time.Hour)
	h.tr.answer = func(ctx context.Context, url, id string, n int) Result {
		return Result{Outcome: Failed, RetryAfter: 30 * time.Second}
	}
	h.kick()
	if got := h.armed().Sub(t0); got != 30*time.Second {
		t.Fatalf("armed %v ahead, want 30 s", got)
	}
}
