package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// jsRelay is one sealbridge-relay process on the JetStream backend.
type jsRelay struct {
	url string       // http://ADDR
	did identity.DID // the relay DID it printed
}

// startJSRelay starts sealbridge-relay --backend jetstream on natsURL with the
// key in idFile and waits for its two lines on stdout; it is stopped (SIGTERM)
// when the test ends.
func startJSRelay(t *testing.T, bin, idFile, natsURL string, extra ...string) jsRelay {
	t.Helper()
	args := append([]string{"--listen", "127.0.0.1:0", "--home", t.TempDir(), "--identity-file", idFile,
		"--log-level", "warn", "--backend", "jetstream", "--nats-url", natsURL}, extra...)
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		if msg := stderr.String(); t.Failed() && msg != "" {
			t.Logf("relay %s stderr:\n%s", natsURL, msg)
		}
	})
	ready := make(chan jsRelay, 1)
	go func() {
		var r jsRelay
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				r.url = u
			}
			if d, ok := strings.CutPrefix(sc.Text(), "relay "); ok {
				r.did = identity.DID(d)
			}
			if r.url != "" && r.did != "" {
				ready <- r
				break
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case r := <-ready:
		return r
	case <-exited:
		t.Fatalf("relay on %s exited before it listened: %s", natsURL, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("relay on %s did not start within 60s: %s", natsURL, stderr.String())
	}
	return jsRelay{}
}

// waitJetStream polls the cluster until JetStream answers (a meta leader is
// elected), so the relays do not start into an election.
func waitJetStream(t *testing.T, urls string) {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, urls))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "JetStream meta leader", 60*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil, fmt.Sprint(err)
	})
}

// ack is the first receipt the carrier got for one envelope, and from where.
type ack struct {
	relayURL string
	receipt  []byte
}

// recordingTransport is the carrier's HTTP transport that keeps every receipt
// it verified (an Accepted result: a signed receipt matching the envelope).
type recordingTransport struct {
	*carrier.HTTPTransport
	t      *testing.T
	mu     sync.Mutex
	acks   map[string]ack // envelope id → first receipt
	byURL  map[string]int // relay URL → envelopes first acknowledged there
	differ int            // accepts whose receipt differs from the first one's
}

func (r *recordingTransport) Send(ctx context.Context, relayURL string, env []byte) carrier.Result {
	res := r.HTTPTransport.Send(ctx, relayURL, env)
	r.note(relayURL, env, res)
	return res
}

func (r *recordingTransport) SendBatch(ctx context.Context, relayURL string, envs [][]byte) []carrier.Result {
	res := r.HTTPTransport.SendBatch(ctx, relayURL, envs)
	for i := range res {
		r.note(relayURL, envs[i], res[i])
	}
	return res
}

