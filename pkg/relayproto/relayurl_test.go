package relayproto

import (
	"errors"
	"strings"
	"testing"
)

func TestCanonicalRelayURL(t *testing.T) {
	for raw, want := range map[string]string{
		"http://127.0.0.1:9":                 "http://127.0.0.1:9",
		"http://127.0.0.1:9/":                "http://127.0.0.1:9",
		"HTTP://Relay.Example:80/":           "http://relay.example",
		"https://relay.example:443":          "https://relay.example",
		"https://relay.example:80":           "https://relay.example:80",
		"http://relay.example:/":             "http://relay.example",
		"http://relay.example/base/":         "http://relay.example/base/",
		"http://relay.example/Base":          "http://relay.example/Base",
		"http://[::1]:8470/":                 "http://[::1]:8470",
		"http://[::1]:80":                    "http://[::1]",
		"https://relay.example:8470/v1/x%20": "https://relay.example:8470/v1/x%20",
	} {
		got, err := CanonicalRelayURL(raw)
		if err != nil || got != want {
			t.Errorf("CanonicalRelayURL(%q) = %q, %v; want %q", raw, got, err, want)
			continue
		}
		if again, err := CanonicalRelayURL(got); err != nil || again != got {
			t.Errorf("not idempotent: %q -> %q, %v", got, again, err)
		}
	}
	for raw, hint := range map[string]string{
		"ftp://x": "", "x": "", "/v1": "", "http://": "", "http:///path": "", "mailto:a@b": "",
		"http://relay.example:8470 x":         "",
		"https://user:secret@Relay.Example/":  "use https://relay.example",
		"http://relay.example/#frag":          "use http://relay.example",
		"http://relay.example/?q=1":           "use http://relay.example",
		"http://relay.example:80/p?":          "use http://relay.example/p",
		"http://" + strings.Repeat("a", 2048): "",
	} {
		got, err := CanonicalRelayURL(raw)
		var ue *RelayURLError
		if !errors.As(err, &ue) || ue.Code != CodeRelayURLInvalid {
			t.Errorf("CanonicalRelayURL(%q) = %q, %v; want a refusal", raw, got, err)
			continue
		}
		if h := RelayURLHint(err); h != hint {
			t.Errorf("CanonicalRelayURL(%q): hint %q, want %q", raw, h, hint)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("the refusal repeats user information: %v", err)
		}
	}
}
