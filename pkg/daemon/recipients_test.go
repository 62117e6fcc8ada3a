package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// multiBody is a send request to n fresh recipients; it returns the body and the
// recipients' did:keys.
func multiBody(t *testing.T, n int, body string) (string, []string) {
	t.Helper()
	to := make([]string, n)
	for i := range to {
		peer, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		to[i] = string(peer.DID())
	}
	b, _ := json.Marshal(map[string]any{"to": to, "relayUrl": "http://127.0.0.1:9", "body": []byte(body)})
	return string(b), to
}

// multiAnswer decodes a several-recipient answer and checks it names one message per
// recipient, in order, each queued to its recipient, all ids distinct.
func multiAnswer(t *testing.T, a apiAnswer, to []string) []client.Message {
	t.Helper()
	if a.status != http.StatusCreated {
		t.Fatalf("send to %d recipients: %d %s", len(to), a.status, a.raw)
	}
	var res client.SendResult
	if err := json.Unmarshal([]byte(a.raw), &res); err != nil || len(res.Messages) != len(to) {
		t.Fatalf("answer %s: want %d messages (%v)", a.raw, len(to), err)
	}
	seen := map[string]bool{}
	for i, m := range res.Messages {
		if m.To != to[i] || m.Status != record.StatusQueued || seen[m.MessageID] {
			t.Fatalf("message %d of the answer: %+v; want a new queued message to %s", i, m, to[i])
		}
		seen[m.MessageID] = true
	}
	return res.Messages
}

// One send to three recipients stores three messages, each with its own envelope
// sealed to its recipient, answers one status per recipient in the request's order,
// and a retry with the key answers the same; list order and status views see each.
func TestSendToSeveralRecipients(t *testing.T) {
	d, hc := apiDaemon(t, nil)
	body, to := multiBody(t, 3, "to three")
	ms := multiAnswer(t, post(t, hc, "k", body), to)
	for i, m := range ms {
		stored, err := d.Store().Message(m.MessageID)
		if err != nil || stored == nil || stored.PeerOwnerDID != to[i] {
			t.Fatalf("message %s: %+v %v; want it stored for %s", m.MessageID, stored, err, to[i])
		}
		members, err := d.Store().Pending(context.Background(), m.MessageID)
		if err != nil || len(members) != 1 || members[0].PeerOwnerDID != to[i] {
			t.Fatalf("message %s: outbox %v %v; want one envelope to %s", m.MessageID, members, err, to[i])
		}
	}
	again := post(t, hc, "k", body)
	if again.raw != post(t, hc, "k", body).raw || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s", again.status, again.raw)
	}
	if got := multiAnswer(t, again, to); got[0].MessageID != ms[0].MessageID || got[2].MessageID != ms[2].MessageID {
		t.Fatalf("retry answered other messages: %v, want %v", got, ms)
	}
	if n := countMessages(t, d); n != 3 {
		t.Fatalf("%d messages stored, want 3", n)
	}
	// A one-element list is the one-recipient form: one message object.
	one, to1 := multiBody(t, 1, "to one")
	a := post(t, hc, "k1", one)
	if a.status != http.StatusCreated || a.body["to"] != to1[0] || a.body["messageId"] == nil {
		t.Fatalf("one-element list: %d %s", a.status, a.raw)
	}
}

