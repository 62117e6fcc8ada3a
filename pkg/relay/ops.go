package relay

// The relay's operations endpoints, beside the protocol on the same handler:
// GET /livez (the process serves), GET /readyz (its storage answers) and GET
// /metrics (Prometheus, internal/promx). docs/RELAY.md "Operations".

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/promx"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Paths of the operations endpoints.
const (
	PathLivez   = "/livez"
	PathReadyz  = "/readyz"
	PathMetrics = "/metrics"
)

const (
	// readyFor is how long a storage probe's answer is reused: /readyz and
	// /metrics are public, and a probe of the file storage writes and
	// fsyncs a file, so a flood of them costs one probe a second.
	readyFor = time.Second
	// probeTimeout bounds one probe (and a scrape's depth read).
	probeTimeout = 5 * time.Second
)

// ops is the relay's operations state: the metrics registry and the last
// storage probe. probeMu serializes probes, so concurrent callers wait for
// one and share its answer.
type ops struct {
	reg     *prometheus.Registry
	handler http.Handler

	probeMu  sync.Mutex
	probedAt time.Time // wall clock, not Options.Now (a test's clock may stand still)
	probeErr error
	probed   bool
}

// counts is what the relay counts by code for its metrics. Guarded by r.mu.
type counts struct {
	refusals  map[string]int64 // envelopes refused (single or in a batch), by code
	reqErrors map[string]int64 // HTTP error answers of every endpoint, by code
}

func (c *counts) add(m *map[string]int64, code string, n int64) {
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[code] += n
}

// countRefusals counts n envelopes refused with code.
func (r *Relay) countRefusals(code string, n int) {
	r.mu.Lock()
	r.codes.add(&r.codes.refusals, code, int64(n))
	r.mu.Unlock()
}

func (r *Relay) countRequestError(code string) {
	r.mu.Lock()
	r.codes.add(&r.codes.reqErrors, code, 1)
	r.mu.Unlock()
}

// Ready reports whether the storage answers: on JetStream the connection is
// up and the inbox stream's leader answers; on the files a file can be
// created, written, fsynced and removed in the inbox directory. A probe's
// answer is reused for a second. A change of the answer is logged once.
// Safe for concurrent use.
func (r *Relay) Ready(ctx context.Context) error {
	o := &r.ops
	o.probeMu.Lock()
	defer o.probeMu.Unlock()
	if o.probed && time.Since(o.probedAt) < readyFor {
		return o.probeErr
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	err := r.back.probe(pctx)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err() // the caller went away: not the storage's answer
	}
	switch {
	case err != nil && (o.probeErr == nil || !o.probed):
		r.log.Warn("relay: not ready: the storage does not answer", "backend", r.backendName, "err", err.Error())
	case err == nil && o.probeErr != nil:
		r.log.Info("relay: ready: the storage answers again", "backend", r.backendName)
	}
	o.probed, o.probedAt, o.probeErr = true, time.Now(), err
	return err
}

func (r *Relay) serveLive(w http.ResponseWriter, _ *http.Request) (int, error) {
	writeOps(w, http.StatusOK, map[string]any{"status": "live", "did": string(r.id.DID())})
	return http.StatusOK, nil
}

func (r *Relay) serveReady(w http.ResponseWriter, req *http.Request) (int, error) {
	if err := r.Ready(req.Context()); err != nil {
		if req.Context().Err() != nil {
			return 0, errClientGone
		}
		w.Header().Set("Retry-After", "1")
		writeOps(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "did": string(r.id.DID()),
			"backend": r.backendName, "code": relayproto.CodeRelayStorageUnavailable,
			"message": "the relay's storage does not answer: " + err.Error()})
		return http.StatusServiceUnavailable, nil
	}
	writeOps(w, http.StatusOK, map[string]any{"status": "ready", "did": string(r.id.DID()), "backend": r.backendName})
	return http.StatusOK, nil
}

func (r *Relay) serveMetrics(w http.ResponseWriter, req *http.Request) (int, error) {
	r.ops.handler.ServeHTTP(w, req)
	return http.StatusOK, nil
}

func writeOps(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	writeJSONBytes(w, status, append(data, '\n'))
}

// probe of the file storage: a file created, written, fsynced and removed in
// the inbox directory (fsx.Stage; the load skips a temp left by a crash).
func (f *fileStore) probe(context.Context) error {
	s, err := fsx.Stage(f.fs, ".", []byte("ready\n"))
	if err != nil {
		return fmt.Errorf("the inbox directory %s is not writable: %w", f.inboxDir, err)
	}
	if err := s.Cleanup(); err != nil {
		return fmt.Errorf("the inbox directory %s: remove the probe: %w", f.inboxDir, err)
	}
	return nil
}

