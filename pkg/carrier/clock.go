package carrier

import "time"

// Clock is the carrier's source of time and timers. The default is the wall clock;
// tests inject a fake one so that no test sleeps.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that delivers the time on its channel once, after d.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it was still armed.
	Stop() bool
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) NewTimer(d time.Duration) Timer { return wallTimer{time.NewTimer(d)} }

type wallTimer struct{ t *time.Timer }

func (w wallTimer) C() <-chan time.Time { return w.t.C }
func (w wallTimer) Stop() bool          { return w.t.Stop() }

// WallClock returns the wall clock, the default Clock.
func WallClock() Clock { return wallClock{} }
