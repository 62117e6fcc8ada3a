package conctest_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/internal/conctest"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The operation generator. The space is deliberately small: a run is cut into epochs
// of epochLen, by the monotonic clock from a start all processes share, and each
// epoch has its own few idempotency keys and message ids, derived from the seed, so
// every process works on the same fresh ones at the same time. Each message id has a
// few envelope sets (variants), so that enqueues of one id conflict; the variants of
// one id go to different relays.
//
// The workers of a process run in rounds behind a start gate (gate): in each round the
// process's round plan (drawn from the seed and the round number, the same for all its
// workers) is a burst on one key, a burst on one message, or a free mix, and every
// worker makes its own draw inside it.
const (
	epochLen       = 250 * time.Millisecond
	keysPerEpoch   = 3
	msgsPerEpoch   = 4 // the last of them has a deadline that passes during the run
	variantsPerMsg = 3 // 0 and 1: one envelope each (singles); 2: three envelopes
)

// variantEnvelopes is how many envelopes variant v of a message has.
func variantEnvelopes(v int) int {
	if v == 2 {
		return 3
	}
	return 1
}

// space names the keys and messages of a run and builds their requests.
type space struct {
	seed      uint64
	startMono int64 // the run's start (Mono)
	startWall int64 // and by the wall clock, Unix ms
	peer      identity.DID

	mu         sync.Mutex
	frozen     bool // freeze was called: no epoch after last
	last       int
	msgs       map[[2]int]*msgSpec // by (epoch, index)
	byID       map[string]*msgSpec
	byEnvelope map[string]string // envelope id → message id
}

// msgSpec is one message id of the space with its variants.
type msgSpec struct {
	id       string
	deadline int64 // Unix ms
	variants []variantSpec
}

// variantSpec is one envelope set of a message.
type variantSpec struct {
	req       store.SendRequest
	digest    string // the digest of its first envelope: the message record's
	refusable bool
}

const idDomain = "sealbridge/conctest/v1"

func newSpace(seed uint64, startMono, startWall int64, peer identity.DID) *space {
	return &space{seed: seed, startMono: startMono, startWall: startWall, peer: peer,
		msgs: map[[2]int]*msgSpec{}, byID: map[string]*msgSpec{}, byEnvelope: map[string]string{}}
}

// epochAt is the epoch of Mono time mono (after freeze, at most the last one then).
func (sp *space) epochAt(mono int64) int {
	e := max(0, int((mono-sp.startMono)/int64(epochLen)))
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.frozen {
		e = min(e, sp.last)
	}
	return e
}

// freeze ends the run's epochs at the current one: the final reads look at the
// messages the run could have touched, no further.
func (sp *space) freeze() {
	e := sp.epochAt(conctest.Mono())
	sp.mu.Lock()
	sp.frozen, sp.last = true, e
	sp.mu.Unlock()
}

func (sp *space) key(e, i int) string { return fmt.Sprintf("conctest-%d-%d-%d", sp.seed, e, i) }

// request is the request body number body of key.
func request(key string, body int) []byte { return fmt.Appendf(nil, `{"key":%q,"body":%d}`, key, body) }

// message returns message i of epoch e, building it on first use.
func (sp *space) message(e, i int) *msgSpec {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.messageLocked(e, i)
}

