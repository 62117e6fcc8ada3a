package daemon

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Inbound defaults.
const (
	defaultPollEvery = time.Second
	// inboxBackoffMin and inboxBackoffMax bound the wait after a failed fetch: it
	// doubles from the first to the second while the relay stays unreachable. The
	// bound is short so that mail waiting at a relay that comes back moves within
	// inboxBackoffMax of its return, however long it was away: one signed GET every
	// few seconds is what a follower costs a relay that is down.
	inboxBackoffMin = time.Second
	inboxBackoffMax = 5 * time.Second
	// inboxRetryAfterMax bounds how long a relay's Retry-After (a 503 or 429 of a
	// relay that answers) can hold the follower back.
	inboxRetryAfterMax = 60 * time.Second
	// inboundRetain is how long receipts and observations outlive the envelope's
	// deadline (the relay resends until deadline + 24 h).
	inboundRetain = 7 * 24 * time.Hour
	// confirmationDeadline is the delivery deadline of a delivery-status we send.
	confirmationDeadline = 24 * time.Hour
	inboxPageSize        = 100
	// inboxLongPoll is the wait= of the follower's fetches: the relay holds a
	// fetch that finds nothing that long, and answers it as soon as an envelope
	// arrives. inboxFetchTimeout bounds one request (the wait and the page).
	inboxLongPoll     = 25 * time.Second
	inboxFetchTimeout = inboxLongPoll + 30*time.Second
)

// Receipt outcome codes written by the follower.
const (
	outcomeApplied   = "DELIVERY_STATUS_APPLIED" // a delivery-status that confirmed our message
	outcomeRefused   = "DELIVERY_STATUS_REFUSED" // a delivery-status that did not (forged, unknown message)
	outcomeConfirmed = "CONFIRMATION_RELAYED"    // a message whose delivery-status was relayed
	outcomeConfClose = "CONFIRMATION_CLOSED"     // a message whose delivery-status could not be relayed
)

// fact is the one fact the follower records on an observation.
type fact struct {
	EnvelopeID string `json:"envelopeId"`
	ReceivedAt int64  `json:"receivedAt"`
	Body       string `json:"body"` // standard base64 of the opened body
}

// blobFact is the fact of an observation whose body is a blob (Observation.Blob
// says which): it holds no body.
type blobFact struct {
	EnvelopeID string `json:"envelopeId"`
	ReceivedAt int64  `json:"receivedAt"`
}

// pendingReceipt is a receipt that is not terminal yet, with what it takes to finish it.
type pendingReceipt struct {
	envelopeID string
	status     bool   // a delivery-status envelope (else a message)
	state      string // the receipt's stored state
	messageID  string // kind message: the observed message
	digest     string
	sender     identity.DID
	confEnv    string // the envelope id of our delivery-status, once enqueued
}

// follower follows our inbox at Options.InboxRelay (DESIGN §13) and processes what
// arrives: see processEnvelope.
type follower struct {
	d  *Daemon
	rc *relayproto.Client
	// bodies downloads blob bodies (inbound_blob.go): a client without an
	// overall timeout (a body takes as long as it takes; a stalled one is cut
	// by blobStallTimeout); nil: rc.
	bodies *relayproto.Client
	url    string
	kick   chan struct{}
	// noWait: the relay refused wait= (an older relay); fetch without it.
	noWait  bool
	mu      sync.Mutex
	pending map[string]*pendingReceipt // receipt id → pending work
	// downloaded counts the body bytes written to partial files; redownloads the
	// bodies downloaded again from 0 because the complete file did not match.
	downloaded, redownloads atomic.Int64
}

// confirmationID is the (store) message id of the delivery-status we send for the
// inbound envelope envelopeID: derived, so a retry after a crash finds it.
func confirmationID(envelopeID string) string {
	return uuid.FromDomain("sealbridge/confirmation-id/v1", envelopeID)
}

