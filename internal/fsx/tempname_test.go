package fsx

import (
	"strings"
	"testing"
)

func TestTempNameUnique(t *testing.T) {
	seen := make(map[string]bool, 10000)
	for range 10000 {
		n := TempName()
		if seen[n] {
			t.Fatalf("TempName repeated %q", n)
		}
		seen[n] = true
		if !IsTempName(n) {
			t.Fatalf("IsTempName(%q) = false", n)
		}
		if len(n) != len(".00000000-0000-0000-0000-000000000000.tmp") {
			t.Fatalf("TempName %q has the wrong length", n)
		}
		// A random (version 4, RFC 4122 variant) UUID.
		u := n[1:37]
		if u[14] != '4' || !strings.ContainsRune("89ab", rune(u[19])) {
			t.Fatalf("TempName %q is not a version-4 UUID", n)
		}
		if err := CheckName("outbox/" + n); err != nil {
			t.Fatalf("a temp name is not a valid FS name: %v", err)
		}
		if err := CheckBase(n); err != nil {
			t.Fatalf("a temp name is not a valid base: %v", err)
		}
	}
}

func TestIsTempNameNearMisses(t *testing.T) {
	good := ".1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp"
	if !IsTempName(good) {
		t.Fatalf("IsTempName(%q) = false", good)
	}
	bad := []string{
		"",
		".tmp",
		"..tmp",
		"1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp",      // no leading dot
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427",         // no suffix
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp ",    // trailing space
		" .1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp",    // leading space
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427.TMP",     // suffix case
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp.tmp", // doubled suffix
		"..1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp",    // doubled prefix
		".1B4E28BA-2FA1-41D2-883F-0016D3CCA427.tmp",     // upper-case hex
		".1b4e28ba-2fa1-41d2-883f-0016d3cca42.tmp",      // one digit short
		".1b4e28ba-2fa1-41d2-883f-0016d3cca4270.tmp",    // one digit long
		".1b4e28ba2fa1-41d2-883f-0016d3cca4270.tmp",     // hyphen missing
		".1b4e28ba-2fa141d2-883f-0016d3cca427a.tmp",     // hyphen moved
		".1b4e28ba-2fa1-41d2-883f_0016d3cca427.tmp",     // underscore
		".1b4e28bg-2fa1-41d2-883f-0016d3cca427.tmp",     // non-hex
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427.json",    // a record's suffix
		"1b4e28ba-2fa1-41d2-883f-0016d3cca427.json",     // a record
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp/x",   // a path
		"d/.1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp",   // a path
		".{1b4e28ba-2fa1-41d2-883f-0016d3cca427}.tmp",   // braces
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427\x00.tmp", // NUL
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427\n.tmp",   // newline
		".-1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp",    // extra hyphen
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427-.tmp",    // extra hyphen
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427..tmp",    // extra dot
		".lock",       // the lock
		".generation", // the generation file
		".1b4e28ba-2fa1-41d2-883f-0016d3cca427.tmp\u00a0", // unicode space
	}
	for _, n := range bad {
		if IsTempName(n) {
			t.Errorf("IsTempName(%q) = true", n)
		}
	}
}
