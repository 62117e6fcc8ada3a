package crashtest_test

import (
	"context"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// operatorWorkload: an operator action (carrier.Apply) on messages set up by setup.
// Acknowledged once Apply returns: every message and member as the action left it,
// so in every state after that the action has taken effect.
func operatorWorkload(name, op string, sel func(reqs []store.SendRequest) carrier.Selector,
	prepare func(t *testing.T, s *store.Store, c *clock, reqs []store.SendRequest)) workload {
	var reqs []store.SendRequest
	return workload{name: name, setup: func(t *testing.T, s *store.Store, c *clock) {
		reqs = []store.SendRequest{sendRequest(c.Now(), 3), sendRequest(c.Now(), 1)}
		for _, r := range reqs {
			if _, err := s.Enqueue(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
		if prepare != nil {
			prepare(t, s, c, reqs)
		}
	}, run: func(t *testing.T, s *store.Store, c *clock, ack func(record.Record, ...record.Record), gone func(record.Kind, string)) {
		rs, err := carrier.Apply(context.Background(), s, sel(reqs), action(c, op))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.Code != "" || r.Changed == 0 {
				t.Fatalf("%s: %+v", op, rs)
			}
		}
		ackAll(t, s, reqs, ack)
	}}
}

func action(c *clock, op string) record.Action {
	return record.Action{Op: op, By: "uid:1000", At: c.Now().UnixMilli(), Reason: "crash test"}
}

func ackAll(t *testing.T, s *store.Store, reqs []store.SendRequest, ack func(record.Record, ...record.Record)) {
	for _, r := range reqs {
		m, err := store.GetAs[*record.Message](s, r.MessageID)
		if err != nil || m == nil {
			t.Fatal(m, err)
		}
		ack(m)
		for _, e := range r.Envelopes {
			o, err := store.GetAs[*record.Outbox](s, e.EnvelopeID)
			if err != nil || o == nil {
				t.Fatal(o, err)
			}
			ack(o)
		}
	}
}

func byIDs(reqs []store.SendRequest) carrier.Selector {
	var ids []string
	for _, r := range reqs {
		ids = append(ids, r.MessageID)
	}
	return carrier.Selector{MessageIDs: ids}
}

func byTarget(reqs []store.SendRequest) carrier.Selector {
	return carrier.Selector{Target: reqs[0].RelayURL}
}

// holdAll holds the messages before the workload runs.
func holdAll(t *testing.T, s *store.Store, c *clock, reqs []store.SendRequest) {
	if _, err := carrier.Apply(context.Background(), s, byIDs(reqs), action(c, record.ActionHold)); err != nil {
		t.Fatal(err)
	}
}

// backOff leaves every member backing off in a target wait, as the carrier would.
func backOff(t *testing.T, s *store.Store, c *clock, reqs []store.SendRequest) {
	later := c.Now().UnixMilli() + 600_000
	err := s.Transaction(context.Background(), func(tx *store.Tx) error {
		for _, r := range reqs {
			for _, e := range r.Envelopes {
				o, err := store.TxGet[*record.Outbox](tx, e.EnvelopeID)
				if err != nil {
					return err
				}
				o.NextAttemptAt, o.UnreachableSince, o.Attempts, o.LastError = later, c.Now().UnixMilli(), 1, "relay unreachable"
				if err := tx.Put(o); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The operator's workloads: hold of a target's two messages (one transaction),
// release and cancel of two held messages by id (a transaction each), retry of a
// target in a wait.
func holdWorkload() workload {
	return operatorWorkload("operator-hold", record.ActionHold, byTarget, nil)
}

func releaseWorkload() workload {
	return operatorWorkload("operator-release", record.ActionRelease, byIDs, holdAll)
}

func cancelWorkload() workload {
	return operatorWorkload("operator-cancel", record.ActionCancel, byIDs, holdAll)
}

func retryWorkload() workload {
	return operatorWorkload("operator-retry", record.ActionRetry, byTarget, backOff)
}