// messageKind says what the message record id is: a confirmation, whose id
// confirmationID derives (a version-8 UUID), or a message the API accepted, whose id
// is random (the operation's id, or a fresh one: version 4). The id says it for as long
// as the record lives, after its envelopes are settled and removed.
func messageKind(id string) string {
	if uuid.Derived(id) {
		return client.KindConfirmation
	}
	return client.KindMessage
}

// kickInbox wakes the inbox follower early (no-op without one).
func (d *Daemon) kickInbox() {
	if f := d.inbound(); f != nil {
		select {
		case f.kick <- struct{}{}:
		default:
		}
	}
}

var followers sync.Map // *Daemon → *follower

func (d *Daemon) inbound() *follower {
	if v, ok := followers.Load(d); ok {
		return v.(*follower)
	}
	return nil
}

// Bounds of Options.DeliveredRetention and ClosedRetention when set.
const (
	minRetention = time.Minute
	maxRetention = 10 * 365 * 24 * time.Hour
)

// checkOptions refuses options the daemon cannot run with: a retention out of its
// bounds, and an InboxRelay that is not an absolute http(s) URL with a host, or that
// carries user information, a query or a fragment.
func checkOptions(o Options) error {
	for _, r := range []struct {
		flag string
		d    time.Duration
	}{{"--delivered-retention", o.DeliveredRetention}, {"--closed-retention", o.ClosedRetention}} {
		if r.d != 0 && (r.d < minRetention || r.d > maxRetention) {
			return &OptionError{Option: r.flag, Err: fmt.Errorf("%v is out of range; give a duration from %v to %v, e.g. 72h",
				r.d, minRetention, maxRetention)}
		}
	}
	if o.InboxRelay == "" {
		return nil
	}
	bad := func(format string, args ...any) error {
		return &OptionError{Option: "--inbox-relay", Err: fmt.Errorf(format, args...)}
	}
	u, err := url.Parse(o.InboxRelay)
	switch {
	case err != nil:
		return bad("not a URL; give the relay's http(s) URL, e.g. http://127.0.0.1:8470")
	case u.User != nil:
		return bad("the URL must not carry user information (credentials)")
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("%q is not an http or https URL", u.Redacted())
	case u.Host == "" || u.Hostname() == "":
		return bad("%q has no host", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(o.InboxRelay, "#"):
		return bad("%q must not have a query or a fragment", u.Redacted())
	}
	return nil
}

// inboxBackoff is the wait after the fails-th consecutive failed fetch:
// inboxBackoffMin doubling to inboxBackoffMax, times a jitter factor in [0.8, 1.2)
// (jitter in [0, 1)), kept within those bounds.
func inboxBackoff(fails int, jitter float64) time.Duration {
	base := inboxBackoffMin
	for i := 1; i < fails && base < inboxBackoffMax; i++ {
		base *= 2
	}
	base = min(base, inboxBackoffMax)
	d := time.Duration(float64(base) * (0.8 + 0.4*jitter))
	return min(max(d, inboxBackoffMin), inboxBackoffMax)
}

// follow runs the inbox follower until ctx is done (nothing without InboxRelay).
// It long-polls (inboxLongPoll; PollEvery while receipts are pending, so they
// are reconciled as often as before): after a page with envelopes it fetches
// again at once, otherwise no sooner than PollEvery after the previous fetch
// started, so a relay that answers a wait at once is not hammered. A relay that
// refuses wait= is polled every PollEvery, and so is one whose held-poll slots
// are full (503 RELAY_BUSY to a fetch with wait=: poll falls back to a plain
// fetch at once). While the relay cannot be fetched from, it backs off
// (inboxBackoff, or the relay's Retry-After if longer, up to inboxRetryAfterMax);
// the first success resets the period.
func (d *Daemon) follow(ctx context.Context) {
	if d.opts.InboxRelay == "" {
		return
	}
	every := d.opts.PollEvery
	if every <= 0 {
		every = defaultPollEvery
	}
	f := &follower{d: d, url: d.opts.InboxRelay, kick: make(chan struct{}, 1), pending: map[string]*pendingReceipt{},
		rc:     &relayproto.Client{BaseURL: d.opts.InboxRelay, HTTP: &http.Client{Timeout: inboxFetchTimeout}},
		bodies: &relayproto.Client{BaseURL: d.opts.InboxRelay, HTTP: bodyHTTPClient()}}
	followers.Store(d, f)
	defer followers.Delete(d)
	for attempt := 0; ; attempt++ {
		err := f.recover(ctx)
		if err == nil {
			d.recovered("inbox recovery", "inbox: receipts recovered")
			break
		}
		if ctx.Err() != nil {
			return
		}
		d.problem("inbox recovery", "inbox: recovering receipts", err)
		if !d.sleep(ctx, time.Duration(min(attempt+1, 10))*time.Second, nil) {
			return
		}
	}
	f.replayStatuses(ctx)
	const key = "inbox fetch"
	wait, fails := time.Duration(0), 0
	for {
		if !d.sleep(ctx, wait, f.kick) {
			return
		}
		lp := time.Duration(0)
		if !f.noWait {
			lp = inboxLongPoll
			if f.hasPending() {
				lp = min(lp, every)
			}
		}
		start := d.now()
		got, stuck, err := f.poll(ctx, lp)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			f.noWait = false // the relay may come back another version
			fails++
			wait = max(every, inboxBackoff(fails, d.jitter()))
			var re *relayproto.Error
			if errors.As(err, &re) && re.RetryAfter > 0 {
				wait = max(wait, min(time.Duration(re.RetryAfter)*time.Second, inboxRetryAfterMax))
			}
			d.cond.warn(key, errClass(err), "inbox: the relay cannot be fetched from; backing off",
				"relay", f.url, "failures", fails, "retry_in", wait.String(), "err", err)
		} else {
			if fails > 0 {
				d.cond.clear(key, "inbox: the relay answers again", "relay", f.url, "failures", fails)
			}
			wait, fails = every, 0
			if lp > 0 && !f.noWait && !stuck {
				if got > 0 {
					wait = 0
				} else {
					wait = max(0, every-d.now().Sub(start))
				}
			}
		}
		f.reconcile(ctx)
	}
}

