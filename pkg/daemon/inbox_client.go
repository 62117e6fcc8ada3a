package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// The relay's inbox protocol (docs/RELAY.md "Signed inbox requests"), spoken here
// because pkg/daemon may not import pkg/relay (DESIGN §2).
const (
	inboxDomain     = "sealbridge/inbox-request/v1"
	inboxPath       = "/v1/inbox"
	inboxAckPath    = "/v1/inbox/ack"
	maxInboxPageLen = 64 << 20
)

// inboxEnvelope is one envelope of an inbox page.
type inboxEnvelope struct {
	Cursor         string          `json:"cursor"`
	EnvelopeID     string          `json:"envelopeId"`
	EnvelopeDigest string          `json:"envelopeDigest"`
	ReceivedAt     int64           `json:"receivedAt"`
	Envelope       json.RawMessage `json:"envelope"`
}

type inboxPage struct {
	Envelopes []inboxEnvelope `json:"envelopes"`
	Cursor    string          `json:"cursor"`
	More      bool            `json:"more"`
}

// inboxClient fetches and acknowledges one identity's inbox at one relay.
type inboxClient struct {
	base string
	id   *identity.Identity
	hc   *http.Client
}

func (c *inboxClient) fetch(ctx context.Context, after string, limit int) (*inboxPage, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	q.Set("limit", strconv.Itoa(limit))
	body, err := c.do(ctx, http.MethodGet, inboxPath+"?"+q.Encode(), nil, maxInboxPageLen)
	if err != nil {
		return nil, err
	}
	var p inboxPage
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, fmt.Errorf("inbox: bad page: %w", err)
	}
	return &p, nil
}

func (c *inboxClient) ack(ctx context.Context, ids []string) error {
	data, err := json.Marshal(map[string][]string{"envelopeIds": ids})
	if err != nil {
		return err
	}
	_, err = c.do(ctx, http.MethodPost, inboxAckPath, data, 4<<10)
	return err
}

func (c *inboxClient) do(ctx context.Context, method, path string, body []byte, max int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body == nil {
		req.Body, req.ContentLength = http.NoBody, 0
	} else {
		req.Header.Set("Content-Type", "application/json")
	}
	var rnd [18]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	nonce := base64.RawURLEncoding.EncodeToString(rnd[:])
	ts := strconv.FormatInt(time.Now().UnixMilli(), 10)
	sum := sha256.Sum256(body)
	sig, err := identity.SignDomain(c.id.Signer(), inboxDomain, []byte(method), []byte(req.URL.RequestURI()),
		[]byte(ts), []byte(nonce), []byte(hex.EncodeToString(sum[:])))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Sealbridge-Did", string(c.id.DID()))
	req.Header.Set("Sealbridge-Timestamp", ts)
	req.Header.Set("Sealbridge-Nonce", nonce)
	req.Header.Set("Sealbridge-Signature", base64.RawURLEncoding.EncodeToString(sig))
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("inbox: answer larger than %d bytes", max)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &relayStatusError{status: strconv.Itoa(resp.StatusCode), text: resp.Status + ": " +
			string(bytes.TrimSpace(data[:min(len(data), 512)]))}
	}
	return data, nil
}

// relayStatusError is a relay's answer other than 200.
type relayStatusError struct{ status, text string }

func (e *relayStatusError) Error() string { return "inbox: relay answered " + e.text }
