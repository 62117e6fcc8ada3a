package store_test

// Record format tests (docs/FORMAT.md §3, §4): record.Encode and record.Parse round-trip every
// kind; the file is one line with the header members in a fixed order; raw JSON keeps
// its exact bytes; the header and the payload are decoded strictly; the signature
// binds the kind and the id.

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// tamperT0 is a fixed time (Unix ms) so that the records below, and their signed
// bytes, are deterministic.
const tamperT0 = int64(1_700_000_000_000)

// Fixed ids of the records below.
const (
	tamperEnvID   = "0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90"
	tamperEnvID2  = "1c7a3e9f-2d45-4b8c-8f32-4a6e7d8c9ba1"
	tamperMsgID   = "2d8b4fa0-3e56-4c9d-a043-5b7f8e9dacb2"
	tamperBatchID = "3e9c5ab1-4f67-4dae-b154-6c80f9aebdc3"
	tamperInID    = "4fad6bc2-5a78-4ebf-8265-7d91a0bfced4"
	tamperOpID    = "5abe7cd3-6b89-4fc0-9376-8ea2b1c0dfe5"
)

// tamperEnvelope is a wire envelope with the characters HTML escaping would change,
// JSON escapes that re-encoding would change, and a raw U+2028.
const tamperEnvelope = `{"envelopeId":"` + tamperEnvID + `","body":"<b>a & b</b> \u003c\u0026\u003e \/ ` + "\u00e9\u2028" + `","n":1.50}`

// tamperRecords returns one record of each of the 7 kinds with every field set (the
// first is the outbox record), then variants with the optional fields empty.
func tamperRecords(t testing.TB) []record.Record {
	t.Helper()
	peer := string(peerDID(t))
	env := json.RawMessage(tamperEnvelope)
	return []record.Record{
		&record.Outbox{EnvelopeID: tamperEnvID, MessageID: tamperMsgID, BatchID: tamperBatchID,
			EnvelopeKind: record.EnvelopeDeliveryStatus, State: record.StatePending, Ordinal: 3,
			RelayURL: "https://relay.example/v1/envelopes?a=<b>&c=d", PeerOwnerDID: peer,
			DeliveryDeadline: tamperT0 + 3_600_000, NextAttemptAt: tamperT0 + 2_000, Attempts: 2,
			LastError: `relay said <503> & "retry"`, Lease: &record.Lease{Holder: "carrier<1>&", Until: tamperT0 + 150_000},
			Envelope: env, EnvelopeDigest: envelope.Digest(env), RetainUntil: tamperT0 + 90_000_000},
		&record.Batch{BatchID: tamperBatchID, MessageID: tamperMsgID, EnvelopeIDs: []string{tamperEnvID, tamperEnvID2},
			PeerOwnerDID: peer, RelayURL: "http://127.0.0.1:8080/relay", DeliveryDeadline: tamperT0 + 3_600_000,
			CreatedAt: tamperT0, RetainUntil: tamperT0 + 90_000_000},
		&record.Message{MessageID: tamperMsgID, Status: record.StatusClosed, ClosedBy: record.ClosedByRefused,
			LastError: "409 <conflict>", PeerOwnerDID: peer, RelayURL: "https://relay.example/", EnvelopeDigest: envelope.Digest(env),
			DeliveryDeadline: tamperT0 + 3_600_000, CreatedAt: tamperT0, UpdatedAt: tamperT0 + 5, Attempts: 7, RetainUntil: tamperT0 + 90_000_000},
		&record.Receipt{EnvelopeID: tamperInID, SenderDID: peer, EnvelopeDigest: envelope.Digest([]byte("in")),
			State: record.ReceiptProcessed, OutcomeCode: "ACCEPTED", ReceivedAt: tamperT0, RetainUntil: tamperT0 + 1},
		&record.Observation{MessageID: tamperInID, SenderDID: peer, EnvelopeDigest: envelope.Digest([]byte("in")),
			CreatedAt: tamperT0, DeliveryDeadline: tamperT0 + 10, Facts: []json.RawMessage{
				json.RawMessage(`{"fact":"<seen>&","at":1}`), json.RawMessage(`{"x":"\u00e9"}`)},
			Published: []string{tamperMsgID, tamperOpID}, RetainUntil: tamperT0 + 20},
		&record.Operation{OperationID: tamperOpID, RequestDigest: envelope.Digest([]byte("req")), State: record.OperationDone,
			CreatedAt: tamperT0, LeaseUntil: tamperT0 + 120_000, Response: json.RawMessage(`{"status":201,"body":"<ok>&\u2028"}`),
			RetainUntil: tamperT0 + 86_400_000},
		&record.Binding{KeyHash: record.IdempotencyID("client key <1>"), OperationID: tamperOpID,
			RequestDigest: envelope.Digest([]byte("req")), CreatedAt: tamperT0, RetainUntil: tamperT0 + 86_400_000},
		&record.Refusal{RefusalID: record.RefusalID(envelope.Digest(env)), Reason: record.RefusedRecipient,
			EnvelopeID: tamperInID, SenderDID: peer, EnvelopeDigest: envelope.Digest(env), Size: int64(len(env)),
			ReceivedAt: tamperT0, Envelope: env, RetainUntil: tamperT0 + 604_800_000},
		// optional fields empty
		&record.Refusal{RefusalID: record.RefusalID(envelope.Digest([]byte("x"))), Reason: record.RefusedMalformed,
			EnvelopeDigest: envelope.Digest([]byte("x")), Size: 1, ReceivedAt: tamperT0, RetainUntil: tamperT0 + 1},
		&record.Outbox{EnvelopeID: tamperEnvID2, MessageID: tamperMsgID, BatchID: tamperBatchID,
			EnvelopeKind: record.EnvelopeMessage, State: record.StateRelayed, RelayURL: "http://relay.example",
			PeerOwnerDID: peer, DeliveryDeadline: tamperT0 + 1, Envelope: json.RawMessage(`{}`),
			EnvelopeDigest: envelope.Digest([]byte(`{}`)), RetainUntil: tamperT0 + 2},
		&record.Message{MessageID: tamperMsgID, Status: record.StatusQueued, PeerOwnerDID: peer, RelayURL: "https://r.example",
			EnvelopeDigest: envelope.Digest(env), DeliveryDeadline: tamperT0 + 1, CreatedAt: tamperT0, UpdatedAt: tamperT0, RetainUntil: tamperT0 + 2},
		&record.Receipt{EnvelopeID: tamperInID, SenderDID: peer, EnvelopeDigest: envelope.Digest([]byte("in")),
			State: record.ReceiptPersisted, ReceivedAt: tamperT0, RetainUntil: tamperT0 + 1},
		&record.Observation{MessageID: tamperInID, SenderDID: peer, EnvelopeDigest: envelope.Digest([]byte("in")),
			CreatedAt: tamperT0, DeliveryDeadline: tamperT0 + 10, Facts: []json.RawMessage{}, Published: []string{}, RetainUntil: tamperT0 + 20},
		&record.Operation{OperationID: tamperOpID, RequestDigest: envelope.Digest([]byte("req")), State: record.OperationInFlight,
			CreatedAt: tamperT0, LeaseUntil: tamperT0 + 120_000, RetainUntil: tamperT0 + 86_400_000},
	}
}