// now is the daemon's clock.
func (d *Daemon) now() time.Time { return d.clock.Now() }

// sleep waits dur on the daemon's clock, or until kick (if not nil) fires; it
// reports false if ctx ended first.
func (d *Daemon) sleep(ctx context.Context, dur time.Duration, kick <-chan struct{}) bool {
	t := d.clock.NewTimer(dur)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	case <-kick:
		return true
	}
}

// recover loads the receipts that are not terminal (a previous run stopped before
// finishing them) into the pending set.
func (f *follower) recover(ctx context.Context) error {
	st := f.d.st
	byEnv := map[string]*record.Observation{}
	if err := st.Scan(ctx, record.KindObservations, func(r record.Record) error {
		o := r.(*record.Observation)
		for _, raw := range o.Facts {
			var fc fact
			if json.Unmarshal(raw, &fc) == nil && fc.EnvelopeID != "" {
				byEnv[fc.EnvelopeID] = o
			}
		}
		return nil
	}); err != nil {
		return err
	}
	pend := map[string]*pendingReceipt{}
	var confs []string
	if err := st.Scan(ctx, record.KindReceipts, func(r record.Record) error {
		rc := r.(*record.Receipt)
		if rc.State == record.ReceiptTerminal {
			return nil
		}
		p := &pendingReceipt{envelopeID: rc.EnvelopeID, state: rc.State, digest: rc.EnvelopeDigest,
			sender: identity.DID(rc.SenderDID)}
		if rc.OutcomeCode == outcomeApplied || rc.OutcomeCode == outcomeRefused {
			p.status = true
		} else if o := byEnv[rc.EnvelopeID]; o != nil {
			p.messageID = o.MessageID
			confs = append(confs, confirmationID(rc.EnvelopeID))
		} else {
			f.d.log.Warn("inbox: receipt without its observation", "envelope", rc.EnvelopeID)
			return nil
		}
		pend[record.ReceiptID(rc.EnvelopeID)] = p
		return nil
	}); err != nil {
		return err
	}
	if len(confs) > 0 {
		sums, err := st.OutboxSummaries(ctx)
		if err != nil {
			return err
		}
		envOf := map[string]string{}
		for _, s := range sums {
			if s.EnvelopeKind == record.EnvelopeDeliveryStatus {
				envOf[s.MessageID] = s.EnvelopeID
			}
		}
		for _, p := range pend {
			if !p.status {
				p.confEnv = envOf[confirmationID(p.envelopeID)]
			}
		}
	}
	f.mu.Lock()
	f.pending = pend
	f.mu.Unlock()
	if len(pend) > 0 {
		f.d.log.Info("inbox: resuming receipts", "receipts", len(pend))
	}
	return nil
}

