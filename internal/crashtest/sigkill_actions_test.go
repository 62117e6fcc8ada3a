package crashtest_test

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

var actionKills = flag.Int("crash.actionkills", 100, "SIGKILL rounds of TestSIGKILLOperatorActions (just crash: 1000)")

const actorEnv = "SEALBRIDGE_CRASH_ACTOR"

// actionSteps is what the actor process does to each message, in order: the
// enqueue, then the operator's actions, with the carrier's backoff before the retry
// so that the retry changes something.
var actionSteps = []string{"enqueue", record.ActionHold, record.ActionRelease, "backoff", record.ActionRetry, record.ActionHold, record.ActionCancel}

const (
	// Every targetEvery-th message is instead a group of targetGroup messages of 3
	// envelopes to a target of their own, acted on by target: 72 envelopes, more than
	// one transaction of a target's action changes (carrier's chunk of 64).
	targetEvery = 7
	targetGroup = 24
)

// TestCrashActorProcess is the child of TestSIGKILLOperatorActions: it enqueues a
// message and applies the actions of actionSteps to it, one by one, printing (and
// flushing) "ack STEP ID N" for each message once a step returned, until killed.
func TestCrashActorProcess(t *testing.T) {
	dir := os.Getenv(actorEnv)
	if dir == "" {
		t.Skip("actor process only")
	}
	c := &clock{}
	c.ns.Store(time.Now().UnixNano())
	s := openAt(t, dir, c, nil)
	out := bufio.NewWriter(os.Stdout)
	fail := func(format string, args ...any) {
		fmt.Fprintf(out, "error "+format+"\n", args...)
		out.Flush()
		os.Exit(3)
	}
	ctx := context.Background()
	fmt.Fprintln(out, "ready")
	out.Flush()
	for i := 0; ; i++ {
		c.ns.Store(time.Now().UnixNano())
		var reqs []store.SendRequest
		sel := carrier.Selector{}
		if i%targetEvery == targetEvery-1 {
			sel.Target = "http://127.0.0.1:9/t/" + uuid.NewString()
			for range targetGroup {
				r := sendRequest(c.Now(), 3)
				r.RelayURL = sel.Target
				reqs = append(reqs, r)
			}
		} else {
			reqs = []store.SendRequest{sendRequest(c.Now(), 1+i%3)}
			sel.MessageIDs = []string{reqs[0].MessageID}
		}
		ack := func(step string, rs []store.SendRequest) {
			for _, r := range rs {
				fmt.Fprintf(out, "ack %s %s %d\n", step, r.MessageID, len(r.Envelopes))
			}
			out.Flush()
		}
		for _, r := range reqs {
			if _, err := s.Enqueue(ctx, r); err != nil {
				fail("enqueue %s: %v", r.MessageID, err)
			}
			ack("enqueue", []store.SendRequest{r})
		}
		for _, step := range actionSteps[1:] {
			c.ns.Store(time.Now().UnixNano())
			if step == "backoff" {
				backOff(t, s, c, reqs)
				ack(step, reqs)
				continue
			}
			rs, err := carrier.Apply(ctx, s, sel, action(c, step))
			if err != nil {
				fail("%s: %v", step, err)
			}
			if len(rs) != len(reqs) {
				fail("%s of %d messages answered %d results: %+v", step, len(reqs), len(rs), rs)
			}
			envelopes := map[string]int{}
			for _, r := range reqs {
				envelopes[r.MessageID] = len(r.Envelopes)
			}
			for _, r := range rs {
				if n, ok := envelopes[r.MessageID]; !ok || r.Code != "" || r.Changed != n {
					fail("%s of %d envelopes: %+v", step, n, r)
				}
				delete(envelopes, r.MessageID)
			}
			ack(step, reqs)
		}
	}
}

// actedMessage is what the parent knows of a message an actor acknowledged.
type actedMessage struct {
	step int // index in actionSteps of its last acknowledged step
	n    int // its envelopes
}

// memberAt reports whether envelope o is as step k of actionSteps leaves it.
func memberAt(k int, o *record.Outbox) bool {
	op := func(want string) bool { return o.Operator != nil && o.Operator.Op == want }
	pending := o.State == record.StatePending
	switch k {
	case 0:
		return pending && o.Held == nil && o.UnreachableSince == 0 && o.Operator == nil
	case 1, 5:
		return pending && o.Held != nil && o.Held.Op == record.ActionHold && o.UnreachableSince == 0 && op(record.ActionHold)
	case 2:
		return pending && o.Held == nil && o.UnreachableSince == 0 && op(record.ActionRelease)
	case 3:
		return pending && o.Held == nil && o.UnreachableSince != 0 && op(record.ActionRelease)
	case 4:
		return pending && o.Held == nil && o.UnreachableSince == 0 && op(record.ActionRetry)
	default:
		return o.State == record.StateClosed && o.Held == nil && op(record.ActionCancel)
	}
}

