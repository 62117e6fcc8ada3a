package relay

import (
	"net/http"
	"sync"

	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// authenticate verifies the signed inbox request req, whose body has been read
// into body (relayproto.VerifyInboxRequest), spends its nonce, and returns the
// recipient DID it proves.
func (r *Relay) authenticate(req *http.Request, body []byte) (identity.DID, *relayproto.Error) {
	now := r.now()
	// The nonce cache is in memory: a request signed before this process
	// started could be a replay it cannot recognise.
	auth, e := relayproto.VerifyInboxRequest(req, body, now, r.started)
	if e != nil {
		return "", e
	}
	// Only a verified request spends a nonce, so nobody can burn another's.
	switch r.nonces.add(string(auth.DID)+"\x00"+auth.Nonce, now.Add(2*relayproto.MaxClockSkew).UnixMilli(), now.UnixMilli()) {
	case nonceReplayed:
		return "", newError(http.StatusUnauthorized, relayproto.CodeAuthNonceReplayed, "this nonce was already used")
	case nonceFull:
		return "", unavailable(relayproto.CodeRelayBusy, "too many recent inbox requests", nil)
	}
	return auth.DID, nil
}

type nonceResult int

const (
	nonceFresh nonceResult = iota
	nonceReplayed
	nonceFull
)

// nonceCache remembers the nonces of verified requests until their timestamps
// can no longer be accepted.
type nonceCache struct {
	mu        sync.Mutex
	entries   map[string]int64 // key → expiry (Unix ms)
	lastPrune int64
}

func (c *nonceCache) add(key string, expiry, now int64) nonceResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	if exp, ok := c.entries[key]; ok && exp > now {
		return nonceReplayed
	}
	if now-c.lastPrune > 10_000 || len(c.entries) >= maxNonces {
		for k, exp := range c.entries {
			if exp <= now {
				delete(c.entries, k)
			}
		}
		c.lastPrune = now
	}
	if len(c.entries) >= maxNonces {
		return nonceFull
	}
	c.entries[key] = expiry
	return nonceFresh
}
