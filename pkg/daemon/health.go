package daemon

// The daemon's health: what keeps it from serving the store truthfully, as the
// background loops (the change detector, index preparation, the carrier) and the API
// meet it. GET /readyz answers from this state (no store work per request); each
// problem clears when the loop that found it succeeds again.

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// apiSource prefixes the key of a problem the API met: "api <path>".
const apiSource = "api "

// readyProblem is one reason the daemon is not ready, as GET /readyz lists it.
type readyProblem struct {
	Source string    `json:"source"` // the loop that met it, e.g. "changes messages"
	Code   string    `json:"code,omitempty"`
	Error  string    `json:"error"`
	Hint   string    `json:"hint,omitempty"`
	Since  time.Time `json:"since"`
}

type health struct {
	mu       sync.Mutex
	problems map[string]readyProblem
}

func newHealth() *health { return &health{problems: map[string]readyProblem{}} }

// set records that source cannot read the store (err).
func (h *health) set(source string, err error, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.problems[source]
	if !ok {
		p.Since = now
	}
	p.Source, p.Code, p.Error = source, errcode.Of(err), err.Error()
	h.problems[source] = p
}

// setProblem records p (its Since kept while its source's problem persists).
func (h *health) setProblem(p readyProblem, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p.Since = now
	if old, ok := h.problems[p.Source]; ok {
		p.Since = old.Since
	}
	h.problems[p.Source] = p
}

// has reports whether source's problem holds.
func (h *health) has(source string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.problems[source]
	return ok
}

func (h *health) clear(source string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.problems[source]
	delete(h.problems, source)
	return ok
}

// list returns the problems sorted by source.
func (h *health) list() []readyProblem {
	h.mu.Lock()
	out := make([]readyProblem, 0, len(h.problems))
	for _, p := range h.problems {
		out = append(out, p)
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b readyProblem) int { return strings.Compare(a.Source, b.Source) })
	return out
}

// problem records and logs (as a condition) that source met err reading the store.
func (d *Daemon) problem(source, msg string, err error, attrs ...any) {
	if writeFailure(err) {
		d.m.storeError(err)
		d.writeFailed(err)
		return
	}
	d.health.set(source, err, d.now())
	d.m.storeError(err)
	d.cond.warn(source, errClass(err), msg, append(attrs, "err", err)...)
}

// recovered clears source's problem, logging that it cleared if it was logged.
func (d *Daemon) recovered(source, msg string, attrs ...any) {
	d.health.clear(source)
	d.cond.clear(source, msg, attrs...)
}

// unreadable reports whether err means the store cannot be listed or read (a record
// or directory is invalid), as opposed to a transient failure.
func unreadable(err error) bool { return errors.Is(err, errcode.OutboxStoreInvalid) }

// apiProblem records a request's failure to read the store. The change detector
// rechecks it (recheckAPIProblems) and clears it once that record reads again.
func (d *Daemon) apiProblem(err error) {
	if !unreadable(err) {
		return
	}
	path := "store"
	var ce *errcode.Error
	if errors.As(err, &ce) && ce.Context != "" {
		path = ce.Context
	}
	d.problem(apiSource+path, "api: the store cannot be read", err)
}

// recheckAPIProblems reads again what requests failed to read: a record is read,
// a directory listed; what names neither clears after a change-detector round that
// read everything (roundOK).
func (d *Daemon) recheckAPIProblems(roundOK bool) {
	for _, p := range d.health.list() {
		path, ok := strings.CutPrefix(p.Source, apiSource)
		if !ok {
			continue
		}
		k, name, _ := strings.Cut(path, "/")
		kind := record.Kind(k)
		var err error
		switch id := strings.TrimSuffix(name, ".json"); {
		case !kind.Valid():
			if !roundOK {
				continue
			}
		case name != "" && record.ValidID(kind, id):
			_, err = d.st.Get(kind, id)
		default:
			_, err = d.st.List(kind)
		}
		if err == nil {
			d.recovered(p.Source, "api: the store reads again", "path", path)
		}
	}
}

// carrierEvent logs what the carrier reports: delivery failures per target (as
// conditions: the first failure, a new reason, at most one repeat a minute, and the
// recovery) and the store failures it meets (also made health problems).
func (d *Daemon) carrierEvent(e carrier.Event) {
	switch e.Kind {
	case carrier.EventAttempt:
		key := "delivery " + e.Target
		if e.Outcome == carrier.Accepted {
			d.cond.clear(key, "delivery: the relay accepts again", "target", e.Target)
			return
		}
		class := e.Outcome.String()
		if e.Status != 0 {
			class += " " + http.StatusText(e.Status)
		}
		attrs := []any{"target", e.Target, "outcome", e.Outcome.String(), "reason", e.Reason, "envelope", e.EnvelopeID}
		if !e.NextAttempt.IsZero() {
			attrs = append(attrs, "next_attempt", e.NextAttempt.UTC().Format(time.RFC3339))
		}
		d.cond.warn(key, class, "delivery: attempt failed", attrs...)
	case carrier.EventRolledBack:
		d.rolledBack(e.Err)
	case carrier.EventStoreError:
		key := "carrier " + e.Target
		if e.Target == "" {
			key = "carrier schedule"
		}
		if writeFailure(e.Err) {
			d.writeFailed(e.Err)
			return
		}
		if unreadable(e.Err) {
			d.health.set(key, e.Err, d.now())
		}
		d.cond.warn(key, errClass(e.Err), "carrier: store failure", "target", e.Target, "err", e.Err)
	case carrier.EventStoreOK:
		key := "carrier " + e.Target
		if e.Target == "" {
			key = "carrier schedule"
		}
		d.recovered(key, "carrier: the store works again", "target", e.Target)
	}
}

func (d *Daemon) serveReady(w http.ResponseWriter, _ *http.Request) {
	if d.draining.Load() {
		writeError(w, http.StatusServiceUnavailable, codeNotReady, "draining")
		return
	}
	if ps := d.health.list(); len(ps) > 0 {
		// Failed writes first: they are what a client's send meets.
		slices.SortStableFunc(ps, func(a, b readyProblem) int {
			return cmpBool(b.Source == writeSource, a.Source == writeSource)
		})
		msg := "the store cannot be read (" + ps[0].Source + "): " + ps[0].Error + "; run sealbridge-fsck"
		if ps[0].Source == writeSource {
			msg = "the store cannot be written: " + ps[0].Error
		}
		if len(ps) > 1 {
			msg += fmt.Sprintf(" (and %d more; see problems)", len(ps)-1)
		}
		body := map[string]any{"code": codeNotReady, "message": msg,
			"status": "not ready", "did": string(d.id.DID()), "problems": ps}
		if ps[0].Hint != "" {
			body["hint"] = ps[0].Hint
		}
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "did": string(d.id.DID()),
		"indexesPrepared": d.prepared.Load()})
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