// tamperEncode encodes r signed by the owner.
func tamperEncode(t testing.TB, r record.Record) []byte {
	t.Helper()
	own := ownerIdentity(t)
	data, err := record.Encode(own.Signer(), own.DID(), r)
	if err != nil {
		t.Fatalf("EncodeRecord %s/%s: %v", r.Kind(), r.RecordID(), err)
	}
	return data
}

// tamperTopKeys returns the top-level keys of a JSON object, in file order.
func tamperTopKeys(t testing.TB, line []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %v %v", tok, err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestRecordRoundTripAllKinds: for a record of each of the 7 kinds (and variants with
// the optional fields empty), record.Encode then record.Parse gives an equal record;
// the file is exactly one line, {"v":1,"kind":…,"id":…,"signer":…,"payload":…,"sig":…}
// followed by '\n', with no whitespace and no HTML escaping; the signature is the
// owner's over the exact payload bytes of the file, bound to the kind and id.
func TestRecordRoundTripAllKinds(t *testing.T) {
	own := ownerIdentity(t)
	kinds := map[record.Kind]bool{}
	for _, r := range tamperRecords(t) {
		k, id := r.Kind(), r.RecordID()
		kinds[k] = true
		t.Run(string(k)+"/"+id, func(t *testing.T) {
			data := tamperEncode(t, r)
			if len(data) == 0 || data[len(data)-1] != '\n' || bytes.Count(data, []byte("\n")) != 1 {
				t.Fatalf("not one line ending in \\n: %q", data)
			}
			if got := tamperTopKeys(t, data); !slices.Equal(got, []string{"v", "kind", "id", "signer", "payload", "sig"}) {
				t.Fatalf("header members %v, want v, kind, id, signer, payload, sig", got)
			}
			rest := bytes.ReplaceAll(data, []byte(tamperEnvelope), nil) // the envelope has escapes of its own
			for _, esc := range []string{`\u003c`, `\u003e`, `\u0026`} {
				if bytes.Contains(rest, []byte(esc)) {
					t.Fatalf("the encoder escaped HTML (%s): %s", esc, data)
				}
			}
			h := tamperSplit(t, data)
			if h.V != 1 || h.Kind != string(k) || h.ID != id || h.Signer != string(own.DID()) {
				t.Fatalf("header %+v", h)
			}
			sig, err := base64.RawURLEncoding.Strict().DecodeString(h.Sig)
			if err != nil || !identity.VerifyDomain(own.Public(), identity.DomainRecord, sig, []byte(k), []byte(id), h.Payload) {
				t.Fatalf("the signature does not verify over the file's payload bytes: %v", err)
			}
			// The exact canonical form: rebuilding the line from its parts gives the
			// same bytes (Ed25519 signatures are deterministic), so there is no
			// whitespace and the members are in order.
			if want := tamperOwnerSigned(t, k, id, h.Payload); !bytes.Equal(data, want) {
				t.Fatalf("encoding\n%s\nis not the canonical line\n%s", data, want)
			}
			got := tamperMustParse(t, k, id, data)
			if !reflect.DeepEqual(got, r) {
				t.Fatalf("round trip changed the record:\n got %#v\nwant %#v", got, r)
			}
			// a second parse shares nothing with the first
			again := tamperMustParse(t, k, id, data)
			if !reflect.DeepEqual(again, got) {
				t.Fatal("parsing is not deterministic")
			}
		})
	}
	for _, k := range record.Kinds {
		if !kinds[k] {
			t.Errorf("kind %s not covered", k)
		}
	}
}

// TestRawJSONKeepsExactBytes: an envelope (and facts, a response) containing '<', '>',
// '&', JSON escapes and U+2028 is stored and read back byte for byte, and its
// envelopeDigest is SHA-256 over exactly those bytes — directly and through
// Enqueue/Get with a cold store.
func TestRawJSONKeepsExactBytes(t *testing.T) {
	recs := tamperRecords(t)
	o := recs[0].(*record.Outbox)
	data := tamperEncode(t, o)
	if !bytes.Contains(data, []byte(tamperEnvelope)) {
		t.Fatalf("the file does not contain the envelope's exact bytes:\n%s", data)
	}
	sum := sha256.Sum256([]byte(tamperEnvelope))
	if o.EnvelopeDigest != hex.EncodeToString(sum[:]) {
		t.Fatalf("envelopeDigest %s is not SHA-256 of the envelope bytes", o.EnvelopeDigest)
	}
	got := tamperMustParse(t, record.KindOutbox, o.EnvelopeID, data).(*record.Outbox)
	if string(got.Envelope) != tamperEnvelope || got.EnvelopeDigest != o.EnvelopeDigest {
		t.Fatalf("envelope changed: %s", got.Envelope)
	}
	obs := recs[4].(*record.Observation)
	if d := tamperEncode(t, obs); !bytes.Contains(d, obs.Facts[0]) || !bytes.Contains(d, obs.Facts[1]) {
		t.Fatalf("facts changed: %s", d)
	}
	op := recs[5].(*record.Operation)
	if d := tamperEncode(t, op); !bytes.Contains(d, op.Response) {
		t.Fatalf("response changed: %s", d)
	}

	// Through the store.
	s := openStore(t, store.Options{})
	req := sendRequest(t, 2)
	req.Envelopes[0].Envelope = json.RawMessage(strings.Replace(tamperEnvelope, tamperEnvID, req.Envelopes[0].EnvelopeID, 1))
	m, err := s.Enqueue(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	first := sha256.Sum256(req.Envelopes[0].Envelope)
	if m.EnvelopeDigest != hex.EncodeToString(first[:]) {
		t.Fatalf("message envelopeDigest %s is not SHA-256 of the first envelope", m.EnvelopeDigest)
	}
	cold := openStore(t, store.Options{Dir: s.Dir(), CacheEntries: -1})
	for _, env := range req.Envelopes {
		ob, err := store.GetAs[*record.Outbox](cold, env.EnvelopeID)
		if err != nil || ob == nil {
			t.Fatalf("GetAs: %v %v", ob, err)
		}
		sum := sha256.Sum256(env.Envelope)
		if !bytes.Equal(ob.Envelope, env.Envelope) || ob.EnvelopeDigest != hex.EncodeToString(sum[:]) {
			t.Fatalf("stored envelope %s (digest %s), want %s", ob.Envelope, ob.EnvelopeDigest, env.Envelope)
		}
		file, err := os.ReadFile(filepath.Join(s.Dir(), "outbox", env.EnvelopeID+".json"))
		if err != nil || !bytes.Contains(file, env.Envelope) {
			t.Fatalf("the file does not hold the exact envelope bytes: %v\n%s", err, file)
		}
	}
}

// TestEncodeRecordRefusesInvalid: record.Encode validates before signing.
func TestEncodeRecordRefusesInvalid(t *testing.T) {
	own := ownerIdentity(t)
	o := *tamperRecords(t)[0].(*record.Outbox)
	o.EnvelopeDigest = envelope.Digest([]byte("other"))
	if _, err := record.Encode(own.Signer(), own.DID(), &o); err == nil {
		t.Fatal("an outbox record whose digest does not match its envelope was encoded")
	}
	o = *tamperRecords(t)[0].(*record.Outbox)
	o.EnvelopeID = strings.ToUpper(o.EnvelopeID)
	if _, err := record.Encode(own.Signer(), own.DID(), &o); err == nil {
		t.Fatal("an upper-case id was encoded")
	}
}

// tamperSignedPayloadCase is an outbox payload (for tamperEnvID) that is correctly
// signed by the owner and that encoding/json alone accepts as a valid record.
type tamperSignedPayloadCase struct{ name, payload string }

func tamperStrictPayloadCases(t testing.TB) []tamperSignedPayloadCase {
	p := string(tamperSplit(t, tamperEncode(t, tamperRecords(t)[0])).Payload)
	dupEnv := *tamperRecords(t)[0].(*record.Outbox)
	dupEnv.Envelope = json.RawMessage(strings.Replace(tamperEnvelope, `"n":1.50}`, `"n":1.50,"n":1.50}`, 1))
	dupEnv.EnvelopeDigest = envelope.Digest(dupEnv.Envelope)
	return []tamperSignedPayloadCase{
		{"unknown-field", p[:len(p)-1] + `,"note":"x"}`},
		{"duplicate-key-same-value", `{"state":"pending",` + p[1:]},
		{"duplicate-key-other-value", `{"attempts":9,` + p[1:]},
		{"case-variant-key", tamperReplacePrefix(t, p, `{"envelopeId":`, `{"EnvelopeId":`)},
		{"case-variant-key-upper", tamperReplaceOnce(t, p, `"retainUntil":`, `"RETAINUNTIL":`)},
		{"nested-case-variant-key", tamperReplaceOnce(t, p, `"holder":`, `"Holder":`)},
		{"nested-unknown-field", tamperReplaceOnce(t, p, `"holder":`, `"pid":1,"holder":`)},
		{"nested-duplicate-key", tamperReplaceOnce(t, p, `"holder":`, `"until":1,"holder":`)},
		{"duplicate-key-inside-envelope", tamperMarshalPayload(t, &dupEnv)},
	}
}

// tamperMarshalPayload encodes r as record.Encode's payload would be: compact, no
// HTML escaping (without record.Encode's validation).
func tamperMarshalPayload(t testing.TB, r record.Record) string {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// TestParseRecordRefusesNonStrictPayload: each payload below is signed by the owner
// for the right kind and id, and encoding/json alone decodes it into a record that
// passes validation with the right id — only the strict decoder refuses it.
func TestParseRecordRefusesNonStrictPayload(t *testing.T) {
	own := ownerIdentity(t)
	for _, tc := range tamperStrictPayloadCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			var lenient record.Outbox
			if err := json.Unmarshal([]byte(tc.payload), &lenient); err != nil {
				t.Fatalf("precondition: encoding/json refuses it already: %v", err)
			}
			if err := lenient.Validate(); err != nil && !strings.Contains(tc.name, "inside") {
				// (A duplicate key inside raw JSON is refused by Validate too, so
				// the writer can never acknowledge what the reader refuses.)
				t.Fatalf("precondition: the lenient record is not valid: %v", err)
			}
			if lenient.RecordID() != tamperEnvID {
				t.Fatalf("precondition: the lenient record has id %s", lenient.RecordID())
			}
			data := tamperOwnerSigned(t, record.KindOutbox, tamperEnvID, []byte(tc.payload))
			h := tamperSplit(t, data)
			sig, _ := base64.RawURLEncoding.DecodeString(h.Sig)
			if !identity.VerifyDomain(own.Public(), identity.DomainRecord, sig, []byte("outbox"), []byte(tamperEnvID), h.Payload) {
				t.Fatal("precondition: the signature does not verify")
			}
			if r, err := tamperParse(t, record.KindOutbox, tamperEnvID, data); err == nil || r != nil {
				t.Fatalf("accepted: %s", data)
			}
		})
	}
}