// Bad recipient lists are refused whole, before anything is stored: none, too many,
// one named twice, one not a did:key; several without an Idempotency-Key (each
// recipient's message is accepted on its own, so only a key makes a retry safe).
func TestSendToSeveralRecipientsRefusals(t *testing.T) {
	d, hc := apiDaemon(t, nil)
	good, to := multiBody(t, 2, "x")
	many, _ := multiBody(t, client.MaxRecipients+1, "x")
	twice, _ := json.Marshal(map[string]any{"to": []string{to[0], to[1], to[0]}, "relayUrl": "http://127.0.0.1:9", "body": []byte("x")})
	bad, _ := json.Marshal(map[string]any{"to": []string{to[0], "did:key:nope"}, "relayUrl": "http://127.0.0.1:9", "body": []byte("x")})
	empty, _ := json.Marshal(map[string]any{"to": []string{}, "relayUrl": "http://127.0.0.1:9", "body": []byte("x")})
	for name, c := range map[string]struct {
		key, body, want string
	}{
		"too many":    {"k1", many, fmt.Sprintf("1 to %d", client.MaxRecipients)},
		"twice":       {"k2", string(twice), "to[2] names a recipient twice"},
		"not a did":   {"k3", string(bad), "to[1] must be a did:key"},
		"empty":       {"k4", string(empty), "list of 1 to"},
		"without key": {"", good, "needs an Idempotency-Key"},
	} {
		a := post(t, hc, c.key, c.body)
		if a.status != http.StatusBadRequest || a.body["code"] != codeBadRequest || !strings.Contains(a.raw, c.want) {
			t.Errorf("%s: %d %s; want 400 %s saying %q", name, a.status, a.raw, codeBadRequest, c.want)
		}
		if name == "without key" && a.body["hint"] == nil {
			t.Errorf("%s: no hint in %s", name, a.raw)
		}
	}
	if n := countMessages(t, d); n != 0 {
		t.Fatalf("%d messages stored by refused sends", n)
	}
}

// A send to three recipients whose second message fails to commit answers 5xx with
// the retry hint; the first message stays accepted; the retry with the same key
// makes the other two and answers all three, and there are exactly three messages.
func TestSendToSeveralRecipientsFinishedByRetry(t *testing.T) {
	var commits, failAt atomic.Int32
	d, hc := apiDaemon(t, func(op fsx.Op) error {
		if op.Kind == fsx.OpSyncDir && op.Path == string(record.KindMessages) && failAt.Load() > 0 {
			if commits.Add(1) == failAt.Load() {
				return syscall.EIO
			}
		}
		return nil
	})
	body, to := multiBody(t, 3, "part-way")
	failAt.Store(2)
	a := post(t, hc, "k", body)
	failAt.Store(0)
	if a.status < 500 || !strings.Contains(a.raw, "same Idempotency-Key") {
		t.Fatalf("first attempt: %d %s; want a 5xx with the retry hint", a.status, a.raw)
	}
	if n := countMessages(t, d); n < 1 || n > 2 {
		t.Fatalf("%d messages after the failed attempt, want the first (and maybe the second)", n)
	}
	multiAnswer(t, post(t, hc, "k", body), to)
	if n := countMessages(t, d); n != 3 {
		t.Fatalf("%d messages after the retry, want 3", n)
	}
}

// Twelve concurrent sends to the same three recipients with one key, many times:
// each time exactly three messages are stored, and every 201 names the same three.
func TestConcurrentSendsToSeveralRecipients(t *testing.T) {
	const workers = 12
	trials := 20
	if testing.Short() {
		trials = 5
	}
	d, hc := apiDaemon(t, nil)
	for trial := range trials {
		body, to := multiBody(t, 3, fmt.Sprintf("trial %d", trial))
		bodies := make([]string, workers)
		for i := range bodies {
			bodies[i] = body
		}
		var first []client.Message
		for _, a := range racePosts(t, hc, fmt.Sprintf("key-%d", trial), bodies) {
			switch a.status {
			case http.StatusCreated:
				ms := multiAnswer(t, a, to)
				if first == nil {
					first = ms
				}
				for i := range ms {
					if ms[i].MessageID != first[i].MessageID {
						t.Fatalf("trial %d: two answers name different messages: %v and %v", trial, first, ms)
					}
				}
			case http.StatusConflict:
				if a.body["code"] != "IDEMPOTENCY_IN_PROGRESS" {
					t.Fatalf("trial %d: 409 %s", trial, a.raw)
				}
			default:
				t.Fatalf("trial %d: %d %s", trial, a.status, a.raw)
			}
		}
		if n := countMessages(t, d); n != 3*(trial+1) {
			t.Fatalf("trial %d: %d messages stored, want %d", trial, n, 3*(trial+1))
		}
	}
}
