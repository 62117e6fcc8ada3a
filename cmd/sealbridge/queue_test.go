package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
)

// jsonLines decodes ls --json's output: one message object per line.
func jsonLines(t *testing.T, out string) []client.Message {
	t.Helper()
	var ms []client.Message
	for line := range strings.Lines(out) {
		var m client.Message
		if err := json.Unmarshal([]byte(line), &m); err != nil || m.MessageID == "" {
			t.Fatalf("ls --json line %q: %v", line, err)
		}
		ms = append(ms, m)
	}
	return ms
}

// Messages to a relay that refuses connections: queue shows the target unreachable
// since the first attempt with its next probe, its three pending envelopes (all
// under 5 minutes old) and the last error, as text and as the daemon's JSON; ls
// --json writes one object per line and ls --all pages through every message.
func TestQueueAndLsAll(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	startDaemon(t, home, "alice")
	as := []string{"--home", home, "--identity", "alice"}
	if code, out, errs := sb(t, append([]string{"queue"}, as...)...); code != 0 || out != "no pending envelopes\n" {
		t.Fatalf("queue of an empty outbox: %d %q %s", code, out, errs)
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	dead := srv.URL
	srv.Close()
	t.Cleanup(func() { stdin = os.Stdin })
	var ids []string
	for range 3 {
		stdin = strings.NewReader("hello")
		code, out, errs := sb(t, append([]string{"send", "--to", bob, "--relay", dead}, as...)...)
		if code != 0 {
			t.Fatalf("send: %d %s", code, errs)
		}
		ids = append(ids, strings.TrimSpace(out))
	}
	slices.Sort(ids)

	var l []client.Target
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		code, out, errs := sb(t, append([]string{"queue", "--json"}, as...)...)
		l = nil
		for line := range strings.Lines(out) {
			var tg client.Target
			if err := json.Unmarshal([]byte(line), &tg); err != nil || tg.RelayURL == "" {
				t.Fatalf("queue --json line %q: %v", line, err)
			}
			l = append(l, tg)
		}
		if code != 0 {
			t.Fatalf("queue --json: %d %s %s", code, out, errs)
		}
		if len(l) == 1 && l[0].State == "unreachable" {
			break
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("the target did not become unreachable: %+v", l)
		}
	}
	tg := l[0]
	if tg.RelayURL != dead || tg.Pending != 3 || tg.Held != 0 || tg.Attempts < 1 || !strings.Contains(tg.LastError, "connection refused") ||
		tg.UnreachableSince.IsZero() || !tg.NextProbeAt.After(tg.UnreachableSince) || !slices.Equal(tg.Ages, []int{3, 0, 0, 0, 0, 0, 0}) || tg.Bytes <= 0 {
		t.Fatalf("queue --json: %+v", tg)
	}
	code, out, errs := sb(t, append([]string{"queue", "--wide"}, as...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 6 || !strings.Contains(lines[1], "unreachable since ") || !strings.Contains(lines[1], ", next probe at ") ||
		!strings.Contains(lines[1], "Post ") || !strings.Contains(lines[1], "connection refused") {
		t.Fatalf("queue --wide:\n%s", out)
	}
	wide := lines[1]
	// By default: times relative to now, the last error's gist, and a hint to retry.
	code, out, errs = sb(t, append([]string{"queue"}, as...)...)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 6 || lines[2] != "" || !strings.HasPrefix(lines[0], "TARGET") || !strings.HasPrefix(lines[1], dead+" ") ||
		!strings.Contains(lines[1], "unreachable for ") || !strings.Contains(lines[1], ", probe in ") ||
		!strings.Contains(lines[1], "relay unreachable: connection refused") || strings.Contains(lines[1], "Post ") ||
		len(lines[1]) >= len(wide) || strings.Fields(lines[1])[1] != "3" ||
		!strings.HasPrefix(errs, "sealbridge: hint: ") || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, "sealbridge retry --target "+dead) ||
		!slices.Equal(strings.Fields(lines[3]), []string{"TARGET", "TOTAL", "5m", "10m", "20m", "40m", "80m", "160m", "older"}) ||
		!slices.Equal(strings.Fields(lines[5]), []string{"TOTAL", "3", "3", "0", "0", "0", "0", "0", "0"}) {
		t.Fatalf("queue:\n%s", out)
	}

	// One page: one object per line and a "more:" line; --all: every message, once.
	code, out, errs = sb(t, append([]string{"ls", "--json", "--limit", "1"}, as...)...)
	if ms := jsonLines(t, out); code != 0 || len(ms) != 1 || ms[0].MessageID != ids[0] || !strings.Contains(errs, "--after "+ids[0]) {
		t.Fatalf("ls --json --limit 1: %d %s\n%s", code, errs, out)
	}
	code, out, errs = sb(t, append([]string{"ls", "--json", "--all", "--limit", "1"}, as...)...)
	var got []string
	for _, m := range jsonLines(t, out) {
		got = append(got, m.MessageID)
		if m.Status != "queued" || m.RelayURL != dead {
			t.Fatalf("ls --all --json: %+v", m)
		}
	}
	if code != 0 || !slices.Equal(got, ids) || errs != "" {
		t.Fatalf("ls --all --json --limit 1: %d %v (want %v) %s", code, got, ids, errs)
	}
	code, out, errs = sb(t, append([]string{"ls", "--all", "--limit", "2", "--after", ids[0]}, as...)...)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "MESSAGE") || !strings.HasPrefix(lines[1], ids[1]) ||
		!strings.HasPrefix(lines[2], ids[2]) || errs != "" {
		t.Fatalf("ls --all --after: %d %s\n%s", code, errs, out)
	}
}

// The daemon's hints are printed (each once); without one, a waiting target gets
// the retry --target that makes an attempt now.
func TestQueueHints(t *testing.T) {
	waiting := []client.Target{{RelayURL: "http://a:1", State: "unreachable"}, {RelayURL: "http://b:1", State: "ready"}}
	if got := queueHints(&client.TargetList{Targets: waiting}); !slices.Equal(got, []string{"make an attempt to http://a:1 now with: sealbridge retry --target http://a:1"}) {
		t.Errorf("own hint: %q", got)
	}
	daemon := []client.Target{{RelayURL: "http://a:1", State: "unreachable", Hint: "retry it"}, {RelayURL: "http://c:1", State: "backing-off", Hint: "retry it"}}
	if got := queueHints(&client.TargetList{Targets: daemon, Hint: "the view's"}); !slices.Equal(got, []string{"the view's", "retry it"}) {
		t.Errorf("the daemon's hints: %q", got)
	}
	if got := queueHints(&client.TargetList{Targets: waiting[1:]}); got != nil {
		t.Errorf("no target waits: %q", got)
	}
}

func TestShortReasonAndDID(t *testing.T) {
	for in, want := range map[string]string{
		`relay unreachable: Post "http://127.0.0.1:9/v1/envelopes": dial tcp 127.0.0.1:9: connect: connection refused`: "relay unreachable: connection refused",
		"failed: HTTP 503 RELAY_BUSY":         "failed: HTTP 503 RELAY_BUSY",
		"":                                    "",
		"refused: " + strings.Repeat("x", 80): "refused: " + strings.Repeat("x", 50) + "…",
	} {
		if got := shortReason(in); got != want {
			t.Errorf("shortReason(%q) = %q, want %q", in, got, want)
		}
	}
	if got := shortDID("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"); got != "did:key:z6Mk…2doK" {
		t.Errorf("shortDID: %q", got)
	}
}
