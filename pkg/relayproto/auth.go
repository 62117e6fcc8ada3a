package relayproto

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Inbox request authentication (docs/RELAY.md). The recipient signs
//
//	"sealbridge/inbox-request/v1" 0x00 METHOD 0x00 REQUEST-URI 0x00 TIMESTAMP 0x00 NONCE 0x00 BODY-SHA256
//
// with its Ed25519 key (identity.SignDomain, five parts): METHOD is the HTTP
// method, REQUEST-URI the path with its query exactly as on the request line,
// TIMESTAMP the Sealbridge-Timestamp header (Unix milliseconds, decimal),
// NONCE the Sealbridge-Nonce header, and BODY-SHA256 the lower-case hex
// SHA-256 of the request body (of no bytes for a GET).
const (
	DomainInboxRequest = "sealbridge/inbox-request/v1"

	HeaderDID       = "Sealbridge-Did"
	HeaderTimestamp = "Sealbridge-Timestamp"
	HeaderNonce     = "Sealbridge-Nonce"
	HeaderSignature = "Sealbridge-Signature"

	// Nonces are 16 to 64 characters of base64url.
	minNonceLen, maxNonceLen = 16, 64
)

var b64 = base64.RawURLEncoding.Strict()

// inboxParts returns the parts a signature covers.
func inboxParts(method, requestURI, timestamp, nonce string, body []byte) [][]byte {
	sum := sha256.Sum256(body)
	return [][]byte{[]byte(method), []byte(requestURI), []byte(timestamp), []byte(nonce),
		[]byte(hex.EncodeToString(sum[:]))}
}

// SignInboxRequest signs req as id at now: it sets the four Sealbridge-*
// headers with a fresh random nonce. The signature covers the method, the
// request URI (req.URL.RequestURI(), which is what net/http sends), the
// timestamp, the nonce and the SHA-256 of the body; the body is read and put
// back (req.GetBody too). Sign each attempt anew: the relay refuses a nonce it
// has seen.
func SignInboxRequest(req *http.Request, id *identity.Identity, now time.Time) error {
	if req == nil || req.URL == nil || id == nil {
		return errors.New("relay: sign inbox request: nil request or identity")
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		if body, err = io.ReadAll(io.LimitReader(req.Body, MaxAckBodySize+1)); err != nil {
			return fmt.Errorf("relay: sign inbox request: read body: %w", err)
		}
		req.Body.Close()
		if len(body) > MaxAckBodySize {
			return fmt.Errorf("relay: sign inbox request: body larger than %d bytes", MaxAckBodySize)
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.ContentLength = int64(len(body))
	}
	var rnd [18]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("relay: sign inbox request: nonce: %w", err)
	}
	nonce := b64.EncodeToString(rnd[:])
	ts := strconv.FormatInt(now.UnixMilli(), 10)
	sig, err := identity.SignDomain(id.Signer(), DomainInboxRequest,
		inboxParts(req.Method, req.URL.RequestURI(), ts, nonce, body)...)
	if err != nil {
		return fmt.Errorf("relay: sign inbox request: %w", err)
	}
	req.Header.Set(HeaderDID, string(id.DID()))
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderNonce, nonce)
	req.Header.Set(HeaderSignature, b64.EncodeToString(sig))
	return nil
}

// InboxAuth is what a verified inbox request proves: who signed it, and the
// nonce it spends.
type InboxAuth struct {
	DID   identity.DID
	Nonce string
}

// VerifyInboxRequest checks the Sealbridge-* headers of a received request
// (req.RequestURI as on its request line) whose body has been read into body,
// at now: well-formed headers, a timestamp within MaxClockSkew of now and not
// before notBefore (the earliest time the verifier can tell a replay from a
// fresh request: the relay's start, its nonce cache being in memory), and a
// signature that verifies under the DID's key. Every refusal is a 401 with one
// of the CodeAuth* codes. Spending the nonce is the caller's: only it knows
// which nonces it has seen.
func VerifyInboxRequest(req *http.Request, body []byte, now, notBefore time.Time) (*InboxAuth, *Error) {
	did, ts, nonce, sigText := req.Header.Get(HeaderDID), req.Header.Get(HeaderTimestamp),
		req.Header.Get(HeaderNonce), req.Header.Get(HeaderSignature)
	if did == "" || ts == "" || nonce == "" || sigText == "" {
		return nil, newError(http.StatusUnauthorized, CodeAuthMissing,
			"signed request required: headers %s, %s, %s and %s", HeaderDID, HeaderTimestamp, HeaderNonce, HeaderSignature)
	}
	pub, err := identity.ParseDID(did)
	if err != nil {
		return nil, &Error{Status: http.StatusUnauthorized, Code: CodeAuthDID, Message: "Sealbridge-Did: " + err.Error(), Cause: err}
	}
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || ms <= 0 || strconv.FormatInt(ms, 10) != ts {
		return nil, newError(http.StatusUnauthorized, CodeAuthMalformed, "Sealbridge-Timestamp is not Unix milliseconds")
	}
	if len(nonce) < minNonceLen || len(nonce) > maxNonceLen || strings.Trim(nonce,
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
		return nil, newError(http.StatusUnauthorized, CodeAuthMalformed,
			"Sealbridge-Nonce must be %d to %d base64url characters", minNonceLen, maxNonceLen)
	}
	sig, err := b64.DecodeString(sigText)
	if err != nil || len(sig) != identity.SignatureSize || b64.EncodeToString(sig) != sigText {
		return nil, newError(http.StatusUnauthorized, CodeAuthMalformed,
			"Sealbridge-Signature is not a canonical base64url Ed25519 signature")
	}
	t := time.UnixMilli(ms)
	if t.Before(now.Add(-MaxClockSkew)) || t.After(now.Add(MaxClockSkew)) {
		return nil, newError(http.StatusUnauthorized, CodeAuthTimestamp,
			"Sealbridge-Timestamp is more than %v from the relay's clock (%d)", MaxClockSkew, now.UnixMilli())
	}
	if t.Before(notBefore) {
		return nil, newError(http.StatusUnauthorized, CodeAuthTimestamp,
			"Sealbridge-Timestamp is before the relay started (%d); sign the request again", notBefore.UnixMilli())
	}
	if !identity.VerifyDomain(pub, DomainInboxRequest, sig, inboxParts(req.Method, req.RequestURI, ts, nonce, body)...) {
		return nil, newError(http.StatusUnauthorized, CodeAuthSignature,
			"the signature does not verify under the key of %s", did)
	}
	return &InboxAuth{DID: identity.DID(did), Nonce: nonce}, nil
}
