package identity_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// TestParseDIDLengthBound: the length bound is 128 bytes inclusive. A 128-byte input is
// parsed (and refused for what it is), a 129-byte one is refused for its length
// before any decoding.
func TestParseDIDLengthBound(t *testing.T) {
	at := "did:key:z" + strings.Repeat("1", 128-len("did:key:z"))
	if len(at) != 128 {
		t.Fatalf("test input is %d bytes", len(at))
	}
	_, err := identity.ParseDID(at)
	if err == nil || errors.Is(err, identity.ErrDIDLength) {
		t.Fatalf("ParseDID(128 bytes) = %v, want a non-length error", err)
	}
	if !errors.Is(err, identity.ErrDIDMulticodec) {
		t.Fatalf("ParseDID(128 bytes of base58 zeros) = %v, want ErrDIDMulticodec", err)
	}
	_, err = identity.ParseDID(at + "1")
	if !errors.Is(err, identity.ErrDIDLength) {
		t.Fatalf("ParseDID(129 bytes) = %v, want ErrDIDLength", err)
	}
}

// TestLoadKeyFileReadsToTheLimit: a key file of exactly 16 KiB is read whole. A key
// padded with white space to the limit loads; the same file with its last byte made
// non-space is refused for that byte, which a short read would miss.
func TestLoadKeyFileReadsToTheLimit(t *testing.T) {
	const limit = 16 << 10
	dir := t.TempDir()
	id, path := writeKey(t, dir, "k")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	padded := append(data, bytes.Repeat([]byte("\n"), limit-len(data))...)

	full := filepath.Join(dir, "full")
	if err := os.WriteFile(full, padded, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := identity.LoadKeyFile(full)
	if err != nil {
		t.Fatalf("a %d-byte key file: %v", limit, err)
	}
	if !got.Public().Equal(id.Public()) {
		t.Fatal("the padded key file loads another key")
	}

	padded[limit-1] = 'x'
	tail := filepath.Join(dir, "tail")
	if err := os.WriteFile(tail, padded, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.LoadKeyFile(tail); !errors.Is(err, identity.ErrKeyFileFormat) {
		t.Fatalf("a %d-byte key file ending in a non-space byte: %v, want ErrKeyFileFormat", limit, err)
	}
}

// TestSignDomainRefusesLeadingZeroInPart: a 0x00 anywhere in a part but the last makes
// the message ambiguous, also as the part's first byte; the error names the part.
func TestSignDomainRefusesLeadingZeroInPart(t *testing.T) {
	id := newID(t)
	for _, tc := range []struct {
		parts [][]byte
		part  string
	}{
		{[][]byte{[]byte("\x00ab"), []byte("c")}, "part 1 "},
		{[][]byte{[]byte("a"), []byte("\x00"), []byte("c")}, "part 2 "},
	} {
		_, err := identity.SignDomain(id.Signer(), "test-domain", tc.parts...)
		if !errors.Is(err, identity.ErrDomain) {
			t.Fatalf("SignDomain(%q) = %v, want ErrDomain", tc.parts, err)
		}
		if !strings.Contains(err.Error(), tc.part) {
			t.Fatalf("SignDomain(%q) = %v, want it to name %q", tc.parts, err, tc.part)
		}
	}
	// In the last part a 0x00 is unambiguous.
	sig, err := identity.SignDomain(id.Signer(), "test-domain", []byte("a"), []byte("\x00b"))
	if err != nil {
		t.Fatal(err)
	}
	if !identity.VerifyDomain(id.Public(), "test-domain", sig, []byte("a"), []byte("\x00b")) {
		t.Fatal("a signature over a last part with 0x00 does not verify")
	}
}

// TestSignDomainRefusesAmbiguousDomains: an empty domain, a domain with 0x00 (at its
// start too) and a message of no parts are refused, and never verify.
func TestSignDomainRefusesAmbiguousDomains(t *testing.T) {
	id := newID(t)
	good, err := identity.SignDomain(id.Signer(), "d", []byte("p"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		domain string
		parts  [][]byte
	}{
		{"", [][]byte{[]byte("p")}},
		{"\x00d", [][]byte{[]byte("p")}},
		{"d\x00", [][]byte{[]byte("p")}},
		{"d", nil},
	} {
		if _, err := identity.SignDomain(id.Signer(), tc.domain, tc.parts...); !errors.Is(err, identity.ErrDomain) {
			t.Errorf("SignDomain(%q, %q) = %v, want ErrDomain", tc.domain, tc.parts, err)
		}
		if identity.VerifyDomain(id.Public(), tc.domain, good, tc.parts...) {
			t.Errorf("VerifyDomain(%q, %q) = true", tc.domain, tc.parts)
		}
	}
}