func (sp *space) messageLocked(e, i int) *msgSpec {
	if m := sp.msgs[[2]int{e, i}]; m != nil {
		return m
	}
	name := fmt.Sprintf("%d/%d/%d", sp.seed, e, i)
	m := &msgSpec{id: uuid.FromDomain(idDomain, "message/"+name), deadline: sp.startWall + time.Hour.Milliseconds()}
	if i == msgsPerEpoch-1 {
		m.deadline = sp.startWall + int64(e+2)*epochLen.Milliseconds()
	}
	for v := range variantsPerMsg {
		relay := relays[(i+v)%len(relays)]
		req := store.SendRequest{MessageID: m.id, PeerOwnerDID: sp.peer, RelayURL: relay,
			DeliveryDeadline: time.UnixMilli(m.deadline)}
		for k := range variantEnvelopes(v) {
			id := uuid.FromDomain(idDomain, fmt.Sprintf("envelope/%s/%d/%d", name, v, k))
			env, _ := json.Marshal(map[string]any{"envelopeId": id, "messageId": m.id, "variant": v, "ordinal": k})
			kind := record.EnvelopeMessage
			if k > 0 {
				kind = record.EnvelopeDeliveryStatus
			}
			req.Envelopes = append(req.Envelopes, store.OutgoingEnvelope{EnvelopeID: id, Kind: kind, Envelope: env})
			sp.byEnvelope[id] = m.id
		}
		m.variants = append(m.variants, variantSpec{req: req, digest: envelope.Digest(req.Envelopes[0].Envelope),
			refusable: relay == relayStrict})
	}
	sp.msgs[[2]int{e, i}] = m
	sp.byID[m.id] = m
	return m
}

// upTo builds and returns every message of epochs 0..e.
func (sp *space) upTo(e int) []*msgSpec {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var out []*msgSpec
	for x := 0; x <= e; x++ {
		for i := range msgsPerEpoch {
			out = append(out, sp.messageLocked(x, i))
		}
	}
	return out
}

// messageOf returns the message id of an envelope of the space (building the epochs
// up to now first: the envelope may be another process's), or "".
func (sp *space) messageOf(envelopeID string) string {
	sp.upTo(sp.epochAt(conctest.Mono()) + 1)
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.byEnvelope[envelopeID]
}

// byIDOf returns the message of the space with id (building the epochs up to now
// first), or nil.
func (sp *space) byIDOf(id string) *msgSpec {
	sp.upTo(sp.epochAt(conctest.Mono()) + 1)
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.byID[id]
}

// variantOf returns which variant of m has first-envelope digest d, or -1.
func (m *msgSpec) variantOf(d string) int {
	for v, x := range m.variants {
		if x.digest == d {
			return v
		}
	}
	return -1
}

// variantOfEnvelope returns which variant of m holds envelope id, or -1.
func (m *msgSpec) variantOfEnvelope(id string) int {
	for v, x := range m.variants {
		for _, e := range x.req.Envelopes {
			if e.EnvelopeID == id {
				return v
			}
		}
	}
	return -1
}

// recentEpoch draws an epoch for an operation in epoch e: mostly e, sometimes the
// one before (its messages are settling), now and then any earlier one (settled).
func recentEpoch(rng *rand.Rand, e int) int {
	switch p := rng.IntN(10); {
	case e == 0 || p < 6:
		return e
	case p < 9:
		return e - 1
	}
	return rng.IntN(e + 1)
}

// gate is the start gate of a process's workers: each round starts when every worker
// has finished the one before, so a burst's calls are issued together. Once the run's
// end (Mono time) has passed, no further round starts.
type gate struct {
	mu      sync.Mutex
	cond    *sync.Cond
	n       int
	waiting int
	round   int
	stop    bool
	end     int64
}

