// Package promtest checks a /metrics answer as `promtool check metrics` does:
// it must parse as the Prometheus text exposition format and have no lint
// problem (client_golang's promlint, the linter promtool runs: names, units,
// _total on counters, help text). Test-only (internal/archtest).
package promtest

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// Check fails t unless body parses and lints clean.
func Check(t testing.TB, body []byte) {
	t.Helper()
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("/metrics does not parse as the text exposition format: %v\n%s", err, body)
	}
	for _, p := range problems {
		t.Errorf("/metrics lint: %s: %s", p.Metric, p.Text)
	}
}