// TestParseRecordRefusesInvalidPayload: payloads signed by the owner for the right
// kind and id that decode strictly but fail the kind's validation are refused.
func TestParseRecordRefusesInvalidPayload(t *testing.T) {
	valid := tamperRecords(t)[0].(*record.Outbox)
	mut := func(f func(o *record.Outbox)) string {
		o := *valid
		f(&o)
		return tamperMarshalPayload(t, &o)
	}
	cases := map[string]string{
		"empty-object":    `{}`,
		"null":            `null`,
		"array":           `[]`,
		"string":          `"x"`,
		"unknown-state":   mut(func(o *record.Outbox) { o.State = "done" }),
		"unknown-kind":    mut(func(o *record.Outbox) { o.EnvelopeKind = "receipt" }),
		"digest-mismatch": mut(func(o *record.Outbox) { o.EnvelopeDigest = envelope.Digest([]byte("x")) }),
		"envelope-not-compact": mut(func(o *record.Outbox) {
			o.Envelope = json.RawMessage(`{"a": 1}`)
			o.EnvelopeDigest = envelope.Digest(o.Envelope)
		}),
		"bad-peer-did":   mut(func(o *record.Outbox) { o.PeerOwnerDID = "did:key:zzz" }),
		"bad-relay-url":  mut(func(o *record.Outbox) { o.RelayURL = "ftp://relay.example" }),
		"no-retention":   mut(func(o *record.Outbox) { o.RetainUntil = 0 }),
		"negative-order": mut(func(o *record.Outbox) { o.Ordinal = -1 }),
		"empty-lease":    mut(func(o *record.Outbox) { o.Lease = &record.Lease{} }),
		"bad-batch-id":   mut(func(o *record.Outbox) { o.BatchID = strings.ToUpper(o.BatchID) }),
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			data := tamperOwnerSigned(t, record.KindOutbox, tamperEnvID, []byte(payload))
			if r, err := tamperParse(t, record.KindOutbox, tamperEnvID, data); err == nil || r != nil {
				t.Fatalf("accepted: %s", data)
			}
		})
	}
}

