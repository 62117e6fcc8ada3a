package daemon

import (
	"context"
	"fmt"
	"github.com/sealbridge/sealbridge/internal/promtest"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// update rewrites message id's record and its pending envelopes in one transaction.
func update(t *testing.T, d *Daemon, id string, om func(*record.Outbox), mm func(*record.Message)) {
	t.Helper()
	err := d.st.Transaction(context.Background(), func(tx *store.Tx) error {
		m, err := store.TxGet[*record.Message](tx, id)
		if err != nil {
			return err
		}
		envs, err := d.st.Pending(context.Background(), id)
		if err != nil {
			return err
		}
		for _, o := range envs {
			om(o)
			if err := tx.Put(o); err != nil {
				return err
			}
		}
		mm(m)
		return tx.Put(m)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func getTyped[T any](t *testing.T, h http.Handler, path string) (T, map[string]any) {
	t.Helper()
	var v T
	code, raw := get(t, h, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, code, raw)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if err := decodeBody(rec.Body.Bytes(), &v); err != nil { // strict: no field the client lacks
		t.Fatalf("GET %s: %v\n%s", path, err, rec.Body.String())
	}
	return v, raw
}

// GET /v1/targets shows a target in an unreachable wait with its times in RFC 3339,
// its pending and held envelopes, attempts, last error and age buckets at the
// daemon's clock; message views carry the hold and, once closed, why and by whom;
// the per-target metrics count the target's envelopes.
func TestTargetsAndOperatorViews(t *testing.T) {
	d, _, clk := healthDaemon(t, Options{})
	h := d.handler()
	waiting, held := enqueue(t, d), enqueue(t, d)
	m, err := d.st.Message(waiting)
	if err != nil || m == nil {
		t.Fatal(m, err)
	}
	since := m.CreatedAt + 1000
	update(t, d, waiting, func(o *record.Outbox) {
		o.Attempts, o.LastError, o.UnreachableSince, o.NextAttemptAt = 3, "relay unreachable: connection refused", since, since+300_000
	}, func(m *record.Message) { m.Attempts = 3 })
	hold := &record.Action{Op: record.ActionHold, By: "uid:1000", At: since, Reason: "relay migration"}
	update(t, d, held, func(o *record.Outbox) { o.Held, o.Operator = hold, hold },
		func(m *record.Message) { m.Held, m.Operator = hold, hold })
	clk.mu.Lock()
	clk.now = time.UnixMilli(m.CreatedAt).Add(12 * time.Minute)
	clk.mu.Unlock()

	l, raw := getTyped[client.TargetList](t, h, "/v1/targets")
	if len(l.Targets) != 1 {
		t.Fatalf("targets %+v", l)
	}
	tg := l.Targets[0]
	want := client.Target{RelayURL: "http://127.0.0.1:9", State: carrier.TargetUnreachable, Pending: 2, Held: 1,
		Bytes: tg.Bytes, OldestPendingAt: time.UnixMilli(m.CreatedAt).UTC(), UnreachableSince: time.UnixMilli(since).UTC(),
		NextProbeAt: time.UnixMilli(since + 300_000).UTC(), Attempts: 3, LastError: "relay unreachable: connection refused",
		Ages: []int{0, 0, 2, 0, 0, 0, 0}, Hint: "probe it now: sealbridge retry --target http://127.0.0.1:9"}
	if tg.Bytes <= 0 || fmt.Sprint(tg) != fmt.Sprint(want) {
		t.Fatalf("target\n got %+v\nwant %+v", tg, want)
	}
	if !l.At.Equal(clk.Now()) || !slices.Equal(l.AgeBuckets, []string{"5m", "10m", "20m", "40m", "80m", "160m", "older"}) {
		t.Fatalf("at %v buckets %v", l.At, l.AgeBuckets)
	}
	rt := raw["targets"].([]any)[0].(map[string]any)
	if rt["unreachableSince"] != time.UnixMilli(since).UTC().Format(time.RFC3339Nano) || rt["backoffUntil"] != nil {
		t.Fatalf("JSON times: %v", rt)
	}

	// The metrics count the target's envelopes under its URL.
	rec := httptest.NewRecorder()
	d.m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	promtest.Check(t, body) // as promtool check metrics: parses, lints clean
	for _, line := range []string{`sealbridge_target_pending_envelopes{target="http://127.0.0.1:9"} 2`,
		`sealbridge_target_held_envelopes{target="http://127.0.0.1:9"} 1`, `sealbridge_targets{state="unreachable"} 1`,
		`sealbridge_target_oldest_pending_age_seconds{target="http://127.0.0.1:9"} 720`} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("metrics lack %q", line)
		}
	}

	// The held message shows its hold, in the message view and in the list.
	wantHold := &client.OperatorAction{Op: "hold", By: "uid:1000", At: time.UnixMilli(since).UTC(), Reason: "relay migration"}
	cm, _ := getTyped[client.Message](t, h, "/v1/messages/"+held)
	if fmt.Sprint(cm.Held) != fmt.Sprint(wantHold) || fmt.Sprint(cm.Operator) != fmt.Sprint(wantHold) {
		t.Fatalf("held message: held %+v operator %+v", cm.Held, cm.Operator)
	}

	// Cancelled: the list says why it closed, by what and who did it.
	cancel := &record.Action{Op: record.ActionCancel, By: "uid:1000", At: since + 5000, Reason: "wrong peer"}
	update(t, d, waiting, func(o *record.Outbox) {
		o.State, o.LastError = record.StateClosed, "cancelled by operator: wrong peer"
	}, func(m *record.Message) {
		m.Status, m.ClosedBy, m.LastError, m.Operator = record.StatusClosed, record.ClosedByCancelled, "cancelled by operator: wrong peer", cancel
	})
	list, _ := getTyped[client.MessageList](t, h, "/v1/messages")
	for _, e := range list.Messages {
		switch e.MessageID {
		case waiting:
			if e.Status != record.StatusClosed || e.ClosedBy != record.ClosedByCancelled || e.LastError != "cancelled by operator: wrong peer" ||
				e.Operator == nil || e.Operator.Op != "cancel" || e.Operator.Reason != "wrong peer" || e.Held != nil {
				t.Fatalf("cancelled message in the list: %+v", e)
			}
		case held:
			if fmt.Sprint(e.Held) != fmt.Sprint(wantHold) {
				t.Fatalf("held message in the list: %+v", e)
			}
		}
	}
	if l, _ := getTyped[client.TargetList](t, h, "/v1/targets"); len(l.Targets) != 1 || l.Targets[0].State != carrier.TargetHeld || l.Targets[0].Pending != 1 {
		t.Fatalf("after the cancel: %+v", l)
	}

	// Released, retried and relayed: listed from the index, it still says what the
	// operator last did.
	retry := &record.Action{Op: record.ActionRetry, By: "uid:1000", At: since + 9000}
	update(t, d, held, func(o *record.Outbox) { o.State, o.Held, o.Operator = record.StateRelayed, nil, retry },
		func(m *record.Message) { m.Status, m.Held, m.Operator = record.StatusRelayed, nil, retry })
	list, _ = getTyped[client.MessageList](t, h, "/v1/messages?status=relayed")
	if len(list.Messages) != 1 || list.Messages[0].Operator == nil || list.Messages[0].Operator.Op != "retry" {
		t.Fatalf("relayed message in the list: %+v, want its last operator action", list.Messages)
	}
}

// The per-target series are bounded: the 32 targets with the most pending envelopes
// keep their label, the rest are summed under "other" (their oldest the oldest).
func TestTargetMetricsBounded(t *testing.T) {
	var views []carrier.TargetView
	for i := range 40 {
		views = append(views, carrier.TargetView{RelayURL: fmt.Sprintf("http://r%02d.test", i), Pending: i + 1, Held: 1,
			InFlight: 1, Bytes: 10, OldestPendingAt: int64(1000 + i)})
	}
	got := targetMetrics(views)
	if len(got) != maxTargetSeries+1 {
		t.Fatalf("%d series", len(got))
	}
	if got[0].target != "http://r39.test" || got[31].target != "http://r08.test" {
		t.Fatalf("kept %s … %s, want the largest", got[0].target, got[31].target)
	}
	o := got[32]
	if o.target != otherTarget || o.pending != 36 || o.held != 8 || o.inFlight != 8 || o.bytes != 80 || o.oldest != 1000 {
		t.Fatalf("other: %+v", o)
	}
	if len(targetMetrics(views[:5])) != 5 {
		t.Fatal("under the cap an other series appeared")
	}
}
