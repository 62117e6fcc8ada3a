package relayproto

import (
	"errors"
	"net"
	"net/url"
	"strings"
)

// CodeRelayURLInvalid is the stable code of a relay URL CanonicalRelayURL refuses.
const CodeRelayURLInvalid = "RELAY_URL_INVALID"

// MaxRelayURL bounds a relay URL (as records keep it, record.ValidRelayURL).
const MaxRelayURL = 2048

// RelayURLError is CanonicalRelayURL's refusal: a stable Code
// (CodeRelayURLInvalid), why, and Hint, which shows the canonical form the URL
// would have without what is refused ("use https://relay.example"), when there is
// one ("" otherwise). Its message never repeats the URL (it may carry a password).
type RelayURLError struct {
	Code   string
	Reason string
	Hint   string
}

func (e *RelayURLError) Error() string { return "relay URL: " + e.Reason }

// CanonicalRelayURL returns the one form of relay URL raw that sealbridge keeps and
// compares: scheme and host in lower case, the scheme's default port (80 for http,
// 443 for https) and an empty port dropped, and the "/" of an empty path dropped
// ("HTTP://Relay.Example:80/" is "http://relay.example"); any other path is kept as
// it is. It refuses (a *RelayURLError) a URL
// that is not absolute http or https with a host, or that carries user
// information, a query or a fragment, or is over MaxRelayURL bytes. It is pure and
// safe for concurrent use; a canonical URL is its own canonical form.
func CanonicalRelayURL(raw string) (string, error) {
	refuse := func(reason, hint string) (string, error) {
		if hint != "" {
			hint = "use " + hint
		}
		return "", &RelayURLError{Code: CodeRelayURLInvalid, Reason: reason, Hint: hint}
	}
	if len(raw) > MaxRelayURL {
		return refuse("over 2048 bytes", "")
	}
	if strings.ContainsFunc(raw, func(c rune) bool { return c <= 0x20 || c == 0x7f }) {
		return refuse("contains a space or a control character", "")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return refuse("not a URL", "")
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return refuse("not an http or https URL", "")
	}
	if u.Opaque != "" || u.Host == "" {
		return refuse("has no host", "")
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return refuse("has no host", "")
	}
	host = strings.ToLower(host)
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if port != "" {
		host = net.JoinHostPort(host, port)
	} else if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	path := u.EscapedPath()
	if path == "/" {
		path = ""
	}
	canon := scheme + "://" + host + path
	switch {
	case u.User != nil:
		return refuse("carries user information", canon)
	case u.RawQuery != "" || u.ForceQuery:
		return refuse("has a query", canon)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return refuse("has a fragment", canon)
	}
	if len(canon) > MaxRelayURL {
		return refuse("over 2048 bytes", "")
	}
	return canon, nil
}

// RelayURLHint returns the hint of a refusal of CanonicalRelayURL in err's chain,
// or "" (none, or no such refusal).
func RelayURLHint(err error) string {
	var e *RelayURLError
	if errors.As(err, &e) {
		return e.Hint
	}
	return ""
}

// RelayURLFix is what to tell someone whose relay URL CanonicalRelayURL refused
// (err): the canonical form to use when there is one (RelayURLHint), else what a
// relay URL is.
func RelayURLFix(err error) string {
	if h := RelayURLHint(err); h != "" {
		return h
	}
	return "give an http or https URL with a host and no user information, query or fragment, e.g. https://relay.example:8470"
}
