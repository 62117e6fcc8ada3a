package daemon

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// tryPost is post for a goroutine other than the test's: it returns what went wrong
// instead of failing the test.
func tryPost(hc *http.Client, key, body string) (apiAnswer, error) {
	req, _ := http.NewRequest(http.MethodPost, "http://sealbridged/v1/messages", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return doAnswer(hc, req)
}

// doAnswer sends req and reads its JSON answer, returning what went wrong instead
// of failing a test (for any goroutine).
func doAnswer(hc *http.Client, req *http.Request) (apiAnswer, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return apiAnswer{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return apiAnswer{}, err
	}
	a := apiAnswer{status: resp.StatusCode, header: resp.Header, raw: string(data)}
	if err := json.Unmarshal(data, &a.body); err != nil {
		return a, fmt.Errorf("answer %d is not JSON: %s", resp.StatusCode, data)
	}
	return a, nil
}

// racePosts sends bodies[i] with key from one goroutine each, all let go at once.
func racePosts(t *testing.T, hc *http.Client, key string, bodies []string) []apiAnswer {
	t.Helper()
	answers, errs := make([]apiAnswer, len(bodies)), make([]error, len(bodies))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, body := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			answers[i], errs[i] = tryPost(hc, key, body)
		}()
	}
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return answers
}

// checkRace checks the answers to one key's racing sends (answers[i] answered
// bodies[i]): exactly one request made the message (201, not replayed); every other
// with its body got 201 with the same message id (replayed) or 409
// IDEMPOTENCY_IN_PROGRESS with Retry-After and a hint; every request with another
// body got 422 IDEMPOTENCY_KEY_REUSED with a hint. It returns the winner's answer, its
// body, and how many were answered in progress.
func checkRace(t *testing.T, trial int, bodies []string, answers []apiAnswer) (apiAnswer, string, int) {
	t.Helper()
	win := -1
	for i, a := range answers {
		if a.status == http.StatusCreated && a.header.Get("Idempotent-Replayed") == "" {
			if win >= 0 {
				t.Fatalf("trial %d: two requests made a message: %s and %s", trial, answers[win].raw, a.raw)
			}
			win = i
		}
	}
	if win < 0 {
		t.Fatalf("trial %d: no request made the message: %v", trial, answers)
	}
	w := answers[win]
	id, _ := w.body["messageId"].(string)
	inProgress := 0
	for i, a := range answers {
		hint, _ := a.body["hint"].(string)
		switch {
		case i == win:
		case bodies[i] != bodies[win]:
			if a.status != http.StatusUnprocessableEntity || a.body["code"] != errcode.IdempotencyKeyReused.String() || hint == "" {
				t.Fatalf("trial %d: another body under the key: %d %s; want 422 %s with a hint", trial, a.status, a.raw, errcode.IdempotencyKeyReused)
			}
		case a.status == http.StatusCreated:
			if a.body["messageId"] != id || a.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("trial %d: 201 %s (replayed %q); want the winner's message %s, replayed", trial, a.raw, a.header.Get("Idempotent-Replayed"), id)
			}
		case a.status == http.StatusConflict:
			if a.body["code"] != errcode.IdempotencyInProgress.String() || hint == "" || a.header.Get("Retry-After") == "" {
				t.Fatalf("trial %d: 409 %s (Retry-After %q); want %s with a hint and Retry-After", trial, a.raw, a.header.Get("Retry-After"), errcode.IdempotencyInProgress)
			}
			inProgress++
		default:
			t.Fatalf("trial %d: %d %s; want the winner's answer or 409 %s", trial, a.status, a.raw, errcode.IdempotencyInProgress)
		}
	}
	return w, bodies[win], inProgress
}

// Twelve concurrent POST /v1/messages with one Idempotency-Key, many times, with the
// same body and with two bodies under the key: each time exactly one message is
// stored (one message record, one outbox record) and sent, the others get its answer
// or 409 IDEMPOTENCY_IN_PROGRESS, another body 422 IDEMPOTENCY_KEY_REUSED; a retry
// afterwards gets the stored answer byte for byte.
func TestConcurrentIdempotentSends(t *testing.T) {
	const workers = 12
	trials := 60
	if testing.Short() {
		trials = 15
	}
	for _, mixed := range []bool{false, true} {
		t.Run(map[bool]string{false: "one body", true: "two bodies"}[mixed], func(t *testing.T) {
			d, hc := apiDaemon(t, nil)
			replays, inProgress := 0, 0
			for trial := range trials {
				key := fmt.Sprintf("key-%d", trial)
				a, b := sendBody(t, "the body"), sendBody(t, "another body")
				bodies := make([]string, workers)
				for i := range bodies {
					bodies[i] = a
					if mixed && i%2 == 1 {
						bodies[i] = b
					}
				}
				w, body, n409 := checkRace(t, trial, bodies, racePosts(t, hc, key, bodies))
				inProgress += n409
				if mixed {
					replays += workers/2 - 1 - n409
				} else {
					replays += workers - 1 - n409
				}
				if n, o := countMessages(t, d), countKind(t, d, record.KindOutbox); n != trial+1 || o != trial+1 {
					t.Fatalf("trial %d: %d message records and %d outbox records, want %d of each", trial, n, o, trial+1)
				}
				again, err := tryPost(hc, key, body)
				if err != nil {
					t.Fatal(err)
				}
				if again.status != w.status || again.raw != w.raw || again.header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("trial %d: the retry got %d %s; want the stored answer %d %s", trial, again.status, again.raw, w.status, w.raw)
				}
			}
			t.Logf("%d trials of %d requests: the losers with the winner's body got 201 replayed %d times, 409 in progress %d times",
				trials, workers, replays, inProgress)
		})
	}
}
