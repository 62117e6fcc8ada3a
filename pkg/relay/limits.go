package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Limits are what an operator bounds on a relay (docs/RELAY.md "Limits"). The
// zero value bounds nothing but a blob body's size (MaxBody: 4 GiB) and the
// held polls per address. They are checked where an envelope is accepted
// (Accept, AcceptBatch), for new envelopes only: a duplicate of an envelope
// the relay already holds is answered with its receipt whatever the limits.
type Limits struct {
	// QuotaEnvelopes and QuotaBytes bound the envelopes and envelope bytes
	// waiting in one recipient's inbox (0: no bound). Past them a new envelope
	// is refused with 429 RELAY_QUOTA and Retry-After (QuotaRetryAfter).
	QuotaEnvelopes int
	QuotaBytes     int64
	// SenderRate is how many new envelopes per second the relay accepts from
	// one sender (the envelope's signed sender DID), SenderBurst how many at
	// once (a token bucket; 0 rate: no bound; burst default max(1, rate)).
	// Past them: 429 RELAY_RATE_LIMITED with Retry-After (when a token is due).
	SenderRate  float64
	SenderBurst int
	// AllowList, if set, accepts envelopes only for recipients registered with
	// POST /v1/recipients/register; others get 403 RECIPIENT_NOT_ALLOWED.
	AllowList bool
	// ExpireEvery is the period of the maintenance pass that removes inbox
	// envelopes past their delivery deadline (0: no pass; an expired envelope
	// is never served either way).
	ExpireEvery time.Duration
	// HeldPollsPerAddress bounds the inbox fetches held at once (GET
	// /v1/inbox with wait=) from one client address — an IPv4 address or an
	// IPv6 /64, as the connection shows it (no forwarding header is
	// trusted) —, so that one client, whatever identities it makes, cannot
	// take every held-fetch place; past it a waiting fetch gets 503
	// RELAY_BUSY. The one limit with a bound by default: 0 is
	// DefaultHeldPollsPerAddress. Behind a reverse proxy every fetch comes
	// from the proxy's address: raise it to Options.MaxInboxWaiters.
	HeldPollsPerAddress int
	// MaxBody bounds the sealed size of a blob body the relay keeps (a larger
	// one: 413 BODY_TOO_LARGE when its envelope is posted); 0 is
	// DefaultMaxBody (4 GiB).
	MaxBody int64
	// SenderByteRate is how many bytes per second — envelopes and their
	// bodies — the relay accepts from one sender, SenderByteBurst how many at
	// once (default max(rate, envelope.MaxSize)); 0 rate: no bound. A new
	// envelope is admitted when its sender's bucket holds its bytes or the
	// whole burst, and takes all its bytes (the bucket may go below zero: a
	// body larger than the burst is admitted, and the sender waits after it).
	// Past them: 429 RELAY_RATE_LIMITED with Retry-After.
	SenderByteRate  float64
	SenderByteBurst int64
}

// QuotaRetryAfter is the Retry-After, in seconds, of a RELAY_QUOTA refusal:
// an inbox drains when its recipient fetches, which the relay cannot predict.
const QuotaRetryAfter = 60

// Check reports the first nonsensical limit.
func (l Limits) Check() error {
	switch {
	case l.QuotaEnvelopes < 0:
		return errors.New("the envelope quota must be 0 (none) or more")
	case l.QuotaBytes < 0:
		return errors.New("the byte quota must be 0 (none) or more")
	case l.QuotaBytes > 0 && l.QuotaBytes < envelope.MaxSize:
		return fmt.Errorf("a byte quota below the envelope size limit (%d) would refuse envelopes an empty inbox must take", envelope.MaxSize)
	case l.SenderRate < 0 || math.IsNaN(l.SenderRate) || math.IsInf(l.SenderRate, 0):
		return errors.New("the sender rate must be 0 (none) or a positive number of envelopes per second")
	case l.SenderBurst < 0:
		return errors.New("the sender burst must be 0 (default) or more")
	case l.SenderBurst > 0 && l.SenderRate == 0:
		return errors.New("a sender burst needs a sender rate")
	case l.ExpireEvery < 0:
		return errors.New("the expiry period must be 0 (no pass) or more")
	case l.MaxBody < 0 || l.MaxBody > envelope.MaxBlobSize:
		return fmt.Errorf("the body size limit must be 0 (the default, %d) to %d bytes", DefaultMaxBody, envelope.MaxBlobSize)
	case l.SenderByteRate < 0 || math.IsNaN(l.SenderByteRate) || math.IsInf(l.SenderByteRate, 0):
		return errors.New("the sender byte rate must be 0 (none) or a positive number of bytes per second")
	case l.SenderByteBurst < 0:
		return errors.New("the sender byte burst must be 0 (default) or more")
	case l.SenderByteBurst > 0 && l.SenderByteRate == 0:
		return errors.New("a sender byte burst needs a sender byte rate")
	case l.HeldPollsPerAddress < 0:
		return errors.New("the held polls per address must be 0 (the default) or more")
	}
	return nil
}

