package daemon

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sealbridge/sealbridge/internal/promx"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// metrics is the daemon's Prometheus registry. Queue gauges and carrier counters
// are computed at scrape time from the store's indexes and carrier.Stats.
type metrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.CounterVec
	enqueue     prometheus.Histogram
	refused     prometheus.Counter
	storeErrors *prometheus.CounterVec // the API's and maintenance's store errors
	// inboxRefused counts refused inbound envelopes by reason (record.RefusalReasons).
	inboxRefused *prometheus.CounterVec
	// refusalsNotKept counts refused envelopes counted but not kept (the bound on
	// refusals records was reached).
	refusalsNotKept prometheus.Counter
	// bodyBytes counts the plaintext bytes of large bodies the API streamed: "sent"
	// into streamed sends (sealed as blobs), "got" out of body downloads.
	bodyBytes *prometheus.CounterVec
}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{reg: promx.NewRegistry("sealbridge_build_info", prometheus.Labels{"version": d.opts.Version, "did": string(d.id.DID())}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sealbridge_api_requests_total",
			Help: "Local API requests by route and HTTP status."}, []string{"route", "code"}),
		enqueue: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sealbridge_enqueue_duration_seconds",
			Help:    "Time to durably enqueue a message (store lock wait, publication and fsyncs).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "sealbridge_api_refused_connections_total",
			Help: "Socket connections refused because the peer is another user (SO_PEERCRED)."}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sealbridge_daemon_store_errors_total",
			Help: "Store errors met by the API and the daemon's background loops (startup, change detector, inbox, maintenance), by error code."}, []string{"code"}),
		inboxRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sealbridge_inbox_refused_envelopes_total",
			Help: "Inbound envelopes the daemon refused (kept in GET /v1/inbox/refused), by reason."}, []string{"reason"}),
		refusalsNotKept: prometheus.NewCounter(prometheus.CounterOpts{Name: "sealbridge_inbox_refusals_not_kept_total",
			Help: "Refused inbound envelopes not kept as evidence because the store holds the most refusals it keeps (10,000)."}),
		bodyBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sealbridge_api_body_bytes_total",
			Help: "Plaintext bytes of large bodies the local API streamed: sent (into streamed sends, sealed as blobs) and got (out of GET /v1/inbox/{id}/body)."},
			[]string{"direction"}),
	}
	m.bodyBytes.WithLabelValues("sent")
	m.bodyBytes.WithLabelValues("got")
	for _, r := range record.RefusalReasons {
		m.inboxRefused.WithLabelValues(r) // every reason shows, at 0
	}
	m.reg.MustRegister(m.requests, m.enqueue, m.refused, m.storeErrors, m.inboxRefused, m.refusalsNotKept, m.bodyBytes,
		&scrape{d: d})
	return m
}

func (m *metrics) handler() http.Handler { return promx.Handler(m.reg) }

func (m *metrics) storeError(err error) {
	code := errcode.Of(err)
	if code == "" {
		code = "OTHER"
	}
	m.storeErrors.WithLabelValues(code).Inc()
}

var (
	descOutbox = prometheus.NewDesc("sealbridge_outbox_envelopes", "Outbox envelopes by state (queue depth).",
		[]string{"state"}, nil)
	descMessages = prometheus.NewDesc("sealbridge_messages", "Sent messages by status.", []string{"status"}, nil)
	descOldest   = prometheus.NewDesc("sealbridge_outbox_oldest_pending_age_seconds",
		"Age of the oldest message with a pending envelope (0 if none).", nil, nil)
	descAttempts = prometheus.NewDesc("sealbridge_carrier_attempts_total", "Send attempts by outcome.",
		[]string{"outcome"}, nil)
	descClosed = prometheus.NewDesc("sealbridge_carrier_closed_total",
		"Envelopes closed without an attempt's verdict, by reason.", []string{"reason"}, nil)
	descCarrierErr = prometheus.NewDesc("sealbridge_carrier_store_errors_total",
		"Store errors met by the carrier, by error code.", []string{"code"}, nil)
	descTargets = prometheus.NewDesc("sealbridge_carrier_targets",
		"Relay targets with pending envelopes at the last reconciliation.", nil, nil)
	descWaiting = prometheus.NewDesc("sealbridge_carrier_targets_waiting",
		"Targets in a persisted unreachable wait.", nil, nil)
	descInFlight   = prometheus.NewDesc("sealbridge_carrier_targets_in_flight", "Targets with a pass running.", nil, nil)
	descLeaseSkips = prometheus.NewDesc("sealbridge_carrier_lease_skips_total",
		"Envelopes due by the index that could not be leased.", nil, nil)
	descLockHolds = prometheus.NewDesc("sealbridge_store_lock_acquisitions_total", "Times the daemon took the store lock.", nil, nil)
	descLockWait  = prometheus.NewDesc("sealbridge_store_lock_wait_seconds_total",
		"Time spent waiting for the store lock (behind other holders in this process and other processes).", nil, nil)
	descTargetPending = prometheus.NewDesc("sealbridge_target_pending_envelopes",
		"Pending envelopes by relay target (held ones included); the targets beyond the 32 with the most are summed under target=\"other\".",
		[]string{"target"}, nil)
	descTargetHeld = prometheus.NewDesc("sealbridge_target_held_envelopes",
		"Pending envelopes an operator holds, by relay target (as sealbridge_target_pending_envelopes).", []string{"target"}, nil)
	descTargetInFlight = prometheus.NewDesc("sealbridge_target_in_flight_envelopes",
		"Pending envelopes with an attempt under way (a live lease), by relay target.", []string{"target"}, nil)
	descTargetBytes = prometheus.NewDesc("sealbridge_target_pending_bytes",
		"Signed bytes of the pending envelopes, by relay target.", []string{"target"}, nil)
	descTargetOldest = prometheus.NewDesc("sealbridge_target_oldest_pending_age_seconds",
		"Age of the oldest pending envelope's message, by relay target.", []string{"target"}, nil)
	descTargetStates = prometheus.NewDesc("sealbridge_targets",
		"Relay targets with pending envelopes by state (ready, backing-off, unreachable, held).", []string{"state"}, nil)
	descScrapeErr = prometheus.NewDesc("sealbridge_metrics_store_scrape_errors",
		"1 if the store's indexes could not be read for this scrape.", nil, nil)
)

