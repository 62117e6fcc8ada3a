package record_test

import (
	"bytes"
	"crypto"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// Every kind written by Encode parses back as the same record, from exactly the
// canonical line of docs/FORMAT.md §3/§4.
func TestEncodeParseRoundTrip(t *testing.T) {
	o := owner(t)
	for _, r := range validRecords(t) {
		data := encode(t, r)
		prefix := `{"v":1,"kind":"` + string(r.Kind()) + `","id":"` + r.RecordID() + `","signer":"` + string(o.DID()) + `","payload":{`
		if !bytes.HasPrefix(data, []byte(prefix)) || !bytes.HasSuffix(data, []byte("\"}\n")) ||
			bytes.Count(data, []byte("\n")) != 1 {
			t.Errorf("%s: not the canonical line: %s", r.Kind(), data)
		}
		got, err := parse(t, r.Kind(), r.RecordID(), data)
		if err != nil {
			t.Errorf("%s: %v", r.Kind(), err)
			continue
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("%s: parsed %+v, wrote %+v", r.Kind(), got, r)
		}
		if again := encode(t, got); !bytes.Equal(again, data) {
			t.Errorf("%s: re-encoding the parsed record changed its bytes", r.Kind())
		}
	}
}

// The writer encodes the payload compactly, without HTML escaping, in the field
// order of the schema, omitting empty optional fields; raw JSON keeps its bytes.
func TestEncodePayloadForm(t *testing.T) {
	m := validMessage(t)
	m.LastError = "<relay> & co"
	data := encode(t, m)
	want := `"payload":{"messageId":"` + idB + `","status":"queued","lastError":"<relay> & co","peerOwnerDid":"` +
		m.PeerOwnerDID + `","relayUrl":"https://relay.example/","envelopeDigest":"` + m.EnvelopeDigest +
		`","deliveryDeadline":1767225600000,"createdAt":1767139200000,"updatedAt":1767139200000,"attempts":0,"retainUntil":1767830400000},`
	if !bytes.Contains(data, []byte(want)) {
		t.Errorf("payload is not the compact, ordered, unescaped form:\n%s\nwant it to contain\n%s", data, want)
	}
	o := validOutbox(t)
	if data := encode(t, o); !bytes.Contains(data, []byte(`"envelope":`+string(testEnvelope)+`,`)) {
		t.Errorf("the envelope's bytes changed: %s", data)
	}
}

// Encode refuses what it could not write faithfully: an invalid record, a string
// that is not UTF-8, a record that is not one of the package's kinds.
func TestEncodeRefuses(t *testing.T) {
	o := owner(t)
	bad := validMessage(t)
	bad.Attempts = -1
	nonUTF8 := validMessage(t)
	nonUTF8.LastError = "relay \xff down"
	badReason := validMessage(t)
	badReason.Operator = &record.Action{Op: record.ActionHold, By: "uid:\xfe", At: tCreated}
	for name, r := range map[string]record.Record{
		"invalid":              bad,
		"non-UTF-8 lastError":  nonUTF8,
		"non-UTF-8 action":     badReason,
		"an unknown kind":      foreign{kind: "letters", id: idA},
		"a foreign outbox":     foreign{kind: record.KindOutbox, id: idA},
		"a malformed id":       foreign{kind: record.KindMessages, id: "x"},
		"an unencodable value": foreign{kind: record.KindMessages, id: idA, Bad: make(chan int)},
	} {
		data, err := record.Encode(o.Signer(), o.DID(), r)
		if !errors.Is(err, record.ErrInvalid) || data != nil {
			t.Errorf("%s: %v (%d bytes), want ErrInvalid", name, err, len(data))
		}
	}
	// A signer that fails: an error, no bytes, and not the record's fault.
	data, err := record.Encode(failingSigner{o.Signer()}, o.DID(), validMessage(t))
	if err == nil || errors.Is(err, record.ErrInvalid) || data != nil {
		t.Errorf("failing signer: %v (%d bytes)", err, len(data))
	}
}

// foreign is a Record of no kind of this package.
type foreign struct {
	kind record.Kind
	id   string
	Bad  chan int `json:"bad,omitempty"`
}

func (f foreign) Kind() record.Kind { return f.kind }
func (f foreign) RecordID() string  { return f.id }
func (f foreign) Validate() error   { return nil }

type failingSigner struct{ crypto.Signer }

func (failingSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("token unplugged")
}

// Parse refuses every line that is not exactly the canonical, verified line of a
// valid record of this kind and id, and says why (fsck reports the reason).
func TestParseRefuses(t *testing.T) {
	o, s := owner(t), stranger(t)
	m := validMessage(t)
	good := encode(t, m)
	payload := string(payloadOf(t, good))
	sig := sigOf(t, good)
	resign := func(p string) []byte {
		return signedLine(t, o, identity.DomainRecord, record.KindMessages, idB, o.DID(), p)
	}
	swap := func(old, new string) []byte { return []byte(strings.Replace(string(good), old, new, 1)) }
	for _, c := range []struct {
		name  string
		kind  record.Kind
		id    string
		data  []byte
		cause string // what the error must say
	}{
		{"an unknown kind", "letters", idB, good, "unknown kind"},
		{"a malformed id", record.KindMessages, strings.ToUpper(idB), good, "malformed"},
		{"a hex id outside idempotency", record.KindMessages, record.IdempotencyID("k"), good, "malformed"},
		{"empty", record.KindMessages, idB, nil, "one line"},
		{"no final newline", record.KindMessages, idB, good[:len(good)-1], "one line"},
		{"two final newlines", record.KindMessages, idB, append(bytes.Clone(good), '\n'), "one line"},
		{"a leading newline", record.KindMessages, idB, append([]byte("\n"), good...), "one line"},
		{"a newline inside", record.KindMessages, idB, swap(`,"sig"`, "\n,\"sig\""), "one line"},
		{"CRLF", record.KindMessages, idB, append(bytes.Clone(good[:len(good)-1]), '\r', '\n'), "canonical"},
		{"another version", record.KindMessages, idB, swap(`{"v":1,`, `{"v":2,`), "version 2"},
		{"in another kind's directory", record.KindOutbox, idB, good, "does not match its directory"},
		{"under another file name", record.KindMessages, idA, good, "does not match its file name"},
		{"by another signer", record.KindMessages, idB,
			signedLine(t, s, identity.DomainRecord, record.KindMessages, idB, s.DID(), payload), "not signed by the store's owner"},
		{"a space in the header", record.KindMessages, idB, swap(`{"v":1,`, `{"v": 1,`), "canonical"},
		{"header keys reordered", record.KindMessages, idB, swap(`{"v":1,"kind":"messages",`, `{"kind":"messages","v":1,`), "canonical"},
		{"an escaped header", record.KindMessages, idB, swap(`"kind":"messages"`, `"kind":"\u006dessages"`), "canonical"},
		{"an extra header key", record.KindMessages, idB, swap(`,"sig":`, `,"x":1,"sig":`), "does not verify"},
		{"a space before the end", record.KindMessages, idB, swap("\"}\n", "\" }\n"), "canonical"},
		{"not JSON", record.KindMessages, idB, []byte("garbage\n"), "record header"},
		{"no payload", record.KindMessages, idB, assemble(record.KindMessages, idB, o.DID(), "", sig), "record header"},
		{"a one-byte payload", record.KindMessages, idB, assemble(record.KindMessages, idB, o.DID(), "1", sig), "canonical"},
		{"an empty object for a payload", record.KindMessages, idB, assemble(record.KindMessages, idB, o.DID(), "{}", sig), "does not verify"},
		{"a signature with padding", record.KindMessages, idB, swap(sig+`"`, sig[:84]+`=="`), "malformed signature"},
		{"a signature in std base64", record.KindMessages, idB, swap(sig+`"`, "+"+sig[1:]+`"`), "malformed signature"},
		{"a signature with stray bits", record.KindMessages, idB, swap(sig+`"`, sig[:85]+strayBits(sig[85])+`"`), "malformed signature"},
		{"a signature with CR inside", record.KindMessages, idB, swap(sig+`"`, sig[:40]+"\r\r"+sig[42:]+`"`), "malformed signature"},
		{"a payload byte changed", record.KindMessages, idB, swap(`"attempts":0`, `"attempts":1`), "does not verify"},
		{"a signature of other bytes", record.KindMessages, idB,
			assemble(record.KindMessages, idB, o.DID(), payload, sigOf(t, encode(t, validBatch(t)))), "does not verify"},
		{"a stranger's signature under the owner's name", record.KindMessages, idB,
			signedLine(t, s, identity.DomainRecord, record.KindMessages, idB, o.DID(), payload), "does not verify"},
		{"an envelope signature replayed", record.KindMessages, idB,
			signedLine(t, o, identity.DomainEnvelope, record.KindMessages, idB, o.DID(), payload), "does not verify"},
		{"moved to another file name, signature kept", record.KindMessages, idA,
			assemble(record.KindMessages, idA, o.DID(), payload, sig), "does not verify"},
		{"moved to another kind, signature kept", record.KindObservations, idB,
			assemble(record.KindObservations, idB, o.DID(), payload, sig), "does not verify"},
		{"a payload that is not the kind's schema", record.KindMessages, idB, resign(`{"messageId":7}`), "payload"},
		{"a payload with whitespace", record.KindMessages, idB, resign(strings.Replace(payload, `"status":"queued"`, `"status": "queued"`, 1)), "canonical form"},
		{"a payload with an unknown key", record.KindMessages, idB, resign(strings.Replace(payload, `{`, `{"x":1,`, 1)), "canonical form"},
		{"a payload with a duplicate key", record.KindMessages, idB, resign(strings.Replace(payload, `"attempts":0`, `"attempts":0,"attempts":0`, 1)), "canonical form"},
		{"a payload with a key in another case", record.KindMessages, idB, resign(strings.Replace(payload, `"attempts"`, `"Attempts"`, 1)), "canonical form"},
		{"a payload reordered", record.KindMessages, idB, resign(reorder(payload)), "canonical form"},
		{"a payload with an escape", record.KindMessages, idB, resign(strings.Replace(payload, `"queued"`, `"\u0071ueued"`, 1)), "canonical form"},
		{"a payload with another number form", record.KindMessages, idB, resign(strings.Replace(payload, `"attempts":0`, `"attempts":-0`, 1)), "canonical form"},
		{"a payload with an empty optional field", record.KindMessages, idB, resign(strings.Replace(payload, `"status":"queued",`, `"status":"queued","lastError":"",`, 1)), "canonical form"},
		{"a payload that fails validation", record.KindMessages, idB, resign(strings.Replace(payload, `"status":"queued"`, `"status":"sent"`, 1)), "status"},
		{"a payload of another message", record.KindMessages, idB, resign(strings.Replace(payload, idB, idA, 1)), "own id"},
	} {
		r, err := record.Parse(c.kind, c.id, c.data, o.DID(), o.Public())
		if err == nil || r != nil {
			t.Errorf("%s: accepted (%v)", c.name, r)
			continue
		}
		if !strings.Contains(err.Error(), c.cause) {
			t.Errorf("%s: %q, want it to say %q", c.name, err, c.cause)
		}
	}
}

// reorder returns the message payload with its first two fields swapped.
func reorder(payload string) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(payload), &m); err != nil {
		panic(err)
	}
	rest := strings.TrimPrefix(payload, `{"messageId":`+string(m["messageId"])+`,"status":`+string(m["status"]))
	return `{"status":` + string(m["status"]) + `,"messageId":` + string(m["messageId"]) + rest
}