// replayStatuses processes, once at start, the delivery statuses the inbox relay
// retained after this store acknowledged them (relayproto.PathInboxStatuses). A store
// restored from an older copy and reconciled learns again from them which of its
// messages were delivered; in any other store each is a duplicate of a receipt it
// holds and changes nothing. A relay without the endpoint, or one that cannot be
// reached, is skipped (logged): the statuses still to come arrive as always.
func (f *follower) replayStatuses(ctx context.Context) {
	after, applied := "", 0
	for {
		page, err := f.rc.InboxStatuses(ctx, f.d.id, 0, after)
		if err != nil {
			f.d.log.Info("inbox: the relay's retained delivery statuses were not replayed", "relay", f.url, "err", err)
			return
		}
		for _, ie := range page.Envelopes {
			env, err := envelope.Parse(ie.Envelope)
			if err != nil || env.Kind() != envelope.KindDeliveryStatus {
				continue
			}
			p, _, err := f.process(ctx, ie, true)
			if err != nil {
				f.d.log.Warn("inbox: replaying a retained delivery status", "envelope", ie.EnvelopeID, "err", err)
				continue
			}
			if p != nil {
				applied++
				f.advance(ctx, p, true)
			}
		}
		if !page.More || page.Cursor == "" || page.Cursor == after {
			break
		}
		after = page.Cursor
	}
	if applied > 0 {
		f.d.log.Info("inbox: retained delivery statuses replayed", "applied", applied)
	}
}

// hasPending reports receipts waiting to be advanced.
func (f *follower) hasPending() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending) > 0
}

// poll fetches the inbox from the start (acknowledged envelopes leave it) and
// processes every envelope; the first fetch waits up to wait (long poll) for
// one to arrive. A relay that cannot hold it (503 RELAY_BUSY: its held-poll
// slots are full) is fetched from again at once without wait=, which is no
// failure. It reports how many envelopes it saw and whether one of them
// was left unacknowledged (it failed and will be fetched again).
func (f *follower) poll(ctx context.Context, wait time.Duration) (got int, stuck bool, err error) {
	after := ""
	for {
		page, err := f.rc.FetchWait(ctx, f.d.id, after, inboxPageSize, wait)
		var re *relayproto.Error
		if wait > 0 && errors.As(err, &re) && re.Status == http.StatusBadRequest && re.Code == relayproto.CodeBadRequest {
			f.noWait = true
			f.d.log.Info("inbox: the relay does not hold fetches (wait=); polling it", "relay", f.url)
			page, err = f.rc.Fetch(ctx, f.d.id, after, inboxPageSize)
		} else if wait > 0 && errors.As(err, &re) && re.Status == http.StatusServiceUnavailable && re.Code == relayproto.CodeRelayBusy {
			f.d.log.Debug("inbox: the relay holds no more fetches; fetching without wait=", "relay", f.url)
			page, err = f.rc.Fetch(ctx, f.d.id, after, inboxPageSize)
		}
		wait = 0
		if err != nil {
			return got, stuck, err
		}
		got += len(page.Envelopes)
		var acks []string
		var done []*pendingReceipt
		for _, ie := range page.Envelopes {
			p, ack, err := f.processEnvelope(ctx, ie)
			if err != nil {
				if ctx.Err() != nil {
					return got, stuck, err
				}
				stuck = true
				f.d.m.storeError(err)
				if writeFailure(err) {
					f.d.writeFailed(err) // one condition for every writer
					continue
				}
				f.d.cond.warn("inbox envelope "+ie.EnvelopeID, errClass(err), "inbox: processing an envelope",
					"envelope", ie.EnvelopeID, "err", err)
				continue // not acknowledged: fetched again next time
			}
			f.d.cond.clear("inbox envelope "+ie.EnvelopeID, "inbox: envelope processed", "envelope", ie.EnvelopeID)
			if ack {
				acks = append(acks, ie.EnvelopeID)
			}
			if p != nil {
				done = append(done, p)
			}
		}
		if len(acks) > 0 {
			// Acknowledge only what is durable (or refused for good).
			if _, err := f.rc.Ack(ctx, f.d.id, acks); err != nil {
				return got, stuck, fmt.Errorf("acknowledging: %w", err)
			}
		}
		for _, p := range done {
			f.advance(ctx, p, true)
		}
		if !page.More || page.Cursor == "" || page.Cursor == after {
			return got, stuck, nil
		}
		after = page.Cursor
	}
}