// messageAt reports whether message m is as step k of actionSteps leaves it.
func messageAt(k int, m *record.Message) bool {
	op := func(want string) bool { return m.Operator != nil && m.Operator.Op == want }
	queued := m.Status == record.StatusQueued
	switch k {
	case 0:
		return queued && m.Held == nil && m.Operator == nil
	case 1, 5:
		return queued && m.Held != nil && op(record.ActionHold)
	case 2, 3:
		return queued && m.Held == nil && op(record.ActionRelease)
	case 4:
		return queued && m.Held == nil && op(record.ActionRetry)
	default:
		return m.Status == record.StatusClosed && m.ClosedBy == record.ClosedByCancelled && m.Held == nil && op(record.ActionCancel)
	}
}

// checkActed checks message id against what was acknowledged of it: present, with
// its n envelopes, every record as its last acknowledged step left it or as the next
// step (which may have been in flight at the kill) leaves it; as the action writes
// the members first and the message last, a message already changed by the next step
// has every member changed too. With whole (after fsck found nothing or repaired
// it), the message and its members must also agree as fsck's state rules demand: a
// queued message is held exactly when each of its pending envelopes is, and a
// closed one has none pending.
func checkActed(s *store.Store, batches map[string]string, id string, a actedMessage, whole bool) (midway bool, err error) {
	m, err := s.Message(id)
	if err != nil || m == nil {
		return false, fmt.Errorf("acknowledged message (last step %s) is absent: %v", actionSteps[a.step], err)
	}
	members, err := s.Committed(batches[id])
	if err != nil || len(members) != a.n {
		return false, fmt.Errorf("acknowledged message (last step %s) has %d committed envelopes, want %d (%v)", actionSteps[a.step], len(members), a.n, err)
	}
	next := min(a.step+1, len(actionSteps)-1)
	desc := func() string {
		d := fmt.Sprintf("message %s held=%v operator=%v closedBy=%q;", m.Status, m.Held != nil, opOf(m.Operator), m.ClosedBy)
		for _, o := range members {
			d += fmt.Sprintf(" [%s held=%v operator=%v unreachable=%v]", o.State, o.Held != nil, opOf(o.Operator), o.UnreachableSince != 0)
		}
		return d
	}
	msgNow, msgNext := messageAt(a.step, m), messageAt(next, m)
	if !msgNow && !msgNext {
		return false, fmt.Errorf("message is neither as %s nor as %s left it: %s", actionSteps[a.step], actionSteps[next], desc())
	}
	pendingHeld, pendingFree := 0, 0
	for _, o := range members {
		if !memberAt(a.step, o) {
			midway = true
		}
		if !memberAt(a.step, o) && !memberAt(next, o) {
			return false, fmt.Errorf("envelope %s is neither as %s nor as %s left it: %s", o.EnvelopeID, actionSteps[a.step], actionSteps[next], desc())
		}
		if msgNext && !msgNow && !memberAt(next, o) {
			return false, fmt.Errorf("message changed by %s before its envelope %s: %s", actionSteps[next], o.EnvelopeID, desc())
		}
		if o.State == record.StatePending {
			if o.Held != nil {
				pendingHeld++
			} else {
				pendingFree++
			}
		}
	}
	if whole {
		switch {
		case m.Status == record.StatusClosed && pendingHeld+pendingFree > 0:
			return false, fmt.Errorf("closed message with %d pending envelopes after fsck: %s", pendingHeld+pendingFree, desc())
		case m.Status == record.StatusQueued && m.Held != nil && pendingFree > 0:
			return false, fmt.Errorf("held message with %d envelopes not held after fsck: %s", pendingFree, desc())
		case m.Status == record.StatusQueued && m.Held == nil && pendingHeld > 0:
			return false, fmt.Errorf("message not held with %d held envelopes after fsck: %s", pendingHeld, desc())
		}
	}
	return midway || !msgNow, nil
}

func opOf(a *record.Action) string {
	if a == nil {
		return "-"
	}
	return a.Op
}

// batchIDs maps each message id to its envelopes' batch id.
func batchIDs(t *testing.T, s *store.Store) map[string]string {
	sums, err := s.OutboxSummaries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range sums {
		out[e.MessageID] = e.BatchID
	}
	return out
}