func (r *recordingTransport) note(relayURL string, env []byte, res carrier.Result) {
	if res.Outcome != carrier.Accepted {
		return
	}
	en, err := envelope.Parse(env)
	if err != nil || len(res.Receipt) == 0 {
		r.t.Errorf("accepted without an envelope or a receipt: %v", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if first, ok := r.acks[en.ID()]; ok {
		if !bytes.Equal(first.receipt, res.Receipt) {
			r.differ++
		}
		return
	}
	r.acks[en.ID()] = ack{relayURL, bytes.Clone(res.Receipt)}
	r.byURL[relayURL]++
}

func (r *recordingTransport) counts() (total int, byURL map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	byURL = map[string]int{}
	for u, n := range r.byURL {
		byURL[u] = n
	}
	return len(r.acks), byURL
}

// Two sealbridge-relay processes on a three-node JetStream cluster (R3), each
// connected to its own node, share one relay identity. A carrier delivers 1,000
// envelopes for four recipients across both while the node of the first relay
// is stopped and started again. Then: every envelope acknowledged with a
// verified receipt is fetched exactly once by its recipient (pages from either
// relay), byte for byte; each one posted again to the other relay (a carrier
// that crashed before it recorded the receipt) gets the byte-identical receipt
// and is not held twice; another envelope under a used id is 409
// ENVELOPE_CONFLICT from either relay; acknowledged through either relay, the
// inboxes are empty on both. About 15-30 s on a busy 2-core machine.
func TestJetStreamTwoRelaysNodeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node NATS cluster and two relay processes: about 20 s")
	}
	start := time.Now()
	_, relayBin := buildBinaries(t)
	c := natstest.Cluster(t, 3)
	waitJetStream(t, c.URLs())
	idFile := filepath.Join(t.TempDir(), "relay-identity.pem")
	relays := []jsRelay{
		startJSRelay(t, relayBin, idFile, c.URL(0)), // creates the identity
		startJSRelay(t, relayBin, idFile, c.URL(1)), // loads it
	}
	if relays[0].did != relays[1].did || relays[0].did == "" {
		t.Fatalf("relay DIDs %q and %q, want one shared identity", relays[0].did, relays[1].did)
	}
	relayDID := relays[0].did
	other := map[string]string{relays[0].url: relays[1].url, relays[1].url: relays[0].url}

	const nEnvelopes, nRecipients = 1000, 4
	alice := ident(t, 1)
	recipients := make([]*identity.Identity, nRecipients)
	for i := range recipients {
		recipients[i] = ident(t, byte(40+i))
	}
	st, err := store.Open(alice.Signer(), store.Options{Dir: t.TempDir() + "/store"})
	if err != nil {
		t.Fatal(err)
	}
	wires := map[string][]byte{}          // envelope id → wire bytes
	to := map[string]*identity.Identity{} // envelope id → recipient
	now := time.Now()
	for n := range nEnvelopes {
		r := recipients[n%nRecipients]
		en, data, err := envelope.NewMessage(alice, r.DID(), uuid.NewString(), []byte(fmt.Sprint("js e2e ", n)), now.Add(time.Hour), now)
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.Enqueue(context.Background(), store.SendRequest{
			MessageID: en.MessageID(), PeerOwnerDID: r.DID(), RelayURL: relays[(n/7)%2].url, DeliveryDeadline: en.DeliveryDeadline(),
			Envelopes: []store.OutgoingEnvelope{{EnvelopeID: en.ID(), Kind: record.EnvelopeMessage, Envelope: data}},
		})
		if err != nil {
			t.Fatal(err)
		}
		wires[en.ID()], to[en.ID()] = data, r
	}

	tr := &recordingTransport{HTTPTransport: carrier.NewHTTPTransport(carrier.HTTPOptions{SendTimeout: 5 * time.Second}),
		t: t, acks: map[string]ack{}, byURL: map[string]int{}}
	cr := carrier.New(st, tr, fastOptions())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cr.Run(ctx) }()
	stopCarrier := func() {
		if cancel != nil {
			cancel()
			<-done
			cancel = nil
		}
	}
	defer stopCarrier()
	cr.Kick()

	// Node 0 (the first relay's) goes down after 300 acknowledgements and
	// comes back after 300 more.
	var atStop map[string]int
	stopped, restarted := false, false
	waitFor(t, "1,000 envelopes acknowledged", 3*time.Minute, func() (bool, string) {
		n, byURL := tr.counts()
		switch {
		case !stopped && n >= 300:
			c.Stop(0)
			stopped, atStop = true, byURL
		case stopped && !restarted && (n >= 600 || n == nEnvelopes):
			for _, r := range relays {
				if byURL[r.url] == atStop[r.url] {
					return false, fmt.Sprintf("relay %s acknowledged nothing while node 0 was down (%d in all)", r.url, n)
				}
			}
			c.Start(0)
			restarted = true
			t.Logf("acknowledged while node 0 was down: %d by the relay on node 0, %d by the relay on node 1",
				byURL[relays[0].url]-atStop[relays[0].url], byURL[relays[1].url]-atStop[relays[1].url])
		}
		return restarted && n == nEnvelopes, fmt.Sprintf("%d acknowledged, per relay %v, node 0 stopped %t restarted %t", n, byURL, stopped, restarted)
	})
	waitFor(t, "the carrier records every envelope relayed", 60*time.Second, func() (bool, string) {
		r, total := relayedCount(t, st)
		return r == nEnvelopes, fmt.Sprintf("%d/%d relayed", r, total)
	})
	stopCarrier()
	tr.mu.Lock()
	acks, differ := tr.acks, tr.differ
	tr.mu.Unlock()
	if differ != 0 {
		t.Fatalf("%d envelopes were acknowledged twice with different receipts", differ)
	}
	for id, a := range acks {
		rc, err := envelope.ParseRelayReceipt(a.receipt)
		if err != nil || !rc.Matches(id, envelope.Digest(wires[id])) || rc.RelayDID != relayDID {
			t.Fatalf("receipt of %s: %+v, %v; want one by %s matching the envelope", id, rc, err, relayDID)
		}
	}
	delivered := time.Since(start)

	// Every acknowledged envelope is in its recipient's inbox exactly once,
	// the pages taken from both relays in turn.
	checkInboxes := func(when string) {
		t.Helper()
		seen := map[string]bool{}
		for _, r := range recipients {
			for _, e := range fetchAllJS(t, relays, r) {
				if seen[e.EnvelopeID] {
					t.Fatalf("%s: envelope %s fetched twice", when, e.EnvelopeID)
				}
				seen[e.EnvelopeID] = true
				if to[e.EnvelopeID] != r || !bytes.Equal(e.Envelope, wires[e.EnvelopeID]) {
					t.Fatalf("%s: envelope %s is not one acknowledged for this recipient, byte for byte", when, e.EnvelopeID)
				}
			}
		}
		for id := range acks {
			if !seen[id] {
				t.Fatalf("%s: acknowledged envelope %s was not fetched", when, id)
			}
		}
		if len(seen) != len(acks) {
			t.Fatalf("%s: %d envelopes fetched, %d acknowledged", when, len(seen), len(acks))
		}
	}
	checkInboxes("after delivery")

	// A carrier that crashed after the relay's answer posts the same bytes
	// again, here to the other relay: the same receipt, byte for byte.
	ids := make([]string, 0, len(acks))
	for id := range acks {
		ids = append(ids, id)
	}
	errs := make(chan error, len(ids))
	var wg sync.WaitGroup
	const workers = 8
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(ids); i += workers {
				id := ids[i]
				cl := &relayproto.Client{BaseURL: other[acks[id].relayURL]}
				got, _, err := postRetry(cl, wires[id])
				if err != nil {
					errs <- fmt.Errorf("re-post of %s to the other relay: %w", id, err)
					return
				}
				if !bytes.Equal(got, acks[id].receipt) {
					errs <- fmt.Errorf("re-post of %s to the other relay: receipt\n%s\nwant the first one\n%s", id, got, acks[id].receipt)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Another envelope (other sender, other digest) under a used id: 409 from
	// either relay.
	for _, id := range ids[:10] {
		forged := forgeWithID(t, id, ident(t, 3), to[id].DID())
		for _, r := range relays {
			_, _, err := (&relayproto.Client{BaseURL: r.url}).Post(context.Background(), forged)
			var re *relayproto.Error
			if !errors.As(err, &re) || re.Status != 409 || re.Code != relayproto.CodeEnvelopeConflict {
				t.Fatalf("same id %s, other digest, at %s: %v; want 409 %s", id, r.url, err, relayproto.CodeEnvelopeConflict)
			}
		}
	}
	checkInboxes("after the re-posts and the conflicts")

	// Acknowledged through either relay, every inbox is empty on both.
	for _, r := range recipients {
		var got []string
		for _, e := range fetchAllJS(t, relays, r) {
			got = append(got, e.EnvelopeID)
		}
		for k := 0; len(got) > 0; k++ {
			n := min(len(got), relayproto.MaxAckIDs)
			if _, err := (&relayproto.Client{BaseURL: relays[k%2].url}).Ack(context.Background(), r, got[:n]); err != nil {
				t.Fatalf("ack: %v", err)
			}
			got = got[n:]
		}
		for _, rl := range relays {
			s, err := (&relayproto.Client{BaseURL: rl.url}).Status(context.Background(), r)
			if err != nil || s.Count != 0 {
				t.Fatalf("status at %s after the acks: %+v, %v; want an empty inbox", rl.url, s, err)
			}
		}
	}
	t.Logf("%d envelopes through two relays on a 3-node R3 cluster with a node restart: delivered in %v, whole test %v",
		nEnvelopes, delivered.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// postRetry posts wire, retrying while a relay answers 503 (its JetStream
// connection settling after the restart) for up to a minute.
func postRetry(cl *relayproto.Client, wire []byte) ([]byte, *envelope.RelayReceipt, error) {
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond) // the carrier's backoff, not a wait for an event
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		b, rc, err := cl.Post(ctx, wire)
		cancel()
		var re *relayproto.Error
		if err == nil || !errors.As(err, &re) || re.Status != 503 || time.Now().After(deadline) {
			return b, rc, err
		}
		<-tick.C
	}
}

// fetchAllJS fetches id's whole inbox, the pages from the relays in turn,
// retrying a page that fails while the cluster settles after the restart.
func fetchAllJS(t *testing.T, relays []jsRelay, id *identity.Identity) []relayproto.InboxEnvelope {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var all []relayproto.InboxEnvelope
	after := ""
	tick := time.NewTicker(20 * time.Millisecond) // a recipient's backoff after a failed page
	defer tick.Stop()
	for k := 0; ; k++ {
		cl := &relayproto.Client{BaseURL: relays[k%2].url}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		page, err := cl.Fetch(ctx, id, after, relayproto.MaxFetchLimit)
		cancel()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("fetch at %s: %v", cl.BaseURL, err)
			}
			<-tick.C
			continue
		}
		all = append(all, page.Envelopes...)
		after = page.Cursor
		if !page.More {
			return all
		}
	}
}

