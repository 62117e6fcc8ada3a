package conctest_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/sealbridge/sealbridge/internal/conctest"
)

var (
	seedFlag     = flag.Uint64("explore.seed", 0, "seed of the (first) run of TestExplore (0: from the clock; printed)")
	durationFlag = flag.Duration("explore.duration", 3*time.Second, "how long the workers of one run of TestExplore issue operations")
	forFlag      = flag.Duration("explore.for", 0, "run TestExplore again, with the next seed, until this much time has passed (just explore: 10m)")
	procsFlag    = flag.Int("explore.procs", 3, "processes on the store in TestExplore: the test's own and procs-1 children")
	workersFlag  = flag.Int("explore.workers", 6, "workers of each process of TestExplore")
	outFlag      = flag.String("explore.out", "", "directory where a run of TestExplore leaves its history, and a failing one an HTML view of each violation")
	showFlag     = flag.Int("explore.show", 3, "how many violations of each kind (key, message) and 4× as many failed invariants a failing run of TestExplore reports")
)

// checkTimeout bounds the linearizability check of one partition.
const checkTimeout = time.Minute

// TestExploreChild is a child process of TestExplore; run directly it does nothing.
func TestExploreChild(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		t.Skip("a child process of TestExplore only")
	}
	runChild(t, raw)
}

// TestExplore runs the concurrency explorer (package comment, docs/TESTING.md): one
// run of -explore.duration, or runs with seeds seed, seed+1, … until -explore.for has
// passed. Each failing run prints the command that replays its seed.
func TestExplore(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	until := time.Now().Add(*forFlag)
	for run := uint64(0); ; run++ {
		s := seed + run
		if !t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) { explore(t, s) }) || !time.Now().Before(until) {
			return
		}
	}
}

// replay is the command that runs seed's run again.
func replay(seed uint64) string {
	cmd := fmt.Sprintf("go test ./internal/conctest -run '^TestExplore$' -count=1 -v -explore.seed=%d", seed)
	if *durationFlag != 3*time.Second {
		cmd += " -explore.duration=" + durationFlag.String()
	}
	if *procsFlag != 3 {
		cmd += fmt.Sprintf(" -explore.procs=%d", *procsFlag)
	}
	if *workersFlag != 6 {
		cmd += fmt.Sprintf(" -explore.workers=%d", *workersFlag)
	}
	return cmd
}

