package carrier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The numbers of DESIGN §11 (see docs/CARRIER.md for why).
const (
	maxTargetsDefault        = 16
	defaultBackoffMin        = 2 * time.Second
	defaultBackoffMax        = 300 * time.Second
	defaultProbeMin          = time.Second
	defaultProbeEvery        = 300 * time.Second
	defaultOfflineLimit      = 30 * 24 * time.Hour
	defaultSweepEvery        = 5 * time.Minute
	defaultStoreRetryMin     = time.Second
	defaultStoreFailureDelay = 300 * time.Second
	defaultPollEvery         = 2 * time.Second
	// leaseMargin is how much longer than one send a lease lasts (the settlement).
	leaseMargin = 30 * time.Second
	// settleTimeout bounds a settlement that runs after Run's ctx was cancelled.
	settleTimeout = 10 * time.Second
)

// WatchMode selects how writes by other processes are noticed.
type WatchMode int

const (
	// WatchAuto uses inotify and falls back to stamp polling.
	WatchAuto WatchMode = iota
	// WatchInotify uses inotify only (no fallback).
	WatchInotify
	// WatchPoll polls the listing stamps every PollEvery.
	WatchPoll
	// WatchOff relies on Kick and the sweep only (tests).
	WatchOff
)

// Options configure a Carrier. Zero fields take the defaults of DESIGN §11.
type Options struct {
	Clock    Clock  // default: the wall clock
	HolderID string // this process's lease holder name (default "carrier:<pid>:<random>")
	// MaxTargets bounds the targets (relay URLs) with an attempt in flight (16).
	MaxTargets int
	// SendTimeout bounds one attempt (150 s); LeaseFor is the lease an attempt takes
	// (SendTimeout + 30 s).
	SendTimeout, LeaseFor time.Duration
	// BackoffMin and BackoffMax bound the retry delay of a failed attempt (2 s, 300 s).
	BackoffMin, BackoffMax time.Duration
	// ProbeMin is the first probe's delay after a target became unreachable (1 s);
	// the delay grows with the wait's length (about doubling, jittered) to
	// ProbeEvery, the longest probe interval (300 s). OfflineLimit is how long a
	// target may stay unreachable before its envelopes expire (30 days).
	ProbeMin, ProbeEvery, OfflineLimit time.Duration
	// SweepEvery is the reconciliation backstop and the longest timer (5 min).
	SweepEvery time.Duration
	// StoreRetryMin is how long a target waits after a store error (1 s), doubling
	// with each further failure in a row to StoreFailureDelay (300 s). The first
	// store transaction that succeeds ends every such wait.
	StoreRetryMin, StoreFailureDelay time.Duration
	// TakeOverLeases says that no other holder of this store's leases is alive (the
	// daemon's pid lock proves its predecessor dead): Run first releases every
	// lease of another holder, so that an envelope a dead carrier had in flight is
	// sent again at once (the relay de-duplicates) instead of after its lease.
	TakeOverLeases bool
	// Watch selects change notification; PollEvery is the stamp polling interval (2 s).
	Watch     WatchMode
	PollEvery time.Duration
	// MaxPerPass bounds the envelopes one dispatch of a target sends (64) before the
	// schedule is looked at again.
	MaxPerPass int
	Logger     *slog.Logger
	// Events, if set, is told of every settled attempt and of the store's failures
	// and successes (see Event): the daemon logs delivery failures from them. It is
	// called from the carrier's goroutines and must return quickly.
	Events func(Event)
	// Jitter returns a number in [0, 1); default math/rand/v2.
	Jitter func() float64
	// UploadChunk bounds one request of a blob body's upload (64 MiB): the relay
	// makes each request durable before it answers, so an upload that is cut
	// resumes from its end at worst (blob.go).
	UploadChunk int64
	// Identity is the store's owner. With it, and a transport that is a
	// HeadTransport, the carrier checks each receipt's SenderSeq against the
	// store's head and asks the relay for its signed head when the relay has
	// witnessed a newer one (docs/CARRIER.md "The head witness"); without it no relay's
	// receipt is checked (a restored store is then caught by the local witness
	// and the daemon's start only).
	Identity *identity.Identity
}