// scrape computes the queue gauges and carrier counters at scrape time.
type scrape struct{ d *Daemon }

func (s *scrape) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutbox, descMessages, descOldest, descAttempts, descClosed,
		descCarrierErr, descTargets, descWaiting, descInFlight, descLeaseSkips, descLockHolds, descLockWait, descScrapeErr,
		descTargetPending, descTargetHeld, descTargetInFlight, descTargetBytes, descTargetOldest, descTargetStates} {
		ch <- d
	}
}

func (s *scrape) Collect(ch chan<- prometheus.Metric) {
	st := s.d.car.Stats()
	for k, v := range st.Attempts {
		ch <- prometheus.MustNewConstMetric(descAttempts, prometheus.CounterValue, float64(v), k)
	}
	for k, v := range st.Closed {
		ch <- prometheus.MustNewConstMetric(descClosed, prometheus.CounterValue, float64(v), k)
	}
	for k, v := range st.StoreErrors {
		ch <- prometheus.MustNewConstMetric(descCarrierErr, prometheus.CounterValue, float64(v), k)
	}
	ch <- prometheus.MustNewConstMetric(descTargets, prometheus.GaugeValue, float64(st.Targets))
	ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(st.TargetsWaiting))
	ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(st.InFlight))
	ch <- prometheus.MustNewConstMetric(descLeaseSkips, prometheus.CounterValue, float64(st.LeaseSkips))
	holds, waited := s.d.st.LockStats()
	ch <- prometheus.MustNewConstMetric(descLockHolds, prometheus.CounterValue, float64(holds))
	ch <- prometheus.MustNewConstMetric(descLockWait, prometheus.CounterValue, waited.Seconds())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	failed := 0.0
	now := s.d.now()
	outbox, err1 := s.d.st.OutboxSummaries(ctx)
	msgs, err2 := s.d.st.MessageSummaries(ctx)
	views, err3 := carrier.Targets(ctx, s.d.st, now)
	if err1 != nil || err2 != nil || err3 != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(descScrapeErr, prometheus.GaugeValue, failed)
	if failed == 1 {
		return
	}
	byState := map[string]int{record.StatePending: 0, record.StateRelayed: 0, record.StateClosed: 0}
	pendingMsg := map[string]bool{}
	for _, e := range outbox {
		byState[e.State]++
		if e.State == record.StatePending {
			pendingMsg[e.MessageID] = true
		}
	}
	for k, v := range byState {
		ch <- prometheus.MustNewConstMetric(descOutbox, prometheus.GaugeValue, float64(v), k)
	}
	byStatus := map[string]int{record.StatusQueued: 0, record.StatusRelayed: 0, record.StatusDelivered: 0, record.StatusClosed: 0}
	oldest := int64(0)
	for _, m := range msgs {
		byStatus[m.Status]++
		if pendingMsg[m.MessageID] && (oldest == 0 || m.CreatedAt < oldest) {
			oldest = m.CreatedAt
		}
	}
	for k, v := range byStatus {
		ch <- prometheus.MustNewConstMetric(descMessages, prometheus.GaugeValue, float64(v), k)
	}
	age := 0.0
	if oldest != 0 {
		age = max(0, time.Since(time.UnixMilli(oldest)).Seconds())
	}
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, age)
	collectTargets(ch, views, now)
}

// collectTargets reports the per-target series (bounded by targetMetrics) and the
// targets by state.
func collectTargets(ch chan<- prometheus.Metric, views []carrier.TargetView, now time.Time) {
	states := map[string]int{carrier.TargetReady: 0, carrier.TargetBackingOff: 0, carrier.TargetUnreachable: 0, carrier.TargetHeld: 0}
	for _, v := range views {
		states[v.State]++
	}
	for k, v := range states {
		ch <- prometheus.MustNewConstMetric(descTargetStates, prometheus.GaugeValue, float64(v), k)
	}
	for _, t := range targetMetrics(views) {
		ch <- prometheus.MustNewConstMetric(descTargetPending, prometheus.GaugeValue, float64(t.pending), t.target)
		ch <- prometheus.MustNewConstMetric(descTargetHeld, prometheus.GaugeValue, float64(t.held), t.target)
		ch <- prometheus.MustNewConstMetric(descTargetInFlight, prometheus.GaugeValue, float64(t.inFlight), t.target)
		ch <- prometheus.MustNewConstMetric(descTargetBytes, prometheus.GaugeValue, float64(t.bytes), t.target)
		age := 0.0
		if t.oldest != 0 {
			age = max(0, now.Sub(time.UnixMilli(t.oldest)).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(descTargetOldest, prometheus.GaugeValue, age, t.target)
	}
}
