package daemon

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Refused inbound envelopes are acknowledged (the relay's inbox drains), kept as
// refusals records by reason, listed by GET /v1/inbox/refused and counted, and never
// become a receipt, an observation or an inbox message.
func TestRefusedEnvelopesLeaveEvidence(t *testing.T) {
	ctx := context.Background()
	relayURL := newTestRelay(t)
	b := startInbound(t, t.TempDir(), "bob", relayURL)
	sender, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	other, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	wrongEnv, wrong, err := envelope.NewMessage(sender, other.DID(), uuid.NewString(), []byte("not for bob"), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	_, good, err := envelope.NewMessage(sender, b.DID(), uuid.NewString(), []byte("for bob"), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	// Another signature: flip one base64url character of sig.
	i := bytes.LastIndex(good, []byte(`"sig":"`)) + len(`"sig":"`) + 3
	forged := bytes.Clone(good)
	forged[i] = map[bool]byte{true: 'B', false: 'A'}[forged[i] == 'A']
	garbage := []byte(`{"v":1,"payload":{"envelopeId":"not-a-uuid"}}`)
	cases := []struct {
		name, reason string
		raw          []byte
		envID        string
		keep         bool
	}{
		{"wrong recipient", record.RefusedRecipient, wrong, wrongEnv.ID(), true},
		{"bad signature", record.RefusedSignature, forged, "", true},
		{"malformed", record.RefusedMalformed, garbage, "", true},
		{"oversize", record.RefusedOversize, bytes.Repeat([]byte("x"), envelope.MaxSize+1), "", false},
	}
	var f *follower
	eventually(t, 30*time.Second, "bob's follower", func() (bool, string) { f = b.inbound(); return f != nil, "none" })
	for _, c := range cases {
		p, ack, err := f.processEnvelope(ctx, relayproto.InboxEnvelope{EnvelopeID: uuid.NewString(), Envelope: c.raw})
		if err != nil || !ack || p != nil {
			t.Fatalf("%s: pending %v, ack %v, err %v; want acknowledged without a receipt", c.name, p, ack, err)
		}
		rf, err := store.GetAs[*record.Refusal](b.Store(), record.RefusalID(envelope.Digest(c.raw)))
		if err != nil || rf == nil {
			t.Fatalf("%s: no refusal record (%v)", c.name, err)
		}
		if rf.Reason != c.reason || rf.Size != int64(len(c.raw)) || (rf.Envelope != nil) != c.keep ||
			(c.envID != "" && rf.EnvelopeID != c.envID) || rf.RetainUntil-rf.ReceivedAt != store.DefaultClosedRetention.Milliseconds() {
			t.Fatalf("%s: refusal %+v, want reason %s", c.name, rf, c.reason)
		}
	}
	// Refused twice: still one record.
	if _, ack, err := f.processEnvelope(ctx, relayproto.InboxEnvelope{EnvelopeID: uuid.NewString(), Envelope: wrong}); err != nil || !ack {
		t.Fatalf("refused again: ack %v err %v", ack, err)
	}
	if got := countKind(t, b, record.KindRefusals); got != len(cases) {
		t.Fatalf("%d refusals, want %d", got, len(cases))
	}
	for _, k := range []record.Kind{record.KindReceipts, record.KindObservations} {
		if got := countKind(t, b, k); got != 0 {
			t.Fatalf("refused envelopes left %d %s", got, k)
		}
	}
	cb := client.New(b.SocketPath())
	if l, err := cb.Inbox(ctx, 0, ""); err != nil || len(l.Messages) != 0 {
		t.Fatalf("inbox %+v %v: a refused envelope is listed as received", l, err)
	}
	l, err := cb.InboxRefused(ctx)
	if err != nil || len(l.Refused) != len(cases) {
		t.Fatalf("refused list %+v %v", l, err)
	}
	reasons := map[string]bool{}
	for _, r := range l.Refused {
		reasons[r.Reason] = true
	}
	for _, c := range cases {
		if !reasons[c.reason] {
			t.Fatalf("GET /v1/inbox/refused lacks %s: %+v", c.reason, l.Refused)
		}
	}
	rec := httptest.NewRecorder()
	b.m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`sealbridge_inbox_refused_envelopes_total{reason="recipient"} 2`,
		`sealbridge_inbox_refused_envelopes_total{reason="expired"} 0`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Fatalf("metrics lack %s:\n%s", want, rec.Body.String())
		}
	}
}

// A sender flooding an inbox with envelopes that will be refused does not grow the
// store without bound: past maxRefusalRecords a refusal is counted, acknowledged and
// not kept.
func TestRefusalsBounded(t *testing.T) {
	defer func(n int) { maxRefusalRecords = n }(maxRefusalRecords)
	maxRefusalRecords = 2
	ctx := context.Background()
	b := startInbound(t, t.TempDir(), "bob", newTestRelay(t))
	var f *follower
	eventually(t, 30*time.Second, "bob's follower", func() (bool, string) { f = b.inbound(); return f != nil, "none" })
	for i := range 5 {
		raw := []byte(`{"v":1,"payload":{"envelopeId":"not-a-uuid-` + string(rune('a'+i)) + `"}}`)
		if p, ack, err := f.processEnvelope(ctx, relayproto.InboxEnvelope{EnvelopeID: uuid.NewString(), Envelope: raw}); err != nil || !ack || p != nil {
			t.Fatalf("refusal %d: pending %v, ack %v, err %v; want acknowledged", i, p, ack, err)
		}
	}
	if got := countKind(t, b, record.KindRefusals); got != 2 {
		t.Fatalf("%d refusals kept, want the bound, 2", got)
	}
	rec := httptest.NewRecorder()
	b.m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`sealbridge_inbox_refused_envelopes_total{reason="malformed"} 5`, `sealbridge_inbox_refusals_not_kept_total 3`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
}
