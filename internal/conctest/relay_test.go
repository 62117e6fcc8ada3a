package conctest_test

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/internal/conctest"
	"github.com/sealbridge/sealbridge/pkg/carrier"
)

// The relays of the space: each variant of a message goes to one of them.
const (
	relayOK     = "http://127.0.0.1:9/ok"     // accepts, now and then fails (503)
	relayFlaky  = "http://127.0.0.1:9/flaky"  // fails and is unreachable as often as it accepts; no batch endpoint
	relayStrict = "http://127.0.0.1:9/strict" // refuses (400) some envelopes for good
)

var relays = []string{relayOK, relayFlaky, relayStrict}

// scriptedRelay is the carrier's Transport: it answers every envelope at once, by a
// script drawn from the run's seed (per relay: how often it accepts, fails, refuses or
// does not answer), and records each answer in the history (OpSend), so that the
// explorer can check what the carriers sent. It is safe for concurrent use.
type scriptedRelay struct {
	mu  sync.Mutex
	rng *rand.Rand
	rec *conctest.Recorder
	// messageOf names the message of an envelope id of the space ("" if none).
	messageOf func(envelopeID string) string
}

func newScriptedRelay(seed uint64, proc int, rec *conctest.Recorder, messageOf func(string) string) *scriptedRelay {
	return &scriptedRelay{rng: rand.New(rand.NewPCG(seed, 0x7e1a<<32|uint64(proc))), rec: rec, messageOf: messageOf}
}

// outcome draws the answer of relay url to one envelope.
func (r *scriptedRelay) outcome(url string) carrier.Outcome {
	r.mu.Lock()
	p := r.rng.IntN(100)
	r.mu.Unlock()
	switch url {
	case relayOK:
		if p < 85 {
			return carrier.Accepted
		}
		return carrier.Failed
	case relayFlaky:
		switch {
		case p < 40:
			return carrier.Accepted
		case p < 75:
			return carrier.Failed
		}
		return carrier.Unreachable
	case relayStrict:
		switch {
		case p < 60:
			return carrier.Accepted
		case p < 85:
			return carrier.Refused
		}
		return carrier.Failed
	}
	return carrier.Refused
}

var errScripted = errors.New("scripted relay")

func result(o carrier.Outcome) carrier.Result {
	switch o {
	case carrier.Accepted:
		return carrier.Result{Outcome: o, Status: 200}
	case carrier.Refused:
		return carrier.Result{Outcome: o, Status: 400, Err: errScripted}
	case carrier.Failed:
		return carrier.Result{Outcome: o, Status: 503, Err: errScripted, RetryAfter: time.Millisecond}
	}
	return carrier.Result{Outcome: o, Err: errScripted}
}

// record notes the answer to env in the history.
func (r *scriptedRelay) record(call int64, url string, env []byte, res carrier.Result) {
	var e struct {
		EnvelopeID string `json:"envelopeId"`
	}
	_ = json.Unmarshal(env, &e)
	r.rec.Add(-1, call, conctest.Mono(), conctest.Input{Kind: conctest.OpSend, Env: e.EnvelopeID, Msg: r.messageOf(e.EnvelopeID), Target: url},
		conctest.Output{Outcome: res.Outcome.String()})
}

func (r *scriptedRelay) Send(ctx context.Context, url string, env []byte) carrier.Result {
	call := conctest.Mono()
	res := result(r.outcome(url))
	r.record(call, url, env, res)
	return res
}

// Batches: every relay but the flaky one has the batch endpoint.
func (r *scriptedRelay) Batches(url string) bool { return url != relayFlaky }

func (r *scriptedRelay) SendBatch(ctx context.Context, url string, envs [][]byte) []carrier.Result {
	call := conctest.Mono()
	out := make([]carrier.Result, len(envs))
	for i, env := range envs {
		out[i] = result(r.outcome(url))
		r.record(call, url, env, out[i])
	}
	return out
}