// Real crashes of the operator's actions: actor processes enqueue messages and hold,
// release, retry, hold again and cancel each (by id, or a group by target), printing
// each acknowledged step; the parent SIGKILLs them at random moments, reopens the
// store and checks that every acknowledged message is present, as its last
// acknowledged step (or the step in flight) left it; that fsck finds only what it can
// repair, and after the repair nothing, with every message still as allowed and
// consistent; and that the store still takes a new message and a new action.
func TestSIGKILLOperatorActions(t *testing.T) {
	rounds, seed, rng := killRounds(t, *actionKills, 10, "actionkills", 0x0bc0a7e5)
	ctx := context.Background()
	const storeRounds = 50 // a store lives this many rounds (fsck reads all of it each round)
	var dir string
	var acked map[string]actedMessage
	kills, total, repairs, inFlight := 0, 0, 0, 0
	fatal := func(round int, format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d round %d: %s", seed, round, fmt.Sprintf(format, args...))
	}
	for round := 0; round < rounds; round++ {
		if round%storeRounds == 0 {
			dir, acked = privateDir(t), map[string]actedMessage{}
		}
		actors := 1 + rng.IntN(2)
		delay := time.Duration(rng.IntN(100_000)) * time.Microsecond
		cmds, outs, failed := startChildren(t, "TestCrashActorProcess", actorEnv, dir, actors)
		if failed != "" {
			fatal(round, "actor did not start: %q", failed)
		}
		// Let them act for a random moment, then SIGKILL them all.
		kills += killAfter(cmds, delay)
		fresh := map[string]bool{}
		for i, cmd := range cmds {
			var other []string
			for outs[i].Scan() {
				line := outs[i].Text()
				f := strings.Fields(line)
				if len(f) != 4 || f[0] != "ack" {
					other = append(other, line)
					continue
				}
				n, _ := strconv.Atoi(f[3])
				a, seen := acked[f[2]]
				switch {
				case !seen && f[1] == actionSteps[0]:
					a = actedMessage{step: 0, n: n}
				case seen && a.step+1 < len(actionSteps) && f[1] == actionSteps[a.step+1] && a.n == n:
					a.step++
				default:
					fatal(round, "acknowledgement out of order: %q after %v", line, a)
				}
				acked[f[2]] = a
				fresh[f[2]] = true
			}
			err := cmd.Wait()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !exit.Sys().(syscall.WaitStatus).Signaled() {
				fatal(round, "actor ended by itself (%v), not by the kill: %s", err, strings.Join(other, "\n"))
			}
		}
		// Reopen (a fresh instance, as after a restart) and check what was acknowledged.
		c := &clock{}
		c.ns.Store(time.Now().UnixNano())
		s := openAt(t, dir, c, nil)
		check := map[string]bool{}
		for id := range fresh {
			check[id] = true
		}
		full := round%25 == 24 || round%storeRounds == storeRounds-1 || round == rounds-1
		if full {
			for id := range acked {
				check[id] = true
			}
		}
		batches := batchIDs(t, s)
		for id := range check {
			midway, err := checkActed(s, batches, id, acked[id], false)
			if err != nil {
				fatal(round, "after the kill, message %s: %v", id, err)
			}
			if midway && fresh[id] {
				inFlight++
			}
		}
		// fsck: only what it can repair; after the repair, nothing; and every
		// acknowledged message still as allowed, now consistent.
		opts := fsck.Options{Owner: owner(t).DID(), Signer: owner(t).Signer()}
		rep, err := fsck.Check(ctx, dir, opts)
		if err != nil {
			fatal(round, "fsck: %v", err)
		}
		for _, f := range rep.Findings {
			if f.Severity == fsck.Problem && !f.Repairable {
				fatal(round, "fsck: unrepairable %s %s: %s", f.Code, f.Path, f.Explanation)
			}
		}
		if rep.Problems() > 0 {
			repairs++
			if _, err := fsck.Repair(ctx, dir, opts); err != nil {
				fatal(round, "fsck repair: %v", err)
			}
			again, err := fsck.Check(ctx, dir, opts)
			if err != nil {
				fatal(round, "fsck after repair: %v", err)
			}
			for _, f := range again.Findings {
				if f.Severity == fsck.Problem {
					fatal(round, "fsck after repair still finds %s %s: %s", f.Code, f.Path, f.Explanation)
				}
			}
			s = openAt(t, dir, c, nil)
			batches = batchIDs(t, s)
		}
		for id := range check {
			if _, err := checkActed(s, batches, id, acked[id], true); err != nil {
				fatal(round, "after fsck (%d problems repaired), message %s: %v", rep.Problems(), id, err)
			}
		}
		// The store still takes a new message and a new action on it.
		if round%10 == 9 {
			req := sendRequest(c.Now(), 2)
			if _, err := s.Enqueue(ctx, req); err != nil {
				fatal(round, "store takes no new message after a kill: %v", err)
			}
			rs, err := carrier.Apply(ctx, s, carrier.Selector{MessageIDs: []string{req.MessageID}}, action(c, record.ActionHold))
			if err != nil || len(rs) != 1 || rs[0].Code != "" || rs[0].Changed != 2 {
				fatal(round, "store takes no new action after a kill: %+v %v", rs, err)
			}
			acked[req.MessageID] = actedMessage{step: 1, n: 2}
		}
		total = max(total, len(acked))
	}
	t.Logf("%d SIGKILLs over %d rounds (a fresh store every %d); up to %d acknowledged messages per store, all present and as acknowledged; %d found changed by a step in flight at the kill; fsck repaired %d states",
		kills, rounds, storeRounds, total, inFlight, repairs)
	if total == 0 {
		t.Fatal("no message was ever acknowledged: the kills came too early to test anything")
	}
}