// processEnvelope verifies one inbox envelope and durably records it. It returns
// the pending receipt to advance once acknowledged (nil if none) and whether to
// acknowledge the envelope at the relay. An error means: leave it at the relay.
func (f *follower) processEnvelope(ctx context.Context, ie relayproto.InboxEnvelope) (*pendingReceipt, bool, error) {
	return f.process(ctx, ie, false)
}

// process is processEnvelope; replayed says ie is a delivery status the relay
// retained after it was acknowledged (replayStatuses), whose deadline no longer
// matters: it confirms a delivery that happened.
func (f *follower) process(ctx context.Context, ie relayproto.InboxEnvelope, replayed bool) (*pendingReceipt, bool, error) {
	d := f.d
	env, err := envelope.Parse(ie.Envelope)
	if err == nil {
		err = env.CheckRecipient(d.id.DID())
	}
	if err == nil && !replayed {
		err = env.CheckDeadline(time.Now())
	}
	if err != nil {
		return f.refuse(ctx, ie, env, refusalReason(err), err)
	}
	rid := record.ReceiptID(env.ID())
	prev, err := store.GetAs[*record.Receipt](d.st, rid)
	if err != nil {
		return nil, false, err
	}
	if prev != nil {
		return f.duplicate(ctx, ie, env, prev)
	}
	now := time.Now().UnixMilli()
	retain := env.DeliveryDeadlineMillis() + inboundRetain.Milliseconds()
	rc := &record.Receipt{EnvelopeID: env.ID(), SenderDID: string(env.Sender()), EnvelopeDigest: env.Digest(),
		State: record.ReceiptPersisted, ReceivedAt: now, RetainUntil: retain}
	p := &pendingReceipt{envelopeID: env.ID(), state: record.ReceiptPersisted, digest: env.Digest(), sender: env.Sender()}
	switch env.Kind() {
	case envelope.KindMessage:
		obs := &record.Observation{MessageID: env.MessageID(), SenderDID: string(env.Sender()), EnvelopeDigest: env.Digest(),
			CreatedAt: env.CreatedAtMillis(), DeliveryDeadline: env.DeliveryDeadlineMillis(),
			Published: []string{}, RetainUntil: retain}
		if ref, ok := env.Blob(); ok {
			// One download of a body at a time in this store; whoever waited for it
			// may find the envelope recorded by the one before.
			unlock := lockBlob(d.st, ref.EnvelopeID)
			defer unlock()
			if prev, err := store.GetAs[*record.Receipt](d.st, rid); err != nil {
				return nil, false, err
			} else if prev != nil {
				return f.duplicate(ctx, ie, env, prev)
			}
			// Its message id observed already: refused below, without a download.
			if o, err := store.GetAs[*record.Observation](d.st, obs.MessageID); err != nil {
				return nil, false, err
			} else if o != nil {
				return f.refuse(ctx, ie, env, record.RefusedObserved, errors.New("message id already observed from another envelope"),
					"message", env.MessageID())
			}
			plain, err := f.receiveBlob(ctx, ref)
			var br *blobRefusal
			if errors.As(err, &br) {
				return f.refuse(ctx, ie, env, br.reason, br.err, "code", errcode.Of(br.err))
			}
			if err != nil {
				return nil, false, err
			}
			// The blob is durable and verified: now the records that refer to it.
			fc, _ := json.Marshal(blobFact{EnvelopeID: env.ID(), ReceivedAt: now})
			obs.Facts = []json.RawMessage{fc}
			obs.Blob = &record.ObservedBlob{EnvelopeID: ref.EnvelopeID, Digest: ref.Digest, Size: ref.Size, BodySize: plain}
		} else {
			body, err := envelope.Open(d.id, env)
			if err != nil {
				return f.refuse(ctx, ie, env, record.RefusedBody, err)
			}
			fc, _ := json.Marshal(fact{EnvelopeID: env.ID(), ReceivedAt: now, Body: base64.StdEncoding.EncodeToString(body)})
			obs.Facts = []json.RawMessage{fc}
		}
		p.messageID = env.MessageID()
		conflictObs := false
		err = d.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
			conflictObs = false
			if r, err := store.TxGet[*record.Receipt](tx, rid); err != nil || r != nil {
				if err == nil {
					err = errors.New("receipt written concurrently")
				}
				return err
			}
			o, err := store.TxGet[*record.Observation](tx, obs.MessageID)
			if err != nil {
				return err
			}
			if o != nil {
				conflictObs = true
				return nil
			}
			return tx.PutAll(rc, obs)
		})
		if err != nil {
			return nil, false, err
		}
		if conflictObs {
			return f.refuse(ctx, ie, env, record.RefusedObserved, errors.New("message id already observed from another envelope"),
				"message", env.MessageID())
		}
		d.log.Debug("inbox: observed a message", "message", env.MessageID(), "sender", env.Sender())
	case envelope.KindDeliveryStatus:
		p.status = true
		c, _ := env.Confirmation()
		applied := false
		err = d.st.PreparedTransaction(ctx, func(tx *store.Tx) error {
			applied = false
			if r, err := store.TxGet[*record.Receipt](tx, rid); err != nil || r != nil {
				if err == nil {
					err = errors.New("receipt written concurrently")
				}
				return err
			}
			m, err := store.TxGet[*record.Message](tx, c.MessageID)
			if err != nil {
				return err
			}
			rc.OutcomeCode = outcomeRefused
			if m != nil && env.ConfirmsDelivery(d.id.DID(), identity.DID(m.PeerOwnerDID), m.MessageID, m.EnvelopeDigest) == nil {
				rc.OutcomeCode, applied = outcomeApplied, true
				if m.Status == record.StatusQueued || m.Status == record.StatusRelayed {
					tx.EndMessage(m, record.StatusDelivered, "", "", now)
					if err := tx.Put(m); err != nil {
						return err
					}
				}
			}
			return tx.Put(rc)
		})
		if err != nil {
			return nil, false, err
		}
		if applied {
			d.log.Debug("inbox: message delivered", "message", c.MessageID)
		} else {
			var why error = errors.New("no such message")
			if m, _ := d.st.Message(c.MessageID); m != nil {
				why = env.ConfirmsDelivery(d.id.DID(), identity.DID(m.PeerOwnerDID), m.MessageID, m.EnvelopeDigest)
			}
			d.log.Warn("inbox: refused a delivery status", "envelope", env.ID(), "message", c.MessageID,
				"sender", env.Sender(), "err", why)
		}
	default:
		return f.refuse(ctx, ie, env, record.RefusedKind, fmt.Errorf("unknown kind %q", env.Kind()))
	}
	f.mu.Lock()
	f.pending[rid] = p
	f.mu.Unlock()
	return p, true, nil
}

