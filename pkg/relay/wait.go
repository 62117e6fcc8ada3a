package relay

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Long-polled inbox fetches (GET /v1/inbox?wait=…).
const (
	// DefaultMaxInboxWaiters is Options.MaxInboxWaiters unless set.
	DefaultMaxInboxWaiters = 1024
	// maxWaitersPerRecipient bounds the waiting fetches of one recipient, so one
	// recipient cannot take every place (a daemon needs one).
	maxWaitersPerRecipient = 4
	// inboxWaitSlack is how far past its wait a held fetch's connection read
	// and write deadlines are set, so the server's own timeouts (shorter than
	// relayproto.MaxInboxWait) neither cancel it nor cut its answer.
	inboxWaitSlack = 30 * time.Second
)

// waiter is one held fetch; ch is closed when its recipient's inbox gains a
// visible envelope (or waits are stopped).
type waiter struct{ ch chan struct{} }

// waitState is the relay's held fetches, by recipient dir name. Guarded by r.mu.
type waitState struct {
	max     int
	n       int
	by      map[string]map[*waiter]struct{}
	stopped bool
	wakes   int64 // waiters woken (the tests')
}

// wakeLocked wakes every fetch waiting on recipient dir rdir. r.mu must be held.
func (r *Relay) wakeLocked(rdir string) {
	for w := range r.waits.by[rdir] {
		r.dropWaiterLocked(rdir, w)
		r.waits.wakes++
		close(w.ch)
	}
}

// publishedLocked is called when the visible sequence numbers grew from below
// lo to below hi (an in-flight write finished): it wakes the recipients that
// have an envelope in [lo, hi). r.mu must be held.
func (r *Relay) publishedLocked(lo, hi uint64) {
	if lo >= hi || r.waits.n == 0 {
		return
	}
	for rdir := range r.waits.by {
		ib := r.inboxes[rdir]
		if ib == nil {
			continue
		}
		i := firstAtLeast(ib.entries, lo)
		if i < len(ib.entries) && ib.entries[i].seq < hi {
			r.wakeLocked(rdir)
		}
	}
}

// firstAfter is the index of the first entry with a sequence number above after.
func firstAfter(entries []*entry, after uint64) int { return firstAtLeast(entries, after+1) }

// firstAtLeast is the index of the first entry with a sequence number of at least seq.
func firstAtLeast(entries []*entry, seq uint64) int {
	i, _ := slices.BinarySearchFunc(entries, seq, func(x *entry, s uint64) int {
		switch {
		case x.seq < s:
			return -1
		case x.seq > s:
			return 1
		}
		return 0
	})
	return i
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
	r.waits.n--
}

// addWaiter registers a held fetch of rdir after cursor after — unless an
// envelope is visible there already (ready) or waits are stopped (both: nil
// waiter). Beyond the bounds it answers 503 RELAY_BUSY.
func (r *Relay) addWaiter(rdir string, after uint64) (w *waiter, ready bool, e error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ib := r.inboxes[rdir]; ib != nil {
		if i := firstAfter(ib.entries, after); i < len(ib.entries) && ib.entries[i].seq < r.visibleBelow() {
			return nil, true, nil
		}
	}
	if r.waits.stopped {
		return nil, false, nil
	}
	if r.waits.n >= r.waits.max || len(r.waits.by[rdir]) >= maxWaitersPerRecipient {
		return nil, false, unavailable(relayproto.CodeRelayBusy, "too many inbox fetches waiting; fetch without wait or retry later", nil)
	}
	if r.waits.by == nil {
		r.waits.by = map[string]map[*waiter]struct{}{}
	}
	if r.waits.by[rdir] == nil {
		r.waits.by[rdir] = map[*waiter]struct{}{}
	}
	w = &waiter{ch: make(chan struct{})}
	r.waits.by[rdir][w] = struct{}{}
	r.waits.n++
	return w, false, nil
}

// FetchWait is Fetch held for up to wait while the page would be empty: it
// answers as soon as an envelope after cursor becomes visible in recipient's
// inbox, with an empty page when wait ends or waits are stopped
// (StopWaiting), and with ctx's error when ctx ends first (the client went
// away); its place is freed in every case.
// Exported for the package's external tests, which call it without an HTTP server.
func (r *Relay) FetchWait(ctx context.Context, recipient identity.DID, after uint64, limit int, wait time.Duration) (*relayproto.InboxPage, error) {
	page, err := r.Fetch(recipient, after, limit)
	cursor := strconv.FormatUint(after, 10)
	if err != nil || wait <= 0 || len(page.Envelopes) > 0 || page.More || page.Cursor != cursor {
		return page, err
	}
	t := time.NewTimer(min(wait, relayproto.MaxInboxWait))
	defer t.Stop()
	rdir := recipientDir(recipient)
	for {
		w, ready, err := r.addWaiter(rdir, after)
		if err != nil {
			return nil, err
		}
		if !ready && w == nil {
			return page, nil // stopped
		}
		if w != nil {
			select {
			case <-w.ch:
			case <-t.C:
				r.mu.Lock()
				r.dropWaiterLocked(rdir, w)
				r.mu.Unlock()
				return page, nil
			case <-ctx.Done():
				r.mu.Lock()
				r.dropWaiterLocked(rdir, w)
				r.mu.Unlock()
				return nil, ctx.Err()
			}
		}
		// Woken: read the page again. It can still be empty (acknowledged
		// meanwhile by another fetch of the recipient); then wait on.
		if page, err = r.Fetch(recipient, after, limit); err != nil || len(page.Envelopes) > 0 || page.More || page.Cursor != cursor {
			return page, err
		}
	}
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
func (r *Relay) Status(recipient identity.DID) relayproto.InboxStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var st relayproto.InboxStatus
	ib := r.inboxes[recipientDir(recipient)]
	if ib == nil {
		return st
	}
	below := r.visibleBelow()
	for _, e := range ib.entries {
		if e.seq >= below {
			break
		}
		st.Count++
		st.Bytes += int64(e.size)
		if st.OldestReceivedAt == 0 || e.receivedAt < st.OldestReceivedAt {
			st.OldestReceivedAt = e.receivedAt
		}
		st.NewestReceivedAt = max(st.NewestReceivedAt, e.receivedAt)
	}
	return st
}
