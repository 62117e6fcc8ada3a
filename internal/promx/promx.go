// Package promx is what sealbridge's Prometheus endpoints share: a registry with
// the Go runtime and process collectors and a build-information gauge, and the
// /metrics handler over it (the daemon's and the relay's, so that both expose
// the same standard series the same way).
package promx

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry holding the Go runtime and process collectors
// and a gauge buildInfo (e.g. "sealbridge_build_info") of value 1 with labels.
func NewRegistry(buildInfo string, labels prometheus.Labels) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	bi := prometheus.NewGauge(prometheus.GaugeOpts{Name: buildInfo, Help: "Build information.", ConstLabels: labels})
	bi.Set(1)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), bi)
	return reg
}

// Handler serves reg in the exposition format the scraper asks for (text by
// default), at most two scrapes at once, each bounded to 30 s.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{MaxRequestsInFlight: 2, Timeout: 30 * time.Second})
}
