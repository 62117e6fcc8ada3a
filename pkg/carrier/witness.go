package carrier

import "context"

// The head witness (docs/CARRIER.md "The head witness"; DESIGN §5 "The head").
//
// Every post carries the store's current signed head (WithHead, from
// store.Store.Head); the relay keeps the highest head it has seen from the sender
// and signs its seq into each receipt (SenderSeq). A receipt naming a seq above
// the store's head means that the relay has seen a head this store never wrote
// since: the store may have been restored from a copy. The carrier then fetches
// the relay's signed head (a bare seq is only the relay's word) and gives it to
// store.Store.Witness, which decides: a head of the owner's with a higher seq
// makes the store rolled back, refusing every write, and the carrier stops
// dispatching (Run).

// head returns the bytes of the store's current head, nil before the first.
func (c *Carrier) head() []byte {
	_, b := c.s.Head()
	return b
}

// witness checks the receipts of one run against the store's head. It returns
// the store's STORE_ROLLED_BACK error when a relay's signed head proves the store
// rolled back, and nil otherwise: the receipts name no newer head, or the relay's
// head could not be had or is not the owner's (logged; the next receipt above the
// head asks again). It is safe to call from concurrent passes: Witness is.
func (c *Carrier) witness(ctx context.Context, relayURL string, results []Result) error {
	var seen int64
	for _, r := range results {
		if r.Outcome == Accepted && r.ParsedReceipt != nil {
			seen = max(seen, r.ParsedReceipt.SenderSeq)
		}
	}
	if seen == 0 {
		return nil
	}
	if h, _ := c.s.Head(); h != nil && seen <= h.Seq {
		return nil
	}
	if err := c.s.RolledBack(); err != nil {
		return err // another pass (or the daemon) has shown it meanwhile
	}
	ht, ok := c.t.(HeadTransport)
	if !ok || c.o.Identity == nil {
		c.o.Logger.Debug("carrier: a receipt names a head newer than the store's, and the relay's head cannot be asked for",
			"target", relayURL, "senderSeq", seen)
		return nil
	}
	c.st.headChecks.Add(1)
	hctx, cancel := context.WithTimeout(ctx, c.o.SendTimeout)
	defer cancel()
	b, err := ht.SenderHead(hctx, relayURL, c.o.Identity)
	switch {
	case err != nil:
		c.o.Logger.Warn("carrier: a receipt names a head newer than the store's; the relay's head could not be fetched",
			"target", relayURL, "senderSeq", seen, "err", err)
		return nil
	case b == nil:
		c.o.Logger.Warn("carrier: a receipt names a head newer than the store's, and the relay says it holds none",
			"target", relayURL, "senderSeq", seen)
		return nil
	}
	err = c.s.Witness(b, relayURL)
	switch {
	case rolledBack(err):
		return err
	case err != nil:
		c.o.Logger.Warn("carrier: the relay's head is not a head of this store's owner", "target", relayURL, "err", err)
	}
	return nil
}
