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

// TestFromDomain: the derived id is a valid version-8 UUID, fixed for a domain and
// name, and changes with either (the domain separates receipt ids from confirmation
// ids of the same envelope).
func TestFromDomain(t *testing.T) {
	a := FromDomain("sealbridge/receipt-id/v1", "0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90")
	if !Valid(a) || a[14] != '8' || !strings.ContainsRune("89ab", rune(a[19])) {
		t.Fatalf("FromDomain = %q: not a version-8 RFC 9562 UUID", a)
	}
	if a != FromDomain("sealbridge/receipt-id/v1", "0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90") {
		t.Fatal("FromDomain is not deterministic")
	}
	if a == FromDomain("sealbridge/confirmation-id/v1", "0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90") ||
		a == FromDomain("sealbridge/receipt-id/v1", "1c7a3e9f-2d45-4b8c-8f32-4a6e7d8c9ba1") {
		t.Fatal("FromDomain ignores its domain or its name")
	}
	// The domain and the name are separated: moving a byte across the boundary changes the id.
	if FromDomain("ab", "c") == FromDomain("a", "bc") {
		t.Fatal("FromDomain does not separate domain and name")
	}
}

// Derived tells FromDomain's ids from random and URL-derived ones.
func TestDerived(t *testing.T) {
	if !Derived(FromDomain("sealbridge/test/v1", "x")) {
		t.Fatal("a FromDomain id is not Derived")
	}
	for _, s := range []string{NewString(), FromURL("https://example.invalid/"), "", "not-a-uuid-at-all-00000000000000000"} {
		if Derived(s) {
			t.Fatalf("%q is Derived", s)
		}
	}
}

// TestFromName checks the RFC 9562 (A.4) example, that the namespace matters, that the
// ids are never Derived (a message of a several-recipient send is not a
// confirmation), and that an invalid namespace panics.
func TestFromName(t *testing.T) {
	if got, want := FromName("6ba7b810-9dad-11d1-80b4-00c04fd430c8", "www.example.com"), "2ed6657d-e927-568b-95e1-2665a8aea6a2"; got != want {
		t.Fatalf("FromName(DNS, www.example.com) = %s, want %s", got, want)
	}
	a, b := NewString(), NewString()
	if FromName(a, "did:key:z1") == FromName(b, "did:key:z1") || FromName(a, "did:key:z1") == FromName(a, "did:key:z2") {
		t.Fatal("FromName ignores its namespace or its name")
	}
	if id := FromName(a, "x"); !Valid(id) || Derived(id) || id[14] != '5' {
		t.Fatalf("FromName = %s: want a valid version-5 id that is not Derived", id)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("FromName with an invalid namespace did not panic")
		}
	}()
	FromName("not-a-uuid", "x")
}
