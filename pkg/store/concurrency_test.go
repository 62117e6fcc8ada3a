package store_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The helper process protocol (TestConcHelperProcess): the parent sets concEnvDir and
// concEnvCount, the child opens the store, prints "ready", waits for a line on stdin,
// then enqueues with concChildWorkers goroutines and prints one
// "ack <messageId> <envelopeId>[,<envelopeId>…]" line per acknowledged message.
const (
	concEnvDir       = "SEALBRIDGE_CONC_STORE_DIR"
	concEnvCount     = "SEALBRIDGE_CONC_COUNT"
	concChildWorkers = 4
	concLockWait     = 30 * time.Second
)

// concAck is one acknowledged message: its id and its envelope ids in ordinal order.
type concAck struct {
	msgID     string
	envelopes []string
	from      string // "parent" or "child N", for messages
}

// concEnvelopes returns the message's envelope count: 1 or 2, alternating, so batches
// of both sizes are exercised.
func concEnvelopes(i int) int { return 1 + i%2 }

// concEnqueueShare enqueues count messages with workers goroutines (each its share)
// and calls ack for every acknowledged one. It returns the errors of failed enqueues.
func concEnqueueShare(t testing.TB, s *store.Store, workers, count int, ack func(store.SendRequest)) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for w := range workers {
		n := count / workers
		if w < count%workers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				req := sendRequest(t, concEnvelopes(w+i))
				if _, err := s.Enqueue(context.Background(), req); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("worker %d, message %d (%s): %w", w, i, req.MessageID, err))
					mu.Unlock()
					continue
				}
				ack(req)
			}
		}()
	}
	wg.Wait()
	return errs
}

func concEnvelopeIDs(req store.SendRequest) []string {
	ids := make([]string, len(req.Envelopes))
	for i, e := range req.Envelopes {
		ids[i] = e.EnvelopeID
	}
	return ids
}

// TestConcHelperProcess is the child of TestConcEnqueueProcesses; run directly it does
// nothing.
func TestConcHelperProcess(t *testing.T) {
	dir := os.Getenv(concEnvDir)
	if dir == "" {
		return
	}
	count, err := strconv.Atoi(os.Getenv(concEnvCount))
	if err != nil || count <= 0 {
		t.Fatalf("bad %s: %q", concEnvCount, os.Getenv(concEnvCount))
	}
	s := openStore(t, store.Options{Dir: dir, LockWait: concLockWait})
	var outMu sync.Mutex
	say := func(line string) {
		outMu.Lock()
		defer outMu.Unlock()
		// os.Stdout is unbuffered: one line, one write(2).
		if _, err := io.WriteString(os.Stdout, line+"\n"); err != nil {
			t.Errorf("stdout: %v", err)
		}
	}
	say("ready")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if strings.TrimSpace(line) != "go" {
		t.Fatalf("no go signal from the parent (%q, %v)", line, err)
	}
	errs := concEnqueueShare(t, s, concChildWorkers, count, func(req store.SendRequest) {
		say("ack " + req.MessageID + " " + strings.Join(concEnvelopeIDs(req), ","))
	})
	for _, err := range errs {
		t.Errorf("enqueue: %v", err)
	}
}

// concOrder records whose acknowledgements arrived in which order ('p' parent, 'c'
// child), to show that the processes really enqueued at the same time.
type concOrder struct {
	mu  sync.Mutex
	seq []byte
}

func (o *concOrder) note(who byte) {
	o.mu.Lock()
	o.seq = append(o.seq, who)
	o.mu.Unlock()
}

// switches counts how often consecutive acknowledgements came from different sides.
func (o *concOrder) switches() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for i := 1; i < len(o.seq); i++ {
		if o.seq[i] != o.seq[i-1] {
			n++
		}
	}
	return n
}

// concChild is a running helper process.
type concChild struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	ready  chan struct{}
	done   chan struct{} // closed when stdout is drained
	mu     sync.Mutex
	acks   []concAck
	other  []string // stdout lines that are not acks
}