// duplicate answers an envelope we already hold a receipt for.
func (f *follower) duplicate(ctx context.Context, ie relayproto.InboxEnvelope, env *envelope.Envelope, prev *record.Receipt) (*pendingReceipt, bool, error) {
	if prev.EnvelopeDigest != env.Digest() {
		return f.refuse(ctx, ie, env, record.RefusedConflict, errors.New("same envelope id, other digest"),
			"stored", prev.EnvelopeDigest)
	}
	f.d.log.Debug("inbox: duplicate envelope", "envelope", env.ID())
	f.mu.Lock()
	p := f.pending[record.ReceiptID(env.ID())]
	f.mu.Unlock()
	return p, true, nil
}

// advance moves p forward as far as it can now. acked says the envelope is
// acknowledged at the relay.
func (f *follower) advance(ctx context.Context, p *pendingReceipt, acked bool) {
	d := f.d
	rid := record.ReceiptID(p.envelopeID)
	if p.state == record.ReceiptPersisted {
		if !acked {
			if _, err := f.rc.Ack(ctx, f.d.id, []string{p.envelopeID}); err != nil {
				f.stuck(p, "inbox: acknowledging", err, "envelope", p.envelopeID)
				return
			}
		}
		next := record.ReceiptProcessed
		outcome := ""
		if p.status {
			next = record.ReceiptTerminal
		}
		if err := f.raise(ctx, rid, next, outcome); err != nil {
			f.stuck(p, "inbox: raising a receipt", err, "envelope", p.envelopeID)
			return
		}
		p.state = next
	}
	if p.state == record.ReceiptProcessed && !p.status {
		outcome, err := f.confirmation(ctx, p)
		if err != nil {
			d.m.storeError(err)
			f.stuck(p, "inbox: sending the delivery status", err, "envelope", p.envelopeID)
			return
		}
		if outcome == "" {
			return
		}
		if err := f.raise(ctx, rid, record.ReceiptTerminal, outcome); err != nil {
			f.stuck(p, "inbox: raising a receipt", err, "envelope", p.envelopeID)
			return
		}
		p.state = record.ReceiptTerminal
	}
	if p.state == record.ReceiptTerminal {
		f.mu.Lock()
		delete(f.pending, rid)
		f.mu.Unlock()
		d.cond.clear("inbox receipt "+p.envelopeID, "inbox: receipt finished", "envelope", p.envelopeID)
	}
}

