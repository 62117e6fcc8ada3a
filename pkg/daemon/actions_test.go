package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// actionDaemon runs a daemon whose relay always fails, with an hour of backoff: a
// sent message stays queued.
func actionDaemon(t *testing.T) (*Daemon, *client.Client) {
	t.Helper()
	tr := &scripted{stuck: true, fail: carrier.Result{Outcome: carrier.Failed, Status: http.StatusServiceUnavailable,
		Err: errors.New("HTTP 503")}}
	d, c, _, _ := changeDaemon(t, t.TempDir(), Options{Transport: tr,
		Carrier: carrier.Options{BackoffMin: time.Hour, BackoffMax: time.Hour, Watch: carrier.WatchOff}})
	return d, c
}

func sendOne(t *testing.T, c *client.Client) string {
	t.Helper()
	peer, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Send(context.Background(), client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: "http://relay.test:8470",
		Body: []byte("x")}, "")
	if err != nil {
		t.Fatal(err)
	}
	return m.MessageID
}

// nextChangeOf reads the change feed from *cursor until a change of message id,
// and returns its state.
func nextChangeOf(t *testing.T, c *client.Client, cursor *string, id string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		p, err := c.Changes(context.Background(), *cursor, []string{client.TopicMessages}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		*cursor = p.Cursor
		for _, ch := range p.Changes {
			if ch.ID == id {
				return ch.State
			}
		}
	}
	t.Fatalf("no change of message %s in the feed", id)
	return ""
}

// Hold, a repeated hold, cancel and a hold of the cancelled message through the
// client: each change is in the records (who: the socket peer's uid; why), in the
// message view and in the change feed; a repeat changes nothing; a closed or
// unknown message refuses with its code.
func TestQueueActionsThroughTheSocket(t *testing.T) {
	ctx := context.Background()
	d, c := actionDaemon(t)
	id := sendOne(t, c)
	cursor := firstCursor(t, c)
	me := "uid:" + strconv.Itoa(os.Getuid())

	ans, err := c.Hold(ctx, client.Selector{MessageIDs: []string{id}}, "looking into it")
	if err != nil {
		t.Fatal(err)
	}
	// The message's first attempt may be under way (InFlight 1: a hold does not stop
	// it); everything else of the result is fixed.
	if len(ans.Results) == 1 && ans.Results[0].InFlight <= 1 {
		ans.Results[0].InFlight = 0
	}
	if ans.Action != "hold" || len(ans.Results) != 1 || ans.Results[0] != (client.ActionResult{MessageID: id, Changed: 1}) {
		t.Fatalf("hold: %+v", ans)
	}
	m, err := d.st.Message(id)
	if err != nil || m == nil {
		t.Fatal(m, err)
	}
	if m.Held == nil || m.Held.By != me || m.Held.Reason != "looking into it" || m.Operator == nil || m.Operator.Op != record.ActionHold {
		t.Fatalf("message record after hold: held %+v operator %+v, want by %s", m.Held, m.Operator, me)
	}
	envs, err := d.st.Pending(ctx, id)
	if err != nil || len(envs) != 1 || envs[0].Held == nil || envs[0].Held.By != me {
		t.Fatalf("pending envelopes after hold: %v %+v", err, envs)
	}
	if st := nextChangeOf(t, c, &cursor, id); st != record.StatusQueued {
		t.Fatalf("hold reported as %q", st)
	}
	if again, err := c.Hold(ctx, client.Selector{MessageIDs: []string{id}}, ""); err != nil ||
		len(again.Results) != 1 || again.Results[0].Changed != 0 || again.Results[0].Code != "" {
		t.Fatalf("hold again: %+v %v", again, err)
	}

	ans, err = c.Cancel(ctx, client.Selector{MessageIDs: []string{id}}, "not needed")
	if err != nil || len(ans.Results) != 1 || ans.Results[0].Changed != 1 || ans.Results[0].Code != "" {
		t.Fatalf("cancel: %+v %v", ans, err)
	}
	if st := nextChangeOf(t, c, &cursor, id); st != record.StatusClosed {
		t.Fatalf("cancel reported as %q", st)
	}
	v, err := c.Message(ctx, id)
	if err != nil || v.Status != record.StatusClosed || v.ClosedBy != record.ClosedByCancelled {
		t.Fatalf("message after cancel: %+v %v", v, err)
	}
	m, _ = d.st.Message(id)
	if m.Held != nil || m.Operator == nil || m.Operator.Op != record.ActionCancel || m.Operator.By != me || m.Operator.Reason != "not needed" {
		t.Fatalf("message record after cancel: held %+v operator %+v", m.Held, m.Operator)
	}

	unknown := uuid.NewString()
	ans, err = c.Hold(ctx, client.Selector{MessageIDs: []string{id, unknown}}, "")
	if err != nil || len(ans.Results) != 2 {
		t.Fatalf("hold of a closed and an unknown message: %+v %v", ans, err)
	}
	if r := ans.Results[0]; r.MessageID != id || r.Code != errcode.MessageClosed.String() || r.Changed != 0 {
		t.Errorf("hold of the cancelled message: %+v", r)
	}
	if r := ans.Results[1]; r.MessageID != unknown || r.Code != errcode.MessageNotFound.String() {
		t.Errorf("hold of an unknown message: %+v", r)
	}
	if len(ans.Refused()) != 2 {
		t.Errorf("Refused: %+v", ans.Refused())
	}
}