// forgeWithID builds a valid envelope by sender to recipient under envelope
// id id (the envelope API always draws a new id).
func forgeWithID(t *testing.T, id string, sender *identity.Identity, recipient identity.DID) []byte {
	t.Helper()
	now := time.Now()
	en, data, err := envelope.NewMessage(sender, recipient, uuid.NewString(), []byte("other"), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	var w struct {
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		t.Fatal(err)
	}
	payload := bytes.Replace(w.Payload, []byte(`"envelopeId":"`+en.ID()+`"`), []byte(`"envelopeId":"`+id+`"`), 1)
	sig, err := identity.SignDomain(sender.Signer(), identity.DomainEnvelope, payload)
	if err != nil {
		t.Fatal(err)
	}
	out := []byte(`{"v":1,"payload":` + string(payload) + `,"sig":"` + base64.RawURLEncoding.EncodeToString(sig) + `"}`)
	if got, err := envelope.Parse(out); err != nil || got.ID() != id {
		t.Fatalf("forged envelope under %s does not parse: %v", id, err)
	}
	return out
}

// On one node, a relay asked for an unreplicated stream (R1) without the
// operator's declaration that the server fsyncs every write refuses to start,
// naming the settings to change; a client cannot see the server's
// sync_interval, so the declaration is the flag. With --jetstream-sync-always
// (this node does sync every write) the same relay starts and accepts.
func TestJetStreamRelayRefusesUndurableSingleNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands")
	}
	_, relayBin := buildBinaries(t)
	s := natstest.Node(t)
	idFile := filepath.Join(t.TempDir(), "relay-identity.pem")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, "--listen", "127.0.0.1:0", "--home", t.TempDir(), "--identity-file", idFile,
		"--backend", "jetstream", "--nats-url", s.ClientURL(), "--jetstream-replicas", "1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || ctx.Err() != nil {
		t.Fatalf("R1 without --jetstream-sync-always: %v (stdout %q), want exit status 1", err, stdout.String())
	}
	msg := stderr.String()
	if !strings.Contains(msg, "--jetstream-sync-always") || !strings.Contains(msg, "sync_interval") || !strings.Contains(msg, "replicas") {
		t.Fatalf("refusal names neither the flag, the server setting nor the replicas: %s", msg)
	}
	if strings.Contains(stdout.String(), "listening") {
		t.Fatalf("the refused relay listened: %s", stdout.String())
	}
	// The same node with the declaration: the relay starts and accepts.
	r := startJSRelay(t, relayBin, idFile, s.ClientURL(), "--jetstream-replicas", "1", "--jetstream-sync-always")
	now := time.Now()
	_, data, err := envelope.NewMessage(ident(t, 1), ident(t, 2).DID(), uuid.NewString(), []byte("x"), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, rc, err := (&relayproto.Client{BaseURL: r.url}).Post(context.Background(), data); err != nil || rc.RelayDID != r.did {
		t.Fatalf("post to the synced single-node relay: %+v, %v", rc, err)
	}
}