// depth of the file storage: every envelope in its inboxes, as the in-memory
// index holds them (past their deadline too, until the expiry pass).
func (f *fileStore) depth(context.Context) (n, bytes int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ib := range f.inboxes {
		n += int64(len(ib.entries))
		bytes += ib.bytes
	}
	return n, bytes, nil
}

func (f *fileStore) conn() *nats.Conn { return nil }

func (j *jsBackend) probe(ctx context.Context) error { return j.st.Ready(ctx) }

func (j *jsBackend) depth(ctx context.Context) (n, bytes int64, err error) {
	m, b, err := j.st.Depth(ctx)
	return int64(m), int64(b), err
}

func (j *jsBackend) conn() *nats.Conn { return j.st.Conn() }

// newOps makes the registry: build information, the Go and process
// collectors, and the relay's own series, computed at scrape time.
func (r *Relay) newOps(version string) {
	r.ops.reg = promx.NewRegistry("sealbridge_relay_build_info",
		prometheus.Labels{"version": version, "did": string(r.id.DID()), "backend": r.backendName})
	r.ops.reg.MustRegister(&relayCollector{r: r})
	r.ops.handler = promx.Handler(r.ops.reg)
}

var (
	descEnvelopes = prometheus.NewDesc("sealbridge_relay_envelopes_total",
		"Envelopes answered with a receipt, by outcome: accepted (new, stored) or duplicate (held already).", []string{"outcome"}, nil)
	descRefusals = prometheus.NewDesc("sealbridge_relay_envelope_refusals_total",
		"Envelopes refused, alone or in a batch, by error code (RELAY_QUOTA: a recipient's quota; RELAY_RATE_LIMITED: a sender's rate).",
		[]string{"code"}, nil)
	descReqErrors = prometheus.NewDesc("sealbridge_relay_request_errors_total",
		"HTTP error answers of every endpoint, by error code.", []string{"code"}, nil)
	descHeld = prometheus.NewDesc("sealbridge_relay_held_polls",
		"Inbox fetches held now (GET /v1/inbox with wait=).", nil, nil)
	descHeldLimit = prometheus.NewDesc("sealbridge_relay_held_polls_limit",
		"Held inbox fetches allowed, in all (scope=total), per recipient and per client address.", []string{"scope"}, nil)
	descHeldRefused = prometheus.NewDesc("sealbridge_relay_held_poll_refusals_total",
		"Held inbox fetches refused with 503 RELAY_BUSY, by the bound that refused them (total, recipient, address).", []string{"bound"}, nil)
	descInbox = prometheus.NewDesc("sealbridge_relay_inbox_envelopes",
		"Envelopes waiting in every inbox (past their deadline too, until the expiry pass removes them).", nil, nil)
	descInboxBytes = prometheus.NewDesc("sealbridge_relay_inbox_bytes",
		"Bytes of the envelopes waiting in every inbox (on JetStream: the stream's bytes, headers included).", nil, nil)
	descAcked = prometheus.NewDesc("sealbridge_relay_acked_envelopes_total",
		"Envelopes removed from inboxes by their recipients' acknowledgements.", nil, nil)
	descExpired = prometheus.NewDesc("sealbridge_relay_expired_envelopes_total",
		"Envelopes removed from inboxes past their delivery deadline.", nil, nil)
	descReady = prometheus.NewDesc("sealbridge_relay_storage_ready",
		"1 if the storage answers (GET /readyz would answer 200), else 0.", nil, nil)
	descScrapeErr = prometheus.NewDesc("sealbridge_relay_scrape_storage_error",
		"1 if the inbox depth could not be read for this scrape (the inbox series are then absent).", nil, nil)
	descNATSUp = prometheus.NewDesc("sealbridge_relay_nats_connected",
		"1 if the JetStream storage's NATS connection is connected, else 0 (reconnecting or closed).", nil, nil)
	descNATSReconnects = prometheus.NewDesc("sealbridge_relay_nats_reconnects_total",
		"Times the JetStream storage's NATS connection reconnected.", nil, nil)
)

// Codes every scrape shows, at 0 until counted: the limits' refusals.
var alwaysShownRefusals = []string{relayproto.CodeRelayQuota, relayproto.CodeRelayRateLimited,
	relayproto.CodeRecipientNotAllowed, relayproto.CodeEnvelopeConflict}

