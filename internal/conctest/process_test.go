package conctest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/conctest"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The processes of a run. Process 0 is the test itself; processes 1.. are the test
// binary run again as children (TestExploreChild, gated by childEnv), each with its own
// Store and carrier on the same store directory. The protocol, one line at a time:
//
//	child → parent: "ready"                  its store is open
//	parent → child: "go <mono> <wall>"       the run's start (Mono ns, Unix ms): work until start + duration
//	child → parent: "quiet"                  its workers and carrier have stopped
//	parent → child: "check"                  every process is quiet: compare your indexes with a fresh store's
//	child → parent: "problem <text>"         (any number) a failed check
//	child → parent: "done"                   its history file is written; it exits
const childEnv = "SEALBRIDGE_CONCTEST_CHILD"

// runConfig is what one process of a run needs (a child gets it as JSON in childEnv).
type runConfig struct {
	Home     string        // the data root of the store
	History  string        // where the process writes its history
	Proc     int           // 0: the test process
	Procs    int           // how many processes the run has
	Seed     uint64        // the run's seed
	Workers  int           // workers of this process
	Duration time.Duration // how long the workers issue operations

}

// The fixed keys of a run: the store's owner, the recipient of its messages (who signs
// the delivery-status confirmations) and a stranger (who signs forged ones).
type keys struct {
	owner, peer, stranger *identity.Identity
}

func fixedKeys() keys {
	id := func(b byte) *identity.Identity {
		seed := [32]byte{b, 0xc0, 0x4c, 0x7e, 0x57}
		i, err := identity.FromSeed(seed[:])
		if err != nil {
			panic(err)
		}
		return i
	}
	return keys{owner: id(1), peer: id(2), stranger: id(3)}
}

// node is one process of a run: its store, recorder, scripted relay, carrier and
// workers.
type node struct {
	cfg   runConfig
	keys  keys
	st    *store.Store
	rec   *conctest.Recorder
	space *space
	relay *scriptedRelay
	car   *carrier.Carrier
	confs sync.Map // confirmation envelopes built, by message id and number

	mu       sync.Mutex
	problems []string
}

// openStore opens the run's store; cacheEntries -1 reads every record afresh.
func openStore(cfg runConfig, k keys, cacheEntries int) (*store.Store, error) {
	return store.Open(k.owner.Signer(), store.Options{Home: cfg.Home, LockWait: 30 * time.Second, CacheEntries: cacheEntries})
}

func newNode(cfg runConfig) (*node, error) {
	n := &node{cfg: cfg, keys: fixedKeys(), rec: conctest.NewRecorder(cfg.Proc)}
	var err error
	if n.st, err = openStore(cfg, n.keys, 0); err != nil {
		return nil, err
	}
	return n, nil
}

// problem records a failed check of this process.
func (n *node) problem(format string, args ...any) {
	n.mu.Lock()
	n.problems = append(n.problems, fmt.Sprintf("process %d: ", n.cfg.Proc)+fmt.Sprintf(format, args...))
	n.mu.Unlock()
}

func (n *node) takeProblems() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.problems...)
}

// run issues operations from startMono (Mono ns; startWall the same moment in Unix
// ms) for the run's duration, with the carrier delivering meanwhile, and returns once
// the workers and the carrier have stopped.
func (n *node) run(startMono, startWall int64) {
	n.space = newSpace(n.cfg.Seed, startMono, startWall, n.keys.peer.DID())
	n.relay = newScriptedRelay(n.cfg.Seed, n.cfg.Proc, n.rec, n.space.messageOf)
	n.car = carrier.New(n.st, n.relay, carrier.Options{
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, ProbeEvery: 100 * time.Millisecond,
		SweepEvery: time.Second, StoreFailureDelay: 100 * time.Millisecond, PollEvery: 50 * time.Millisecond,
		Events: func(e carrier.Event) {
			// A store call cut short by the carrier's own stop is no failure (the
			// store calls a lock wait cut short OUTBOX_STORE_UNWRITABLE).
			if e.Kind == carrier.EventStoreError && !busy(e.Err) && !errors.Is(e.Err, context.Canceled) {
				n.problem("carrier: store error: %v", e.Err)
			}
		},
	})
	runCtx, stop := context.WithCancel(context.Background())
	carDone := make(chan error, 1)
	go func() { carDone <- n.car.Run(runCtx) }()
	g := newGate(n.cfg.Workers, startMono+int64(n.cfg.Duration))
	var wg sync.WaitGroup
	for i := range n.cfg.Workers {
		w := &worker{n: n, id: i, rng: rand.New(rand.NewPCG(n.cfg.Seed, uint64(n.cfg.Proc)<<32|uint64(i)))}
		wg.Go(func() { w.loop(g) })
	}
	wg.Wait()
	stop()
	<-carDone
}