// explore is one run: processes and workers on one fresh store for the run's duration,
// then every process's index check, the linearizability check of the merged history
// and the invariants.
func explore(t *testing.T, seed uint64) {
	if *procsFlag < 1 || *procsFlag > 8 || *workersFlag < 1 {
		t.Fatalf("-explore.procs must be 1..8 and -explore.workers at least 1")
	}
	t.Logf("seed %d; replay: %s", seed, replay(seed))
	dir := t.TempDir()
	config := func(proc int) runConfig {
		return runConfig{Home: filepath.Join(dir, "home"), History: filepath.Join(dir, fmt.Sprintf("history-%d.jsonl", proc)),
			Proc: proc, Procs: *procsFlag, Seed: seed, Workers: *workersFlag, Duration: *durationFlag}
	}
	var problems []string
	fail := func(err error) {
		if err != nil {
			problems = append(problems, err.Error())
		}
	}
	limit := *durationFlag + 2*time.Minute // a bound for a child's answer, far beyond any run
	var children []*child
	for p := 1; p < *procsFlag; p++ {
		c, err := startChild(config(p))
		if err != nil {
			t.Fatal(err)
		}
		defer c.stop()
		children = append(children, c)
	}
	for _, c := range children {
		if _, err := c.await("ready", limit); err != nil {
			t.Fatal(err)
		}
	}
	parent, err := newNode(config(0))
	if err != nil {
		t.Fatal(err)
	}
	startMono, startWall := conctest.Mono(), time.Now().UnixMilli()
	for _, c := range children {
		fail(c.send(fmt.Sprintf("go %d %d", startMono, startWall)))
	}
	parent.run(startMono, startWall)
	ran := time.Since(time.UnixMilli(startWall))
	for _, c := range children {
		ps, err := c.await("quiet", limit)
		problems = append(problems, ps...)
		fail(err)
	}
	for _, c := range children {
		fail(c.send("check"))
	}
	parent.checkIndexes()
	histories := [][]conctest.Op{parent.rec.Ops()}
	for _, c := range children {
		ps, err := c.await("done", limit)
		problems = append(problems, ps...)
		fail(err)
		fail(c.cmd.Wait())
		h, err := conctest.ReadFile(c.cfg.History)
		fail(err)
		histories = append(histories, h)
	}
	problems = append(problems, parent.takeProblems()...)
	if len(problems) > 0 && len(histories) < *procsFlag {
		t.Fatalf("seed %d: a child failed; replay: %s\n%s", seed, replay(seed), strings.Join(problems, "\n"))
	}

	// The state the run left, read by a store opened afresh, closes the history.
	fresh, err := openStore(config(*procsFlag), parent.keys, -1)
	if err != nil {
		t.Fatal(err)
	}
	final := &node{cfg: config(*procsFlag), keys: parent.keys, st: fresh, rec: conctest.NewRecorder(*procsFlag), space: parent.space}
	reader := &worker{n: final}
	parent.space.freeze()
	for _, m := range parent.space.upTo(parent.space.epochAt(conctest.Mono())) {
		reader.readMessage(m, false)
	}
	reader.summaries(false)
	reader.summaries(true)
	history := conctest.Merge(append(histories, final.rec.Ops())...)
	problems = append(problems, final.takeProblems()...)

	checked, stats := conctest.Check(history, checkTimeout)
	var violations []conctest.Violation
	for _, v := range checked {
		if v.Result == porcupine.Unknown {
			// Undecided in time, as porcupine allows: no finding either way.
			t.Logf("seed %d: %s", seed, v.Report(startMono))
			continue
		}
		violations = append(violations, v)
	}
	problems = append(problems, invariants(fresh, parent.keys, parent.space, history)...)
	t.Logf("seed %d: %d operations by %d processes × %d workers in %s (the parent's stopped after %s); %d partitions checked in %s (the slowest, %s of %d operations, in %s)",
		seed, len(history), *procsFlag, *workersFlag, *durationFlag, ran.Round(time.Millisecond),
		stats.Partitions, stats.Took.Round(time.Millisecond), stats.Slowest, stats.SlowestOps, stats.SlowestTook.Round(time.Millisecond))
	if len(violations) == 0 && len(problems) == 0 {
		if *outFlag != "" {
			t.Log(keep(seed, history, nil))
		}
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d partitions not linearizable, %d failed invariants\nreplay: %s\n", seed, len(violations), len(problems), replay(seed))
	maxReported := *showFlag
	shown := map[string]int{} // violations reported, by kind of partition
	for _, v := range violations {
		kind, _, _ := strings.Cut(v.Partition, ":")
		if shown[kind]++; shown[kind] <= maxReported {
			b.WriteString(v.Report(startMono))
		}
	}
	for kind, n := range shown {
		if n > maxReported {
			fmt.Fprintf(&b, "… and %d more %s partitions not linearizable (-explore.out keeps them all)\n", n-maxReported, kind)
		}
	}
	for i, p := range problems {
		if i == 4*maxReported {
			fmt.Fprintf(&b, "… and %d more failed invariants\n", len(problems)-i)
			break
		}
		fmt.Fprintf(&b, "%s\n", p)
	}
	if *outFlag != "" {
		b.WriteString(keep(seed, history, violations))
	}
	t.Error(b.String())
}

// keep writes a failing run's history and its violations' HTML views to -explore.out,
// and says where.
func keep(seed uint64, history []conctest.Op, violations []conctest.Violation) string {
	if err := os.MkdirAll(*outFlag, 0o700); err != nil {
		return fmt.Sprintf("explore.out: %v\n", err)
	}
	base := filepath.Join(*outFlag, fmt.Sprintf("seed-%d", seed))
	var b strings.Builder
	if err := conctest.WriteFile(base+".jsonl", history); err != nil {
		fmt.Fprintf(&b, "explore.out: %v\n", err)
	} else {
		fmt.Fprintf(&b, "history: %s.jsonl\n", base)
	}
	for i, v := range violations {
		path := fmt.Sprintf("%s-%d.html", base, i)
		if err := v.Visualize(path); err != nil {
			fmt.Fprintf(&b, "explore.out: %v\n", err)
			continue
		}
		fmt.Fprintf(&b, "%s: %s\n", v.Partition, path)
	}
	return b.String()
}