func (o Options) withDefaults() Options {
	if o.Clock == nil {
		o.Clock = wallClock{}
	}
	if o.HolderID == "" {
		o.HolderID = fmt.Sprintf("carrier:%d:%s", os.Getpid(), uuid.NewString()[:8])
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if o.MaxTargets <= 0 {
		o.MaxTargets = maxTargetsDefault
	}
	def(&o.SendTimeout, defaultSendTimeout)
	def(&o.LeaseFor, o.SendTimeout+leaseMargin)
	def(&o.BackoffMin, defaultBackoffMin)
	def(&o.BackoffMax, defaultBackoffMax)
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = o.BackoffMin
	}
	def(&o.ProbeEvery, defaultProbeEvery)
	def(&o.ProbeMin, min(defaultProbeMin, o.ProbeEvery))
	o.ProbeMin = min(o.ProbeMin, o.ProbeEvery)
	def(&o.OfflineLimit, defaultOfflineLimit)
	def(&o.SweepEvery, defaultSweepEvery)
	def(&o.StoreFailureDelay, defaultStoreFailureDelay)
	def(&o.StoreRetryMin, min(defaultStoreRetryMin, o.StoreFailureDelay))
	o.StoreRetryMin = min(o.StoreRetryMin, o.StoreFailureDelay)
	def(&o.PollEvery, defaultPollEvery)
	if o.MaxPerPass <= 0 {
		o.MaxPerPass = 64
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
	if o.UploadChunk <= 0 {
		o.UploadChunk = defaultUploadChunk
	}
	return o
}

// Carrier delivers one store's outbox to its relays (DESIGN §11). Create it with New,
// run it with Run; Kick tells it that a local write happened.
type Carrier struct {
	s  *store.Store
	t  Transport
	o  Options
	st stats

	kick chan struct{}
	done chan passResult

	running atomic.Bool

	// Test hooks, nil outside tests: onPass is called as a pass of a target begins,
	// onLease after an attempt's lease step with whether this holder took the lease.
	onPass  func(target string)
	onLease func(envelopeID string, leased bool)
	// onRenew is called after each lease renewal of an upload with whether the
	// lease was still this holder's.
	onRenew func(envelopeID string, kept bool)

	// Loop-owned state (only Run's goroutine touches these).
	inflight     map[string]bool      // targets with a pass running
	blocked      map[string]time.Time // targets delayed (store failure, no progress)
	storeBlocked map[string]bool      // of blocked, those delayed by a store failure
	storeFails   int                  // store failures in a row (the delay's exponent)
	tookOver     bool                 // TakeOverLeases is done
	stopErr      error                // the store is rolled back: dispatch no more
	timer        Timer
	timerAt      time.Time

	// expMu guards expedite: the envelopes an operator's retry asked to attempt
	// at once, whatever their target's wait (Expedite).
	expMu    sync.Mutex
	expedite map[string]bool

	// mu guards the observation fields below (tests and Stats).
	mu        sync.Mutex
	loopIdle  bool      // the loop is waiting for an event
	loopGen   uint64    // how often the loop went idle
	nInflight int       // targets in flight when the loop last looked
	armedAt   time.Time // the due timer's time (zero: disarmed)
}

// New returns a carrier for s that sends through t.
func New(s *store.Store, t Transport, opts Options) *Carrier {
	o := opts.withDefaults()
	return &Carrier{s: s, t: t, o: o, kick: make(chan struct{}, 1), done: make(chan passResult, o.MaxTargets),
		inflight: map[string]bool{}, blocked: map[string]time.Time{}, storeBlocked: map[string]bool{},
		expedite: map[string]bool{}, st: newStats()}
}

// Kick tells the carrier that the store changed (the daemon calls it after Enqueue).
// It never blocks.
func (c *Carrier) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Expedite asks for an attempt of each listed pending envelope at once, whatever
// its target's wait: in a waiting target it is the probe. It overrides only the
// wait (and the plan's due time): the lease step still re-reads the record and
// skips one that is held, leased by another live holder, or whose own
// nextAttemptAt is still to come — so it is for envelopes an operator's retry made
// due (Apply, through Act). It lasts until the envelope's next lease step (or until
// it is no longer dispatchable), in memory only: the durable side of a retry is
// Apply's. Safe for concurrent use; it kicks the carrier.
func (c *Carrier) Expedite(envelopeIDs []string) {
	if len(envelopeIDs) == 0 {
		return
	}
	c.expMu.Lock()
	for _, id := range envelopeIDs {
		c.expedite[id] = true
	}
	c.expMu.Unlock()
	c.Kick()
}

// expedited returns a copy of the expedite set (nil if empty).
func (c *Carrier) expedited() map[string]bool {
	c.expMu.Lock()
	defer c.expMu.Unlock()
	if len(c.expedite) == 0 {
		return nil
	}
	out := make(map[string]bool, len(c.expedite))
	for id := range c.expedite {
		out[id] = true
	}
	return out
}

// unexpedite forgets envelope ids (their lease step came, or they left the plan).
func (c *Carrier) unexpedite(ids ...string) {
	c.expMu.Lock()
	for _, id := range ids {
		delete(c.expedite, id)
	}
	c.expMu.Unlock()
}

// passResult is what one target's pass reports to the loop.
type passResult struct {
	target   string
	progress bool  // something was attempted, closed or expired
	err      error // a store error: the target waits storeDelay
}

// Run delivers until ctx is done, then waits for the attempts in flight to settle
// and returns ctx's error. When the store is rolled back (it says so, refuses a
// write as STORE_ROLLED_BACK, or a relay's signed head proves it: EventRolledBack)
// Run dispatches nothing more: it cancels the attempts in flight, waits for them
// (their settlements are refused: the envelopes stay pending, their records as
// they were) and returns the STORE_ROLLED_BACK error. A Carrier runs at most once
// at a time.
func (c *Carrier) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("carrier: already running")
	}
	defer c.running.Store(false)
	c.stopErr = nil
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.watch(ctx) })
	sweep := c.o.Clock.NewTimer(c.o.SweepEvery)
	defer func() {
		sweep.Stop()
		c.arm(time.Time{}, time.Time{})
		cancel()
		wg.Wait()
		c.drainDone()
		c.st.inFlight.Store(int64(len(c.inflight)))
	}()
	for {
		c.reconcile(ctx, &wg)
		if c.stopErr != nil {
			return c.stopErr
		}
		c.setIdle(true)
		var due <-chan time.Time
		if c.timer != nil {
			due = c.timer.C()
		}
		select {
		case <-ctx.Done():
			c.setIdle(false)
			return ctx.Err()
		case <-c.kick:
		case <-due:
			c.timer = nil
		case <-sweep.C():
			sweep = c.o.Clock.NewTimer(c.o.SweepEvery)
			c.st.sweeps.Add(1)
		case r := <-c.done:
			c.finish(r)
		}
		c.setIdle(false)
		// Collect every other pass that ended meanwhile before planning again.
		for more := true; more; {
			select {
			case r := <-c.done:
				c.finish(r)
			default:
				more = false
			}
		}
	}
}

