package fsck

import (
	"strings"
	"testing"
	"time"
)

func TestSanitize(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"signature does not verify", "signature does not verify"},
		{"record is not signed by the store's owner", "record is not signed by the store's owner"},
		{`record kind "messages" does not match its directory "receipts"`, `record kind "messages" does not match its directory "receipts"`},
		{`messages payload: unknown key "secretField"`, `messages payload: unknown key "…"`},
		{`status "TOP-SECRET" is unknown`, `status "…" is unknown`},
		{`record header: invalid character 'S' looking for beginning of value`, `record header: invalid character '…' looking for beginning of value`},
		{`escaped "a\"SECRET\"b" value`, `escaped "…" value`},
		{`unterminated "SECRET`, `unterminated "…"`},
		{"first line\nSECRET second line", "first line"},
		{strings.Repeat("x", 500), strings.Repeat("x", maxExplanation) + "…"},
	} {
		if got := sanitize(c.in); got != c.want {
			t.Errorf("sanitize(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestHumanAge(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{30 * time.Second, "less than a minute"},
		{90 * time.Second, "1 min"},
		{time.Hour, "1 h"},
		{3*time.Hour + 59*time.Minute, "3 h"},
		{72 * time.Hour, "3 days"},
	} {
		if got := humanAge(c.d); got != c.want {
			t.Errorf("humanAge(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
