// Package uuid is sealbridge's one UUID helper: the generator of every random id
// (envelope, message, batch and operation ids, temp-file names), the one validator of
// the id form, and the name-based ids of the test fixtures. It sits at the bottom of
// the package map so that internal/fsx can use it as well as pkg/envelope.
package uuid

import (
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
)

// NewString returns a fresh random (version 4) UUID in its lower-case hyphenated
// form. crypto/rand never fails on the platforms Go supports (it aborts the program
// rather than return short), so there is no error to handle.
func NewString() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	return format(b)
}

// namespaceURL is the URL namespace of RFC 9562.
const namespaceURL = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"

// FromURL returns the name-based (version 5, SHA-1) UUID of url in the URL namespace:
// the same id for the same url on every run. Only fixed test fixtures use it; every
// live id is NewString's or FromName's.
func FromURL(url string) string { return FromName(namespaceURL, url) }

// FromName returns the name-based (version 5, RFC 9562) UUID of name in namespace,
// itself a UUID (Valid; FromName panics on anything else, a programming error): the
// same id for the same pair on every run. The daemon names the messages of a send to
// several recipients with it (namespace: the first message's id, name: the
// recipient's did:key), so a retry after a crash finds each again; being version 5,
// those ids are never Derived.
func FromName(namespace, name string) string {
	if !Valid(namespace) {
		panic("uuid.FromName: the namespace is not a UUID")
	}
	var ns [16]byte
	hexDigits := namespace[0:8] + namespace[9:13] + namespace[14:18] + namespace[19:23] + namespace[24:36]
	if _, err := hex.Decode(ns[:], []byte(hexDigits)); err != nil {
		panic("uuid.FromName: " + err.Error())
	}
	h := sha1.New()
	h.Write(ns[:])
	h.Write([]byte(name))
	var b [16]byte
	copy(b[:], h.Sum(nil))
	b[6] = b[6]&0x0f | 0x50 // version 5
	b[8] = b[8]&0x3f | 0x80
	return format(b)
}

// FromDomain returns the name-based (version 8, RFC 9562) UUID made from
// SHA-256(domain 0x00 name): the derived ids of records (a receipt's id from its
// envelope id, a confirmation's message id), so that a retry after a crash finds the
// same file and a sender's chosen id never names a file by itself.
func FromDomain(domain, name string) string {
	sum := sha256.Sum256([]byte(domain + "\x00" + name))
	var b [16]byte
	copy(b[:], sum[:16])
	b[6] = b[6]&0x0f | 0x80 // version 8
	b[8] = b[8]&0x3f | 0x80
	return format(b)
}

// Derived reports whether s is a valid UUID of the version FromDomain makes (8): an id
// derived from a domain and a name, never a random one (NewString's are version 4).
func Derived(s string) bool { return Valid(s) && s[14] == '8' }

func format(b [16]byte) string {
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

// Valid reports whether s is a lower-case hyphenated UUID (8-4-4-4-12 hex digits; any
// version and variant): the form of every envelope, message and record id and of the
// uuid in a temp-file name.
func Valid(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return false
			}
		} else if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
