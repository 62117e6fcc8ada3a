package promtest

import (
	"fmt"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	failed []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(f string, args ...any) {
	r.failed = append(r.failed, fmt.Sprintf(f, args...))
}
func (r *recorder) Fatalf(f string, args ...any) {
	r.failed = append(r.failed, fmt.Sprintf(f, args...))
}

// Check passes a clean exposition and fails one that does not parse or that
// promtool's linter refuses (a counter without _total, a missing HELP).
func TestCheck(t *testing.T) {
	for body, wantFail := range map[string]bool{
		"# HELP a_total Things.\n# TYPE a_total counter\na_total 1\n":   false,
		"# HELP a Things.\n# TYPE a counter\na 1\n":                     true,
		"# TYPE b_total counter\nb_total 1\n":                           true,
		"# HELP c_total Things.\n# TYPE c_total counter\nc_total{x 1\n": true,
	} {
		r := &recorder{TB: t}
		Check(r, []byte(body))
		if (len(r.failed) > 0) != wantFail {
			t.Errorf("%q: failures %q, want failing %v", body, r.failed, wantFail)
		}
	}
}
