package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
)

// maxDepth bounds the nesting of an envelope. The deepest valid value is
// wire → payload → body/confirms → string: depth 3.
const maxDepth = 8

// decodeStrict decodes one JSON object, the part of the envelope named what,
// into v (a pointer to a struct) with DecodeStrict; the object must start at the
// first byte. Its errors wrap ErrMalformed.
func decodeStrict(what string, data []byte, v any) error {
	if len(data) == 0 || data[0] != '{' {
		return fmt.Errorf("%w: %s is not a JSON object", ErrMalformed, what)
	}
	if err := DecodeStrict(data, v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrMalformed, what, err)
	}
	return nil
}

// DecodeStrict decodes one JSON object into v (a pointer to a struct), refusing
// what encoding/json alone accepts: a top-level value that is not an object,
// duplicate keys, keys that are not exactly a field's JSON name (unknown keys
// and case variants), nesting deeper than maxDepth, and trailing data other
// than white space. Its errors name byte offsets within data or a field, and
// quote no input. It is the one strict decoder of the module: the envelope's
// parts and the request bodies of the daemon and the relay use it.
func DecodeStrict(data []byte, v any) error {
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return errors.New("not a JSON object")
	}
	if err := checkKeys(data, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errors.New(describeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

// describeJSONError turns an encoding/json error into a message that names
// a position or a field, never input bytes.
func describeJSONError(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("invalid JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q has the wrong type", typ.Field)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "truncated JSON"
	}
	return "invalid JSON"
}

// checkKeys walks the token stream of data alongside type t: every object
// must have unique keys, and an object decoded into a struct may use only the
// struct's exact JSON field names. Values decoded into json.RawMessage are
// checked for duplicate keys and depth only (they are decoded strictly later).
func checkKeys(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkValue(dec, t, 0)
}

var rawMessageType = reflect.TypeOf(json.RawMessage(nil))

func walkValue(dec *json.Decoder, t reflect.Type, depth int) error {
	if depth > maxDepth {
		return errors.New("JSON nested too deeply")
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType {
		t = nil
	}
	tok, err := dec.Token()
	if err != nil {
		return errors.New(describeJSONError(err))
	}
	switch tok {
	case json.Delim('{'):
		var fields map[string]reflect.Type
		if t != nil && t.Kind() == reflect.Struct {
			fields = structFields(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			off := dec.InputOffset()
			kt, err := dec.Token()
			if err != nil {
				return errors.New(describeJSONError(err))
			}
			key, ok := kt.(string)
			if !ok {
				return fmt.Errorf("object key expected after byte %d", off)
			}
			if seen[key] {
				return fmt.Errorf("duplicate key after byte %d", off)
			}
			seen[key] = true
			var ft reflect.Type
			if fields != nil {
				if ft, ok = fields[key]; !ok {
					return fmt.Errorf("unknown key after byte %d", off)
				}
			}
			if err := walkValue(dec, ft, depth+1); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // '}'
			return errors.New(describeJSONError(err))
		}
	case json.Delim('['):
		for dec.More() {
			if err := walkValue(dec, nil, depth+1); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // ']'
			return errors.New(describeJSONError(err))
		}
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

// marshalCompact encodes v compactly, in struct field order, without HTML
// escaping and without the encoder's trailing newline.
func marshalCompact(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
