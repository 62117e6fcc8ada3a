// Package client is the Go client of sealbridged's local API (docs/DAEMON.md): HTTP
// over the daemon's unix socket, JSON bodies, errors as {code, message}.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// SendRequest is the body of POST /v1/messages. To is the recipients' did:keys (one,
// or up to MaxRecipients distinct ones: one message each, see Client.SendAll); Body is
// base64 in JSON; DeadlineMs is the delivery deadline in Unix milliseconds (0: the
// daemon uses now + 24 h).
type SendRequest struct {
	To         Recipients `json:"to"`
	RelayURL   string     `json:"relayUrl"`
	Body       []byte     `json:"body"`
	DeadlineMs int64      `json:"deadline,omitempty"`
}

// MaxRecipients bounds the recipients of one send.
const MaxRecipients = 64

// Recipients is the "to" of a send: in JSON a string for one recipient (the form every
// earlier request used, so a retry's request digest is unchanged) or an array of
// strings for several.
type Recipients []string

// MarshalJSON writes one recipient as a string and several as an array.
func (r Recipients) MarshalJSON() ([]byte, error) {
	if len(r) == 1 {
		return json.Marshal(r[0])
	}
	return json.Marshal([]string(r))
}

// UnmarshalJSON reads a string or an array of strings.
func (r *Recipients) UnmarshalJSON(data []byte) error {
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '"' {
		var one string
		if err := json.Unmarshal(data, &one); err != nil {
			return err
		}
		*r = Recipients{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(data, &many); err != nil {
		return err
	}
	*r = many
	return nil
}

// SendResult is the answer to a send to several recipients: one message per
// recipient, in the order of the request's To.
type SendResult struct {
	Messages []Message `json:"messages"`
}

// Message is a sent message's status as the daemon reports it. For a queued
// message, LastError is the last failed attempt's error and NextAttemptAt when the
// next attempt is due (zero: now, or none scheduled); for a closed one LastError is
// why it closed (the relay's answer to a refused one) and ClosedBy by what
// (deadline, refused, expired, cancelled). Kind says what the message is:
// KindMessage, one the user sent, or KindConfirmation, the delivery confirmation the
// daemon sent back for a message it received (relayed is its last status: nothing
// confirms a confirmation).
type Message struct {
	MessageID     string    `json:"messageId"`
	Kind          string    `json:"kind,omitempty"`
	Status        string    `json:"status"`
	ClosedBy      string    `json:"closedBy,omitempty"`
	LastError     string    `json:"lastError,omitempty"`
	To            string    `json:"to"`
	RelayURL      string    `json:"relayUrl"`
	Attempts      int       `json:"attempts"`
	NextAttemptAt time.Time `json:"nextAttemptAt,omitzero"`
	// WaitingFor, for a queued message not due now, is what its next attempt waits
	// for: "target" (its relay is in an unreachable wait: NextAttemptAt is the
	// target's next probe, LastError the target's last error if the message has
	// none; `retry` attempts it now), "backoff" (its own retry delay), "lease" (an
	// attempt is under way until LeaseUntil) or "held".
	WaitingFor string    `json:"waitingFor,omitempty"`
	LeaseUntil time.Time `json:"leaseUntil,omitzero"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	Deadline   time.Time `json:"deadline"`

	// Held is an operator's hold in force, Operator the last operator action on the
	// message.
	Held     *OperatorAction `json:"held,omitempty"`
	Operator *OperatorAction `json:"operator,omitempty"`
	// Error, set only on an entry of a list, says that this message's record could
	// not be read (OUTBOX_STORE_INVALID: run sealbridge-fsck); the entry then carries
	// only MessageID.
	Error *Error `json:"error,omitempty"`
}

// Message kinds (Message.Kind).
const (
	KindMessage      = "message"
	KindConfirmation = "confirmation"
)

// MessageList is one page of GET /v1/messages; Next, if set, is the `after` of the
// next page.
type MessageList struct {
	Messages []Message `json:"messages"`
	Next     string    `json:"next,omitempty"`
}

// Error is an error answered by the daemon: the HTTP status and the JSON {code, message}.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Outcome is "unknown" when a failed send's message may have been accepted
	// nonetheless (MessageID names it): retry with the same Idempotency-Key. Hint
	// is the daemon's advice, if any.
	Outcome   string `json:"outcome,omitempty"`
	MessageID string `json:"messageId,omitempty"`
	Hint      string `json:"hint,omitempty"`
	// RetryAfter is the answer's Retry-After in seconds, as a duration (0: none).
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string {
	if e.Status < 300 {
		// A stream that broke after its successful header: the status says nothing.
		return fmt.Sprintf("sealbridged: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("sealbridged: %d %s: %s", e.Status, e.Code, e.Message)
}

// Is reports whether target is the errcode sentinel of e's code, so that
// errors.Is(err, errcode.IdempotencyKeyReused) works across the socket.
func (e *Error) Is(target error) bool {
	c := errcode.Lookup(e.Code)
	return c != nil && target == error(c)
}

// SocketPath returns where the daemon of identity did under the data root listens:
// $XDG_RUNTIME_DIR/sealbridge/<short id>.sock when XDG_RUNTIME_DIR is set (an
// absolute path), otherwise <dataRoot>/run/<short id>.sock (internal/dataroot).
func SocketPath(dataRoot string, did string) string {
	return dataroot.SocketPaths(dataRoot, did)[0]
}

// Locate returns the socket of identity did's daemon: the first of its candidate
// paths (SocketPath, then <dataRoot>/run/<short id>.sock) that exists as a
// socket, or SocketPath if none does. A daemon started with another
// $XDG_RUNTIME_DIR than the caller's is found this way.
func Locate(dataRoot string, did string) string {
	return locate(dataroot.SocketPaths(dataRoot, did))
}

func locate(candidates []string) string {
	for _, p := range candidates {
		if isSocket(p) {
			return p
		}
	}
	return candidates[0]
}

func isSocket(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// Client talks to one daemon over its unix socket. It is safe for concurrent use.
type Client struct {
	candidates []string // the socket paths it dials, in order (one for New)
	hc         *http.Client
}

// New returns a client of the daemon listening on socketPath.
func New(socketPath string) *Client {
	return newClient([]string{socketPath})
}

// ForIdentity returns a client of identity did's daemon under the data root. Each
// connection goes to the first of the identity's candidate socket paths (see
// Locate) that exists as a socket; one that refuses the connection (left by a
// daemon that died) is passed over for the next. If none exists the error names
// SocketPath.
func ForIdentity(dataRoot string, did string) *Client {
	return newClient(dataroot.SocketPaths(dataRoot, did))
}

func newClient(candidates []string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx, candidates)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
		// A streamed send asks for 100-continue (SendStream): the daemon answers a
		// refusal it can make from the headers before the body is sent.
		ExpectContinueTimeout: 5 * time.Second,
	}
	return &Client{candidates: candidates, hc: &http.Client{Transport: tr}}
}

// dial connects to the first candidate that exists as a socket and accepts the
// connection; with none, it dials the first candidate for its error.
func dial(ctx context.Context, candidates []string) (net.Conn, error) {
	var d net.Dialer
	var first error
	for _, p := range candidates {
		if len(candidates) > 1 && !isSocket(p) {
			continue
		}
		c, err := d.DialContext(ctx, "unix", p)
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
	}
	if first != nil {
		return nil, first
	}
	return d.DialContext(ctx, "unix", candidates[0])
}

// socketPath returns the socket the client dials: for a client of ForIdentity, the
// one Locate finds now.
func (c *Client) socketPath() string { return locate(c.candidates) }

// Send asks the daemon to send a message. A non-empty idempotencyKey is sent as the
// Idempotency-Key header: the same key with the same request answers the same
// response; with another request, IDEMPOTENCY_KEY_REUSED.
func (c *Client) Send(ctx context.Context, r SendRequest, idempotencyKey string) (*Message, error) {
	if len(r.To) != 1 {
		return nil, fmt.Errorf("client: Send takes one recipient, this request has %d (use SendAll)", len(r.To))
	}
	ms, err := c.SendAll(ctx, r, idempotencyKey)
	if err != nil {
		return nil, err
	}
	return &ms[0], nil
}

// SendAll sends r to each of its recipients (one message each) and returns their
// messages in the order of r.To. With more than one recipient the daemon requires an
// Idempotency-Key: each recipient's message is accepted on its own, and a retry with
// the same key finishes a send that failed part-way.
func (c *Client) SendAll(ctx context.Context, r SendRequest, idempotencyKey string) ([]Message, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	hdr := http.Header{"Content-Type": {"application/json"}}
	if idempotencyKey != "" {
		hdr.Set("Idempotency-Key", idempotencyKey)
	}
	if len(r.To) == 1 {
		var m Message
		if err := c.do(ctx, http.MethodPost, "/v1/messages", hdr, body, &m); err != nil {
			return nil, err
		}
		return []Message{m}, nil
	}
	var res SendResult
	if err := c.do(ctx, http.MethodPost, "/v1/messages", hdr, body, &res); err != nil {
		return nil, err
	}
	if len(res.Messages) != len(r.To) {
		return nil, fmt.Errorf("client: the daemon answered %d messages for %d recipients", len(res.Messages), len(r.To))
	}
	return res.Messages, nil
}

// Message returns a sent message's status; a missing one answers an *Error with
// Status 404.
func (c *Client) Message(ctx context.Context, id string) (*Message, error) {
	var m Message
	if err := c.do(ctx, http.MethodGet, "/v1/messages/"+url.PathEscape(id), nil, nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Messages lists sent messages by id, optionally of one status, limit per page
// (0: the daemon's default), after the given message id.
func (c *Client) Messages(ctx context.Context, status string, limit int, after string) (*MessageList, error) {
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if after != "" {
		q.Set("after", after)
	}
	path := "/v1/messages"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var l MessageList
	if err := c.do(ctx, http.MethodGet, path, nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Live checks GET /livez.
func (c *Client) Live(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/livez", nil, nil, nil)
}

// Ready checks GET /readyz.
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", nil, nil, nil)
}

// maxResponse bounds a response body.
const maxResponse = 16 << 20

func (c *Client) do(ctx context.Context, method, path string, hdr http.Header, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://sealbridged"+path, rd)
	if err != nil {
		return err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return c.roundTrip(req, out)
}

// answerError reads a non-2xx answer into an *Error: its JSON {code, message, …},
// or the status text and the body when it is not one.
func (c *Client) answerError(resp *http.Response) error {
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("sealbridged at %s: %w", c.socketPath(), err)
	}
	e := &Error{Status: resp.StatusCode}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	if jerr := json.Unmarshal(data, e); jerr != nil || e.Code == "" {
		e.Code = http.StatusText(resp.StatusCode)
		e.Message = string(bytes.TrimSpace(data))
	}
	return e
}

// IsNotRunning reports whether err means no daemon listens on the socket (it is
// missing or refuses connections).
func IsNotRunning(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return false
	}
	var op *net.OpError
	var pe *os.PathError
	return (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &pe)
}
