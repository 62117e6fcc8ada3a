package daemon

// The change feed (DESIGN §13, docs/DAEMON.md "Change feed"): an in-memory ring of
// the last ChangeWindow changes to messages, outbox, receipts and observations, fed
// by the daemon's own writes (recordChange) and by a detector that diffs the store's
// metadata whenever a listing stamp moves (writes by the carrier or by other
// processes). A cursor is {instance, sequence}; a cursor that cannot be continued
// is answered with a reset, never with a partial replay.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Change-feed limits.
const (
	defaultChangeWindow    = 100_000
	defaultChangePollEvery = 250 * time.Millisecond
	maxChangePage          = 256
	maxChangeWait          = 60 * time.Second
	// baselineWait bounds how long a request waits for the detector's first scan.
	baselineWait = 5 * time.Second
)

// Reset reasons.
const (
	resetNoCursor   = "no cursor"
	resetRestarted  = "daemon restarted"
	resetPastWindow = "cursor past the retained window"
	resetAhead      = "cursor ahead of the daemon"
)

// stateRemoved is the state of a change whose record went away (retention).
const stateRemoved = "removed"

// feedEntry is the last state the feed reported for one record. sig is the
// detector's fingerprint of it; "" when the state came from recordChange.
type feedEntry struct{ state, sig string }

// changeFeed is the ring and its notification.
type changeFeed struct {
	instance string
	window   int

	mu     sync.Mutex
	buf    []client.Change // circular once full: seq s lives at (s-1) % window
	seq    uint64          // the last sequence given
	notify chan struct{}   // closed and replaced at every append
	last   map[string]map[string]feedEntry

	baselined chan struct{} // closed after the detector's first full scan
	drainCh   chan struct{} // closed when the daemon drains
	drainOnce sync.Once
	waiting   atomic.Int32 // long polls waiting (tests)
}

func newChangeFeed(window int) *changeFeed {
	if window <= 0 {
		window = defaultChangeWindow
	}
	f := &changeFeed{instance: strings.ReplaceAll(uuid.NewString(), "-", ""), window: window,
		notify: make(chan struct{}), last: map[string]map[string]feedEntry{},
		baselined: make(chan struct{}), drainCh: make(chan struct{})}
	for _, t := range client.Topics {
		f.last[t] = map[string]feedEntry{}
	}
	return f
}

// appendLocked adds a change; f.mu is held.
func (f *changeFeed) appendLocked(topic, id, state string) {
	f.seq++
	c := client.Change{Seq: f.seq, Topic: topic, ID: id, State: state, At: time.Now().UTC()}
	if len(f.buf) < f.window {
		f.buf = append(f.buf, c)
	} else {
		f.buf[(f.seq-1)%uint64(f.window)] = c
	}
	close(f.notify)
	f.notify = make(chan struct{})
}

// record appends a change made by the daemon itself.
func (f *changeFeed) record(topic, id, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.last[topic]; m != nil {
		m[id] = feedEntry{state: state}
	}
	f.appendLocked(topic, id, state)
}

// observe is the detector's report of record id of topic in state, fingerprinted
// by sig; it appends a change unless the feed already reported it.
func (f *changeFeed) observe(topic, id, state, sig string, silent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.last[topic]
	e, ok := m[id]
	switch {
	case ok && e.sig == sig:
		return
	case ok && e.sig == "" && e.state == state: // reported by recordChange already
		m[id] = feedEntry{state: state, sig: sig}
		return
	}
	m[id] = feedEntry{state: state, sig: sig}
	if !silent {
		f.appendLocked(topic, id, state)
	}
}

// forget reports the records of topic not in seen as removed.
func (f *changeFeed) forget(topic string, seen map[string]bool, silent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.last[topic] {
		if !seen[id] {
			delete(f.last[topic], id)
			if !silent {
				f.appendLocked(topic, id, stateRemoved)
			}
		}
	}
}

// drain makes every long poll, present and future, return at once.
func (f *changeFeed) drain() { f.drainOnce.Do(func() { close(f.drainCh) }) }

// cursor encodes {instance, seq}: opaque to clients.
func (f *changeFeed) cursor(seq uint64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(f.instance + ":" + strconv.FormatUint(seq, 10)))
}

func parseCursor(s string) (instance string, seq uint64, err error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return "", 0, errors.New("malformed cursor")
	}
	inst, n, ok := strings.Cut(string(raw), ":")
	if !ok || inst == "" {
		return "", 0, errors.New("malformed cursor")
	}
	seq, err = strconv.ParseUint(n, 10, 64)
	if err != nil {
		return "", 0, errors.New("malformed cursor")
	}
	return inst, seq, nil
}

// page is the result of a read: changes after a sequence, the sequence to continue
// from, or a reset reason.
type page struct {
	changes []client.Change
	next    uint64
	reset   string
}

