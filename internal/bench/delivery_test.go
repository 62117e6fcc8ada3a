package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Delivery: the carrier (pkg/carrier) draining a backlog of pending envelopes to one
// reference relay (pkg/relay) running in this process behind an HTTP server on
// 127.0.0.1, against the same relay's raw accept rate, and the store-lock holds of a
// target that goes unreachable and comes back. Only the public carrier and relay APIs
// are used, so the rows follow whatever those packages do.

// Backlog sizes (docs/PERFORMANCE.md): the acceptance sizes in the full report, smaller
// in the quick report and in the every-benchmark-once smoke run (each row says so).
var (
	deliverSize = sized{full: 10_000, quick: 200, smoke: 128}
	cycleSize   = sized{full: 10_000, quick: 2_048, smoke: 128}
)

// relaySeed is the reference relay's own identity (it signs receipts).
var relaySeed = [32]byte{7: 7, 31: 1}

// relayServer is one HTTP server for the whole process; each benchmark run points it
// at a fresh relay (fresh data root), so the relay URL, which the pre-signed outbox
// records name, never changes.
var (
	relaySrvOnce sync.Once
	relaySrv     *httptest.Server
	relayCur     atomic.Pointer[http.Handler]
)

func relayURL() string {
	relaySrvOnce.Do(func() {
		relaySrv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := relayCur.Load()
			if h == nil {
				http.Error(w, "no relay", http.StatusServiceUnavailable)
				return
			}
			(*h).ServeHTTP(w, r)
		}))
		onClose(relaySrv.Close)
	})
	return relaySrv.URL
}