func newGate(n int, end int64) *gate {
	g := &gate{n: n, end: end}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// wait blocks until every worker arrived, and returns the round to run, or false when
// the run is over.
func (g *gate) wait() (int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.round
	g.waiting++
	if g.waiting == g.n {
		g.waiting = 0
		g.round++
		g.stop = g.stop || conctest.Mono() >= g.end
		g.cond.Broadcast()
	}
	for g.round == r {
		g.cond.Wait()
	}
	return r, !g.stop
}

// worker is one goroutine issuing operations.
type worker struct {
	n   *node
	id  int
	rng *rand.Rand
}

func (w *worker) loop(g *gate) {
	for {
		round, ok := g.wait()
		if !ok {
			return
		}
		w.step(round)
	}
}

// step runs the worker's part of round.
func (w *worker) step(round int) {
	sp := w.n.space
	e := sp.epochAt(conctest.Mono())
	plan := rand.New(rand.NewPCG(w.n.cfg.Seed, uint64(w.n.cfg.Proc)<<40|uint64(round)))
	switch focus := plan.IntN(100); {
	case focus < 25: // every worker begins one fresh key, mostly with the same request
		body := 0
		if w.rng.IntN(6) == 0 {
			body = 1
		}
		w.begin(sp.key(e, w.n.own(plan, keysPerEpoch)), body)
	case focus < 50: // every worker enqueues one fresh message, each a variant of its own
		w.enqueue(sp.message(e, w.n.own(plan, msgsPerEpoch)), w.rng.IntN(variantsPerMsg))
	case focus < 65: // everything at once on one message
		w.onMessage(sp.message(recentEpoch(plan, e), w.n.own(plan, msgsPerEpoch)))
	default:
		w.mixed(e)
	}
}

// own draws the key or message (of count per epoch) of a burst: one of those this
// process owns (index modulo the processes), so that the bursts of two processes
// never pile onto one key or message at once. The other processes still reach it
// with their free draws, and the store and its lock are shared by all: the bound is
// on how many calls overlap in one partition of the history, which the checker's
// search grows exponentially with.
func (n *node) own(plan *rand.Rand, count int) int {
	var mine []int
	for i := range count {
		if i%n.cfg.Procs == n.cfg.Proc%n.cfg.Procs {
			mine = append(mine, i)
		}
	}
	if len(mine) == 0 {
		return n.cfg.Proc % count
	}
	return mine[plan.IntN(len(mine))]
}

// onMessage is one draw of the calls that change or read message m.
func (w *worker) onMessage(m *msgSpec) {
	switch p := w.rng.IntN(100); {
	case p < 25:
		w.enqueue(m, w.rng.IntN(variantsPerMsg))
	case p < 50:
		w.act(m, w.action())
	case p < 75:
		w.inbound(m, w.confirmedVariant(), w.rng.IntN(2))
	case p < 90:
		w.readMessage(m, w.rng.IntN(2) == 0)
	default:
		w.summaries(w.rng.IntN(2) == 0)
	}
}

// mixed is one draw from every kind of call, on the space's recent keys and messages.
func (w *worker) mixed(e int) {
	sp := w.n.space
	m := func() *msgSpec { return sp.message(recentEpoch(w.rng, e), w.rng.IntN(msgsPerEpoch)) }
	switch p := w.rng.IntN(100); {
	case p < 12:
		w.begin(sp.key(recentEpoch(w.rng, e), w.rng.IntN(keysPerEpoch)), w.rng.IntN(2))
	case p < 24:
		w.enqueue(m(), w.rng.IntN(variantsPerMsg))
	case p < 39:
		w.readMessage(m(), w.rng.IntN(3) == 0)
	case p < 49:
		w.summaries(w.rng.IntN(2) == 0)
	case p < 64:
		w.act(m(), w.action())
	case p < 69:
		w.actOnTarget(relays[w.rng.IntN(len(relays))], w.action())
	case p < 85:
		w.inbound(m(), w.confirmedVariant(), w.rng.IntN(2))
	case p < 89:
		w.maintain()
	default:
		w.readMessage(m(), false)
	}
}

// action draws an operator action: holds and releases most, cancels least.
func (w *worker) action() string {
	switch p := w.rng.IntN(100); {
	case p < 35:
		return record.ActionHold
	case p < 65:
		return record.ActionRelease
	case p < 85:
		return record.ActionRetry
	}
	return record.ActionCancel
}

// confirmedVariant draws the variant an inbound confirmation confirms; -1 (one in
// ten) is a confirmation signed by someone other than the message's recipient.
func (w *worker) confirmedVariant() int {
	if w.rng.IntN(10) == 0 {
		return -1
	}
	return w.rng.IntN(variantsPerMsg)
}
