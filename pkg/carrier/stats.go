package carrier

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Stats is a snapshot of the carrier's counters and gauges, for the daemon's metrics.
type Stats struct {
	// Attempts counts sends by outcome: "accepted", "refused", "failed", "unreachable".
	Attempts map[string]uint64
	// Closed counts envelopes closed without an attempt's verdict, by reason:
	// "deadline" (OUTBOX_DEADLINE_EXPIRED) and "expired" (OfflineLimit reached).
	Closed map[string]uint64
	// StoreErrors counts store failures by error code ("OTHER" if uncoded).
	StoreErrors map[string]uint64
	// LeaseSkips counts envelopes that were due by the index but could not be leased
	// (changed or leased by another process meanwhile).
	LeaseSkips uint64
	// Targets is the number of targets with pending envelopes at the last
	// reconciliation; TargetsWaiting those of them in a persisted unreachable wait.
	Targets, TargetsWaiting int
	// InFlight is the number of targets with a pass running.
	InFlight int
	// Reconciles and Sweeps count schedule computations and backstop sweeps.
	Reconciles, Sweeps uint64
	// Notifications counts change notifications (inotify events or stamp changes).
	Notifications uint64
	// Watch names the change notification in use: "inotify", "poll" or "off".
	Watch string
	// UploadedBytes counts the blob body bytes relays acknowledged as durable
	// (their offset moved forward by that much).
	UploadedBytes uint64
	// HeadChecks counts the relays' signed heads fetched because a receipt named a
	// head newer than the store's (the head witness, witness.go).
	HeadChecks uint64
}

type stats struct {
	mu          sync.Mutex
	attempts    map[string]uint64
	closed      map[string]uint64
	storeErrors map[string]uint64
	watch       string

	leaseSkips, reconciles, sweeps, notifications, uploaded, headChecks atomic.Uint64
	targets, targetsWaiting, inFlight                                   atomic.Int64
}

func newStats() stats {
	return stats{attempts: map[string]uint64{}, closed: map[string]uint64{}, storeErrors: map[string]uint64{}, watch: "off"}
}

func (s *stats) attempt(o Outcome)      { s.add(s.attempts, o.String()) }
func (s *stats) close(reason string)    { s.add(s.closed, reason) }
func (s *stats) storeError(code string) { s.add(s.storeErrors, code) }

func (s *stats) add(m map[string]uint64, k string) {
	s.mu.Lock()
	m[k]++
	s.mu.Unlock()
}

func (s *stats) setWatch(w string) {
	s.mu.Lock()
	s.watch = w
	s.mu.Unlock()
}

// Stats returns a snapshot of the counters.
func (c *Carrier) Stats() Stats {
	s := &c.st
	s.mu.Lock()
	out := Stats{Attempts: maps.Clone(s.attempts), Closed: maps.Clone(s.closed), StoreErrors: maps.Clone(s.storeErrors), Watch: s.watch}
	s.mu.Unlock()
	out.LeaseSkips = s.leaseSkips.Load()
	out.Reconciles = s.reconciles.Load()
	out.Sweeps = s.sweeps.Load()
	out.Notifications = s.notifications.Load()
	out.UploadedBytes = s.uploaded.Load()
	out.HeadChecks = s.headChecks.Load()
	out.Targets = int(s.targets.Load())
	out.TargetsWaiting = int(s.targetsWaiting.Load())
	out.InFlight = int(s.inFlight.Load())
	return out
}
