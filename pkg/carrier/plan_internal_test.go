package carrier

import (
	"slices"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The plan dispatches pending members of a batch whose marker exists and singles
// (batch id = envelope id, no marker) whose message record exists; not a single
// whose message record is missing (an enqueue that never committed), nor a member
// whose marker is missing.
func TestBuildPlanSingles(t *testing.T) {
	const url = "http://127.0.0.1:9/"
	sum := func(env, msg, batch string) store.OutboxSummary {
		return store.OutboxSummary{EnvelopeID: env, MessageID: msg, BatchID: batch, State: record.StatePending,
			RelayURL: url, DeliveryDeadline: 1 << 40}
	}
	sums := []store.OutboxSummary{
		sum("e-marked", "m-1", "b-1"),      // its marker exists
		sum("e-single", "m-2", "e-single"), // a single with its message record
		sum("e-half", "m-3", "e-half"),     // a single without its message record
		sum("e-nomarker", "m-4", "b-4"),    // its marker is missing
	}
	plans := buildPlan(sums, []string{"b-1"}, []string{"m-1", "m-2", "m-4"}, 0, "h", nil)
	var got []string
	for _, tp := range plans {
		for _, e := range tp.envs {
			got = append(got, e.EnvelopeID)
		}
	}
	slices.Sort(got)
	if want := []string{"e-marked", "e-single"}; !slices.Equal(got, want) {
		t.Fatalf("dispatchable: %v, want %v", got, want)
	}
}
