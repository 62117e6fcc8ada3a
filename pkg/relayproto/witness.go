package relayproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// The relay as a witness of sender store heads (docs/RELAY.md, "Store heads").
//
// A post (PathEnvelopes, PathEnvelopesBatch) may carry the sender's latest
// signed store head (envelope.SignStoreHead) in HeaderHead. The relay verifies
// it (its owner must be the sender of every envelope of the request, else 400
// CodeHeadInvalid and nothing is accepted), keeps the highest head per sender
// durably before it answers, and signs that head's seq into each receipt
// (envelope.RelayReceipt.SenderSeq). A sender asks for the head the relay
// holds (PathSenderHead) and for the state of its envelopes
// (PathSenderReceipts); a recipient asks for the delivery statuses the relay
// retained after it acknowledged them (PathInboxStatuses).

// HeaderHead carries a store head (its exact bytes: one printable-ASCII line
// without spaces) on a post.
const HeaderHead = "Sealbridge-Head"

// Paths of the witness endpoints; a relay without them answers 404.
const (
	// PathSenderHead (GET, signed by the sender as the inbox requests are):
	// 200 with the highest head the relay witnessed from the signer (its exact
	// bytes), 404 CodeHeadUnknown when none.
	PathSenderHead = "/v1/senders/head"
	// PathSenderReceipts (POST, signed by the sender, body
	// SenderReceiptsRequest): the SenderReceiptsAnswer.
	PathSenderReceipts = "/v1/senders/receipts"
	// PathInboxStatuses (GET ?since=<Unix ms>&after=<cursor>&limit=<n>,
	// signed by the recipient): an InboxPage of the delivery-status envelopes
	// the recipient acknowledged that the relay still retains, oldest first,
	// received at or after since.
	PathInboxStatuses = "/v1/inbox/statuses"
)

// Error codes of the witness.
const (
	// CodeHeadInvalid (400): the HeaderHead of a post does not parse, or its
	// owner is not the sender of every envelope of the request.
	CodeHeadInvalid = "HEAD_INVALID"
	// CodeHeadUnknown (404): the relay witnessed no head from the signer.
	CodeHeadUnknown = "HEAD_UNKNOWN"
)

// SenderReceiptsRequest is the body of POST /v1/senders/receipts: 1 to
// MaxAckIDs envelope ids.
type SenderReceiptsRequest struct {
	EnvelopeIDs []string `json:"envelopeIds"`
}

// States of a SenderReceipt.
const (
	// SenderReceiptHeld: the envelope waits in its recipient's inbox.
	SenderReceiptHeld = "held"
	// SenderReceiptAcked: the relay accepted the envelope and the recipient
	// acknowledged it; only its de-duplication record remains.
	SenderReceiptAcked = "acked"
	// SenderReceiptUnknown: the relay never accepted it from the signer, or
	// its record expired.
	SenderReceiptUnknown = "unknown"
)

// SenderReceipt is the answer for one envelope id of POST /v1/senders/receipts.
type SenderReceipt struct {
	EnvelopeID string `json:"envelopeId"`
	State      string `json:"state"`
	// Receipt is the receipt as the relay first answered it, byte for byte
	// (held and acked only).
	Receipt json.RawMessage `json:"receipt,omitempty"`
	// Parsed is Receipt parsed and verified (set by Client.SenderReceipts;
	// never sent).
	Parsed *envelope.RelayReceipt `json:"-"`
}

// SenderReceiptsAnswer is the answer to POST /v1/senders/receipts: one
// SenderReceipt per id of the request, in its order.
type SenderReceiptsAnswer struct {
	Receipts []SenderReceipt `json:"receipts"`
}

// maxSenderReceiptsAnswer bounds the answer to a SenderReceiptsRequest.
const maxSenderReceiptsAnswer = MaxAckIDs*(envelope.MaxReceiptSize+128) + 1024

// setHead puts c.Head's bytes, if any, in req's HeaderHead.
func (c *Client) setHead(req *http.Request) {
	if c.Head == nil {
		return
	}
	if h := c.Head(); len(h) > 0 {
		req.Header.Set(HeaderHead, string(h))
	}
}

