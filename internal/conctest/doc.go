// Package conctest is the concurrency explorer (DESIGN §16, docs/TESTING.md): where
// internal/crashtest proves each store operation alone against every crash, this
// package races them. Many goroutines in several processes, each process with its own
// store.Store on one directory, issue random operations over a deliberately small space
// (the same few idempotency keys, message ids and relays), in bursts behind a start
// gate, mixed with operator actions, maintenance, inbound delivery confirmations and
// each process's carrier leasing and settling against a scripted relay.
//
// Every call and its answer is recorded with the system-wide monotonic clock
// (CLOCK_MONOTONIC), so the histories of the processes merge into one. The merged
// history is then checked for linearizability with github.com/anishathalye/porcupine
// against the sequential model of the store's API in model.go: every answer a caller
// got must be explained by one sequential order of all the calls, in which the effects
// of the background actors (the carriers, maintenance) are spontaneous transitions
// between the calls. The history is partitioned per idempotency key and per message
// id, so that checking stays fast.
//
// This package holds what is independent of the store: the history and its recorder
// (history.go), the model (model.go) and the checker (check.go). The explorer that runs
// the store lives in its tests (explore_test.go and the files beside it), which also
// check, after every run, the invariants that are not about the order of answers.
package conctest