// TestParseRecordRefusesNonStrictHeader: header variants around a valid payload and
// signature, each of which encoding/json alone would decode to the valid header (or
// which break the one-line and version rules).
func TestParseRecordRefusesNonStrictHeader(t *testing.T) {
	own := ownerIdentity(t)
	valid := tamperEncode(t, tamperRecords(t)[0])
	h := tamperSplit(t, valid)
	m := map[string]string{"v": "1", "kind": tamperQuote("outbox"), "id": tamperQuote(tamperEnvID),
		"signer": tamperQuote(string(own.DID())), "payload": string(h.Payload), "sig": tamperQuote(h.Sig)}
	frame := func(pairs ...string) []byte {
		var out []string
		for i := 0; i < len(pairs); i += 2 {
			v := pairs[i+1]
			if v == "" {
				v = m[pairs[i]]
			}
			out = append(out, pairs[i], v)
		}
		return tamperFrame(out...)
	}
	canon := []string{"v", "", "kind", "", "id", "", "signer", "", "payload", "", "sig", ""}
	if !bytes.Equal(frame(canon...), valid) {
		t.Fatal("precondition: the canonical frame differs from EncodeRecord's output")
	}
	set := func(key, val string) []string {
		c := slices.Clone(canon)
		for i := 0; i < len(c); i += 2 {
			if c[i] == key {
				c[i+1] = val
			}
		}
		return c
	}
	rename := func(key, to string) []string {
		c := slices.Clone(canon)
		for i := 0; i < len(c); i += 2 {
			if c[i] == key {
				c[i], c[i+1] = to, m[key]
			}
		}
		return c
	}
	sig, _ := base64.RawURLEncoding.DecodeString(h.Sig)
	cases := map[string][]byte{
		"v2":                   frame(set("v", "2")...),
		"v0":                   frame(set("v", "0")...),
		"v-string":             frame(set("v", `"1"`)...),
		"v-float":              frame(set("v", "1.0")...),
		"no-v":                 frame(canon[2:]...),
		"no-sig":               frame(canon[:10]...),
		"extra-key":            frame(append(slices.Clone(canon), "x", "null")...),
		"duplicate-kind":       frame(append(slices.Clone(canon), "kind", "")...),
		"duplicate-payload":    frame(append(slices.Clone(canon), "payload", "")...),
		"case-variant-Kind":    frame(rename("kind", "Kind")...),
		"case-variant-ID":      frame(rename("id", "ID")...),
		"case-variant-Sig":     frame(rename("sig", "Sig")...),
		"signer-other-case":    frame(set("signer", tamperQuote(strings.ToUpper(string(own.DID()))))...),
		"kind-upper":           frame(set("kind", tamperQuote("OUTBOX"))...),
		"id-upper":             frame(set("id", tamperQuote(strings.ToUpper(tamperEnvID)))...),
		"sig-padded":           frame(set("sig", tamperQuote(base64.URLEncoding.EncodeToString(sig)))...),
		"sig-non-canonical":    frame(set("sig", tamperQuote(tamperNonCanonicalSig(t, h.Sig)))...),
		"sig-std-padded":       frame(set("sig", tamperQuote(base64.StdEncoding.EncodeToString(sig)))...),
		"sig-short":            frame(set("sig", tamperQuote(h.Sig[:len(h.Sig)-2]))...),
		"sig-long":             frame(set("sig", tamperQuote(base64.RawURLEncoding.EncodeToString(append(sig, 0))))...),
		"payload-string":       frame(set("payload", tamperQuote(string(h.Payload)))...),
		"newline-inside":       bytes.Replace(valid, []byte(`,"sig"`), []byte(",\n"+`"sig"`), 1),
		"record-twice":         append(slices.Clone(valid), valid...),
		"no-trailing-newline":  valid[:len(valid)-1],
		"trailing-data":        append(slices.Clone(valid[:len(valid)-1]), []byte(" {}\n")...),
		"trailing-second-line": append(slices.Clone(valid), '\n'),
		"array":                []byte("[" + string(valid[:len(valid)-1]) + "]\n"),
		"empty":                {},
		"newline-only":         []byte("\n"),
		"null":                 []byte("null\n"),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if bytes.Equal(data, valid) {
				t.Fatal("precondition: unchanged")
			}
			if r, err := tamperParse(t, record.KindOutbox, tamperEnvID, data); err == nil || r != nil {
				t.Fatalf("accepted: %q", data)
			}
		})
	}
}

