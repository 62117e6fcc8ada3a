//go:build race

package envelope_test

// raceEnabled: the exhaustive tests sample instead (this package runs no
// goroutines of its own; the race detector only slows them down).
const raceEnabled = true