// A request is decoded strictly and needs exactly one selector; the caller cannot
// name itself ("by" is the socket peer's), and the reason is bounded.
func TestQueueActionRequestsRefused(t *testing.T) {
	d, c := actionDaemon(t)
	id := sendOne(t, c)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.SocketPath())
	}}}
	t.Cleanup(hc.CloseIdleConnections)
	for _, body := range []string{
		`{}`,
		`{"messageIds":[]}`,
		`{"messageIds":["` + id + `"],"target":"http://relay.test:8470"}`,
		`{"messageIds":["` + id + `"],"by":"uid:0"}`,
		`{"messageIds":["` + id + `"],"messageIds":["` + id + `"]}`,
		`{"messageIDs":["` + id + `"]}`,
		`{"messageIds":["NOT-A-UUID"]}`,
		`{"target":"ftp://relay.test"}`,
		`{"messageIds":["` + id + `"],"reason":"` + strings.Repeat("r", record.MaxActionReason+1) + `"}`,
		`{"messageIds":["` + id + `"],"reason":"two\nlines"}`,
		`{"messageIds":["` + id + `"]} {}`,
	} {
		resp, err := hc.Post("http://sealbridged/v1/queue/hold", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%.80s: %d, want 400", body, resp.StatusCode)
		}
	}
	m, _ := d.st.Message(id)
	if m.Held != nil || m.Operator != nil {
		t.Fatalf("a refused request changed the message: held %+v operator %+v", m.Held, m.Operator)
	}
	// The longest reason is taken.
	long := strings.Repeat("r", record.MaxActionReason)
	if ans, err := c.Hold(context.Background(), client.Selector{MessageIDs: []string{id}}, long); err != nil || ans.Results[0].Changed != 1 {
		t.Fatalf("hold with a %d-byte reason: %+v %v", len(long), ans, err)
	}
	var ce *client.Error
	if _, err := c.Hold(context.Background(), client.Selector{}, ""); !errors.As(err, &ce) || ce.Status != http.StatusBadRequest || ce.Code != codeBadRequest {
		t.Fatalf("hold without a selector: %v", err)
	}
}

// hold and retry of a target select the messages pending to it; retry makes the
// unheld ones due now.
func TestQueueActionsByTarget(t *testing.T) {
	ctx := context.Background()
	_, c := actionDaemon(t)
	a, b := sendOne(t, c), sendOne(t, c)
	waitFor(t, "both attempted once", func() bool {
		for _, id := range []string{a, b} {
			if m, err := c.Message(ctx, id); err != nil || m.Attempts == 0 {
				return false
			}
		}
		return true
	})
	if ans, err := c.Hold(ctx, client.Selector{MessageIDs: []string{a}}, ""); err != nil || ans.Results[0].Changed != 1 {
		t.Fatalf("hold a: %+v %v", ans, err)
	}
	before := time.Now()
	ans, err := c.Retry(ctx, client.Selector{Target: "http://relay.test:8470"}, "")
	if err != nil || len(ans.Results) != 2 {
		t.Fatalf("retry --target: %+v %v", ans, err)
	}
	got := map[string]client.ActionResult{}
	for _, r := range ans.Results {
		got[r.MessageID] = r
	}
	if got[a].Changed != 0 || got[a].Code != "" || got[b].Changed != 1 {
		t.Fatalf("retry --target with a held: %+v", ans.Results)
	}
	// b was due now: the carrier (kicked) attempted it again at once; a was not.
	waitFor(t, "b attempted again", func() bool {
		m, err := c.Message(ctx, b)
		return err == nil && m.Attempts == 2
	})
	if m, _ := c.Message(ctx, a); m.Attempts != 1 {
		t.Fatalf("held message attempted after the retry: %d attempts", m.Attempts)
	}
	if m, _ := c.Message(ctx, b); !m.NextAttemptAt.After(before.Add(30 * time.Minute)) {
		t.Fatalf("b's next attempt %v: want the hour's backoff after its retried attempt", m.NextAttemptAt)
	}
}