// TestParseRecordRefusesWrongPath: a valid file parsed as another kind or id, or with
// a malformed id, or for another owner, is refused.
func TestParseRecordRefusesWrongPath(t *testing.T) {
	own, foreign := ownerIdentity(t), tamperForeign(t)
	for _, r := range tamperRecords(t)[:7] {
		data := tamperEncode(t, r)
		k, id := r.Kind(), r.RecordID()
		for _, other := range record.Kinds {
			if other == k {
				continue
			}
			if _, err := record.Parse(other, id, data, own.DID(), own.Public()); err == nil {
				t.Errorf("%s/%s accepted as kind %s", k, id, other)
			}
		}
		for _, otherID := range []string{tamperEnvID, tamperEnvID2, strings.ToUpper(id), id + "x", "", "../" + id} {
			if otherID == id {
				continue
			}
			if _, err := record.Parse(k, otherID, data, own.DID(), own.Public()); err == nil {
				t.Errorf("%s/%s accepted as id %q", k, id, otherID)
			}
		}
		if _, err := record.Parse(k, id, data, foreign.DID(), foreign.Public()); err == nil {
			t.Errorf("%s/%s accepted for another owner", k, id)
		}
		// the owner's DID with another key, and the other way round
		if _, err := record.Parse(k, id, data, own.DID(), foreign.Public()); err == nil {
			t.Errorf("%s/%s accepted under a foreign key", k, id)
		}
		if _, err := record.Parse(k, id, data, foreign.DID(), own.Public()); err == nil {
			t.Errorf("%s/%s accepted naming a foreign owner", k, id)
		}
	}
}