// Bounds of the limits' own bookkeeping.
const (
	// maxSenders bounds the rate limiter's buckets; past it (after dropping the
	// full ones) new senders get 503 RELAY_BUSY.
	maxSenders = 1 << 20
	// expireChunk bounds the envelopes one step of the expiry pass removes (one
	// inbox directory fsync, one store transaction).
	expireChunk = 256
	// registryDir holds the allow-list, one file per registered recipient,
	// named by the recipient's inbox directory name and holding its DID. It
	// lives in the inbox directory, whose inbox subdirectories are 64 hex
	// digits (load skips anything else).
	registryDir = "recipients"
)

// usage is what waits in one inbox, or is reserved there by accepts in flight.
type usage struct {
	n     int
	bytes int64
}

// reservation is an accept's claim on its recipient's quota, from the check
// until the accept ended (released): the envelope is then in the inbox, which
// usage counts, or the accept failed.
type reservation struct {
	rdir     string
	bytes    int64
	released bool
}

// admit checks the limits for a new envelope of size bytes: allow-list, quota
// (reserving its place), then the sender's rate. The reservation is released
// when the accept ends, after its envelope entered the inbox: in between it
// is counted twice, so concurrent accepts can be refused early but never
// overshoot (on JetStream: in this process; other processes' accepts in
// flight are not seen).
func (r *Relay) admit(ctx context.Context, env *envelope.Envelope, size int64) (*reservation, *relayproto.Error) {
	rdir := recipientDir(env.Recipient())
	if r.limits.AllowList {
		ok, err := r.back.registered(ctx, env.Recipient())
		if err != nil {
			return nil, asError(err)
		}
		if !ok {
			r.count(func(s *Stats) { s.NotAllowed++ })
			return nil, newError(http.StatusForbidden, relayproto.CodeRecipientNotAllowed,
				"this relay keeps envelopes only for registered recipients, and %s is not one", env.Recipient())
		}
	}
	var res *reservation
	if q := r.limits; q.QuotaEnvelopes > 0 || q.QuotaBytes > 0 {
		qmu := &r.quotaStripes[stripe(rdir)]
		qmu.Lock()
		u, err := r.back.usage(ctx, env.Recipient())
		if err != nil {
			qmu.Unlock()
			return nil, asError(err)
		}
		bodies := r.pendingUsage(rdir) // pending blob envelopes claim their place too
		u.n, u.bytes = u.n+bodies.n, u.bytes+bodies.bytes
		r.mu.Lock()
		pend := r.reserved[rdir]
		n, b := u.n+pend.n+1, u.bytes+pend.bytes+size
		if (q.QuotaEnvelopes > 0 && n > q.QuotaEnvelopes) || (q.QuotaBytes > 0 && b > q.QuotaBytes) {
			r.stats.OverQuota++
			r.mu.Unlock()
			qmu.Unlock()
			return nil, &relayproto.Error{Status: http.StatusTooManyRequests, Code: relayproto.CodeRelayQuota,
				Message:    fmt.Sprintf("the inbox of %s is full (%d envelopes, %d bytes waiting)", env.Recipient(), u.n+pend.n, u.bytes+pend.bytes),
				RetryAfter: QuotaRetryAfter}
		}
		res = &reservation{rdir: rdir, bytes: size}
		r.reserved[rdir] = usage{pend.n + 1, pend.bytes + res.bytes}
		r.mu.Unlock()
		qmu.Unlock()
	}
	if e := r.rate.take(string(env.Sender()), r.now()); e != nil {
		r.release(res)
		r.count(func(s *Stats) { s.RateLimited++ })
		return nil, e
	}
	if e := r.byteRate.takeN(string(env.Sender()), float64(size), r.now()); e != nil {
		r.rate.refund(string(env.Sender()), r.now())
		r.release(res)
		r.count(func(s *Stats) { s.RateLimited++ })
		return nil, e
	}
	return res, nil
}

// release ends res (nil: no quota; released already: nothing). It takes the
// recipient's quota stripe, so an admit that read the inbox's usage before
// this accept's envelope entered it still sees the reservation.
func (r *Relay) release(res *reservation) {
	if res == nil || res.released {
		return
	}
	res.released = true
	qmu := &r.quotaStripes[stripe(res.rdir)]
	qmu.Lock()
	r.mu.Lock()
	u := r.reserved[res.rdir]
	u.n--
	u.bytes -= res.bytes
	if u.n <= 0 {
		delete(r.reserved, res.rdir)
	} else {
		r.reserved[res.rdir] = u
	}
	r.mu.Unlock()
	qmu.Unlock()
}

