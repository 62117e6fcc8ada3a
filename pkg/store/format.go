package store

import (
	"bytes"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// FormatVersion is the record file format version ("v").
const FormatVersion = 1

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

// ErrRecordInvalid is wrapped by EncodeRecord's errors for a record that cannot be
// written: it fails its validation, or it would not read back as the same record.
var ErrRecordInvalid = errors.New("store: record is invalid")

// EncodeRecord validates r and returns its signed one-line file bytes:
//
//	{"v":1,"kind":K,"id":I,"signer":DID,"payload":{…},"sig":"<base64url>"}\n
//
// The signature is Ed25519 by signer over
// "sealbridge/record/v1" 0x00 kind 0x00 id 0x00 payload-bytes.
//
// It refuses (ErrRecordInvalid) a record whose encoding would not parse back strictly
// to the same record — say a string that is not UTF-8 (the encoder would replace it),
// or raw JSON with duplicate keys — so a write that is acknowledged always reads back.
func EncodeRecord(signer crypto.Signer, owner identity.DID, r Record) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRecordInvalid, err)
	}
	kind, id := r.Kind(), r.RecordID()
	if err := checkKindID(kind, id); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRecordInvalid, err)
	}
	payload, err := marshalPayload(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRecordInvalid, err)
	}
	back := newRecord(kind)
	if err := decodeStrict(payload, back); err != nil || !reflect.DeepEqual(back, r) {
		return nil, fmt.Errorf("%w: it does not read back as written (non-UTF-8 text or duplicate keys?)", ErrRecordInvalid)
	}
	sig, err := identity.SignDomain(signer, identity.DomainRecord, []byte(kind), []byte(id), payload)
	if err != nil {
		return nil, err
	}
	return encodeFile(fileHeader{V: FormatVersion, Kind: kind, ID: id, Signer: string(owner), Payload: payload,
		Sig: sigEncoding.EncodeToString(sig)})
}

// encodeFile returns the canonical line of h: compact, fixed key order, no HTML
// escaping, ending in '\n'.
func encodeFile(h fileHeader) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(len(h.Payload) + 256)
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&h); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil // Encode ends the line with '\n'
}

// ParseRecord checks every content rule of DESIGN §4 on the bytes of the file
// "<kind>/<id>.json" and returns the typed record. The bytes must be exactly the
// canonical line EncodeRecord writes (one line ending in '\n'); the header must be strict (known keys only, no duplicates, no case variants);
// v must be known, kind and id must match the path, signer must be owner, the signature
// must verify over the exact payload bytes, the payload must decode strictly into the
// kind's schema and pass its validation, and the record's own id must match. File
// properties (regular file, one link, owner, mode, size) are the reader's to check.
func ParseRecord(kind Kind, id string, data []byte, owner identity.DID, ownerKey identity.PublicKey) (Record, error) {
	if err := checkKindID(kind, id); err != nil {
		return nil, err
	}
	if len(data) == 0 || data[len(data)-1] != '\n' || bytes.IndexByte(data[:len(data)-1], '\n') >= 0 {
		return nil, invalid("record is not exactly one line")
	}
	var h fileHeader
	if err := decodeStrict(data[:len(data)-1], &h); err != nil {
		return nil, fmt.Errorf("record header: %w", err)
	}
	// Only the canonical line is a record: no whitespace, reordered keys, escapes or
	// alternative encodings of the signature that would still decode the same.
	if canon, err := encodeFile(h); err != nil || !bytes.Equal(canon, data) {
		return nil, invalid("record is not in canonical form")
	}
	switch {
	case h.V != FormatVersion:
		return nil, invalid("unknown format version %d", h.V)
	case h.Kind != kind:
		return nil, invalid("record kind %q does not match its directory %q", h.Kind, kind)
	case h.ID != id:
		return nil, invalid("record id does not match its file name")
	case h.Signer != string(owner):
		return nil, invalid("record is not signed by the store's owner")
	}
	sig, err := sigEncoding.DecodeString(h.Sig)
	if err != nil || len(sig) != identity.SignatureSize || sigEncoding.EncodeToString(sig) != h.Sig {
		// The decoder skips '\r' and '\n': only the canonical encoding is accepted.
		return nil, invalid("malformed signature")
	}
	if !identity.VerifyDomain(ownerKey, identity.DomainRecord, sig, []byte(kind), []byte(id), h.Payload) {
		return nil, invalid("signature does not verify")
	}
	r := newRecord(kind)
	if err := decodeStrict(h.Payload, r); err != nil {
		return nil, fmt.Errorf("%s payload: %w", kind, err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if r.RecordID() != id {
		return nil, invalid("the record's own id does not match its file name")
	}
	return r, nil
}

// decodeStrict decodes one JSON object into v, refusing what encoding/json alone
// accepts: duplicate keys, keys that are not exactly a field's name (including case
// variants), unknown fields, and trailing data.
func decodeStrict(data []byte, v any) error {
	if err := checkKeys(data, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

var errDepth = errors.New("JSON nested too deeply")

// checkKeys walks the token stream of data alongside type t: every object must have
// unique keys, and an object decoded into a struct may only use the struct's exact
// field names. Values decoded into json.RawMessage are only checked for duplicate keys.
func checkKeys(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkValue(dec, t, 0)
}

var rawMessageType = reflect.TypeOf(json.RawMessage(nil))

// maxDepth bounds the nesting of a record file.
const maxDepth = 64

// checkRawKeys checks raw JSON for duplicate keys and nesting deeper than max.
func checkRawKeys(data []byte, max int) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkValue(dec, nil, maxDepth-max)
}

func walkValue(dec *json.Decoder, t reflect.Type, depth int) error {
	if depth > maxDepth {
		return errDepth
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType {
		t = nil // opaque: only syntax and duplicate keys are checked
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		var fields map[string]reflect.Type
		if t != nil && t.Kind() == reflect.Struct {
			fields = structFields(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return err
			}
			key := kt.(string)
			if seen[key] {
				return fmt.Errorf("duplicate key %q", key)
			}
			seen[key] = true
			var ft reflect.Type
			switch {
			case fields != nil:
				var ok bool
				if ft, ok = fields[key]; !ok {
					return fmt.Errorf("unknown key %q", key)
				}
			case t != nil && t.Kind() == reflect.Map:
				ft = t.Elem()
			}
			if err := walkValue(dec, ft, depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
		return err
	case json.Delim('['):
		var et reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			et = t.Elem()
		}
		for dec.More() {
			if err := walkValue(dec, et, depth+1); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil
}

var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// structFields maps the exact JSON names of t's exported fields to their types.
func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}
