// Package bench holds sealbridge's comparative benchmarks: every
// figure of the store is measured in the same run, on the same disk, beside its
// physical floor (raw temp+write+fsync+rename+fsync-dir, Ed25519, a raw warm scan) and
// beside SQLite (WAL, synchronous=FULL) and bbolt doing the same durable work on the
// same signed record bytes; the carrier's delivery to a reference relay in this
// process is measured beside that relay's raw accept rate; the relay's accept rate
// (file backend, and pkg/relay/jsstore on in-process NATS servers) beside the raw
// durable create and a plain JetStream publish.
//
// Everything lives in _test.go files, so SQLite and bbolt are test-only dependencies
// and the package adds no import edge to the package map:
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/bench    # every benchmark once (CI smoke)
//	SEALBRIDGE_BENCH_REPORT=1 go test -run TestBenchReport -v -timeout 30m ./internal/bench
//	SEALBRIDGE_BENCH_REPORT=1 SEALBRIDGE_BENCH_QUICK=1 go test -run TestBenchReport -v ./internal/bench
//
// TestBenchReport runs the benchmarks interleaved (floor, ours, SQLite, bbolt, floor,
// ours, …) for at least five rounds and prints a markdown table of medians and of the
// paired ratios ours/floor and ours/SQLite (`just bench`, `just bench quick`).
// docs/PERFORMANCE.md explains the table.
package bench
