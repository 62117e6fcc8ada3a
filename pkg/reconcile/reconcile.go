// Package reconcile brings a store forward to what its relays know of it
// (docs/FSCK.md "Reconcile"; DESIGN §5 "The head"): after a store was restored
// from a copy it may hold envelopes as pending that a relay accepted since (the
// copy was made before their receipts), and its head is behind the heads its
// owner signed since. Run asks every relay the store names what it holds of the
// store's pending envelopes, settles those a relay holds as relayed — with the
// carrier's own rule for an accepted attempt (carrier.SettleAccepted) — and
// writes a head above every head a relay witnessed, which ends the store's
// rolled-back state (store.Store.Reconcile). It never posts an envelope: the
// ones no relay knows stay pending, and the carrier sends them (the relay never
// had them).
//
// Run works on a store that is not rolled back too: then it only brings
// envelopes forward and writes a head.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// DefaultTimeout bounds one request to a relay.
const DefaultTimeout = 60 * time.Second

// Options configure Run. The zero value is usable.
type Options struct {
	// Relays are relay URLs to ask besides those the outbox records name (any
	// state): e.g. a relay the store's copy never used but a later message did.
	Relays []string
	// HTTP is the client for the relays (default: a private client that uses no
	// proxy and follows no redirect); Timeout bounds each request (DefaultTimeout).
	HTTP    *http.Client
	Timeout time.Duration
	// Now is the clock of the settlements (default time.Now).
	Now func() time.Time
}

// RelayReport is what one relay answered.
type RelayReport struct {
	URL string `json:"url"`
	// WitnessedSeq is the seq of the highest head of the store's owner the relay
	// witnessed (0: it holds none).
	WitnessedSeq int64 `json:"witnessedSeq"`
	// Asked is how many of the store's pending envelopes for this relay were
	// asked about; BroughtForward those the relay holds (held or acked), settled
	// as relayed; LeftPending those it does not know, left pending.
	Asked          int `json:"asked"`
	BroughtForward int `json:"broughtForward"`
	LeftPending    int `json:"leftPending"`
}

// Report is what Run did.
type Report struct {
	// RolledBack is the store's rolled-back state before Run, as its error text
	// ("" when it was not rolled back).
	RolledBack string        `json:"rolledBack,omitempty"`
	Relays     []RelayReport `json:"relays"`
	// BroughtForward and LeftPending sum the relays'.
	BroughtForward int `json:"broughtForward"`
	LeftPending    int `json:"leftPending"`
	// Head is the head Run wrote (its seq is above every head a relay
	// witnessed); HeadSeq is its seq.
	Head    *envelope.StoreHead `json:"-"`
	HeadSeq int64               `json:"headSeq"`
}

// answer is one envelope a relay holds, with its verified receipt.
type answer struct {
	id      string
	relay   int // index into Report.Relays
	receipt *envelope.RelayReceipt
}