// TestSignatureBindsKindAndID (DESIGN §3): the signature covers the domain, the kind
// and the id, so a record cannot be moved to another kind or id even when the header
// is rewritten to match and the payload is valid for the new place.
func TestSignatureBindsKindAndID(t *testing.T) {
	own := ownerIdentity(t)
	recs := tamperRecords(t)

	// An outbox record, header rewritten to kind batches (same id, payload and sig).
	o := recs[0].(*record.Outbox)
	data := tamperEncode(t, o)
	moved := bytes.Replace(data, []byte(`"kind":"outbox"`), []byte(`"kind":"batches"`), 1)
	if bytes.Equal(moved, data) {
		t.Fatal("precondition: header not rewritten")
	}
	for _, k := range []record.Kind{record.KindBatches, record.KindOutbox} {
		if _, err := tamperParse(t, k, o.EnvelopeID, moved); err == nil {
			t.Errorf("an outbox record with its header rewritten to batches is accepted as %s", k)
		}
	}

	// A payload that IS a valid batch, signed by the owner as if it were an outbox
	// record with the batch's id: only the kind in the signature tells them apart.
	b := recs[1].(*record.Batch)
	payload := []byte(tamperSplit(t, tamperEncode(t, b)).Payload)
	frame := func(sig []byte, kind record.Kind, id string) []byte {
		return tamperFrame("v", "1", "kind", tamperQuote(string(kind)), "id", tamperQuote(id),
			"signer", tamperQuote(string(own.DID())), "payload", string(payload),
			"sig", tamperQuote(base64.RawURLEncoding.EncodeToString(sig)))
	}
	if _, err := tamperParse(t, record.KindBatches, b.BatchID,
		frame(tamperSigBytes(t, own.Signer(), record.KindBatches, b.BatchID, payload), record.KindBatches, b.BatchID)); err != nil {
		t.Fatalf("control: the batch signed for batches/%s is refused: %v", b.BatchID, err)
	}
	otherID := tamperEnvID2
	forged := map[string][]byte{
		"signed-as-outbox":         tamperSigBytes(t, own.Signer(), record.KindOutbox, b.BatchID, payload),
		"signed-for-another-id":    tamperSigBytes(t, own.Signer(), record.KindBatches, otherID, payload),
		"signed-as-envelope":       tamperSigDomain(t, own.Signer(), identity.DomainEnvelope, payload),
		"signed-without-domain":    tamperSigRaw(t, own.Signer(), payload),
		"signed-with-other-domain": tamperSigDomain(t, own.Signer(), "sealbridge/record/v2", []byte("batches"), []byte(b.BatchID), payload),
	}
	for name, sig := range forged {
		if sig == nil {
			continue
		}
		if _, err := tamperParse(t, record.KindBatches, b.BatchID, frame(sig, record.KindBatches, b.BatchID)); err == nil {
			t.Errorf("%s: accepted as batches/%s", name, b.BatchID)
		}
	}
}