func (c *Carrier) setIdle(v bool) {
	c.mu.Lock()
	c.loopIdle = v
	if v {
		c.loopGen++
	}
	c.nInflight = len(c.inflight)
	c.mu.Unlock()
	c.st.inFlight.Store(int64(len(c.inflight)))
}

func (c *Carrier) drainDone() {
	for {
		select {
		case r := <-c.done:
			c.finish(r)
		default:
			return
		}
	}
}

// finish records the end of a target's pass.
func (c *Carrier) finish(r passResult) {
	delete(c.inflight, r.target)
	now := c.o.Clock.Now()
	switch {
	case rolledBack(r.err):
		c.rolledBack(r.target, r.err)
		return
	case r.err != nil:
		c.storeError(r.err)
		delay := c.storeDelay()
		c.storeWarn("carrier: store failure, target delayed", "target", r.target, "delay", delay, "err", r.err)
		c.blocked[r.target] = now.Add(delay)
		c.storeBlocked[r.target] = true
		c.event(Event{Kind: EventStoreError, Target: r.target, Err: r.err})
		return
	}
	delete(c.storeBlocked, r.target) // its pass ran: whatever delays it now is not the store's
	if r.progress {
		c.storeRecovered() // something was written: the store works
	}
	switch {
	case !r.progress:
		// Due by the index but nothing could be done (another process holds it, or
		// the index lagged): never spin.
		c.blocked[r.target] = now.Add(c.o.BackoffMin)
	default:
		delete(c.blocked, r.target)
	}
	c.event(Event{Kind: EventStoreOK, Target: r.target})
}

// storeDelay counts a store failure and returns how long to wait before the store
// is tried again: StoreRetryMin doubling per failure in a row, jittered by [1, 1.5),
// at most StoreFailureDelay. A store failure is the store's, not the relay's: it
// never starts a target wait.
func (c *Carrier) storeDelay() time.Duration {
	c.storeFails++
	d := c.o.StoreRetryMin
	for i := 1; i < c.storeFails && d < c.o.StoreFailureDelay; i++ {
		d *= 2
	}
	d = time.Duration(float64(d) * (1 + 0.5*c.o.Jitter()))
	return min(max(d, c.o.StoreRetryMin), c.o.StoreFailureDelay)
}

// storeRecovered ends every delay a store failure caused: a pass just ended
// without a store error, so nothing waits on a failure that has cleared.
func (c *Carrier) storeRecovered() {
	c.storeFails = 0
	for t := range c.storeBlocked {
		delete(c.blocked, t)
		delete(c.storeBlocked, t)
	}
}

