package record

import (
	"bytes"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// formatVersion is the record file format version ("v").
const formatVersion = 1

// fileHeader is the outer object of a record file, in its fixed key order.
type fileHeader struct {
	V       int             `json:"v"`
	Kind    Kind            `json:"kind"`
	ID      string          `json:"id"`
	Signer  string          `json:"signer"`
	Payload json.RawMessage `json:"payload"`
	Sig     string          `json:"sig"`
}

var sigEncoding = base64.RawURLEncoding.Strict()

// marshalPayload encodes r compactly without HTML escaping, so embedded raw JSON
// (envelopes, facts, responses) keeps its exact bytes.
func marshalPayload(r Record) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// ErrInvalid is wrapped by Encode's errors for a record that cannot be
// written: it fails its validation, or it would not read back as the same record.
var ErrInvalid = errors.New("record is invalid")

// Encode validates r and returns its signed one-line file bytes:
//
//	{"v":1,"kind":K,"id":I,"signer":DID,"payload":{…},"sig":"<base64url>"}\n
//
// The signature is Ed25519 by signer over
// "sealbridge/record/v1" 0x00 kind 0x00 id 0x00 payload-bytes.
//
// It refuses a record whose encoding would not parse back strictly
// to the same record — say a string that is not UTF-8 (the encoder would replace it),
// or raw JSON with duplicate keys — so a write that is acknowledged always reads back.
func Encode(signer crypto.Signer, owner identity.DID, r Record) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	kind, id := r.Kind(), r.RecordID()
	if err := CheckKindID(kind, id); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	payload, err := marshalPayload(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	back := newRecord(kind)
	if err := json.Unmarshal(payload, back); err != nil || !reflect.DeepEqual(back, r) {
		return nil, fmt.Errorf("%w: it does not read back as written (non-UTF-8 text or duplicate keys?)", ErrInvalid)
	}
	sig, err := identity.SignDomain(signer, identity.DomainRecord, []byte(kind), []byte(id), payload)
	if err != nil {
		return nil, err
	}
	prefix := headerPrefix(kind, id, owner)
	line := make([]byte, 0, len(prefix)+len(payload)+len(sigSuffix))
	line = append(line, prefix...)
	line = append(line, payload...)
	line = append(line, `,"sig":"`...)
	line = append(line, sigEncoding.EncodeToString(sig)...)
	return append(line, "\"}\n"...), nil
}

// sigB64Len is the length of a signature in unpadded base64url.
const sigB64Len = 86

// sigSuffix has the shape of the end of every record line.
var sigSuffix = []byte(`,"sig":"` + strings.Repeat("A", sigB64Len) + "\"}\n")

// headerPrefix is the start of the canonical line of record kind/id signed by owner:
// kind is one of the kinds, id a UUID or hex digest, owner a did:key (base58): none
// needs escaping in JSON.
func headerPrefix(kind Kind, id string, owner identity.DID) []byte {
	return []byte(`{"v":1,"kind":"` + string(kind) + `","id":"` + id + `","signer":"` + string(owner) + `","payload":`)
}

// headerError explains why a line does not match its canonical template, decoding it
// leniently only for the explanation.
func headerError(kind Kind, id string, data []byte, owner identity.DID) error {
	var h fileHeader
	if err := json.Unmarshal(bytes.TrimSuffix(data, []byte("\n")), &h); err != nil {
		return fmt.Errorf("record header: %w", err)
	}
	switch {
	case h.V != formatVersion:
		return invalid("unknown format version %d", h.V)
	case h.Kind != kind:
		return invalid("record kind %q does not match its directory %q", h.Kind, kind)
	case h.ID != id:
		return invalid("record id does not match its file name")
	case h.Signer != string(owner):
		return invalid("record is not signed by the store's owner")
	}
	return invalid("record is not in canonical form")
}

// Parse checks every content rule of docs/FORMAT.md §4 on the bytes of the file
// "<kind>/<id>.json" and returns the typed record. The bytes must be exactly the
// canonical line Encode writes: one line ending in '\n', v known, kind and id
// those of the path, signer the owner, the signature verifying over the exact payload
// bytes, the payload the canonical encoding of the kind's schema (so no unknown,
// duplicate or case-variant keys) passing its validation, and the record's own id
// that of the path. File
// properties (regular file, one link, owner, mode, size) are the reader's to check.
func Parse(kind Kind, id string, data []byte, owner identity.DID, ownerKey identity.PublicKey) (Record, error) {
	if err := CheckKindID(kind, id); err != nil {
		return nil, err
	}
	if len(data) == 0 || data[len(data)-1] != '\n' || bytes.IndexByte(data[:len(data)-1], '\n') >= 0 {
		return nil, invalid("record is not exactly one line")
	}
	// The line must be exactly the canonical line for this kind, id and owner. That
	// is a fixed template around the payload and the signature, so checking it
	// refuses unknown, duplicate and case-variant keys, whitespace, reordering,
	// escapes and alternative encodings at once, without decoding the header.
	prefix := headerPrefix(kind, id, owner)
	n := len(data)
	if n < len(prefix)+len(sigSuffix)+2 || !bytes.HasPrefix(data, prefix) ||
		!bytes.Equal(data[n-len(sigSuffix):n-sigB64Len-3], sigSuffix[:len(sigSuffix)-sigB64Len-3]) ||
		!bytes.Equal(data[n-3:], []byte("\"}\n")) {
		return nil, headerError(kind, id, data, owner)
	}
	payload := data[len(prefix) : n-len(sigSuffix)]
	sigText := string(data[n-sigB64Len-3 : n-3])
	sig, err := sigEncoding.DecodeString(sigText)
	if err != nil || len(sig) != identity.SignatureSize || sigEncoding.EncodeToString(sig) != sigText {
		// The decoder skips '\r' and '\n': only the canonical encoding is accepted.
		return nil, invalid("malformed signature")
	}
	if !identity.VerifyDomain(ownerKey, identity.DomainRecord, sig, []byte(kind), []byte(id), payload) {
		return nil, invalid("signature does not verify")
	}
	// The payload too must be the canonical encoding of its schema (the same rule
	// as the header); raw JSON inside it is checked for duplicate keys by Validate.
	r := newRecord(kind)
	if err := json.Unmarshal(payload, r); err != nil {
		return nil, fmt.Errorf("%s payload: %w", kind, err)
	}
	if canon, err := marshalPayload(r); err != nil || !bytes.Equal(canon, payload) {
		return nil, invalid("%s payload is not in canonical form (unknown, duplicate or misspelt keys?)", kind)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if r.RecordID() != id {
		return nil, invalid("the record's own id does not match its file name")
	}
	return r, nil
}

var errDepth = errors.New("JSON nested too deeply")

// errNotCompact reports whitespace outside strings in raw JSON.
var errNotCompact = errors.New("JSON is not compact")

// checkRawKeys checks raw JSON, which must already be valid, for whitespace outside
// strings, duplicate keys in any object (comparing keys after unescaping), and nesting
// deeper than max.
func checkRawKeys(data []byte, max int) error {
	type frame struct {
		obj, wantKey bool
		keys         []string
		set          map[string]bool
	}
	var stack []frame
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			return errNotCompact
		case '{', '[':
			if len(stack) >= max {
				return errDepth
			}
			stack = append(stack, frame{obj: data[i] == '{', wantKey: data[i] == '{'})
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		case ',':
			if n := len(stack); n > 0 && stack[n-1].obj {
				stack[n-1].wantKey = true
			}
		case '"':
			j, escaped := i+1, false
			for ; j < len(data) && data[j] != '"'; j++ {
				if data[j] == '\\' {
					escaped = true
					j++
				}
			}
			if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
				f := &stack[n-1]
				key := string(data[i+1 : j])
				if escaped {
					if err := json.Unmarshal(data[i:j+1], &key); err != nil {
						return err
					}
				}
				if f.set == nil && len(f.keys) >= 16 {
					f.set = make(map[string]bool, 2*len(f.keys))
					for _, k := range f.keys {
						f.set[k] = true
					}
				}
				dup := slices.Contains(f.keys, key)
				if f.set != nil {
					dup = f.set[key]
					f.set[key] = true
				} else {
					f.keys = append(f.keys, key)
				}
				if dup {
					return fmt.Errorf("duplicate key %q", key)
				}
				f.wantKey = false
			}
			i = j
		}
	}
	return nil
}