// stuck logs, as a condition of p's receipt, that advancing it failed: reconcile
// retries it at every poll.
func (f *follower) stuck(p *pendingReceipt, msg string, err error, attrs ...any) {
	if writeFailure(err) {
		f.d.writeFailed(err)
		return
	}
	f.d.cond.warn("inbox receipt "+p.envelopeID, errClass(err), msg, append(attrs, "err", err)...)
}

// raise moves receipt rid up to state (never down), setting outcome if given.
func (f *follower) raise(ctx context.Context, rid, state, outcome string) error {
	return f.d.st.Update(ctx, record.KindReceipts, rid, func(cur record.Record) (record.Record, error) {
		r, _ := cur.(*record.Receipt)
		if r == nil {
			return nil, fmt.Errorf("receipt %s is missing", rid)
		}
		rank := map[string]int{record.ReceiptPersisted: 0, record.ReceiptProcessed: 1, record.ReceiptTerminal: 2}
		if rank[r.State] >= rank[state] {
			return nil, nil
		}
		r.State = state
		if outcome != "" {
			r.OutcomeCode = outcome
		}
		return r, nil
	})
}

// confirmation reports how the delivery-status owed for p's message ended:
// outcomeConfirmed once it is relayed, outcomeConfClose once it is closed, "" while it
// is pending or was only now enqueued. The carrier moves the confirmation's message
// record with its one envelope (record.Speaks), and the record outlives the envelope,
// which maintenance removes once settled: so the envelope tells while it is there,
// and the message record after it is gone (also after a restart, which knows no
// envelope id). Only when neither exists is the confirmation enqueued: it was never
// accepted (or it ended so long ago that its message's retention ran out, and the
// sender gets a second, identical confirmation, which changes nothing there).
func (f *follower) confirmation(ctx context.Context, p *pendingReceipt) (string, error) {
	st := f.d.st
	if p.confEnv != "" {
		o, err := store.GetAs[*record.Outbox](st, p.confEnv)
		if err != nil {
			return "", err
		}
		if o != nil {
			return confirmationOutcome(o.State), nil
		}
	}
	cid := confirmationID(p.envelopeID)
	m, err := store.GetAs[*record.Message](st, cid)
	if err != nil {
		return "", err
	}
	switch {
	case m == nil && p.confEnv != "":
		// Seen and gone with its message record: it was settled.
		return outcomeConfirmed, nil
	case m == nil:
		return "", f.confirm(ctx, p)
	case m.Status != record.StatusQueued:
		return confirmationOutcome(m.Status), nil
	}
	// Queued: its envelope says when it settles.
	if p.confEnv == "" {
		sums, err := st.OutboxSummaries(ctx)
		if err != nil {
			return "", err
		}
		for _, s := range sums {
			if s.MessageID == cid {
				p.confEnv = s.EnvelopeID
				return confirmationOutcome(s.State), nil
			}
		}
	}
	// A queued message record whose envelope is gone: written before the carrier moved
	// a confirmation's message (it never did), its envelope settled and removed by
	// maintenance (a message record exists only once its envelope is durable).
	return outcomeConfirmed, nil
}

