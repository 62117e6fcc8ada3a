package relay

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Long-polled inbox fetches (GET /v1/inbox?wait=…).
const (
	// DefaultMaxInboxWaiters is Options.MaxInboxWaiters unless set.
	DefaultMaxInboxWaiters = 1024
	// DefaultHeldPollsPerAddress is Limits.HeldPollsPerAddress unless set: a
	// sixteenth of the default total, so one client address (which may make
	// any number of throwaway identities) cannot take every place.
	DefaultHeldPollsPerAddress = 64
	// maxWaitersPerRecipient bounds the waiting fetches of one recipient, so one
	// recipient cannot take every place (a daemon needs one).
	maxWaitersPerRecipient = 4
	// inboxWaitSlack is how far past its wait a held fetch's connection read
	// and write deadlines are set, so the server's own timeouts (shorter than
	// relayproto.MaxInboxWait) neither cancel it nor cut its answer.
	inboxWaitSlack = 30 * time.Second
)

// waiter is one held fetch; ch is closed when its recipient's inbox gains a
// visible envelope (or waits are stopped). addr is its client's address key
// (addressKey; "" counts against no address).
type waiter struct {
	ch   chan struct{}
	addr string
}

// waitState is the relay's held fetches, by recipient dir name and by client
// address. Guarded by r.mu.
type waitState struct {
	max        int // in all
	maxPerAddr int // per client address key
	n          int
	by         map[string]map[*waiter]struct{}
	byAddr     map[string]int
	stopped    bool
	wakes      int64            // waiters woken (the tests')
	busy       map[string]int64 // refusals by the bound that refused: "total", "recipient", "address"
}

// addressKey is what the per-address bound of held fetches counts a client
// by: its IPv4 address, or the /64 its IPv6 address is in (one host is
// commonly given a whole /64). remoteAddr is http.Request.RemoteAddr; one
// that does not parse is its own key.
func addressKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return remoteAddr
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// wakeLocked wakes every fetch waiting on recipient dir rdir. r.mu must be held.
func (r *Relay) wakeLocked(rdir string) {
	for w := range r.waits.by[rdir] {
		r.dropWaiterLocked(rdir, w)
		r.waits.wakes++
		close(w.ch)
	}
}

// wake wakes every fetch waiting on recipient dir rdir: the storage calls it
// when an envelope becomes visible there (the file storage when an accept
// publishes one, JetStream on the accept notification of any relay process).
func (r *Relay) wake(rdir string) {
	r.mu.Lock()
	r.wakeLocked(rdir)
	r.mu.Unlock()
}

func (r *Relay) dropWaiterLocked(rdir string, w *waiter) {
	set := r.waits.by[rdir]
	if _, ok := set[w]; !ok {
		return
	}
	delete(set, w)
	if len(set) == 0 {
		delete(r.waits.by, rdir)
	}
	if w.addr != "" {
		if r.waits.byAddr[w.addr]--; r.waits.byAddr[w.addr] <= 0 {
			delete(r.waits.byAddr, w.addr)
		}
	}
	r.waits.n--
}

// addWaiter registers a held fetch of rdir from client address key addr
// ("": none) — unless waits are stopped (nil waiter). Beyond the bounds (in
// all, per recipient, per address) it answers 503 RELAY_BUSY. The bounds are
// checked and the place taken under one lock, so concurrent fetches never
// hold more than a bound. It is registered before the fetch that decides to
// wait reads the inbox, so an envelope that becomes visible after that read
// wakes it.
func (r *Relay) addWaiter(rdir, addr string) (w *waiter, e error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waits.stopped {
		return nil, nil
	}
	bound := ""
	switch {
	case r.waits.n >= r.waits.max:
		bound = "total"
	case len(r.waits.by[rdir]) >= maxWaitersPerRecipient:
		bound = "recipient"
	case addr != "" && r.waits.byAddr[addr] >= r.waits.maxPerAddr:
		bound = "address"
	}
	if bound != "" {
		if r.waits.busy == nil {
			r.waits.busy = map[string]int64{}
		}
		r.waits.busy[bound]++
		return nil, unavailable(relayproto.CodeRelayBusy, "too many inbox fetches waiting; fetch without wait or retry later", nil)
	}
	if r.waits.by == nil {
		r.waits.by, r.waits.byAddr = map[string]map[*waiter]struct{}{}, map[string]int{}
	}
	if r.waits.by[rdir] == nil {
		r.waits.by[rdir] = map[*waiter]struct{}{}
	}
	w = &waiter{ch: make(chan struct{}), addr: addr}
	r.waits.by[rdir][w] = struct{}{}
	if addr != "" {
		r.waits.byAddr[addr]++
	}
	r.waits.n++
	return w, nil
}