func concStartChild(t *testing.T, name, dir string, count int, order *concOrder) *concChild {
	t.Helper()
	c := &concChild{name: name, ready: make(chan struct{}), done: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestConcHelperProcess$", "-test.count=1", "-test.timeout=5m")
	c.cmd.Env = append(os.Environ(), concEnvDir+"="+dir, concEnvCount+"="+strconv.Itoa(count))
	c.cmd.Stderr = &c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		readySeen := false
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "ready" && !readySeen:
				readySeen = true
				close(c.ready)
			case strings.HasPrefix(line, "ack "):
				f := strings.Fields(line)
				c.mu.Lock()
				if len(f) == 3 {
					c.acks = append(c.acks, concAck{msgID: f[1], envelopes: strings.Split(f[2], ","), from: name})
					order.note('c')
				} else {
					c.other = append(c.other, line)
				}
				c.mu.Unlock()
			default:
				c.mu.Lock()
				c.other = append(c.other, line)
				c.mu.Unlock()
			}
		}
		if !readySeen {
			close(c.ready)
		}
	}()
	return c
}

// concWait waits for ch, failing the test when the deadline passes first.
func concWait(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// TestConcEnqueueProcesses is the acceptance test: eight goroutines of this process
// and two helper processes (four goroutines each) enqueue 1,000 messages in one store
// at the same time. Afterwards a fresh, uncached store must hold every acknowledged
// message with its committed batch and nothing else, with no temp or lock left.
func TestConcEnqueueProcesses(t *testing.T) {
	const (
		parentWorkers = 8
		parentCount   = 600 // 8 × 75
		childCount    = 200 // per child
		children      = 2
	)
	if parentCount+children*childCount != 1000 {
		t.Fatal("the acceptance test enqueues 1,000 messages")
	}
	start := time.Now()
	dir := filepath.Join(t.TempDir(), "store")
	s := openStore(t, store.Options{Dir: dir, LockWait: concLockWait})

	var (
		kids  []*concChild
		order concOrder
	)
	for i := range children {
		c := concStartChild(t, fmt.Sprintf("child %d", i+1), dir, childCount, &order)
		kids = append(kids, c)
		t.Cleanup(func() {
			if c.cmd.ProcessState == nil { // still running: the test failed early
				_ = c.cmd.Process.Kill()
				_ = c.cmd.Wait()
			}
		})
	}
	for _, c := range kids {
		concWait(t, c.ready, 60*time.Second, c.name+" to be ready")
	}
	// Start everybody at once.
	for _, c := range kids {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			t.Fatalf("%s: sending the go signal: %v", c.name, err)
		}
		_ = c.stdin.Close()
	}
	var (
		pmu        sync.Mutex
		parentAcks []concAck
	)
	errs := concEnqueueShare(t, s, parentWorkers, parentCount, func(req store.SendRequest) {
		pmu.Lock()
		parentAcks = append(parentAcks, concAck{msgID: req.MessageID, envelopes: concEnvelopeIDs(req), from: "parent"})
		pmu.Unlock()
		order.note('p')
	})
	for _, err := range errs {
		t.Errorf("parent enqueue: %v", err)
	}
	for _, c := range kids {
		concWait(t, c.done, 120*time.Second, c.name+" to finish")
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("%s: %v\nstderr:\n%s\nother stdout:\n%s", c.name, err, c.stderr.String(), strings.Join(c.other, "\n"))
		}
	}
	enqueued := time.Since(start)

	acks := slices.Clone(parentAcks)
	for _, c := range kids {
		if len(c.acks) != childCount {
			t.Errorf("%s acknowledged %d of %d messages", c.name, len(c.acks), childCount)
		}
		acks = append(acks, c.acks...)
	}
	sw := order.switches()
	t.Logf("enqueued %d acknowledged messages in %v; acknowledgements alternated %d times between this process and the children",
		len(acks), enqueued.Round(time.Millisecond), sw)
	if sw < 2 {
		t.Errorf("the processes did not enqueue concurrently (%d alternations)", sw)
	}
	if len(acks) != 1000 {
		t.Errorf("%d messages acknowledged, want 1000", len(acks))
	}
	concVerify(t, dir, acks)
	t.Logf("verified in %v", (time.Since(start) - enqueued).Round(time.Millisecond))
}