// startRelay opens a fresh reference relay in a new data root and serves it at
// relayURL until the returned stop is called.
func startRelay(b *testing.B) (*relay.Relay, func()) {
	id, err := identity.FromSeed(relaySeed[:])
	if err != nil {
		b.Fatal(err)
	}
	r, err := relay.New(relay.Options{Identity: id, Home: benchDir(b), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	relayURL()
	h := r.Handler()
	relayCur.Store(&h)
	return r, func() {
		relayCur.Store(nil)
		if err := r.Close(); err != nil {
			b.Error(err)
		}
	}
}

// backlog is n pending envelopes to the relay at relayURL, as the store holds them
// after Enqueue: messages of record.MaxBatchMembers envelopes (the first of kind
// message), each an outbox record per envelope, a message record and a batch marker,
// signed once per process; and n more envelopes of the same shape for the raw
// accept rate.
type backlog struct {
	n     int
	files []recordFile
	raw   [][]byte
}

// recordFile is one signed record file of a fixture.
type recordFile struct {
	kind record.Kind
	id   string
	data []byte
}

var (
	backlogMu sync.Mutex
	backlogs  = map[int]*backlog{}
)

// pendingBacklog returns the backlog of n envelopes, building it on first use.
func pendingBacklog(b *testing.B, n int) *backlog {
	backlogMu.Lock()
	defer backlogMu.Unlock()
	if bl := backlogs[n]; bl != nil {
		return bl
	}
	bl, err := buildBacklog(n, relayURL())
	if err != nil {
		b.Fatal(err)
	}
	backlogs[n] = bl
	return bl
}

func buildBacklog(n int, url string) (*backlog, error) {
	o, _, peer := owner()
	now := time.Now()
	deadline := now.Add(24 * time.Hour)
	body := bytes.Repeat([]byte("x"), 512)
	// Envelopes first (sealing and signing them is most of the work), on every core.
	envs := make([][]byte, 2*n)
	envIDs := make([]string, 2*n)
	msgIDs := make([]string, (n+record.MaxBatchMembers-1)/record.MaxBatchMembers)
	for i := range msgIDs {
		msgIDs[i] = uuid.NewString()
	}
	err := onAllCores(2*n, func(i int) error {
		msg := uuid.NewString()
		if i < n {
			msg = msgIDs[i/record.MaxBatchMembers]
		}
		e, data, err := envelope.NewMessage(o, identity.DID(peer), msg, body, deadline, now)
		if err != nil {
			return err
		}
		envs[i], envIDs[i] = data, e.ID()
		return nil
	})
	if err != nil {
		return nil, err
	}
	bl := &backlog{n: n, raw: envs[n:]}
	nowMs, deadlineMs := now.UnixMilli(), deadline.UnixMilli()
	retain := deadlineMs + 7*24*time.Hour.Milliseconds()
	var recs []record.Record
	for m, msgID := range msgIDs {
		lo, hi := m*record.MaxBatchMembers, min((m+1)*record.MaxBatchMembers, n)
		batch := &record.Batch{BatchID: uuid.NewString(), MessageID: msgID, PeerOwnerDID: peer, RelayURL: url,
			DeliveryDeadline: deadlineMs, CreatedAt: nowMs, RetainUntil: retain}
		for i := lo; i < hi; i++ {
			kind := record.EnvelopeMessage
			if i > lo {
				kind = record.EnvelopeDeliveryStatus
			}
			recs = append(recs, &record.Outbox{EnvelopeID: envIDs[i], MessageID: msgID, BatchID: batch.BatchID,
				EnvelopeKind: kind, State: record.StatePending, Ordinal: i - lo, RelayURL: url, PeerOwnerDID: peer,
				DeliveryDeadline: deadlineMs, NextAttemptAt: nowMs, Envelope: envs[i],
				EnvelopeDigest: envelope.Digest(envs[i]), RetainUntil: retain})
			batch.EnvelopeIDs = append(batch.EnvelopeIDs, envIDs[i])
		}
		recs = append(recs, &record.Message{MessageID: msgID, Status: record.StatusQueued, PeerOwnerDID: peer,
			RelayURL: url, EnvelopeDigest: envelope.Digest(envs[lo]), DeliveryDeadline: deadlineMs,
			CreatedAt: nowMs, UpdatedAt: nowMs, RetainUntil: retain}, batch)
	}
	bl.files = make([]recordFile, len(recs))
	err = onAllCores(len(recs), func(i int) error {
		data, err := record.Encode(o.Signer(), o.DID(), recs[i])
		bl.files[i] = recordFile{kind: recs[i].Kind(), id: recs[i].RecordID(), data: data}
		return err
	})
	return bl, err
}

// writeFiles writes fixture record files under storeDir (0700/0600, without fsync),
// then makes them durable with one syncfs, so their write-back is not part of what
// is measured next.
func writeFiles(storeDir string, files []recordFile) error {
	for _, k := range record.Kinds {
		if slices.ContainsFunc(files, func(f recordFile) bool { return f.kind == k }) {
			if err := os.MkdirAll(filepath.Join(storeDir, string(k)), 0o700); err != nil {
				return err
			}
		}
	}
	err := onAllCores(len(files), func(i int) error {
		f := files[i]
		return os.WriteFile(filepath.Join(storeDir, string(f.kind), f.id+".json"), f.data, 0o600)
	})
	if err != nil {
		return err
	}
	return syncFS(storeDir)
}

// backlogStore writes bl into a new store directory and opens it with opts, its
// indexes prepared (a daemon prepares them once at start-up).
func backlogStore(b *testing.B, bl *backlog, opts store.Options) *store.Store {
	opts.Dir = filepath.Join(benchDir(b), "store")
	if err := os.Mkdir(opts.Dir, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := writeFiles(opts.Dir, bl.files); err != nil {
		b.Fatal(err)
	}
	opts.Limits = noLimits
	s := openStore(b, opts)
	if err := s.Prepare(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

// attempts counts a carrier's settled attempts by outcome and signals when a count
// is reached (carrier.Options.Events).
type attempts struct {
	mu     sync.Mutex
	counts map[carrier.Outcome]int
	want   map[carrier.Outcome]int
	reach  map[carrier.Outcome]chan struct{}
	onHook func(carrier.Outcome, int) // called with each new count, under mu
}

func newAttempts() *attempts {
	return &attempts{counts: map[carrier.Outcome]int{}, want: map[carrier.Outcome]int{}, reach: map[carrier.Outcome]chan struct{}{}}
}

// when returns a channel closed once n attempts of outcome o were settled.
func (a *attempts) when(o carrier.Outcome, n int) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch := make(chan struct{})
	if a.counts[o] >= n {
		close(ch)
		return ch
	}
	a.want[o], a.reach[o] = n, ch
	return ch
}

func (a *attempts) event(e carrier.Event) {
	if e.Kind != carrier.EventAttempt {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.counts[e.Outcome]++
	if a.onHook != nil {
		a.onHook(e.Outcome, a.counts[e.Outcome])
	}
	if ch := a.reach[e.Outcome]; ch != nil && a.counts[e.Outcome] >= a.want[e.Outcome] {
		close(ch)
		delete(a.reach, e.Outcome)
	}
}

// runCarrier runs c until stop is called (which waits for Run to return).
func runCarrier(c *carrier.Carrier) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	c.Kick()
	return func() { cancel(); <-done }
}

// waitOrFail waits for ch, failing b if the carrier reported a store error first or
// took longer than any sane run (a stuck carrier must not hang the report).
func waitOrFail(b *testing.B, ch <-chan struct{}, storeErr <-chan error, what string) {
	select {
	case <-ch:
	case err := <-storeErr:
		b.Fatalf("%s: the carrier reported a store error: %v", what, err)
	case <-time.After(30 * time.Minute):
		b.Fatalf("%s: not reached after 30 minutes", what)
	}
}

// storeErrors forwards the carrier's store errors (the first few) to a channel.
func storeErrors(next func(carrier.Event)) (func(carrier.Event), <-chan error) {
	ch := make(chan error, 1)
	return func(e carrier.Event) {
		if e.Kind == carrier.EventStoreError {
			select {
			case ch <- e.Err:
			default:
			}
		}
		next(e)
	}, ch
}

// rawAccept posts envs to the relay back to back over one connection, as the
// carrier's transport does, and returns the accepts per second.
func rawAccept(b *testing.B, tr *carrier.HTTPTransport, envs [][]byte) float64 {
	ctx := context.Background()
	t0 := time.Now()
	for _, e := range envs {
		if res := tr.Send(ctx, relayURL(), e); res.Outcome != carrier.Accepted {
			b.Fatalf("raw accept: %v %v", res.Outcome, res.Err)
		}
	}
	return float64(len(envs)) / time.Since(t0).Seconds()
}

// BenchmarkCarrierDeliverOneRelay is delivery of a backlog of pending envelopes (10,000
// in the full report) to one local reference relay: a Carrier on a store holding
// them and a head (lease, send with the head, settle per envelope, as the carrier
// does it) from its start until the last envelope's accepted attempt is settled
// (send → relayed), reported as env/s; and, measured just before on the same
// relay, the relay's raw accept rate (raw-env/s): as many other envelopes posted
// back to back over one connection with the carrier's HTTP transport, each
// answered with a durable receipt.
func BenchmarkCarrierDeliverOneRelay(b *testing.B) {
	n := deliverSize.get()
	bl := pendingBacklog(b, n)
	var carrierTime time.Duration
	var rawRates []float64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		r, stopRelay := startRelay(b)
		tr := carrier.NewHTTPTransport(carrier.HTTPOptions{})
		rawRates = append(rawRates, rawAccept(b, tr, bl.raw))
		s := backlogStore(b, bl, store.Options{})
		// A head, as the daemon writes one: every post carries it and the relay
		// verifies it, so the row counts the witness's cost.
		if _, _, err := s.WriteHead(context.Background(), true); err != nil {
			b.Fatal(err)
		}
		att := newAttempts()
		events, storeErr := storeErrors(att.event)
		all := att.when(carrier.Accepted, n)
		c := carrier.New(s, tr, carrier.Options{Watch: carrier.WatchOff, Events: events})
		b.StartTimer()
		t0 := time.Now()
		stop := runCarrier(c)
		waitOrFail(b, all, storeErr, fmt.Sprintf("%d envelopes delivered", n))
		carrierTime += time.Since(t0)
		b.StopTimer()
		stop()
		tr.CloseIdleConnections()
		if got := r.Stats().Accepted; got != int64(2*n) {
			b.Fatalf("the relay accepted %d envelopes, want %d", got, 2*n)
		}
		if r.Stats().HeadsWitnessed == 0 {
			b.Fatal("the relay witnessed no head: the posts carried none")
		}
		stopRelay()
	}
	raw, _ := median(rawRates)
	b.ReportMetric(float64(n*b.N)/carrierTime.Seconds(), "env/s")
	b.ReportMetric(raw, "raw-env/s")
	b.ReportMetric(float64(n), "envelopes")
}

// gate is a transport whose relay can be switched off: while down, every Send
// answers Unreachable without a connection, as the HTTP transport does for a refused
// connection.
type gate struct {
	down atomic.Bool
	next carrier.Transport
}

func (g *gate) Send(ctx context.Context, url string, env []byte) carrier.Result {
	if g.down.Load() {
		return carrier.Result{Outcome: carrier.Unreachable, Err: errors.New("connection refused (the benchmark switched the relay off)")}
	}
	return g.next.Send(ctx, url, env)
}

// holdRecorder collects store-lock hold durations while on.
type holdRecorder struct {
	on    atomic.Bool
	mu    sync.Mutex
	holds latencies
}

func (h *holdRecorder) observe(d time.Duration) {
	if h.on.Load() {
		h.mu.Lock()
		h.holds = append(h.holds, d)
		h.mu.Unlock()
	}
}

// BenchmarkLockHoldUnreachable is the store-lock holds of one unreachable/back cycle
// of a target with a backlog of pending envelopes (10,000 in the full report): the
// carrier's first attempt finds the relay unreachable (the target's wait is persisted
// on every pending envelope), the relay comes back at once, the probe after
// ProbeEvery (50 ms here) is accepted (the wait is cleared), and the next pass sends
// its MaxPerPass (64). Every hold of the store lock from the carrier's start to the
// end of that pass is observed (store.Options.LockHoldObserver) and reported:
// max-hold-ms, p99-hold-ms and how many holds there were.
func BenchmarkLockHoldUnreachable(b *testing.B) {
	n := cycleSize.get()
	bl := pendingBacklog(b, n)
	const perPass = 64
	var all latencies
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		_, stopRelay := startRelay(b)
		rec := &holdRecorder{}
		s := backlogStore(b, bl, store.Options{LockHoldObserver: rec.observe})
		tr := carrier.NewHTTPTransport(carrier.HTTPOptions{})
		g := &gate{next: tr}
		g.down.Store(true)
		att := newAttempts()
		// The relay comes back as soon as the carrier has recorded it unreachable.
		att.onHook = func(o carrier.Outcome, _ int) {
			if o == carrier.Unreachable {
				g.down.Store(false)
			}
		}
		events, storeErr := storeErrors(att.event)
		wantAccepted := min(n, 1+perPass)
		back := att.when(carrier.Accepted, wantAccepted)
		c := carrier.New(s, g, carrier.Options{Watch: carrier.WatchOff, Events: events,
			ProbeEvery: 50 * time.Millisecond, MaxPerPass: perPass})
		rec.on.Store(true)
		b.StartTimer()
		stop := runCarrier(c)
		waitOrFail(b, back, storeErr, fmt.Sprintf("%d accepted after the relay came back", wantAccepted))
		b.StopTimer()
		rec.on.Store(false)
		stop()
		tr.CloseIdleConnections()
		stopRelay()
		att.mu.Lock()
		unreachable := att.counts[carrier.Unreachable]
		att.mu.Unlock()
		if unreachable != 1 {
			b.Fatalf("%d unreachable attempts, want 1", unreachable)
		}
		rec.mu.Lock()
		all = append(all, rec.holds...)
		rec.mu.Unlock()
	}
	if len(all) == 0 {
		b.Fatal("no lock hold observed")
	}
	slices.Sort(all)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(all[len(all)-1]), "max-hold-ms")
	b.ReportMetric(ms(all[int(0.99*float64(len(all)-1))]), "p99-hold-ms")
	b.ReportMetric(float64(len(all))/float64(b.N), "holds")
	b.ReportMetric(float64(n), "envelopes")
}