// Run reconciles s, whose owner is id, with its relays: (1) the relays are the
// RelayURL of every outbox record, in any state, and opts.Relays, in canonical
// form; (2) each is asked, signed by id, for the head it witnessed
// (relayproto.Client.SenderHead) and for what it holds of every pending
// (leased or not) envelope of the store for it (SenderReceipts, in requests of
// at most relayproto.MaxAckIDs ids); (3) in store.Store.Reconcile, with the
// highest witnessed seq, every envelope a relay holds (held or acked) that is
// still pending is settled as relayed with carrier.SettleAccepted, and the store
// writes a head above all it knows and leaves the rolled-back state.
//
// All relays are asked before anything is written: a relay that cannot be asked
// (unreachable, refusing, an answer that does not verify) fails Run, with a hint,
// and nothing is written — partial knowledge is not the truth. Likewise a
// receipt that is not for the store's envelope (its digest) fails Run before any
// write. A crash inside the store's Reconcile leaves some envelopes settled and
// no head written: the store stays rolled back, and Run again completes it.
//
// Run never posts an envelope. The caller must hold the store alone (no daemon):
// sealbridge-fsck --reconcile refuses while the daemon runs.
func Run(ctx context.Context, s *store.Store, id *identity.Identity, opts Options) (Report, error) {
	var rep Report
	if s == nil || id == nil {
		return rep, errors.New("reconcile: a store and its owner's identity are needed")
	}
	if err := s.RolledBack(); err != nil {
		rep.RolledBack = err.Error()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.HTTP == nil {
		opts.HTTP = newHTTPClient()
	}
	sums, err := s.OutboxSummaries(ctx)
	if err != nil {
		return rep, err
	}
	urls, pending, err := relaysOf(sums, opts.Relays)
	if err != nil {
		return rep, err
	}
	var maxSeq int64
	var held []answer
	for i, u := range urls {
		rr := RelayReport{URL: u, Asked: len(pending[u])}
		seq, got, err := ask(ctx, opts, id, u, pending[u])
		if err != nil {
			return Report{RolledBack: rep.RolledBack}, errcode.WithHint(fmt.Errorf("reconcile: relay %s: %w", u, err),
				"nothing was written: every relay the store names must answer, or what they hold would be mistaken for all there is; make "+
					u+" reachable and run again")
		}
		rr.WitnessedSeq = seq
		maxSeq = max(maxSeq, seq)
		for _, a := range got {
			a.relay = i
			held = append(held, a)
		}
		rep.Relays = append(rep.Relays, rr)
	}
	now := opts.Now().UnixMilli()
	settled := make([]bool, len(held))
	err = s.Reconcile(ctx, maxSeq, func(tx *store.Tx) error {
		// Read and verify everything before the first write: an error returned
		// after a write would leave that write (a transaction's writes are durable
		// as they are made).
		recs := make([]*record.Outbox, len(held))
		for k, a := range held {
			o, err := store.TxGet[*record.Outbox](tx, a.id)
			if err != nil {
				return err
			}
			if o == nil || o.State != record.StatePending {
				continue // settled meanwhile (an earlier run cut short)
			}
			if !a.receipt.Matches(o.EnvelopeID, o.EnvelopeDigest) {
				return fmt.Errorf("reconcile: relay %s answered a receipt for envelope %s that is not for the store's envelope (another digest); nothing was written",
					urls[a.relay], a.id)
			}
			recs[k] = o
		}
		clear(settled)
		for k, o := range recs {
			if o == nil {
				continue
			}
			if err := carrier.SettleAccepted(tx, o, held[k].receipt, now); err != nil {
				return err
			}
			settled[k] = true
		}
		return nil
	})
	if err != nil {
		return Report{RolledBack: rep.RolledBack}, err
	}
	for k, a := range held {
		if settled[k] {
			rep.Relays[a.relay].BroughtForward++
		}
	}
	for i := range rep.Relays {
		r := &rep.Relays[i]
		r.LeftPending = r.Asked - r.BroughtForward
		rep.BroughtForward += r.BroughtForward
		rep.LeftPending += r.LeftPending
	}
	rep.Head, _ = s.Head()
	if rep.Head != nil {
		rep.HeadSeq = rep.Head.Seq
	}
	return rep, nil
}

// relaysOf returns the relays to ask, sorted, with the pending envelopes of each.
func relaysOf(sums []store.OutboxSummary, extra []string) ([]string, map[string][]string, error) {
	pending := map[string][]string{}
	for i := range sums {
		e := &sums[i]
		u, err := relayproto.CanonicalRelayURL(e.RelayURL)
		if err != nil {
			u = e.RelayURL // the store's own form; the request says what is wrong with it
		}
		if _, ok := pending[u]; !ok {
			pending[u] = nil
		}
		if e.State == record.StatePending {
			pending[u] = append(pending[u], e.EnvelopeID)
		}
	}
	for _, raw := range extra {
		u, err := relayproto.CanonicalRelayURL(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("reconcile: relay %q: %w", raw, err)
		}
		if _, ok := pending[u]; !ok {
			pending[u] = nil
		}
	}
	urls := make([]string, 0, len(pending))
	for u := range pending {
		urls = append(urls, u)
	}
	slices.Sort(urls)
	return urls, pending, nil
}

// ask asks relay u for the head it witnessed from id (its seq, 0 if none) and for
// what it holds of ids; it returns the held and acked ones.
func ask(ctx context.Context, opts Options, id *identity.Identity, u string, ids []string) (int64, []answer, error) {
	c := &relayproto.Client{BaseURL: u, HTTP: opts.HTTP}
	var seq int64
	err := within(ctx, opts.Timeout, func(ctx context.Context) error {
		b, err := c.SenderHead(ctx, id)
		if err != nil || b == nil {
			return err
		}
		h, err := envelope.ParseStoreHead(b)
		if err != nil {
			return fmt.Errorf("its head: %w", err)
		}
		seq = h.Seq
		return nil
	})
	if err != nil {
		return 0, nil, fmt.Errorf("asking for the head it witnessed: %w", err)
	}
	var out []answer
	for chunk := range slices.Chunk(ids, relayproto.MaxAckIDs) {
		var rs []relayproto.SenderReceipt
		err := within(ctx, opts.Timeout, func(ctx context.Context) error {
			var err error
			rs, err = c.SenderReceipts(ctx, id, chunk)
			return err
		})
		if err != nil {
			return 0, nil, fmt.Errorf("asking what it holds of %d envelopes: %w", len(chunk), err)
		}
		for _, r := range rs {
			if r.State == relayproto.SenderReceiptHeld || r.State == relayproto.SenderReceiptAcked {
				out = append(out, answer{id: r.EnvelopeID, receipt: r.Parsed})
			}
		}
	}
	return seq, out, nil
}

func within(ctx context.Context, d time.Duration, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return fn(ctx)
}

// newHTTPClient is the default client: relays are addressed directly (no proxy)
// and never redirect.
func newHTTPClient() *http.Client {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   30 * time.Second,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: DefaultTimeout,
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
}
