package client

import (
	"context"
	"encoding/json"
	"net/http"
)

// Selector picks the messages an operator action applies to: the listed message ids,
// or (Target set, MessageIDs empty) every message with envelopes pending to that
// relay URL now. Exactly one of the two is given.
type Selector struct {
	MessageIDs []string
	Target     string
}

// ActionRequest is the body of POST /v1/queue/{hold,release,cancel,retry}: message
// ids or a target, and an optional reason (at most 256 bytes, one line) that the
// changed records keep.
type ActionRequest struct {
	MessageIDs []string `json:"messageIds,omitempty"`
	Target     string   `json:"target,omitempty"`
	Reason     string   `json:"reason,omitempty"`
}

// ActionResult is what an action did to one message. Changed counts the envelopes
// the request changed (0 with no Code: it was so already). Code, when set, is why
// the action was refused on this message (errcode.MessageClosed, MessageNotFound);
// Message is the refusal's reason or a note, such as that envelopes already relayed
// are not recalled.
//
// Effect, for a retry, is what happens now, whether or not a record changed:
// "attempting" (an attempt is made now), "probing-target" (made now as the probe of
// its target's unreachable wait), "in-flight" (an attempt is already under way) or
// "held" (nothing is attempted until a release). InFlight counts the envelopes
// with an attempt under way when the action ran: after a cancel they may still be
// delivered (a send under way is not recalled; Message says so too).
type ActionResult struct {
	MessageID string `json:"messageId"`
	Changed   int    `json:"changed"`
	Code      string `json:"code,omitempty"`
	Message   string `json:"message,omitempty"`
	Effect    string `json:"effect,omitempty"`
	InFlight  int    `json:"inFlight,omitempty"`
}

// ActionAnswer is the answer to an action: the action and one result per message.
type ActionAnswer struct {
	Action  string         `json:"action"`
	Results []ActionResult `json:"results"`
}

// Refused returns the results whose message refused the action.
func (a ActionAnswer) Refused() []ActionResult {
	var out []ActionResult
	for _, r := range a.Results {
		if r.Code != "" {
			out = append(out, r)
		}
	}
	return out
}

// Hold holds the selected messages: their pending envelopes are not sent until
// released; the deadline still closes them.
func (c *Client) Hold(ctx context.Context, sel Selector, reason string) (ActionAnswer, error) {
	return c.action(ctx, "hold", sel, reason)
}

// Release releases the selected messages' hold; each next attempt keeps its time.
func (c *Client) Release(ctx context.Context, sel Selector, reason string) (ActionAnswer, error) {
	return c.action(ctx, "release", sel, reason)
}

// Cancel closes the selected messages' pending envelopes and the messages
// (closedBy "cancelled"); envelopes already relayed are not recalled.
func (c *Client) Cancel(ctx context.Context, sel Selector, reason string) (ActionAnswer, error) {
	return c.action(ctx, "cancel", sel, reason)
}

// Retry makes the selected messages' pending, unheld envelopes due now, clearing
// backoff and a target's unreachable wait: one attempt now.
func (c *Client) Retry(ctx context.Context, sel Selector, reason string) (ActionAnswer, error) {
	return c.action(ctx, "retry", sel, reason)
}

func (c *Client) action(ctx context.Context, op string, sel Selector, reason string) (ActionAnswer, error) {
	body, err := json.Marshal(ActionRequest{MessageIDs: sel.MessageIDs, Target: sel.Target, Reason: reason})
	if err != nil {
		return ActionAnswer{}, err
	}
	var a ActionAnswer
	hdr := http.Header{"Content-Type": {"application/json"}}
	if err := c.do(ctx, http.MethodPost, "/v1/queue/"+op, hdr, body, &a); err != nil {
		return ActionAnswer{}, err
	}
	return a, nil
}
