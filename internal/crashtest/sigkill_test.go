package crashtest_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var (
	killRoundsFlag = flag.Int("crash.kills", 200, "SIGKILL rounds of TestSIGKILLWriters (just crash: 5000)")
	killSeed       = flag.Uint64("crash.seed", 0, "seed of TestSIGKILLWriters (0: from the clock; printed)")
)

const writerEnv = "SEALBRIDGE_CRASH_WRITER"

// TestCrashWriterProcess is the writer child of TestSIGKILLWriters: it enqueues
// messages in a loop and prints each acknowledged message id, flushed, until killed.
func TestCrashWriterProcess(t *testing.T) {
	dir := os.Getenv(writerEnv)
	if dir == "" {
		t.Skip("writer process only")
	}
	c := &clock{}
	c.ns.Store(time.Now().UnixNano())
	s := openAt(t, dir, c, nil)
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	for i := 0; ; i++ {
		c.ns.Store(time.Now().UnixNano())
		req := sendRequest(c.Now(), 1+i%3)
		if _, err := s.Enqueue(context.Background(), req); err != nil {
			fmt.Fprintln(out, "error", err)
			out.Flush()
			os.Exit(3)
		}
		fmt.Fprintf(out, "ack %s %d\n", req.MessageID, len(req.Envelopes))
		out.Flush()
	}
}

// Real crashes: writer processes enqueue and print what was acknowledged; the parent
// SIGKILLs them at random moments, reopens the store, and checks that every printed
// message is present with its whole batch and that the store is usable.
func TestSIGKILLWriters(t *testing.T) {
	rounds, seed, rng := killRounds(t, *killRoundsFlag, 20, "kills", 0x5ea1b41d)
	dir := privateDir(t)
	acked := map[string]int{} // message id → envelopes
	kills := 0
	for round := 0; round < rounds; round++ {
		// One or two writers at once.
		writers := 1 + rng.IntN(2)
		delay := time.Duration(rng.IntN(60_000)) * time.Microsecond
		cmds, outs, failed := startChildren(t, "TestCrashWriterProcess", writerEnv, dir, writers)
		if failed != "" {
			t.Fatalf("seed %d round %d: writer did not start: %q", seed, round, failed)
		}
		// Let them write for a random moment, then SIGKILL them all.
		kills += killAfter(cmds, delay)
		var fresh []string
		for i, cmd := range cmds {
			for outs[i].Scan() {
				line := outs[i].Text()
				if strings.HasPrefix(line, "error") {
					t.Fatalf("seed %d round %d: writer failed: %s", seed, round, line)
				}
				f := strings.Fields(line)
				if len(f) == 3 && f[0] == "ack" {
					n, _ := strconv.Atoi(f[2])
					acked[f[1]] = n
					fresh = append(fresh, f[1])
				}
			}
			cmd.Wait()
		}
		// Reopen (a fresh instance, as after a restart) and check.
		c := &clock{}
		c.ns.Store(time.Now().UnixNano())
		s := openAt(t, dir, c, nil)
		check := fresh
		if round%50 == 49 || round == rounds-1 {
			check = check[:0]
			for id := range acked {
				check = append(check, id)
			}
		}
		for _, id := range check {
			m, err := s.Message(id)
			if err != nil || m == nil {
				t.Fatalf("seed %d round %d: acknowledged message %s: %v %v", seed, round, id, m, err)
			}
			p, err := s.Pending(context.Background(), id)
			if err != nil || len(p) != acked[id] {
				t.Fatalf("seed %d round %d: message %s has %d dispatchable envelopes, want %d (%v)", seed, round, id, len(p), acked[id], err)
			}
		}
		if round%20 == 19 {
			if _, err := s.Enqueue(context.Background(), sendRequest(c.Now(), 1)); err != nil {
				t.Fatalf("seed %d round %d: store not usable after a kill: %v", seed, round, err)
			}
		}
	}
	t.Logf("%d SIGKILLs over %d rounds; %d acknowledged messages all present and complete", kills, rounds, len(acked))
	if len(acked) == 0 {
		t.Fatal("no message was ever acknowledged: the kills came too early to test anything")
	}
}

// startChildren starts n processes of this test binary running only the test named
// run, with env=dir in their environment, and waits for each to print "ready". It
// returns them and their stdout scanners, or what one printed instead of "ready"
// (all started are killed then).
func startChildren(t *testing.T, run, env, dir string, n int) ([]*exec.Cmd, []*bufio.Scanner, string) {
	t.Helper()
	var cmds []*exec.Cmd
	var outs []*bufio.Scanner
	for range n {
		cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), env+"="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		cmds, outs = append(cmds, cmd), append(outs, sc)
		if !sc.Scan() || sc.Text() != "ready" {
			for _, c := range cmds {
				c.Process.Kill()
				c.Wait()
			}
			return nil, nil, sc.Text()
		}
	}
	return cmds, outs, ""
}

// killAfter waits delay (the random moment of the crash), then SIGKILLs cmds; it
// returns how many it killed.
func killAfter(cmds []*exec.Cmd, delay time.Duration) int {
	<-time.NewTimer(delay).C
	for _, cmd := range cmds {
		cmd.Process.Signal(syscall.SIGKILL)
	}
	return len(cmds)
}

// killRounds returns a SIGKILL test's rounds (flagged, or short under -short), its
// seed (-crash.seed, else from the clock) and a generator of it, and logs how to
// replay the run (roundsFlag is the name of the rounds flag after "crash."; salt
// makes the test's generator its own).
func killRounds(t *testing.T, flagged, short int, roundsFlag string, salt uint64) (int, uint64, *rand.Rand) {
	t.Helper()
	rounds := flagged
	if testing.Short() {
		rounds = short
	}
	seed := *killSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test ./internal/crashtest -run %s -crash.seed=%d -crash.%s=%d)", seed, t.Name(), seed, roundsFlag, rounds)
	return rounds, seed, rand.New(rand.NewPCG(seed, seed^salt))
}