// tamperSigDomain signs parts under domain, or returns nil if SignDomain refuses.
func tamperSigDomain(t testing.TB, signer crypto.Signer, domain string, parts ...[]byte) []byte {
	t.Helper()
	sig, err := identity.SignDomain(signer, domain, parts...)
	if err != nil {
		return nil
	}
	return sig
}

// tamperSigRaw signs msg with plain Ed25519, no domain.
func tamperSigRaw(t testing.TB, signer crypto.Signer, msg []byte) []byte {
	t.Helper()
	sig, err := signer.Sign(rand.Reader, msg, crypto.Hash(0))
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// ---------------------------------------------------------------------------
// Bugs these tests found, since fixed: the writer accepting what the reader refuses,
// and non-canonical headers or signatures being accepted.

// TestEncodeRecordOutputAlwaysParses: whatever record.Encode (and therefore every
// store write) accepts, record.Parse must accept and return equal. It does not for raw
// JSON with duplicate keys or deep nesting (the strict reader refuses them: the write
// is acknowledged and then unreadable), nor for strings that are not UTF-8 (silently
// replaced by U+FFFD, so the stored record differs from the one written and cached).
func TestEncodeRecordOutputAlwaysParses(t *testing.T) {
	own := ownerIdentity(t)
	deep := strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70)
	base := func() *record.Outbox { o := *tamperRecords(t)[0].(*record.Outbox); return &o }
	withEnv := func(env string) record.Record {
		o := base()
		o.Envelope = json.RawMessage(env)
		o.EnvelopeDigest = envelope.Digest(o.Envelope)
		return o
	}
	obs := func(fact string) record.Record {
		r := *tamperRecords(t)[4].(*record.Observation)
		r.Facts = []json.RawMessage{json.RawMessage(fact)}
		return &r
	}
	op := func(resp string) record.Record {
		r := *tamperRecords(t)[5].(*record.Operation)
		r.Response = json.RawMessage(resp)
		return &r
	}
	badUTF8 := base()
	badUTF8.LastError = "relay said \xff\xfe"
	cases := map[string]record.Record{
		"envelope-duplicate-key": withEnv(`{"a":1,"a":2}`),
		"envelope-deep":          withEnv(deep),
		"fact-duplicate-key":     obs(`{"a":1,"a":1}`),
		"response-duplicate-key": op(`{"status":200,"status":500}`),
		"lastError-not-utf8":     badUTF8,
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			data, err := record.Encode(own.Signer(), own.DID(), r)
			if err != nil {
				return // refusing to write is fine
			}
			got, err := tamperParse(t, r.Kind(), r.RecordID(), data)
			if err != nil {
				t.Fatalf("EncodeRecord wrote a record that ParseRecord refuses: %v", err)
			}
			if !reflect.DeepEqual(got, r) {
				t.Fatalf("the record read back differs from the one written:\n got %#v\nwant %#v", got, r)
			}
		})
	}
}