// SenderHead returns the highest store head the relay witnessed from id, its
// exact bytes, verified to be id's head; nil, nil when the relay has none (a
// 404, also from a relay without the endpoint).
func (c *Client) SenderHead(ctx context.Context, id *identity.Identity) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.BaseURL, "/")+PathSenderHead, nil)
	if err != nil {
		return nil, err
	}
	if err := SignInboxRequest(req, id, c.now()); err != nil {
		return nil, err
	}
	body, err := c.do(req, envelope.MaxHeadSize)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Status == http.StatusNotFound {
			return nil, nil
		}
		return nil, err
	}
	h, err := envelope.ParseStoreHead(body)
	if err != nil {
		return nil, fmt.Errorf("relay: bad head: %w", err)
	}
	if h.Owner != id.DID() {
		return nil, fmt.Errorf("relay: the head it answered is %s's, not %s's", h.Owner, id.DID())
	}
	return body, nil
}

// SenderReceipts asks the relay about envelopes id sent (1 to MaxAckIDs ids)
// and returns one SenderReceipt per id, in order. Each held or acked receipt
// is parsed, verified and checked to be for its id (Parsed); an answer that
// is not so is an error.
func (c *Client) SenderReceipts(ctx context.Context, id *identity.Identity, ids []string) ([]SenderReceipt, error) {
	if len(ids) == 0 || len(ids) > MaxAckIDs {
		return nil, fmt.Errorf("relay: sender receipts: 1 to %d ids, not %d", MaxAckIDs, len(ids))
	}
	data, err := json.Marshal(SenderReceiptsRequest{EnvelopeIDs: ids})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+PathSenderReceipts, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if err := SignInboxRequest(req, id, c.now()); err != nil {
		return nil, err
	}
	body, err := c.do(req, maxSenderReceiptsAnswer)
	if err != nil {
		return nil, err
	}
	var ans SenderReceiptsAnswer
	if err := json.Unmarshal(body, &ans); err != nil {
		return nil, fmt.Errorf("relay: bad sender receipts answer: %w", err)
	}
	if len(ans.Receipts) != len(ids) {
		return nil, fmt.Errorf("relay: %d sender receipts for %d ids", len(ans.Receipts), len(ids))
	}
	for i := range ans.Receipts {
		r := &ans.Receipts[i]
		if r.EnvelopeID != ids[i] {
			return nil, fmt.Errorf("relay: sender receipt %d is for %q, not %q", i, r.EnvelopeID, ids[i])
		}
		switch r.State {
		case SenderReceiptHeld, SenderReceiptAcked:
			rc, err := envelope.ParseRelayReceipt(r.Receipt)
			if err != nil {
				return nil, fmt.Errorf("relay: bad receipt for %s: %w", r.EnvelopeID, err)
			}
			if rc.EnvelopeID != r.EnvelopeID || rc.State != envelope.ReceiptStatePersisted {
				return nil, fmt.Errorf("relay: the receipt answered for %s is for another envelope", r.EnvelopeID)
			}
			r.Parsed = rc
		case SenderReceiptUnknown:
			if len(r.Receipt) != 0 {
				return nil, fmt.Errorf("relay: an unknown envelope %s with a receipt", r.EnvelopeID)
			}
		default:
			return nil, fmt.Errorf("relay: unknown sender receipt state for %s", r.EnvelopeID)
		}
	}
	return ans.Receipts, nil
}

// InboxStatuses returns a page of the delivery statuses the relay retained
// for id (envelopes of kind delivery-status id acknowledged), oldest first,
// received at or after since (Unix ms; 0: all), after cursor (empty: from the
// first). A relay without the endpoint answers 404 (an *Error).
func (c *Client) InboxStatuses(ctx context.Context, id *identity.Identity, since int64, cursor string) (*InboxPage, error) {
	q := url.Values{}
	if since > 0 {
		q.Set("since", strconv.FormatInt(since, 10))
	}
	if cursor != "" {
		q.Set("after", cursor)
	}
	return c.getPage(ctx, id, PathInboxStatuses, q, "statuses page")
}