// relayCollector computes the relay's series at scrape time.
type relayCollector struct{ r *Relay }

var (
	descBodiesPending = prometheus.NewDesc("sealbridge_relay_bodies_pending",
		"Blob envelopes pending their body now (posted, not yet complete: not fetchable).", nil, nil)
	descBodies = prometheus.NewDesc("sealbridge_relay_bodies_total",
		"Blob bodies ended, by outcome: completed (verified, the envelope entered its inbox), expired (pending past the envelope's deadline), digest_mismatch (discarded, 422).",
		[]string{"outcome"}, nil)
	descBodyBytes = prometheus.NewDesc("sealbridge_relay_body_bytes_total",
		"Body bytes moved, by direction: in (received by uploads), out (sent by downloads).", []string{"direction"}, nil)
	descUploadConflicts = prometheus.NewDesc("sealbridge_relay_upload_offset_mismatches_total",
		"Body uploads answered 409 UPLOAD_OFFSET_MISMATCH (another offset, or another upload of the body running).", nil, nil)
	descHeads = prometheus.NewDesc("sealbridge_relay_store_heads_total",
		"Store heads carried by posts (Sealbridge-Head), by outcome: witnessed (valid, kept if higher), behind (valid, below the head kept for its sender: a sender behind what it signed earlier), invalid (refused 400 HEAD_INVALID).",
		[]string{"outcome"}, nil)
)

func (c *relayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEnvelopes, descRefusals, descReqErrors, descHeld, descHeldLimit, descHeldRefused,
		descInbox, descInboxBytes, descAcked, descExpired, descReady, descScrapeErr, descNATSUp, descNATSReconnects,
		descBodiesPending, descBodies, descBodyBytes, descUploadConflicts, descHeads} {
		ch <- d
	}
}

func (c *relayCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.r
	st := r.Stats()
	r.mu.Lock()
	refusals := map[string]int64{}
	for _, code := range alwaysShownRefusals {
		refusals[code] = 0
	}
	for k, v := range r.codes.refusals {
		refusals[k] = v
	}
	reqErrors := map[string]int64{}
	for k, v := range r.codes.reqErrors {
		reqErrors[k] = v
	}
	busy := map[string]int64{"total": 0, "recipient": 0, "address": 0}
	for k, v := range r.waits.busy {
		busy[k] = v
	}
	held, heldMax, perAddr := r.waits.n, r.waits.max, r.waits.maxPerAddr
	r.mu.Unlock()

	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(descEnvelopes, st.Accepted, "accepted")
	counter(descEnvelopes, st.Duplicates, "duplicate")
	for k, v := range refusals {
		counter(descRefusals, v, k)
	}
	for k, v := range reqErrors {
		counter(descReqErrors, v, k)
	}
	for k, v := range busy {
		counter(descHeldRefused, v, k)
	}
	gauge(descHeld, float64(held))
	gauge(descHeldLimit, float64(heldMax), "total")
	gauge(descHeldLimit, float64(maxWaitersPerRecipient), "recipient")
	gauge(descHeldLimit, float64(perAddr), "address")
	counter(descAcked, st.Acked)
	counter(descExpired, st.Expired)
	gauge(descBodiesPending, float64(st.BodiesPending))
	counter(descBodies, st.BodiesCompleted, "completed")
	counter(descBodies, st.BodiesExpired, "expired")
	counter(descBodies, st.BodyDigestMismatches, "digest_mismatch")
	counter(descBodyBytes, st.BodyBytesIn, "in")
	counter(descBodyBytes, st.BodyBytesOut, "out")
	counter(descUploadConflicts, st.UploadOffsetMismatches)
	counter(descHeads, st.HeadsWitnessed, "witnessed")
	counter(descHeads, st.HeadsBehind, "behind")
	counter(descHeads, st.HeadsInvalid, "invalid")

	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	ready := 1.0
	if r.Ready(ctx) != nil {
		ready = 0
	}
	gauge(descReady, ready)
	n, bytes, err := r.back.depth(ctx)
	if err != nil {
		gauge(descScrapeErr, 1)
	} else {
		gauge(descScrapeErr, 0)
		gauge(descInbox, float64(n))
		gauge(descInboxBytes, float64(bytes))
	}
	if nc := r.back.conn(); nc != nil {
		up := 0.0
		if nc.Status() == nats.CONNECTED {
			up = 1
		}
		gauge(descNATSUp, up)
		counter(descNATSReconnects, int64(nc.Stats().Reconnects))
	}
}