// concVerify checks the store at dir with a fresh, uncached Store: exactly the
// acknowledged messages, each queued with its committed batch (a marker for two
// envelopes, none for a single), every outbox record a member of a committed batch,
// every batch a committed one, no temp or lock left, and a generation that grew once
// per publication.
func concVerify(t *testing.T, dir string, acks []concAck) {
	t.Helper()
	ctx := context.Background()
	fresh := openStore(t, store.Options{Dir: dir, CacheEntries: -1})
	byID := map[string]concAck{}
	envelopes := 0
	for _, a := range acks {
		if _, dup := byID[a.msgID]; dup {
			t.Errorf("message %s acknowledged twice", a.msgID)
		}
		byID[a.msgID] = a
		envelopes += len(a.envelopes)
	}
	for _, a := range acks {
		m, err := fresh.Message(a.msgID)
		if err != nil || m == nil {
			t.Errorf("%s's message %s: %v, %v", a.from, a.msgID, m, err)
			continue
		}
		if m.MessageID != a.msgID || m.Status != record.StatusQueued {
			t.Errorf("message %s: id %s status %q", a.msgID, m.MessageID, m.Status)
		}
		pend, err := fresh.Pending(ctx, a.msgID)
		if err != nil || len(pend) != len(a.envelopes) {
			t.Errorf("Pending(%s) = %d members, %v; want %d", a.msgID, len(pend), err, len(a.envelopes))
			continue
		}
		for i, o := range pend {
			if o.Ordinal != i || o.EnvelopeID != a.envelopes[i] || o.MessageID != a.msgID || o.State != record.StatePending {
				t.Errorf("Pending(%s)[%d] = envelope %s ordinal %d message %s state %s; want envelope %s",
					a.msgID, i, o.EnvelopeID, o.Ordinal, o.MessageID, o.State, a.envelopes[i])
			}
		}
		if mem, err := fresh.Committed(pend[0].BatchID); err != nil || len(mem) != len(a.envelopes) {
			t.Errorf("Committed(%s) of message %s: %d members, %v", pend[0].BatchID, a.msgID, len(mem), err)
		}
	}

	// Nothing else: message records, batches and outbox records are exactly those of
	// the acknowledged messages.
	msgIDs, err := fresh.List(record.KindMessages)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgIDs) != len(byID) {
		t.Errorf("%d message records, %d acknowledged messages", len(msgIDs), len(byID))
	}
	for _, id := range msgIDs {
		if _, ok := byID[id]; !ok {
			t.Errorf("message record %s was never acknowledged", id)
		}
	}
	batchIDs, err := fresh.List(record.KindBatches)
	if err != nil {
		t.Fatal(err)
	}
	singles := 0
	for _, a := range acks {
		if len(a.envelopes) == 1 {
			singles++
			batchIDs = append(batchIDs, a.envelopes[0]) // a single's batch id is its envelope id
		}
	}
	if len(batchIDs)-singles != len(byID)-singles || singles == 0 {
		t.Errorf("%d batch markers, %d acknowledged messages of which %d singles", len(batchIDs)-singles, len(byID), singles)
	}
	member := map[string]string{} // envelope id → batch id
	for _, b := range batchIDs {
		mem, err := fresh.Committed(b)
		if err != nil || len(mem) == 0 {
			t.Errorf("batch %s: %d members, %v", b, len(mem), err)
			continue
		}
		if _, ok := byID[mem[0].MessageID]; !ok {
			t.Errorf("batch %s belongs to message %s, which was never acknowledged", b, mem[0].MessageID)
		}
		for _, o := range mem {
			member[o.EnvelopeID] = b
		}
	}
	outIDs, err := fresh.List(record.KindOutbox)
	if err != nil {
		t.Fatal(err)
	}
	if len(outIDs) != envelopes {
		t.Errorf("%d outbox records, %d acknowledged envelopes", len(outIDs), envelopes)
	}
	for _, id := range outIDs {
		r, err := store.GetAs[*record.Outbox](fresh, id)
		if err != nil || r == nil {
			t.Errorf("outbox %s: %v %v", id, r, err)
			continue
		}
		if b, ok := member[id]; !ok || b != r.BatchID {
			t.Errorf("outbox %s (batch %s) is not a member of a committed batch", id, r.BatchID)
		}
	}

	// No staged temp or lock temp left anywhere, and the lock file says free; only the
	// generation file and the lock file are hidden, and after its header the generation
	// grew by one byte per publication (n members + message, + marker for more than one member;
	// far fewer than a compaction needs).
	publications := 0
	for _, a := range acks {
		publications += len(a.envelopes) + 1
		if len(a.envelopes) > 1 {
			publications++
		}
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		switch {
		case p == dir:
		case name == ".lock":
			if data, err := os.ReadFile(p); err != nil || !bytes.HasPrefix(data, []byte(`{"free":true`)) {
				t.Errorf("the lock is left held: %.80q, %v", data, err)
			}
		case strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".tmp"):
			t.Errorf("left behind: %s", p)
		case name == ".generation":
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			header, marks, ok := bytes.Cut(data, []byte("\n"))
			if !ok || !bytes.HasPrefix(header, []byte("sealbridge-generation ")) {
				t.Errorf(".generation does not start with its header: %.60q", data)
			} else if len(marks) != publications {
				t.Errorf(".generation has %d marks after its header, want one per publication: %d", len(marks), publications)
			}
		case strings.HasPrefix(name, "."):
			t.Errorf("unexpected hidden file %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestConcReadModifyWrite: eight goroutines each increment one message record's
// Attempts 50 times, each increment a read-modify-write transaction. A lost update
// would leave fewer than 400. "shared": one Store; "instances": every goroutine has
// its own Store on the same directory, so the writers exclude one another only through
// the lock file and must not trust another instance's cached copy. The "prepared"
// variants do the same with PreparedTransaction, whose plan is published only if
// nothing it read changed meanwhile (group commit across the goroutines of a Store).
func TestConcReadModifyWrite(t *testing.T) {
	const workers, rounds = 8, 50
	for _, mode := range []string{"shared", "instances", "prepared/shared", "prepared/instances"} {
		t.Run(mode, func(t *testing.T) {
			run := (*store.Store).Transaction
			if strings.HasPrefix(mode, "prepared/") {
				run = (*store.Store).PreparedTransaction
			}
			s := openStore(t, store.Options{LockWait: concLockWait})
			req, _ := enqueue(t, s, 1)
			stores := make([]*store.Store, workers)
			for i := range stores {
				stores[i] = s
				if strings.HasSuffix(mode, "instances") {
					stores[i] = openStore(t, store.Options{Dir: s.Dir(), LockWait: concLockWait})
				}
			}
			var (
				wg       sync.WaitGroup
				failures atomic.Int64
				errMu    sync.Mutex
				firstErr error
			)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range rounds {
						err := run(stores[w], context.Background(), func(tx *store.Tx) error {
							m, err := store.TxGet[*record.Message](tx, req.MessageID)
							if err != nil {
								return err
							}
							if m == nil {
								return errors.New("message vanished")
							}
							m.Attempts++
							m.UpdatedAt = time.Now().UnixMilli()
							return tx.Put(m)
						})
						if err != nil {
							failures.Add(1)
							errMu.Lock()
							if firstErr == nil {
								firstErr = err
							}
							errMu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			if n := failures.Load(); n > 0 {
				t.Fatalf("%d transactions failed; first: %v", n, firstErr)
			}
			for i, st := range []*store.Store{s, openStore(t, store.Options{Dir: s.Dir(), CacheEntries: -1})} {
				m, err := store.GetAs[*record.Message](st, req.MessageID)
				if err != nil || m == nil {
					t.Fatalf("store %d: %v %v", i, m, err)
				}
				if m.Attempts != workers*rounds {
					t.Errorf("store %d: attempts = %d, want %d (lost updates)", i, m.Attempts, workers*rounds)
				}
			}
		})
	}
}

// TestConcRetryAfterInterruptedEnqueue: a client whose Enqueue failed (here: the
// rename of the batch marker fails, after the members and the message record were
// published) retries with the same request, as it must after any error. The retry
// must not be acknowledged unless the message is then really accepted: present with a
// committed batch.
func TestConcRetryAfterInterruptedEnqueue(t *testing.T) {
	var failMarker atomic.Bool
	failMarker.Store(true)
	injected := errors.New("injected: marker rename fails")
	s := openStore(t, store.Options{WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			if op.Kind == fsx.OpRename && strings.HasPrefix(op.Path2, string(record.KindBatches)+"/") && failMarker.Load() {
				return injected
			}
			return nil
		}
		return f
	}})
	req := sendRequest(t, 2)
	if _, err := s.Enqueue(context.Background(), req); err == nil {
		t.Fatal("Enqueue succeeded although its marker could not be published")
	}
	if m, err := s.Message(req.MessageID); err != nil || m != nil {
		t.Fatalf("unaccepted message is visible: %v %v", m, err)
	}
	failMarker.Store(false)
	m, err := s.Enqueue(context.Background(), req)
	if err != nil {
		t.Logf("retry refused: %v", err) // acceptable: nothing was acknowledged
		return
	}
	got, gerr := s.Message(req.MessageID)
	pend, perr := s.Pending(context.Background(), req.MessageID)
	if gerr == nil && got != nil && perr == nil && len(pend) == len(req.Envelopes) {
		return
	}
	t.Errorf("retry acknowledged message %s (status %q), but Message() = %v, %v and Pending() = %d envelopes, %v (want %d): it was never accepted",
		req.MessageID, m.Status, got, gerr, len(pend), perr, len(req.Envelopes))
}
