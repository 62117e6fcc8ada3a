package daemon

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// serveTargets answers GET /v1/targets: every relay target's backlog (carrier.Targets)
// as the store's indexes say now.
func (d *Daemon) serveTargets(w http.ResponseWriter, r *http.Request) {
	now := d.now()
	views, err := carrier.Targets(r.Context(), d.st, now)
	if err != nil {
		d.writeStoreError(w, err)
		return
	}
	out := client.TargetList{Targets: make([]client.Target, 0, len(views)), At: now.UTC(), AgeBuckets: ageBucketLabels()}
	for _, v := range views {
		out.Targets = append(out.Targets, toClientTarget(v))
	}
	writeJSON(w, http.StatusOK, out)
}

func toClientTarget(v carrier.TargetView) client.Target {
	return client.Target{RelayURL: v.RelayURL, State: v.State, Pending: v.Pending, Held: v.Held, Bytes: v.Bytes,
		InFlight: v.InFlight, OldestPendingAt: msTime(v.OldestPendingAt), BackoffUntil: msTime(v.BackoffUntil),
		UnreachableSince: msTime(v.UnreachableSince), NextProbeAt: msTime(v.NextProbeAt), Attempts: v.Attempts,
		LastError: v.LastError, Ages: v.Ages[:], Hint: targetHint(v)}
}

// targetHint is what an operator can do about a target that waits: attempt its
// messages now (its next probe or attempt would come at NextProbeAt or
// BackoffUntil).
func targetHint(v carrier.TargetView) string {
	switch v.State {
	case carrier.TargetUnreachable:
		return "probe it now: sealbridge retry --target " + v.RelayURL
	case carrier.TargetBackingOff:
		return "attempt now: sealbridge retry --target " + v.RelayURL
	}
	return ""
}

// ageBucketLabels names the buckets of client.Target.Ages: "5m" … "160m", "older".
func ageBucketLabels() []string {
	var out []string
	for _, b := range carrier.AgeBuckets {
		out = append(out, strconv.Itoa(int(b.Minutes()))+"m")
	}
	return append(out, "older")
}

// actionOf is an operator action of a record as the API shows it.
func actionOf(a *record.Action) *client.OperatorAction {
	if a == nil {
		return nil
	}
	return &client.OperatorAction{Op: a.Op, By: a.By, At: msTime(a.At), Reason: a.Reason}
}

// maxTargetSeries bounds the per-target metric series: the targets with the most
// pending envelopes keep their own label, the rest are summed under "other".
const maxTargetSeries = 32

// otherTarget is the target label of the targets beyond maxTargetSeries (no relay
// URL is this).
const otherTarget = "other"

// targetSeries is one target label's metric values.
type targetSeries struct {
	target                  string
	pending, held, inFlight int
	bytes                   int64
	oldest                  int64 // ms, 0: none
}

// targetMetrics folds views into at most maxTargetSeries+1 series: the
// maxTargetSeries targets with the most pending envelopes (then by URL), and one
// "other" summing the rest (its oldest is the oldest of them).
func targetMetrics(views []carrier.TargetView) []targetSeries {
	views = slices.Clone(views)
	slices.SortFunc(views, func(a, b carrier.TargetView) int {
		return cmp.Or(cmp.Compare(b.Pending, a.Pending), strings.Compare(a.RelayURL, b.RelayURL))
	})
	var out []targetSeries
	for i, v := range views {
		s := targetSeries{target: v.RelayURL, pending: v.Pending, held: v.Held, inFlight: v.InFlight, bytes: v.Bytes,
			oldest: v.OldestPendingAt}
		if i < maxTargetSeries {
			out = append(out, s)
			continue
		}
		if i == maxTargetSeries {
			s.target = otherTarget
			out = append(out, s)
			continue
		}
		o := &out[maxTargetSeries]
		o.pending += s.pending
		o.held += s.held
		o.inFlight += s.inFlight
		o.bytes += s.bytes
		if s.oldest != 0 && (o.oldest == 0 || s.oldest < o.oldest) {
			o.oldest = s.oldest
		}
	}
	return out
}
