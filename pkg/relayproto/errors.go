package relayproto

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// Error is a relay answer other than success: an HTTP status and a stable code,
// sent as {"code":…,"message":…}. A client's mistake is always a 4xx.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// RetryAfter, in seconds, is sent as Retry-After with 503s and 429s.
	RetryAfter int `json:"-"`
	// Cause is what made the relay answer so, for the relay's own logs; it is
	// never sent, so a client's Error has none.
	Cause error `json:"-"`
}

func (e *Error) Error() string { return fmt.Sprintf("relay: %d %s: %s", e.Status, e.Code, e.Message) }

func (e *Error) Unwrap() error { return e.Cause }

// Error codes of the relay protocol (docs/RELAY.md).
const (
	CodeEnvelopeTooLarge  = "ENVELOPE_TOO_LARGE"
	CodeEnvelopeMalformed = "ENVELOPE_MALFORMED"
	CodeEnvelopeVersion   = "ENVELOPE_VERSION"
	CodeEnvelopeSignature = "ENVELOPE_SIGNATURE"
	CodeEnvelopeExpired   = "ENVELOPE_EXPIRED"
	CodeEnvelopeConflict  = "ENVELOPE_CONFLICT"
	CodeBadRequest        = "BAD_REQUEST"
	CodeBodyTooLarge      = "BODY_TOO_LARGE"
	CodeNotFound          = "NOT_FOUND"
	CodeMethodNotAllowed  = "METHOD_NOT_ALLOWED"
	CodeAuthMissing       = "AUTH_MISSING"
	CodeAuthMalformed     = "AUTH_MALFORMED"
	CodeAuthDID           = "AUTH_DID"
	CodeAuthTimestamp     = "AUTH_TIMESTAMP"
	CodeAuthNonceReplayed = "AUTH_NONCE_REPLAYED"
	CodeAuthSignature     = "AUTH_SIGNATURE"
	CodeRelayBusy         = "RELAY_BUSY"
	// CodeRelayQuota (429, with Retry-After): the recipient's inbox holds as
	// many envelopes or bytes as the relay keeps for one recipient.
	CodeRelayQuota = "RELAY_QUOTA"
	// CodeRelayRateLimited (429, with Retry-After): the envelope's sender sent
	// more new envelopes than the relay accepts per second from one sender.
	CodeRelayRateLimited = "RELAY_RATE_LIMITED"
	// CodeRecipientNotAllowed (403): the relay keeps envelopes only for the
	// recipients that registered with it (POST /v1/recipients/register).
	CodeRecipientNotAllowed = "RECIPIENT_NOT_ALLOWED"
	CodeRelayInternal       = "RELAY_INTERNAL"
	// CodeInboxUnwritable and CodeInboxUnreadable (503, with Retry-After): the
	// file relay cannot write or read its inbox (or its list of recipients);
	// CodeRelayStorageUnavailable (503, with Retry-After): the relay's JetStream
	// storage does not answer. Retrying later helps.
	CodeInboxUnwritable         = "INBOX_UNWRITABLE"
	CodeInboxUnreadable         = "INBOX_UNREADABLE"
	CodeRelayStorageUnavailable = "RELAY_STORAGE_UNAVAILABLE"
)

func newError(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// do sends req and returns the body of a 200, or the relay's *Error.
func (c *Client) do(req *http.Request, max int64) ([]byte, error) {
	return c.doWith(req, max, nil)
}

// doWith is do where other answers than 200 and 4xx/5xx errors matter:
// other(status, body) is called for a 2xx other than 200, and its error is
// returned (nil: the answer is refused as an error status).
func (c *Client) doWith(req *http.Request, max int64, other func(status int, body []byte) error) ([]byte, error) {
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > max {
		return nil, fmt.Errorf("relay: answer larger than %d bytes", max)
	}
	if other != nil && resp.StatusCode != http.StatusOK && resp.StatusCode/100 == 2 {
		if err := other(resp.StatusCode, body); err != nil {
			return nil, err
		}
	}
	if resp.StatusCode != http.StatusOK {
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(body, e) != nil || e.Code == "" {
			e.Code, e.Message = "HTTP_"+strconv.Itoa(resp.StatusCode), "relay answered "+resp.Status
		}
		if s := resp.Header.Get("Retry-After"); s != "" {
			e.RetryAfter, _ = strconv.Atoi(s)
		}
		return nil, e
	}
	return body, nil
}
