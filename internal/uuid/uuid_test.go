package uuid

import (
	"strings"
	"testing"
)

func TestNewStringIsValidVersion4AndFresh(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		s := NewString()
		if !Valid(s) {
			t.Fatalf("NewString() = %q is not Valid", s)
		}
		if s[14] != '4' || !strings.ContainsRune("89ab", rune(s[19])) {
			t.Fatalf("NewString() = %q: not version 4 with the RFC variant", s)
		}
		if seen[s] {
			t.Fatalf("NewString repeated %q", s)
		}
		seen[s] = true
	}
}

// TestFromURLKnownAnswers pins the version-5 ids: the fixtures' golden files hold them.
// The values are those of the RFC 9562 algorithm (as github.com/google/uuid's NewSHA1
// with NameSpaceURL computes them).
func TestFromURLKnownAnswers(t *testing.T) {
	for url, want := range map[string]string{
		"https://www.example.com/":                      "3d3ed9d2-aa3d-5fa6-90e8-ed662e90f559",
		"https://sealbridge.invalid/fsfixtures/message": "a4a80db8-a0df-511a-8d79-40c3169c39d6",
	} {
		got := FromURL(url)
		if got != want {
			t.Errorf("FromURL(%q) = %s, want %s", url, got, want)
		}
		if !Valid(got) || got[14] != '5' || !strings.ContainsRune("89ab", rune(got[19])) {
			t.Errorf("FromURL(%q) = %s: not a version-5 UUID", url, got)
		}
		if FromURL(url) != got {
			t.Errorf("FromURL(%q) is not stable", url)
		}
	}
}

func TestValidNearMisses(t *testing.T) {
	good := "0f8fad5b-d9cb-469f-a165-70867728950e"
	if !Valid(good) {
		t.Fatalf("Valid(%q) = false", good)
	}
	for _, s := range []string{
		"", good[:35], good + "0", strings.ToUpper(good),
		"0f8fad5bd-9cb-469f-a165-70867728950e", // hyphen moved
		"0f8fad5b-d9cb-469f-a165-70867728950g", // not hex
		"0f8fad5b-d9cb-469f-a165_70867728950e", // not a hyphen
		"{0f8fad5b-d9cb-469f-a165-70867728950}",
	} {
		if Valid(s) {
			t.Errorf("Valid(%q) = true", s)
		}
	}
}