// strayBits returns the last base64url character of a 64-byte signature with a
// low bit set that the decoding does not use (512 bits in 86 characters: 4 spare).
func strayBits(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return string(alphabet[strings.IndexByte(alphabet, c)|1])
}

func payloadOf(t testing.TB, line []byte) []byte {
	t.Helper()
	i := bytes.Index(line, []byte(`,"payload":`))
	j := bytes.LastIndex(line, []byte(`,"sig":"`))
	if i < 0 || j < 0 {
		t.Fatalf("not a record line: %s", line)
	}
	return line[i+len(`,"payload":`) : j]
}

func sigOf(t testing.TB, line []byte) string {
	t.Helper()
	j := bytes.LastIndex(line, []byte(`,"sig":"`))
	return string(line[j+len(`,"sig":"`) : len(line)-3])
}

// A receipt's file is named by the receipt id of its envelope id, and a line holding
// a receipt of another envelope under that name is refused even when signed.
func TestParseReceiptID(t *testing.T) {
	o := owner(t)
	r := validReceipt(t)
	data := encode(t, r)
	if _, err := parse(t, record.KindReceipts, r.EnvelopeID, data); err == nil {
		t.Error("a receipt parsed under its envelope id rather than its receipt id")
	}
	other := validReceipt(t)
	other.EnvelopeID = idD
	p := string(payloadOf(t, encode(t, other)))
	line := signedLine(t, o, identity.DomainRecord, record.KindReceipts, r.RecordID(), o.DID(), p)
	if _, err := parse(t, record.KindReceipts, r.RecordID(), line); err == nil || !strings.Contains(err.Error(), "own id") {
		t.Errorf("another envelope's receipt under this name: %v", err)
	}
}

// The signature binds the owner's key: the right line under another key is refused.
func TestParseWrongKey(t *testing.T) {
	o, s := owner(t), stranger(t)
	data := encode(t, validMessage(t))
	if _, err := record.Parse(record.KindMessages, idB, data, o.DID(), s.Public()); err == nil {
		t.Error("verified under a stranger's key")
	}
}