// readLocked returns up to max changes after seq `after` in topics (nil: all).
func (f *changeFeed) readLocked(after uint64, topics map[string]bool, max int) page {
	if after > f.seq {
		return page{next: f.seq, reset: resetAhead}
	}
	oldest := uint64(1) // the oldest retained sequence
	if f.seq > uint64(f.window) {
		oldest = f.seq - uint64(f.window) + 1
	}
	if after+1 < oldest {
		return page{next: f.seq, reset: resetPastWindow}
	}
	p := page{next: f.seq}
	for s := after + 1; s <= f.seq; s++ {
		c := f.buf[(s-1)%uint64(f.window)]
		if topics != nil && !topics[c.Topic] {
			continue
		}
		p.changes = append(p.changes, c)
		if len(p.changes) == max {
			p.next = s
			break
		}
	}
	return p
}

// next answers a request after seq `after`: the changes pending, or if none and
// wait > 0, the first ones to come within wait. It returns early, possibly with no
// change, when ctx ends or the daemon drains. The notification channel is taken
// under the lock the sequence is read with, so no change can slip between the read
// and the wait.
func (f *changeFeed) next(ctx context.Context, after uint64, topics map[string]bool, wait time.Duration) page {
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		f.mu.Lock()
		p := f.readLocked(after, topics, maxChangePage)
		ch := f.notify
		f.mu.Unlock()
		if p.reset != "" || len(p.changes) > 0 || wait <= 0 {
			return p
		}
		after = p.next
		f.waiting.Add(1)
		select {
		case <-ch:
			f.waiting.Add(-1)
			continue
		case <-timeout:
		case <-ctx.Done():
		case <-f.drainCh:
		}
		f.waiting.Add(-1)
		return p
	}
}

// recordChange reports a write the daemon made itself: record id of topic
// (client.TopicMessages, …) is now in state. The detector would find it too; this
// makes it visible at once, and the detector does not report the same state again.
func (d *Daemon) recordChange(topic, id, state string) { d.changes.record(topic, id, state) }

// detectChanges diffs the store's metadata against the feed's last states whenever
// a kind's listing stamp moves (polled every ChangePollEvery). The first full scan
// is the baseline and reports nothing. A state that persists is always reported;
// states that come and go between two scans are coalesced into the latest.
func (d *Daemon) detectChanges(ctx context.Context) {
	every := d.opts.ChangePollEvery
	if every <= 0 {
		every = defaultChangePollEvery
	}
	dt := d.newDetector()
	for {
		dt.poll(ctx)
		if !sleepCtx(ctx, every) {
			return
		}
	}
}

// detector is the change detector's state between polls.
type detector struct {
	d        *Daemon
	stamps   map[record.Kind]seenStamp
	baseline bool
}

// seenStamp is the listing stamp a kind was last scanned at, and whether it was racy
// then: a racy stamp may stay the same across a change, so it is scanned again.
type seenStamp struct {
	stamp store.Stamp
	racy  bool
}

var detectorKinds = []record.Kind{record.KindMessages, record.KindOutbox, record.KindReceipts, record.KindObservations}

func (d *Daemon) newDetector() *detector {
	return &detector{d: d, stamps: map[record.Kind]seenStamp{}, baseline: true}
}

// poll checks every kind once: a kind is scanned when its listing stamp moved since
// the last scan, or did not but was racy then (a change within the file system's
// timestamp tick can leave the stamp as it is). A kind that cannot be listed or read
// is a health problem ("changes <kind>"), logged as a condition, until a later poll
// reads it; then the problems the API met are read again.
func (dt *detector) poll(ctx context.Context) {
	d, f := dt.d, dt.d.changes
	ok := true
	for _, k := range detectorKinds {
		key := "changes " + string(k)
		st, err := d.st.ListingStamp(k)
		racy := false
		if err == nil {
			if old, seen := dt.stamps[k]; seen && old.stamp == st && !old.racy {
				continue
			}
			racy = d.st.StampRacy(st) // judged before the scan reads what st stands for
			err = d.scanKind(ctx, k, dt.baseline)
		}
		if err != nil {
			ok = false
			if ctx.Err() == nil {
				d.problem(key, "daemon: change detector: the store cannot be read", err, "kind", k)
			}
			continue
		}
		dt.stamps[k] = seenStamp{stamp: st, racy: racy}
		d.recovered(key, "daemon: change detector: the store reads again", "kind", k)
	}
	if dt.baseline && ok {
		dt.baseline = false
		close(f.baselined)
	}
	if ctx.Err() == nil {
		d.recheckAPIProblems(ok)
	}
}

