package daemon

// The store's signed head (docs/DESIGN.md §5 "The head", §13): the daemon writes it
// every head interval and at shutdown, and checks it against the heads its relays
// witnessed before it serves anything.

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// witnessTimeout bounds the start-up question to one relay for the head it holds. A
// relay that does not answer in time is skipped (logged): an outage must not keep
// the daemon from starting, and the carrier checks every receipt's senderSeq later.
const witnessTimeout = 5 * time.Second

// headSource is the health problem's source of a rolled-back store.
const headSource = "store head"

// headEvery is the interval of the daemon's head writes.
func (d *Daemon) headEvery() time.Duration {
	if d.opts.HeadEvery > 0 {
		return d.opts.HeadEvery
	}
	return store.HeadInterval
}

// writeHeads writes the store's head (if anything was committed since the last) every
// head interval until ctx ends. The last write, after the carrier and the other
// writers stopped, is Run's (finalHead).
func (d *Daemon) writeHeads(ctx context.Context) {
	t := time.NewTicker(d.headEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.writeHead(ctx)
	}
}

// writeHead writes the head once; a rolled-back store becomes a health problem.
func (d *Daemon) writeHead(ctx context.Context) {
	_, _, err := d.st.WriteHead(ctx, false)
	switch {
	case err == nil:
	case errors.Is(err, errcode.StoreRolledBack):
		d.rolledBack(err)
	case ctx.Err() == nil:
		d.cond.warn(headSource, errClass(err), "daemon: writing the store head", "err", err)
	}
}

// finalHead writes the head after every writer of this daemon stopped, so that a
// copy made of the stopped store is covered by its head.
func (d *Daemon) finalHead() {
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.DrainTimeout)
	defer cancel()
	if _, _, err := d.st.WriteHead(ctx, false); err != nil && !errors.Is(err, errcode.StoreRolledBack) {
		d.log.Warn("daemon: writing the store head at shutdown", "err", err)
	}
}

// rolledBack records that the store was found behind a witnessed head: every write
// is refused by the store itself; the API says why and /readyz lists it.
func (d *Daemon) rolledBack(err error) {
	if !d.health.has(headSource) {
		d.log.Error("daemon: the store is rolled back; nothing is sent or changed until it is reconciled",
			"err", err, "hint", errcode.HintOf(err))
	}
	d.health.setProblem(readyProblem{Source: headSource, Code: errcode.StoreRolledBack.String(), Error: err.Error(),
		Hint: errcode.HintOf(err)}, d.now())
}

// checkWitnesses asks every relay this store delivers to, and its inbox relay, for
// the highest head they witnessed from this identity, and hands each to the store
// (Store.Witness). It returns STORE_ROLLED_BACK if the store is behind one of them or
// behind its local witness; a relay that cannot be asked is logged and skipped.
func (d *Daemon) checkWitnesses(ctx context.Context) error {
	if err := d.st.RolledBack(); err != nil {
		return err
	}
	urls, err := d.relayURLs(ctx)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(urls))
	for i, u := range urls {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, witnessTimeout)
			defer cancel()
			rc := &relayproto.Client{BaseURL: u, HTTP: &http.Client{Timeout: witnessTimeout}}
			head, err := rc.SenderHead(cctx, d.id)
			if err != nil {
				d.log.Warn("daemon: could not ask a relay for the head it witnessed; skipped", "relay", u, "err", err)
				return
			}
			if head != nil {
				errs[i] = d.st.Witness(head, u)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// relayURLs is the inbox relay and every relay an outbox record names, each once.
func (d *Daemon) relayURLs(ctx context.Context) ([]string, error) {
	sums, err := d.st.OutboxSummaries(ctx)
	if err != nil {
		return nil, err
	}
	var urls []string
	if d.opts.InboxRelay != "" {
		urls = append(urls, d.opts.InboxRelay)
	}
	for _, s := range sums {
		if s.RelayURL != "" && !slices.Contains(urls, s.RelayURL) {
			urls = append(urls, s.RelayURL)
		}
	}
	return urls, nil
}

// logHead logs the head the daemon starts from.
func (d *Daemon) logHead() {
	if h, _ := d.st.Head(); h != nil {
		d.log.Info("daemon: store head", slog.Int64("seq", h.Seq), slog.Int("format", h.Format))
	}
}