// TestEnqueueAcceptedMessageStaysReadable: a message that Enqueue acknowledged must
// be readable afterwards. An envelope with a duplicate key is acknowledged, and then
// its outbox record, Pending and Message all fail with OUTBOX_STORE_INVALID.
func TestEnqueueAcceptedMessageStaysReadable(t *testing.T) {
	s := openStore(t, store.Options{})
	req := sendRequest(t, 1)
	req.Envelopes[0].Envelope = json.RawMessage(`{"envelopeId":"` + req.Envelopes[0].EnvelopeID + `","body":1,"body":2}`)
	if _, err := s.Enqueue(context.Background(), req); err != nil {
		if errors.Is(err, errcode.OutboxStoreInvalid) {
			return // refused up front: fine
		}
		t.Fatalf("Enqueue: %v", err)
	}
	cold := openStore(t, store.Options{Dir: s.Dir(), CacheEntries: -1})
	if _, err := store.GetAs[*record.Outbox](cold, req.Envelopes[0].EnvelopeID); err != nil {
		t.Errorf("acknowledged outbox record unreadable: %v", err)
	}
	if p, err := cold.Pending(context.Background(), req.MessageID); err != nil || len(p) != 1 {
		t.Errorf("Pending of an acknowledged message: %v, %v", p, err)
	}
	if m, err := cold.Message(req.MessageID); err != nil || m == nil {
		t.Errorf("Message of an acknowledged message: %v, %v", m, err)
	}
}

// TestParseRecordRefusesSigWithNewlines: base64's Strict mode still skips '\r' and
// '\n', so a sig member with JSON-escaped CR/LF inside decodes to the valid signature
// and a non-canonical signature encoding is accepted (like padding, which is refused).
func TestParseRecordRefusesSigWithNewlines(t *testing.T) {
	valid := tamperEncode(t, tamperRecords(t)[0])
	h := tamperSplit(t, valid)
	for _, ins := range []string{`\n`, `\r`, `\r\n`, `\n\n\n`} {
		sig := h.Sig[:40] + ins + h.Sig[40:]
		data := bytes.Replace(valid, []byte(tamperQuote(h.Sig)), []byte(`"`+sig+`"`), 1)
		if _, err := tamperParse(t, record.KindOutbox, tamperEnvID, data); err == nil {
			t.Errorf("sig with %s inside accepted", ins)
		}
	}
}

// TestParseRecordRefusesNonCanonicalHeader: DESIGN §1 says any record that was
// tampered with is refused, and docs/FORMAT.md §4 fixes the line's form. The header is not signed,
// so only a byte-exact check of its canonical form refuses these edits, which change
// the file but not what it decodes to.
func TestParseRecordRefusesNonCanonicalHeader(t *testing.T) {
	valid := tamperEncode(t, tamperRecords(t)[0])
	s := string(valid)
	cases := map[string]string{
		"space-after-brace":  strings.Replace(s, `{"v"`, `{ "v"`, 1),
		"space-before-colon": strings.Replace(s, `"kind":`, `"kind" :`, 1),
		"tab-before-payload": strings.Replace(s, `"payload":{`, "\"payload\":\t{", 1),
		"crlf-ending":        strings.TrimSuffix(s, "\n") + "\r\n",
		"escaped-kind":       strings.Replace(s, `"kind":"outbox"`, `"kind":"\u006futbox"`, 1),
		"escaped-key":        strings.Replace(s, `"v":1`, `"\u0076":1`, 1),
		"members-reordered":  tamperReorderHeader(t, valid),
		"sig-char-escaped":   tamperEscapeFirstSigChar(s),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if data == s {
				t.Fatal("precondition: unchanged")
			}
			if _, err := tamperParse(t, record.KindOutbox, tamperEnvID, []byte(data)); err == nil {
				t.Errorf("accepted: %q", data)
			}
		})
	}
}

// tamperReorderHeader moves the sig member to the front.
func tamperReorderHeader(t testing.TB, valid []byte) string {
	h := tamperSplit(t, valid)
	own := ownerIdentity(t)
	return string(tamperFrame("sig", tamperQuote(h.Sig), "v", "1", "kind", tamperQuote(h.Kind), "id", tamperQuote(h.ID),
		"signer", tamperQuote(string(own.DID())), "payload", string(h.Payload)))
}

// tamperEscapeFirstSigChar writes the sig's first character as a \u escape.
func tamperEscapeFirstSigChar(s string) string {
	i := strings.Index(s, `"sig":"`) + len(`"sig":"`)
	return s[:i] + `\u00` + hex.EncodeToString([]byte{s[i]}) + s[i+1:]
}