// scanKind reports k's records whose state differs from the feed's.
func (d *Daemon) scanKind(ctx context.Context, k record.Kind, silent bool) error {
	f := d.changes
	topic := string(k)
	seen := map[string]bool{}
	switch k {
	case record.KindMessages:
		sums, err := d.st.MessageSummaries(ctx)
		if err != nil {
			return err
		}
		for _, s := range sums {
			seen[s.MessageID] = true
			f.observe(topic, s.MessageID, s.Status, s.Status+"|"+s.ClosedBy+"|"+strconv.FormatInt(s.UpdatedAt, 10), silent)
		}
	case record.KindOutbox:
		sums, err := d.st.OutboxSummaries(ctx)
		if err != nil {
			return err
		}
		for _, s := range sums {
			seen[s.EnvelopeID] = true
			f.observe(topic, s.EnvelopeID, s.State, s.State+"|"+strconv.Itoa(s.Attempts), silent)
		}
	case record.KindReceipts, record.KindObservations:
		ids, err := d.st.List(k)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := d.st.Get(k, id)
			if err != nil {
				return err
			}
			if r == nil {
				continue // removed meanwhile
			}
			state, sig := recordState(r)
			seen[id] = true
			f.observe(topic, id, state, sig, silent)
		}
	default:
		return fmt.Errorf("change detector: kind %s is not a topic", k)
	}
	f.forget(topic, seen, silent)
	return nil
}

// recordState is the state a receipt or observation is reported with, and its
// fingerprint for the diff.
func recordState(r record.Record) (state, sig string) {
	switch r := r.(type) {
	case *record.Receipt:
		return r.State, r.State + "|" + r.OutcomeCode
	case *record.Observation:
		return "observed", fmt.Sprintf("observed|%d|%d", len(r.Facts), len(r.Published))
	}
	return "", ""
}

func (d *Daemon) serveChanges(w http.ResponseWriter, r *http.Request) {
	f := d.changes
	q := r.URL.Query()
	var topics map[string]bool
	if s := q.Get("topics"); s != "" {
		topics = map[string]bool{}
		for t := range strings.SplitSeq(s, ",") {
			t = strings.TrimSpace(t)
			if !isTopic(t) {
				writeError(w, http.StatusBadRequest, codeBadRequest, fmt.Sprintf("unknown topic %q (topics: %s)", t, strings.Join(client.Topics, ",")))
				return
			}
			topics[t] = true
		}
	}
	var wait time.Duration
	if s := q.Get("wait"); s != "" {
		var err error
		if wait, err = time.ParseDuration(s); err != nil {
			n, nerr := strconv.Atoi(s) // plain seconds
			wait, err = time.Duration(n)*time.Second, nerr
		}
		if err != nil || wait < 0 {
			writeError(w, http.StatusBadRequest, codeBadRequest, "wait must be a duration such as 30s (at most 60s)")
			return
		}
		wait = min(wait, maxChangeWait)
	}
	after := q.Get("after")
	var inst string
	var seq uint64
	if after != "" {
		var err error
		if inst, seq, err = parseCursor(after); err != nil {
			writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
			return
		}
	}
	// Changes are reported against the detector's baseline: wait for it.
	t := time.NewTimer(baselineWait)
	select {
	case <-f.baselined:
		t.Stop()
	case <-t.C:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, codeNotReady, "the change feed is starting")
		return
	case <-r.Context().Done():
		t.Stop()
		writeError(w, http.StatusServiceUnavailable, codeNotReady, "request cancelled")
		return
	}
	switch {
	case after == "":
		d.writeReset(w, resetNoCursor)
		return
	case inst != f.instance:
		d.writeReset(w, resetRestarted)
		return
	}
	if wait > 0 {
		// The server's read and write timeouts (60 s) count from the request's
		// arrival and may be shorter than the wait; a read deadline that passes
		// cancels the request. Make room for this one.
		rc := http.NewResponseController(w)
		end := time.Now().Add(wait + 30*time.Second)
		_ = rc.SetReadDeadline(end)
		_ = rc.SetWriteDeadline(end)
	}
	p := f.next(r.Context(), seq, topics, wait)
	if p.reset != "" {
		d.writeReset(w, p.reset)
		return
	}
	out := client.ChangePage{Changes: p.changes, Cursor: f.cursor(p.next)}
	if out.Changes == nil {
		out.Changes = []client.Change{}
	}
	writeJSON(w, http.StatusOK, out)
}

// writeReset answers a reset with the current cursor.
func (d *Daemon) writeReset(w http.ResponseWriter, reason string) {
	f := d.changes
	f.mu.Lock()
	cur := f.seq
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, client.ChangePage{Changes: []client.Change{}, Cursor: f.cursor(cur), Reset: true, Reason: reason})
}

func isTopic(t string) bool {
	for _, x := range client.Topics {
		if x == t {
			return true
		}
	}
	return false
}