// confirmationOutcome is the receipt's outcome for a confirmation whose envelope (or
// message record) is in state: "" while it is pending (or queued).
func confirmationOutcome(state string) string {
	switch state {
	case record.StateRelayed, record.StatusDelivered: // relayed is both an outbox state and a message status
		return outcomeConfirmed
	case record.StateClosed:
		return outcomeConfClose
	}
	return ""
}

// confirm enqueues (once) the signed delivery-status for p's message envelope.
func (f *follower) confirm(ctx context.Context, p *pendingReceipt) error {
	d := f.d
	cid := confirmationID(p.envelopeID)
	m, resumed, err := d.st.ResumeEnqueue(ctx, cid)
	if err != nil {
		return err
	}
	if !resumed || m == nil {
		now := time.Now()
		deadline := now.Add(confirmationDeadline)
		env, wire, err := envelope.NewDeliveryStatus(d.id, p.sender,
			envelope.Confirmation{MessageID: p.messageID, EnvelopeDigest: p.digest, Status: envelope.StatusDelivered},
			deadline, now)
		if err != nil {
			return err
		}
		if _, err := d.st.Enqueue(ctx, store.SendRequest{MessageID: cid, PeerOwnerDID: p.sender, RelayURL: f.url,
			DeliveryDeadline: deadline, Envelopes: []store.OutgoingEnvelope{
				{EnvelopeID: env.ID(), Kind: record.EnvelopeDeliveryStatus, Envelope: wire}}}); err != nil {
			return err
		}
	}
	d.car.Kick()
	// Find the envelope id (also for a resumed enqueue).
	sums, err := d.st.OutboxSummaries(ctx)
	if err != nil {
		return err
	}
	for _, s := range sums {
		if s.MessageID == cid {
			p.confEnv = s.EnvelopeID
			return nil
		}
	}
	return fmt.Errorf("delivery status %s not found in the outbox", cid)
}

// reconcile advances every pending receipt (a relayed delivery-status makes its
// receipt terminal; work a crash interrupted is redone).
func (f *follower) reconcile(ctx context.Context) {
	f.mu.Lock()
	ps := make([]*pendingReceipt, 0, len(f.pending))
	for _, p := range f.pending {
		ps = append(ps, p)
	}
	f.mu.Unlock()
	for _, p := range ps {
		if ctx.Err() != nil {
			return
		}
		f.advance(ctx, p, false)
	}
}
