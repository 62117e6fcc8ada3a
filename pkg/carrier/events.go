package carrier

import "time"

// EventKind says what an Event reports.
type EventKind int

const (
	// EventAttempt: an attempt's outcome was settled in the store.
	EventAttempt EventKind = iota
	// EventStoreError: the store failed the carrier, for a target's pass or (Target
	// "") for reading the schedule.
	EventStoreError
	// EventStoreOK: a target's pass (or, Target "", the schedule) worked with the
	// store. Reported at every success, so a receiver keeps a state, not a count.
	EventStoreOK
	// EventRolledBack: the store is rolled back (STORE_ROLLED_BACK, in Err): a
	// relay (Target) answered a receipt naming a head newer than the store's and
	// its signed head proved it (store.Store.Witness), or the store refused a
	// write as rolled back (Target: the pass's, or "" for the schedule). The
	// carrier stops dispatching: Run returns that error once its passes have
	// ended. Nothing the relay accepted meanwhile is lost: those envelopes stay
	// pending (sealbridge-fsck --reconcile brings them forward). Reported once.
	EventRolledBack
)

// Event is what the carrier tells Options.Events. Its texts never contain envelope
// or payload bytes.
type Event struct {
	Kind   EventKind
	Target string // the relay URL; "" for the schedule
	// For EventAttempt: the envelope, the outcome, the HTTP status (0 if none), the
	// outcome in words (what lastError records) and, for a failed or unreachable
	// attempt, when the envelope is due again.
	EnvelopeID  string
	Outcome     Outcome
	Status      int
	Reason      string
	NextAttempt time.Time
	// For EventStoreError and EventRolledBack: the store's error.
	Err error
}

func (c *Carrier) event(e Event) {
	if c.o.Events != nil {
		c.o.Events(e)
	}
}
