package bench

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The report: every benchmark of this package run interleaved (floor, ours, SQLite,
// bbolt, floor, ours, …) for several rounds, then one table of medians and of paired
// ratios. Run it with `just bench` (or `just bench quick`):
//
//	SEALBRIDGE_BENCH_REPORT=1 go test -run TestBenchReport -v -timeout 30m ./internal/bench
//
// Environment:
//
//	SEALBRIDGE_BENCH_REPORT=1   run the report (otherwise the test is skipped)
//	SEALBRIDGE_BENCH_QUICK=1    short benchtime, smaller backlogs, optional benchmarks left out: a few minutes
//	SEALBRIDGE_BENCH_RUNS=N     rounds (default 5, at least 5 for the table)
//	SEALBRIDGE_BENCH_TIME=d     benchtime of each benchmark (default 1s; quick 30ms)
//	SEALBRIDGE_BENCH_OUT=file   also write the markdown table to file
//	SEALBRIDGE_BENCH_ONLY=re    only the rows whose benchmark or baseline name matches re

// bench is one benchmark of this package and the metric a row reads from it.
type bench struct {
	name string
	fn   func(*testing.B)
	unit string // a metric the benchmark reports (b.ReportMetric)
	// optional benchmarks are left out of quick reports.
	optional bool
	// minTime, if set, is the shortest benchtime the benchmark runs for in any report:
	// what it measures only shows under a sustained load (the senders on a store with
	// history reconcile their indexes only once publications keep coming).
	minTime time.Duration
}

func (b bench) with(unit string) bench { b.unit = unit; return b }

var (
	floorCreate1   = bench{name: "FloorCreate1", fn: BenchmarkFloorCreate1, unit: "records/s"}
	floorCreate8   = bench{name: "FloorCreate8", fn: BenchmarkFloorCreate8, unit: "records/s"}
	floorGroup16   = bench{name: "FloorGroup16", fn: BenchmarkFloorGroup16, unit: "records/s"}
	floorSyncfs16  = bench{name: "FloorGroup16Syncfs", fn: BenchmarkFloorGroup16Syncfs, unit: "records/s", optional: true}
	floorSign      = bench{name: "FloorSign", fn: BenchmarkFloorSign, unit: "signs/s"}
	floorVerify    = bench{name: "FloorVerify", fn: BenchmarkFloorVerify, unit: "verifies/s"}
	floorScan      = bench{name: "FloorScan10k", fn: BenchmarkFloorScan10k, unit: "records/s"}
	floorReadDir   = bench{name: "FloorReadDir10k", fn: BenchmarkFloorReadDir10k, unit: "lists/s"}
	storeWrite1    = bench{name: "StoreWrite1", fn: BenchmarkStoreWrite1, unit: "records/s"}
	storePrepared  = bench{name: "StorePrepared16", fn: BenchmarkStorePrepared16, unit: "records/s"}
	storeEnqueue2  = bench{name: "StoreEnqueue2", fn: BenchmarkStoreEnqueue2, unit: "msgs/s"}
	storeSenders8  = bench{name: "StoreSenders8", fn: BenchmarkStoreSenders8, unit: "msgs/s", minTime: sendersMinTime}
	storeFull8     = bench{name: "StoreSenders8Full10k", fn: BenchmarkStoreSenders8Full10k, unit: "msgs/s", minTime: sendersMinTime}
	storeFull100k  = bench{name: "StoreSenders8Full100k", fn: BenchmarkStoreSenders8Full100k, unit: "msgs/s", minTime: sendersMinTime}
	deliverRelay   = bench{name: "CarrierDeliverOneRelay", fn: BenchmarkCarrierDeliverOneRelay, unit: "env/s"}
	lockCycle      = bench{name: "LockHoldUnreachable", fn: BenchmarkLockHoldUnreachable, unit: "max-hold-ms"}
	lockBackup     = bench{name: "LockHoldBackup", fn: BenchmarkLockHoldBackup, unit: "max-hold-ms"}
	storePut8      = bench{name: "StorePut8", fn: BenchmarkStorePut8, unit: "records/s"}
	storeTx8       = bench{name: "StoreTx8", fn: BenchmarkStoreTx8, unit: "records/s", optional: true}
	storeCached    = bench{name: "StoreReadCached", fn: BenchmarkStoreReadCached, unit: "reads/s"}
	storeCold      = bench{name: "StoreReadCold", fn: BenchmarkStoreReadCold, unit: "reads/s"}
	storeList      = bench{name: "StoreList10kCached", fn: BenchmarkStoreList10kCached, unit: "lists/s"}
	storeListMoved = bench{name: "StoreList10kAfterChange", fn: BenchmarkStoreList10kAfterChange, unit: "lists/s"}
	storeFsck      = bench{name: "StoreFsck10k", fn: BenchmarkStoreFsck10k, unit: "records/s"}
	churnFresh     = bench{name: "ChurnFresh", fn: BenchmarkChurnFresh, unit: "records/s"}
	churnDeleted   = bench{name: "ChurnAfterDelete20k", fn: BenchmarkChurnAfterDelete20k, unit: "records/s"}
	storeRemove1   = bench{name: "StoreRemove1", fn: BenchmarkStoreRemove1, unit: "records/s", optional: true}
	sqliteTx1      = bench{name: "SQLiteTx1", fn: BenchmarkSQLiteTx1, unit: "records/s"}
	sqliteTx4      = bench{name: "SQLiteTx4", fn: BenchmarkSQLiteTx4, unit: "tx/s"}
	sqliteTx16     = bench{name: "SQLiteTx16", fn: BenchmarkSQLiteTx16, unit: "records/s"}
	sqlite8        = bench{name: "SQLite8", fn: BenchmarkSQLite8, unit: "records/s"}
	sqlite8Msg     = bench{name: "SQLite8Msg", fn: BenchmarkSQLite8Msg, unit: "tx/s"}
	floorAppend1   = bench{name: "FloorAppend1", fn: BenchmarkFloorAppend1, unit: "records/s"}
	sqlite8Conns   = bench{name: "SQLite8Conns", fn: BenchmarkSQLite8Conns, unit: "records/s", optional: true}
	sqliteRead     = bench{name: "SQLiteRead", fn: BenchmarkSQLiteRead, unit: "reads/s"}
	sqliteList     = bench{name: "SQLiteList10k", fn: BenchmarkSQLiteList10k, unit: "lists/s"}
	sqliteScan10k  = bench{name: "SQLiteScan10k", fn: BenchmarkSQLiteScan10k, unit: "records/s", optional: true}
	boltPut1       = bench{name: "BoltPut1", fn: BenchmarkBoltPut1, unit: "records/s"}
	boltPut4       = bench{name: "BoltPut4", fn: BenchmarkBoltPut4, unit: "tx/s"}
	boltPut16      = bench{name: "BoltPut16", fn: BenchmarkBoltPut16, unit: "records/s"}
	bolt8          = bench{name: "Bolt8", fn: BenchmarkBolt8, unit: "records/s"}
	boltRead       = bench{name: "BoltRead", fn: BenchmarkBoltRead, unit: "reads/s"}
	boltList       = bench{name: "BoltList10k", fn: BenchmarkBoltList10k, unit: "lists/s"}
	boltScan10k    = bench{name: "BoltScan10k", fn: BenchmarkBoltScan10k, unit: "records/s", optional: true}
	partLock       = bench{name: "PartLock", fn: BenchmarkPartLock, unit: "locks/s", optional: true}
	partFsxWrite   = bench{name: "PartFsxWrite", fn: BenchmarkPartFsxWrite, unit: "records/s", optional: true}
	partEncode     = bench{name: "PartEncode", fn: BenchmarkPartEncode, unit: "records/s", optional: true}
	partFsxLstat   = bench{name: "PartFsxLstat", fn: BenchmarkPartFsxLstat, unit: "lstats/s", optional: true}
	partRawLstat   = bench{name: "PartRawLstat", fn: BenchmarkPartRawLstat, unit: "lstats/s", optional: true}
	relayAccept1   = bench{name: "RelayAccept1", fn: BenchmarkRelayAccept1, unit: "env/s"}
	relayBatch64   = bench{name: "RelayAcceptBatch64", fn: BenchmarkRelayAcceptBatch64, unit: "env/s"}
	relayHTTP1     = bench{name: "RelayAcceptHTTP1", fn: BenchmarkRelayAcceptHTTP1, unit: "env/s", optional: true}
	relayHTTP64    = bench{name: "RelayAcceptHTTPBatch64", fn: BenchmarkRelayAcceptHTTPBatch64, unit: "env/s", optional: true}
	relayJS1       = bench{name: "RelayAcceptJetStream1", fn: BenchmarkRelayAcceptJetStream1, unit: "env/s"}
	relayJS64      = bench{name: "RelayAcceptJetStreamBatch64", fn: BenchmarkRelayAcceptJetStreamBatch64, unit: "env/s"}
	relayJSR3_1    = bench{name: "RelayAcceptJetStreamCluster1", fn: BenchmarkRelayAcceptJetStreamCluster1, unit: "env/s", optional: true}
	relayJSR3_64   = bench{name: "RelayAcceptJetStreamClusterBatch64", fn: BenchmarkRelayAcceptJetStreamClusterBatch64, unit: "env/s", optional: true}
	jsPut1         = bench{name: "JetStreamPut1", fn: BenchmarkJetStreamPut1, unit: "env/s"}
	jsPut16        = bench{name: "JetStreamPut16", fn: BenchmarkJetStreamPut16, unit: "env/s"}
	jsPub1         = bench{name: "FloorJetStreamPublish1", fn: BenchmarkFloorJetStreamPublish1, unit: "env/s"}
	jsPub16        = bench{name: "FloorJetStreamPublish16", fn: BenchmarkFloorJetStreamPublish16, unit: "env/s"}
	jsR3Put1       = bench{name: "JetStreamClusterPut1", fn: BenchmarkJetStreamClusterPut1, unit: "env/s", optional: true}
	jsR3Put16      = bench{name: "JetStreamClusterPut16", fn: BenchmarkJetStreamClusterPut16, unit: "env/s", optional: true}
	jsR3Pub1       = bench{name: "FloorJetStreamClusterPublish1", fn: BenchmarkFloorJetStreamClusterPublish1, unit: "env/s", optional: true}
	jsR3Pub16      = bench{name: "FloorJetStreamClusterPublish16", fn: BenchmarkFloorJetStreamClusterPublish16, unit: "env/s", optional: true}
	sealBlob       = bench{name: "SealBlob", fn: BenchmarkSealBlob, unit: "MiB/s"}
	floorAEAD      = bench{name: "FloorAEAD", fn: BenchmarkFloorAEAD, unit: "MiB/s"}
	floorAEADHash  = bench{name: "FloorAEADHash", fn: BenchmarkFloorAEADHash, unit: "MiB/s"}
	largeDelivered = bench{name: "LargeBodyDelivered", fn: BenchmarkLargeBodyDelivered, unit: "MiB/s"}
	floorTwice     = bench{name: "FloorLargeBodyTwice", fn: BenchmarkFloorLargeBodyTwice, unit: "MiB/s"}
)

// sendersMinTime is the shortest benchtime of the 8-senders benchmarks: with the quick
// report's 30 ms they enqueue a handful of messages, too few to show what history costs.
const sendersMinTime = 500 * time.Millisecond

// row is one line of the table: ours beside a baseline (a floor, or the other side of
// a target), SQLite and bbolt. Every value is a rate (higher is better) unless
// lowerBetter, and every ratio is ours / other.
type row struct {
	what      string
	ours      bench
	base      *bench
	baseWhat  string
	min, max  float64 // target on ours/base (0: none)
	sqlite    *bench
	sqliteMin float64 // target on ours/SQLite (0: none)
	bolt      *bench
	// lowerBetter marks a latency row (ms): the ratio is still ours / base.
	lowerBetter bool
	// absMax is a target on ours itself (a latency in ms, 0: none), for what has no
	// baseline to divide by.
	absMax float64
	// size, if set, is the fixture size the row measures; the row says when the
	// quick report measures a smaller one.
	size *sized
}

func ref(b bench) *bench { return &b }

// rows is the table, in the order the report prints it. Each round runs the
// benchmarks of one row one after the other (baseline, ours, SQLite, bbolt), so the
// pairs that make a ratio were measured seconds apart.
var rows = []row{
	{what: "durable single-record write (records/s)", ours: storeWrite1, base: ref(floorCreate1), baseWhat: "raw create+fsync+rename+dir fsync, 1 writer", min: 0.8,
		sqlite: ref(sqliteTx1), bolt: ref(boltPut1)},
	{what: "durable single-record write vs a log append (records/s)", ours: storeWrite1, base: ref(floorAppend1), baseWhat: "append + fdatasync to one open file: no inode, no directory"},
	{what: "durable single-record write, p99 latency (ms)", ours: storeWrite1.with("p99-ms"), base: ref(floorCreate1.with("p99-ms")), baseWhat: "raw create p99", max: 2, lowerBetter: true},
	{what: "8 concurrent senders, 1-envelope Enqueue, empty store (msgs/s; 2 records each)", ours: storeSenders8, base: ref(floorCreate8), baseWhat: "raw creates, 8 writers, no lock (records/s)",
		sqlite: ref(sqlite8), bolt: ref(bolt8)},
	{what: "8 concurrent senders, counted in records (records/s; 2 per message)", ours: storeSenders8.with("records/s"), base: ref(floorCreate8), baseWhat: "raw creates, 8 writers, no lock", min: 0.8,
		sqlite: ref(sqlite8Msg.with("records/s"))},
	{what: "8 concurrent senders vs SQLite doing the same 3 rows per message from 8 goroutines (msgs/s)", ours: storeSenders8, sqlite: ref(sqlite8Msg), sqliteMin: 1.0},
	{what: "8 concurrent senders on a store already holding 10,000 messages (msgs/s)", ours: storeFull8, base: ref(storeSenders8), baseWhat: "same senders, empty store", min: 0.9, size: &history10k},
	{what: "8 concurrent senders on a store already holding 100,000 messages (msgs/s)", ours: storeFull100k, base: ref(storeSenders8), baseWhat: "same senders, empty store", min: 0.8, size: &history100k},
	{what: "8 goroutines, PreparedTransaction of 1 record (records/s)", ours: storePut8, base: ref(floorCreate8), baseWhat: "raw creates, 8 writers, no lock",
		sqlite: ref(sqlite8), bolt: ref(bolt8)},
	{what: "8 goroutines, Transaction of 1 record (records/s)", ours: storeTx8, base: ref(floorCreate8), baseWhat: "raw creates, 8 writers, no lock",
		sqlite: ref(sqlite8Conns), bolt: nil},
	{what: "prepared transaction of 16 records (records/s)", ours: storePrepared, base: ref(floorGroup16), baseWhat: "raw group commit of 16 (parallel fsyncs, 1 dir fsync)", min: 0.9,
		sqlite: ref(sqliteTx16), bolt: ref(boltPut16)},
	{what: "prepared transaction of 16 records vs syncfs (records/s)", ours: storePrepared, base: ref(floorSyncfs16), baseWhat: "16 temps, 16 renames, one syncfs"},
	{what: "Enqueue of a 2-envelope message (msgs/s; 4 records)", ours: storeEnqueue2, base: ref(floorCreate1), baseWhat: "raw create, 1 writer (records/s)",
		sqlite: ref(sqliteTx4), bolt: ref(boltPut4)},
	{what: "cached read (reads/s)", ours: storeCached, base: ref(storeCold), baseWhat: "our cold read", min: 20,
		sqlite: ref(sqliteRead), bolt: ref(boltRead)},
	{what: "cold read: lstat+open+read+parse+verify (reads/s)", ours: storeCold, base: ref(floorVerify), baseWhat: "Ed25519 verify alone, 1 core",
		sqlite: ref(sqliteRead), bolt: ref(boltRead)},
	{what: "listing of 10,000, cached (lists/s)", ours: storeList, base: ref(floorReadDir), baseWhat: "fresh ReadDir of 10,000 names", min: 1000,
		sqlite: ref(sqliteList), bolt: ref(boltList)},
	{what: "listing of 10,000 after one change (lists/s)", ours: storeListMoved, base: ref(floorReadDir), baseWhat: "fresh ReadDir of 10,000 names",
		sqlite: ref(sqliteList), bolt: ref(boltList)},
	{what: "fsck of 10,000 warm records (records/s)", ours: storeFsck, base: ref(floorScan), baseWhat: "raw read+parse+verify, all cores", min: 0.8,
		sqlite: ref(sqliteScan10k), bolt: ref(boltScan10k)},
	{what: "Ed25519 sign, record-sized, 1 core (signs/s)", ours: floorSign},
	{what: "Ed25519 verify, record-sized, 1 core (verifies/s)", ours: floorVerify},
	{what: "part: store lock acquire + release (locks/s)", ours: partLock},
	{what: "part: EncodeRecord = validate + encode + sign (records/s)", ours: partEncode},
	{what: "part: fsx.WriteFile, durable create via fsx (records/s)", ours: partFsxWrite, base: ref(floorCreate1), baseWhat: "raw create, 1 writer"},
	{what: "part: fsx.OS.Lstat of a record (lstats/s)", ours: partFsxLstat, base: ref(partRawLstat), baseWhat: "fstatat on an open dir fd"},
	// The relay's accept rate: two durable files per new envelope (inbox file and
	// receipt record) on the file backend; the same relay on the JetStream backend; and
	// its storage, jsstore, beside a plain JetStream publish of the same bytes.
	{what: "relay accept, 1 new envelope, in process (env/s; 2 durable files each)", ours: relayAccept1, base: ref(floorCreate1), baseWhat: "raw create, 1 writer (records/s)"},
	{what: "relay accept, batches of 64, in process (env/s; 2 durable files each)", ours: relayBatch64, base: ref(floorGroup16), baseWhat: "raw group commit of 16 (records/s)"},
	{what: "relay accept over HTTP, 1 envelope, relayproto.Client (env/s)", ours: relayHTTP1, base: ref(relayAccept1), baseWhat: "the same, in process"},
	{what: "relay accept over HTTP, batches of 64, relayproto.Client (env/s)", ours: relayHTTP64, base: ref(relayBatch64), baseWhat: "the same, in process"},
	{what: "relay accept on JetStream (1 node, sync_interval: always), 1 new envelope, in process (env/s)", ours: relayJS1, base: ref(relayAccept1), baseWhat: "the same on the file backend"},
	{what: "relay accept on JetStream (1 node, sync_interval: always), batches of 64, in process (env/s)", ours: relayJS64, base: ref(relayBatch64), baseWhat: "the same on the file backend"},
	{what: "relay accept on JetStream (3 nodes, R3), 1 new envelope, in process (env/s)", ours: relayJSR3_1, base: ref(relayAccept1), baseWhat: "the same on the file backend"},
	{what: "relay accept on JetStream (3 nodes, R3), batches of 64, in process (env/s)", ours: relayJSR3_64, base: ref(relayBatch64), baseWhat: "the same on the file backend"},
	{what: "jsstore Put, 1 at a time, 1 node, sync_interval: always (env/s)", ours: jsPut1, base: ref(jsPub1), baseWhat: "plain JetStream publish of the same bytes, no KV"},
	{what: "jsstore Put, 16 goroutines, 1 node, sync_interval: always (env/s)", ours: jsPut16, base: ref(jsPub16), baseWhat: "plain publishes, 16 goroutines"},
	{what: "jsstore Put, 1 at a time, 3 nodes, R3 (env/s)", ours: jsR3Put1, base: ref(jsR3Pub1), baseWhat: "plain publish to an R3 stream"},
	{what: "jsstore Put, 16 goroutines, 3 nodes, R3 (env/s)", ours: jsR3Put16, base: ref(jsR3Pub16), baseWhat: "plain publishes to an R3 stream, 16 goroutines"},
	// Large bodies: sealing (age's STREAM of 64 KiB ChaCha20-Poly1305 chunks and the
	// SHA-256 the envelope signs) beside the raw AEAD over the same chunks, one core.
	{what: "sealing a large body, 1 core (MiB/s of plaintext)", ours: sealBlob, base: ref(floorAEAD), baseWhat: "raw ChaCha20-Poly1305 over the same 64 KiB chunks", min: 0.8},
	{what: "sealing a large body vs the AEAD and the SHA-256 of its output, 1 core (MiB/s)", ours: sealBlob, base: ref(floorAEADHash), baseWhat: "raw ChaCha20-Poly1305 + SHA-256 of the sealed bytes"},
	{what: "a large body, send → delivered, two daemons and the relay in one process (MiB/s)", ours: largeDelivered, base: ref(floorTwice),
		baseWhat: "the same bytes written and fsynced twice (sender and relay), same disk", min: 0.5, size: &largeBody},
	// Late in every round: delivery replaces (and so frees) two records per envelope,
	// which slows creates near them for a minute or more, like the churn rows.
	{what: "delivery of 10,000 envelopes to one local relay, send → relayed (env/s)", ours: deliverRelay, base: ref(deliverRelay.with("raw-env/s")),
		baseWhat: "the same relay's raw accept rate, same run: one client posting back to back", min: 0.5, size: &deliverSize},
	{what: "longest store-lock hold, 10,000 pending envelopes whose relay goes unreachable and comes back (ms)", ours: lockCycle, absMax: 50, lowerBetter: true, size: &cycleSize},
	{what: "… p99 store-lock hold in that cycle (ms)", ours: lockCycle.with("p99-hold-ms"), absMax: 10, lowerBetter: true, size: &cycleSize},
	{what: "longest store-lock hold of a backup (Store.Backup) of a store of 10,000 pending envelopes, 8 senders enqueueing meanwhile (ms)", ours: lockBackup, absMax: 50, lowerBetter: true, size: &cycleSize},
	// Last in every round: the mass delete slows creates near it for a minute or more.
	{what: "creates after delivering+removing 20,000 (records/s)", ours: churnDeleted, base: ref(churnFresh), baseWhat: "same creates, fresh store", min: 0.8},
	{what: "cleanup: immediate durable unlink, 1 per tx (records/s)", ours: storeRemove1, base: ref(churnDeleted.with("bulk-removed/s")), baseWhat: "bulk unlink of 20,000 + 1 dir fsync"},
}

// samples holds, per benchmark name, the metrics of each round (nil: not run).
type samples map[string][]map[string]float64

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestBenchReport runs the report (see the comment above). It is skipped unless
// SEALBRIDGE_BENCH_REPORT is set.
func TestBenchReport(t *testing.T) {
	if os.Getenv("SEALBRIDGE_BENCH_REPORT") == "" {
		t.Skip("set SEALBRIDGE_BENCH_REPORT=1 (just bench) to run the interleaved benchmark report")
	}
	quick := os.Getenv("SEALBRIDGE_BENCH_QUICK") != ""
	reportMode = "full"
	if quick {
		reportMode = "quick"
	}
	defer func() { reportMode = "" }()
	runs := max(envInt("SEALBRIDGE_BENCH_RUNS", 5), 5)
	benchtime := "1s"
	if quick {
		benchtime = "30ms"
	}
	if v := os.Getenv("SEALBRIDGE_BENCH_TIME"); v != "" {
		benchtime = v
	}
	if err := flag.Set("test.benchtime", benchtime); err != nil {
		t.Fatalf("benchtime %q: %v", benchtime, err)
	}
	only, err := rowFilter(os.Getenv("SEALBRIDGE_BENCH_ONLY"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got := samples{}
	for round := range runs {
		if !quick {
			churnEpoch = round // every round measures creates right after a fresh mass delete
		}
		ran := map[string]bool{}
		for _, r := range rows {
			if !only(r) {
				continue
			}
			for _, bp := range []*bench{r.base, &r.ours, r.sqlite, r.bolt} {
				if bp == nil || ran[bp.name] || (quick && bp.optional) {
					continue
				}
				ran[bp.name] = true
				if d, err := time.ParseDuration(benchtime); err == nil && d < bp.minTime {
					if err := flag.Set("test.benchtime", bp.minTime.String()); err != nil {
						t.Fatal(err)
					}
				}
				res := testing.Benchmark(bp.fn)
				if err := flag.Set("test.benchtime", benchtime); err != nil {
					t.Fatal(err)
				}
				if res.N == 0 {
					t.Errorf("round %d: Benchmark%s failed (run it alone: go test -run '^$' -bench '^Benchmark%s$' ./internal/bench)", round+1, bp.name, bp.name)
					got[bp.name] = append(got[bp.name], nil)
					continue
				}
				got[bp.name] = append(got[bp.name], res.Extra)
			}
		}
		fmt.Fprintf(os.Stderr, "bench: round %d/%d done after %s\n", round+1, runs, time.Since(start).Round(time.Second))
	}
	var sb strings.Builder
	writeReport(&sb, got, reportInfo{runs: runs, benchtime: benchtime, quick: quick, elapsed: time.Since(start)})
	fmt.Print(sb.String())
	if out := os.Getenv("SEALBRIDGE_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(sb.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// rowFilter returns whether a row is in the report: every row, or with re those
// whose benchmark or baseline name matches it.
func rowFilter(re string) (func(row) bool, error) {
	if re == "" {
		return func(row) bool { return true }, nil
	}
	m, err := regexp.Compile(re)
	if err != nil {
		return nil, fmt.Errorf("SEALBRIDGE_BENCH_ONLY: %w", err)
	}
	return func(r row) bool { return m.MatchString(r.ours.name) || r.base != nil && m.MatchString(r.base.name) }, nil
}

type reportInfo struct {
	runs      int
	benchtime string
	quick     bool
	elapsed   time.Duration
}

// values returns the metric unit of benchmark name in each round (NaN where missing).
func (s samples) values(name, unit string) []float64 {
	var out []float64
	for _, m := range s[name] {
		v, ok := m[unit]
		if !ok {
			v = math.NaN()
		}
		out = append(out, v)
	}
	return out
}

// median returns the median of the finite values of vs (NaN if none) and how many
// there were.
func median(vs []float64) (float64, int) {
	var ok []float64
	for _, v := range vs {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			ok = append(ok, v)
		}
	}
	if len(ok) == 0 {
		return math.NaN(), 0
	}
	slices.Sort(ok)
	n := len(ok)
	if n%2 == 1 {
		return ok[n/2], n
	}
	return (ok[n/2-1] + ok[n/2]) / 2, n
}

// spread is benchstat's "±": the largest distance of a sample from the median, as a
// fraction of the median.
func spread(vs []float64, med float64) float64 {
	d := 0.0
	for _, v := range vs {
		if !math.IsNaN(v) {
			d = max(d, math.Abs(v-med))
		}
	}
	return d / med
}

// pairedRatio is the median over rounds of ours/other, each pair measured in the same
// round seconds apart (more robust on a noisy machine than a ratio of medians).
func (s samples) pairedRatio(ours, other bench) float64 {
	a, b := s.values(ours.name, ours.unit), s.values(other.name, other.unit)
	var rs []float64
	for i := range min(len(a), len(b)) {
		rs = append(rs, a[i]/b[i])
	}
	m, _ := median(rs)
	return m
}

// num formats a rate or latency with three significant digits and k/M suffixes.
func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v >= 10e6:
		return fmt.Sprintf("%.0fM", v/1e6)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 100e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 10e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.2fk", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func ratio(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v >= 100:
		return fmt.Sprintf("%.0f×", v)
	case v >= 10:
		return fmt.Sprintf("%.1f×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

// cell is a benchmark's median with its ± spread.
func (s samples) cell(b *bench) string {
	if b == nil {
		return "—"
	}
	vs := s.values(b.name, b.unit)
	m, n := median(vs)
	if n == 0 {
		return "—"
	}
	return fmt.Sprintf("%s ±%.0f%%", num(m), 100*spread(vs, m))
}

func writeReport(w io.Writer, s samples, info reportInfo) {
	mode := "full"
	if info.quick {
		mode = "quick"
	}
	fmt.Fprintf(w, "\n## sealbridge benchmarks: %s report, %d rounds, benchtime %s, %s/%s, %d cores, %s, took %s\n\n",
		mode, info.runs, info.benchtime, runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.Version(), info.elapsed.Round(time.Second))
	fmt.Fprintf(w, "File system of the benchmark directories: %s\n\n", describeFS(cacheRoot))
	if info.quick {
		fmt.Fprintf(w, "The 8-senders benchmarks run for at least %s each, even in a quick report.\n\n", sendersMinTime)
	}
	fmt.Fprintln(w, "Medians over the rounds (± = largest distance of a round from the median). Ratios are ours / other,")
	fmt.Fprintln(w, "the median of per-round ratios (pairs measured seconds apart). Higher is better except in the rows in ms.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| what | ours | baseline | ours / baseline | target | SQLite | ours / SQLite | bbolt | ours / bbolt |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		if info.quick && r.ours.optional || r.base != nil && info.quick && r.base.optional {
			continue
		}
		if _, ran := s[r.ours.name]; !ran { // left out by SEALBRIDGE_BENCH_ONLY
			continue
		}
		var baseCell, baseRatio, target, sqlCell, sqlRatio, boltCell, boltRatio = "—", "—", "—", "—", "—", "—", "—"
		if r.base != nil {
			baseCell = s.cell(r.base) + " (" + r.baseWhat + ")"
			rt := s.pairedRatio(r.ours, *r.base)
			baseRatio = ratio(rt)
			switch {
			case r.min > 0:
				target = fmt.Sprintf("≥ %s %s", trimRatio(r.min), verdict(rt >= r.min))
			case r.max > 0:
				target = fmt.Sprintf("≤ %s %s", trimRatio(r.max), verdict(rt <= r.max))
			}
		}
		if r.absMax > 0 {
			m, _ := median(s.values(r.ours.name, r.ours.unit))
			target = fmt.Sprintf("≤ %s ms %s", strconv.FormatFloat(r.absMax, 'f', -1, 64), verdict(m <= r.absMax))
		}
		what := r.what
		if r.size != nil && info.quick && r.size.quick != r.size.full {
			what += fmt.Sprintf(" — quick report: %s", thousands(r.size.quick))
		}
		if r.sqlite != nil && !(info.quick && r.sqlite.optional) {
			sqlCell = s.cell(r.sqlite)
			rt := s.pairedRatio(r.ours, *r.sqlite)
			sqlRatio = ratio(rt)
			if r.sqliteMin > 0 {
				sqlRatio += fmt.Sprintf(" (≥ %s %s)", trimRatio(r.sqliteMin), verdict(rt >= r.sqliteMin))
			}
		}
		if r.bolt != nil && !(info.quick && r.bolt.optional) {
			boltCell = s.cell(r.bolt)
			boltRatio = ratio(s.pairedRatio(r.ours, *r.bolt))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			what, s.cell(&r.ours), baseCell, baseRatio, target, sqlCell, sqlRatio, boltCell, boltRatio)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Every benchmark (median, min, max over rounds):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| benchmark | metric | median | min | max | rounds |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	var names []string
	for n := range s {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		units := map[string]bool{}
		for _, m := range s[n] {
			for u := range m {
				units[u] = true
			}
		}
		var us []string
		for u := range units {
			us = append(us, u)
		}
		slices.Sort(us)
		for _, u := range us {
			vs := s.values(n, u)
			m, k := median(vs)
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, v := range vs {
				if !math.IsNaN(v) {
					lo, hi = min(lo, v), max(hi, v)
				}
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d |\n", n, u, num(m), num(lo), num(hi), k)
		}
	}
	if churnFix != nil {
		fmt.Fprintf(w, "\nChurn fixture (last round): 20,000 records written and syncfs'd in %s; removed in bulk (unlink each, one dir fsync) in %s.\n",
			churnFix.built.Round(time.Millisecond), churnFix.removed.Round(time.Millisecond))
	}
	historyMu.Lock()
	for _, n := range slices.Sorted(maps.Keys(histories)) {
		fmt.Fprintf(w, "\nHistory fixture: %s delivered messages signed, written, syncfs'd and indexed (Prepare) in %s, once per process.\n",
			thousands(n), histories[n].built.Round(time.Millisecond))
	}
	historyMu.Unlock()
	for _, j := range []struct {
		what string
		t    *jsTarget
	}{{"one node, sync_interval: always", jsSingle}, {"three nodes, R3", jsCluster}} {
		if j.t != nil {
			fmt.Fprintf(w, "\nJetStream (%s): in-process servers started, stream and bucket created in %s, once per process.\n",
				j.what, j.t.built.Round(time.Millisecond))
		}
	}
}

// thousands formats n with a comma every three digits (10,000).
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// describeFS names the file system holding dir (from /proc/self/mounts) and, for
// ext4, whether it has a journal: without one, creates skip recently deleted inodes
// (fs/ext4/ialloc.c), which shapes every create figure here.
func describeFS(dir string) string {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "unknown"
	}
	best, desc := "", "unknown"
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(dir, f[1]) || len(f[1]) <= len(best) {
			continue
		}
		best = f[1]
		desc = fmt.Sprintf("%s on %s (%s, %s)", f[0], f[1], f[2], f[3])
		if f[2] == "ext4" {
			dev := f[0][strings.LastIndex(f[0], "/")+1:]
			if m, _ := filepath.Glob("/proc/fs/jbd2/" + dev + "-*"); len(m) > 0 {
				desc += ", journal: yes"
			} else {
				desc += ", journal: NO (no jbd2 for " + dev + ")"
			}
		}
	}
	return desc
}

func trimRatio(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) + "×" }

func verdict(ok bool) string {
	if ok {
		return "✓"
	}
	return "✗"
}