// storeWarn logs a store failure: a warning, or at debug level when Events
// receives it (the receiver logs it then).
func (c *Carrier) storeWarn(msg string, args ...any) {
	if c.o.Events != nil {
		c.o.Logger.Debug(msg, args...)
		return
	}
	c.o.Logger.Warn(msg, args...)
}

func (c *Carrier) storeError(err error) {
	code := errcode.Of(err)
	if code == "" {
		code = "OTHER"
	}
	c.st.storeError(code)
}

// reconcile reads the outbox index, dispatches due targets up to MaxTargets, and arms
// the one timer at the earliest due time among the targets not in flight.
func (c *Carrier) reconcile(ctx context.Context, wg *sync.WaitGroup) {
	if ctx.Err() != nil {
		return
	}
	if c.stopErr != nil {
		return
	}
	if err := c.s.RolledBack(); err != nil {
		c.rolledBack("", err)
		return
	}
	c.st.reconciles.Add(1)
	now := c.o.Clock.Now()
	if c.o.TakeOverLeases && !c.tookOver {
		n, err := c.takeOverLeases(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if rolledBack(err) {
				c.rolledBack("", err)
				return
			}
			c.storeError(err)
			delay := c.storeDelay()
			c.storeWarn("carrier: the leases of a dead carrier could not be taken over", "delay", delay, "err", err)
			c.arm(now, now.Add(delay))
			c.event(Event{Kind: EventStoreError, Err: err})
			return
		}
		c.tookOver = true
		if n > 0 {
			c.o.Logger.Info("carrier: took over the leases of a dead carrier", "envelopes", n)
		}
	}
	exp := c.expedited()
	plans, err := c.plan(ctx, now, exp)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if rolledBack(err) {
			c.rolledBack("", err)
			return
		}
		c.storeError(err)
		delay := c.storeDelay()
		c.storeWarn("carrier: the schedule could not be read", "delay", delay, "err", err)
		c.arm(now, now.Add(delay))
		c.event(Event{Kind: EventStoreError, Err: err})
		return
	}
	c.event(Event{Kind: EventStoreOK})
	if exp != nil {
		// Forget what is no longer dispatchable: it will never reach a lease step.
		for _, tp := range plans {
			for i := range tp.envs {
				delete(exp, tp.envs[i].EnvelopeID)
			}
		}
		gone := make([]string, 0, len(exp))
		for id := range exp {
			gone = append(gone, id)
		}
		c.unexpedite(gone...)
	}
	var next time.Time
	waiting := 0
	for _, tp := range plans {
		if tp.waiting {
			waiting++
		}
		if c.inflight[tp.url] {
			continue
		}
		due := time.UnixMilli(tp.due)
		if b, ok := c.blocked[tp.url]; ok {
			if b.After(now) {
				due = laterOf(due, b)
			} else {
				delete(c.blocked, tp.url)
			}
		}
		if !due.After(now) && len(c.inflight) < c.o.MaxTargets {
			c.inflight[tp.url] = true
			wg.Go(func() { c.done <- c.pass(ctx, tp) })
			continue
		}
		if len(c.inflight) < c.o.MaxTargets && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	c.st.targetsWaiting.Store(int64(waiting))
	c.st.targets.Store(int64(len(plans)))
	c.arm(now, next)
}

// rolledBack reports whether err is the store's STORE_ROLLED_BACK.
func rolledBack(err error) bool {
	return errors.Is(err, errcode.StoreRolledBack)
}

// rolledBack stops dispatching: the store is rolled back (err, learnt through
// target's pass, or "" for the schedule). Reported once per Run.
func (c *Carrier) rolledBack(target string, err error) {
	if c.stopErr != nil {
		return
	}
	c.stopErr = err
	c.o.Logger.Error("carrier: the store is rolled back: dispatching stopped", "target", target, "err", err,
		"hint", errcode.HintOf(err))
	c.event(Event{Kind: EventRolledBack, Target: target, Err: err})
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// arm keeps the one due timer at at (zero: disarmed), clamped to SweepEvery from now.
func (c *Carrier) arm(now, at time.Time) {
	if !at.IsZero() && at.Sub(now) > c.o.SweepEvery {
		at = now.Add(c.o.SweepEvery)
	}
	if c.timer != nil && at.Equal(c.timerAt) {
		return
	}
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	c.timerAt = at
	c.mu.Lock()
	c.armedAt = at
	c.mu.Unlock()
	if at.IsZero() {
		return
	}
	c.timer = c.o.Clock.NewTimer(max(0, at.Sub(now)))
}