func (r *Relay) dropWaiter(rdir string, w *waiter) {
	r.mu.Lock()
	r.dropWaiterLocked(rdir, w)
	r.mu.Unlock()
}

// FetchWait is Fetch held for up to wait while the page would be empty: it
// answers as soon as an envelope after cursor becomes visible in recipient's
// inbox, with an empty page when wait ends or waits are stopped
// (StopWaiting), and with ctx's error when ctx ends first (the client went
// away); its place is freed in every case.
// Exported for the package's external tests, which call it without an HTTP
// server; it counts against no client address (GET /v1/inbox counts each
// fetch against its client's, fetchWait).
func (r *Relay) FetchWait(ctx context.Context, recipient identity.DID, after string, limit int, wait time.Duration) (*relayproto.InboxPage, error) {
	return r.fetchWait(ctx, "", recipient, after, limit, wait)
}

// fetchWait is FetchWait for a fetch from client address key addr ("": none).
func (r *Relay) fetchWait(ctx context.Context, addr string, recipient identity.DID, after string, limit int, wait time.Duration) (*relayproto.InboxPage, error) {
	page, err := r.Fetch(ctx, recipient, after, limit)
	if err != nil || wait <= 0 || len(page.Envelopes) > 0 || page.More {
		return page, err
	}
	// The storage's own form of the cursor (the start is "" or "0"; a cursor
	// of the other storage's format is the start): the page is empty while
	// it stays.
	cursor := page.Cursor
	t := time.NewTimer(min(wait, relayproto.MaxInboxWait))
	defer t.Stop()
	rdir := recipientDir(recipient)
	for {
		w, err := r.addWaiter(rdir, addr)
		if err != nil {
			return nil, err
		}
		if w == nil {
			return page, nil // stopped
		}
		// Read again with the waiter in place: an envelope that became
		// visible since the last read is seen now, one that becomes visible
		// later wakes w.
		if page, err = r.Fetch(ctx, recipient, after, limit); err != nil || !emptyPage(page, cursor) {
			r.dropWaiter(rdir, w)
			return page, err
		}
		select {
		case <-w.ch:
			// Woken: read the page again. It can still be empty (acknowledged
			// meanwhile by another fetch of the recipient); then wait on.
		case <-t.C:
			r.dropWaiter(rdir, w)
			return page, nil
		case <-ctx.Done():
			r.dropWaiter(rdir, w)
			return nil, ctx.Err()
		}
	}
}

// emptyPage reports whether page, fetched after cursor, has nothing to give.
func emptyPage(page *relayproto.InboxPage, cursor string) bool {
	return len(page.Envelopes) == 0 && !page.More && page.Cursor == cursor
}

// Waiting is the number of fetches being held now.
func (r *Relay) Waiting() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waits.n
}

// StopWaiting answers every held fetch now (with an empty page) and makes later
// fetches answer at once: register it with http.Server.RegisterOnShutdown so a
// graceful shutdown does not wait out the long polls.
func (r *Relay) StopWaiting() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waits.stopped = true
	for rdir := range r.waits.by {
		r.wakeLocked(rdir)
	}
}

// Status returns what Fetch from the start would page through in recipient's
// inbox: the visible envelopes, their bytes, the oldest and newest receivedAt.
func (r *Relay) Status(ctx context.Context, recipient identity.DID) (relayproto.InboxStatus, error) {
	return r.back.status(ctx, recipient)
}
