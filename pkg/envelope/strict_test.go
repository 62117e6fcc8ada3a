package envelope_test

import (
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
)

func TestDecodeStrict(t *testing.T) {
	type inner struct {
		N int `json:"n"`
	}
	type req struct {
		To    string   `json:"to"`
		IDs   []string `json:"ids,omitempty"`
		Inner *inner   `json:"inner"`
	}
	for _, tc := range []struct {
		in, err string // err: "" for accepted, else a substring of the error
	}{
		{`{"to":"a","ids":["x"],"inner":{"n":1}}`, ""},
		{" \n{\"to\":\"a\"}\n", ""},
		{`{"to":"a","to":"b"}`, "duplicate key"},
		{`{"TO":"a"}`, "unknown key"},
		{`{"to":"a","cc":"b"}`, "unknown key"},
		{`{"inner":{"n":1,"n":2}}`, "duplicate key"},
		{`{"inner":{"N":1}}`, "unknown key"},
		{`{"to":"a"} {}`, "data after the JSON object"},
		{`["to"]`, "not a JSON object"},
		{``, "not a JSON object"},
		{`{"to":1}`, "wrong type"},
		{`{"to":"secret-value"`, "truncated"},
	} {
		var v req
		err := envelope.DecodeStrict([]byte(tc.in), &v)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
		case err != nil && strings.Contains(err.Error(), "secret"):
			t.Errorf("%q: the error quotes input: %v", tc.in, err)
		}
	}
}