// checkIndexes compares this process's store's listings with those of a store opened
// afresh on the directory (no cache): the indexes a process keeps across its own
// publications and other processes' must equal a fresh scan. Every process must be
// quiet.
func (n *node) checkIndexes() {
	fresh, err := openStore(n.cfg, n.keys, -1)
	if err != nil {
		n.problem("opening a fresh store: %v", err)
		return
	}
	lm, err1 := n.st.MessageSummaries(ctx)
	fm, err2 := fresh.MessageSummaries(ctx)
	if err1 != nil || err2 != nil {
		n.problem("MessageSummaries: %v, fresh: %v", err1, err2)
	} else if d := firstDifference(lm, fm); d != "" {
		n.problem("MessageSummaries differ from a fresh store's: %s", d)
	}
	lo, err1 := n.st.OutboxSummaries(ctx)
	fo, err2 := fresh.OutboxSummaries(ctx)
	if err1 != nil || err2 != nil {
		n.problem("OutboxSummaries: %v, fresh: %v", err1, err2)
	} else if d := firstDifference(lo, fo); d != "" {
		n.problem("OutboxSummaries differ from a fresh store's: %s", d)
	}
}

// firstDifference describes the first entry where the listings live and fresh
// differ, or returns "".
func firstDifference[T any](live, fresh []T) string {
	for i := range max(len(live), len(fresh)) {
		switch {
		case i >= len(live):
			return fmt.Sprintf("entry %d only in the fresh store: %+v", i, fresh[i])
		case i >= len(fresh):
			return fmt.Sprintf("entry %d only in this process's: %+v", i, live[i])
		case !reflect.DeepEqual(live[i], fresh[i]):
			return fmt.Sprintf("entry %d: this process's %+v, the fresh store's %+v", i, live[i], fresh[i])
		}
	}
	return ""
}

// runChild is TestExploreChild's body: one child process of a run.
func runChild(t *testing.T, raw string) {
	var cfg runConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("bad %s: %v", childEnv, err)
	}
	say := func(line string) {
		// os.Stdout is unbuffered: one line, one write(2).
		if _, err := io.WriteString(os.Stdout, line+"\n"); err != nil {
			t.Fatalf("stdout: %v", err)
		}
	}
	n, err := newNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := bufio.NewReader(os.Stdin)
	expect := func(word string) []string {
		line, err := in.ReadString('\n')
		f := strings.Fields(line)
		if err != nil || len(f) == 0 || f[0] != word {
			t.Fatalf("expected %q from the parent, got %q (%v)", word, line, err)
		}
		return f[1:]
	}
	say("ready")
	args := expect("go")
	if len(args) != 2 {
		t.Fatalf("go %v", args)
	}
	mono, err1 := strconv.ParseInt(args[0], 10, 64)
	wall, err2 := strconv.ParseInt(args[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("go %v", args)
	}
	n.run(mono, wall)
	say("quiet")
	expect("check")
	n.checkIndexes()
	if err := conctest.WriteFile(cfg.History, n.rec.Ops()); err != nil {
		t.Fatal(err)
	}
	for _, p := range n.takeProblems() {
		say("problem " + strings.ReplaceAll(p, "\n", " "))
	}
	say("done")
}

// child is a running child process, seen from the parent.
type child struct {
	cfg    runConfig
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	lines  chan string // its stdout, a line at a time; closed at its end
	other  []string    // the lines that are not the protocol's (the test framework's own)
}

func startChild(cfg runConfig) (*child, error) {
	raw, _ := json.Marshal(cfg)
	c := &child{cfg: cfg, lines: make(chan string, 64)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestExploreChild$", "-test.count=1", "-test.timeout=30m")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	c.cmd.Stderr = &c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c, nil
}

// send writes one line to the child.
func (c *child) send(line string) error {
	_, err := io.WriteString(c.stdin, line+"\n")
	return err
}

// await reads the child's lines until want, within limit; "problem" lines on the way
// are returned, any other line is kept for the error of a child that failed.
func (c *child) await(want string, limit time.Duration) (problems []string, err error) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			switch {
			case !ok:
				return problems, fmt.Errorf("child %d ended before %q:\n%s\n%s", c.cfg.Proc, want,
					strings.Join(c.other, "\n"), c.stderr.String())
			case line == want:
				return problems, nil
			case strings.HasPrefix(line, "problem "):
				problems = append(problems, strings.TrimPrefix(line, "problem "))
			default:
				c.other = append(c.other, line)
			}
		case <-timer.C:
			return problems, fmt.Errorf("child %d: no %q within %s", c.cfg.Proc, want, limit)
		}
	}
}

// stop kills the child if it still runs and waits for it.
func (c *child) stop() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}