// senderRate is a token bucket per sender DID. A bucket that has refilled is
// the same as none, so full ones are dropped to bound the map. It counts
// envelopes (newSenderRate) or bytes (newByteRate).
type senderRate struct {
	rate  float64 // tokens per second; 0: no limit
	burst float64
	unit  string // "envelopes" or "bytes", for the refusal
	mu    sync.Mutex
	b     map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newSenderRate(l Limits) *senderRate {
	burst := float64(l.SenderBurst)
	if burst == 0 {
		burst = max(1, math.Floor(l.SenderRate))
	}
	return &senderRate{rate: l.SenderRate, burst: burst, unit: "envelopes", b: map[string]*bucket{}}
}

func newByteRate(l Limits) *senderRate {
	burst := float64(l.SenderByteBurst)
	if burst == 0 {
		burst = max(l.SenderByteRate, envelope.MaxSize)
	}
	return &senderRate{rate: l.SenderByteRate, burst: burst, unit: "bytes", b: map[string]*bucket{}}
}

// take spends one of sender's tokens at now, or says when one is due.
func (s *senderRate) take(sender string, now time.Time) *relayproto.Error {
	return s.takeN(sender, 1, now)
}

// refund gives back the token take spent (the accept was refused after it).
func (s *senderRate) refund(sender string, now time.Time) {
	if s.rate == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.b[sender]; b != nil {
		s.refill(b, now)
		b.tokens = min(s.burst, b.tokens+1)
	}
}

// takeN spends cost of sender's tokens at now when the bucket holds cost or
// its whole burst (the bucket may go below zero), or says when it will.
func (s *senderRate) takeN(sender string, cost float64, now time.Time) *relayproto.Error {
	if s.rate == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b[sender]
	if b == nil {
		if len(s.b) >= maxSenders {
			s.pruneLocked(now)
		}
		if len(s.b) >= maxSenders {
			return unavailable(relayproto.CodeRelayBusy, "too many senders at once", nil)
		}
		b = &bucket{tokens: s.burst, at: now}
		s.b[sender] = b
	}
	s.refill(b, now)
	need := min(cost, s.burst)
	if b.tokens >= need {
		b.tokens -= cost
		return nil
	}
	wait := (need - b.tokens) / s.rate // seconds until enough tokens
	return &relayproto.Error{Status: http.StatusTooManyRequests, Code: relayproto.CodeRelayRateLimited,
		Message:    fmt.Sprintf("sender %s sends more than %g %s per second (burst %g)", sender, s.rate, s.unit, s.burst),
		RetryAfter: int(min(math.Ceil(wait), 86400))}
}

func (s *senderRate) refill(b *bucket, now time.Time) {
	if d := now.Sub(b.at).Seconds(); d > 0 {
		b.tokens = min(s.burst, b.tokens+d*s.rate)
		b.at = now
	}
}

// prune drops the buckets that have refilled.
func (s *senderRate) prune(now time.Time) {
	s.mu.Lock()
	s.pruneLocked(now)
	s.mu.Unlock()
}

func (s *senderRate) pruneLocked(now time.Time) {
	for k, b := range s.b {
		if s.refill(b, now); b.tokens >= s.burst {
			delete(s.b, k)
		}
	}
}

// Register adds did to the allow-list, durably, before it answers.
// Registering again changes nothing.
func (r *Relay) Register(ctx context.Context, did identity.DID) error {
	if err := r.back.register(ctx, did); err != nil {
		return err
	}
	r.log.Info("relay: recipient registered", "recipient", string(did))
	return nil
}

// Unregister removes did from the allow-list, durably. Envelopes waiting for
// it stay to be fetched.
func (r *Relay) Unregister(ctx context.Context, did identity.DID) error {
	if err := r.back.unregister(ctx, did); err != nil {
		return err
	}
	r.log.Info("relay: recipient unregistered", "recipient", string(did))
	return nil
}

// Expire is the maintenance pass: it removes the inbox envelopes whose
// delivery deadline has passed (the storage's expire: on the files in chunks
// with Ack's order, records raised to terminal EXPIRED; on JetStream a header
// scan deleting the messages) and returns how many it removed. The
// de-duplication records stay until their retention ends, so a late copy is
// still answered with its receipt. It also drops the sender-rate buckets that
// have refilled.
func (r *Relay) Expire(ctx context.Context) (int, error) {
	r.rate.prune(r.now())
	r.byteRate.prune(r.now())
	r.expireUploads(ctx, r.now())
	n, err := r.back.expire(ctx, r.now())
	if n > 0 {
		r.count(func(s *Stats) { s.Expired += int64(n) })
		r.log.Info("relay: expired envelopes removed", "count", n)
	}
	return n, err
}

// maintain runs Expire every period until stop is closed.
func (r *Relay) maintain(period time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(period)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if _, err := r.Expire(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("relay: expiry pass failed", "err", err)
			}
		}
	}
}
