package record_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/record"
)

// derivedID is docs/FORMAT.md §2 by hand: the first 16 bytes of
// SHA-256(domain 0x00 name), version nibble 8, variant bits 10, as a lower-case UUID.
func derivedID(domain, name string) string {
	sum := sha256.Sum256([]byte(domain + "\x00" + name))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x80
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func TestDerivedIDs(t *testing.T) {
	for _, e := range []string{idA, idB, "not even a uuid"} {
		if got, want := record.ReceiptID(e), derivedID("sealbridge/receipt-id/v1", e); got != want {
			t.Errorf("ReceiptID(%q) = %s, want %s", e, got, want)
		}
		if got, want := record.RefusalID(e), derivedID("sealbridge/refusal-id/v1", e); got != want {
			t.Errorf("RefusalID(%q) = %s, want %s", e, got, want)
		}
	}
	if record.ReceiptID(idA) == record.RefusalID(idA) {
		t.Error("the receipt and refusal ids of one name are equal: the domains do not separate them")
	}
	// IdempotencyID: hex SHA-256 of the key (FIPS 180-2 test vector "abc").
	if got := record.IdempotencyID("abc"); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("IdempotencyID(abc) = %s", got)
	}
	if r := validReceipt(t); r.RecordID() != record.ReceiptID(r.EnvelopeID) {
		t.Errorf("a receipt's id is %s, not the receipt id of its envelope", r.RecordID())
	}
}

// docs/FORMAT.md §2: idempotency files are named by 64 lower-case hex digits, every
// other kind's by a lower-case hyphenated UUID.
func TestValidID(t *testing.T) {
	hash := record.IdempotencyID("k")
	for _, c := range []struct {
		kind record.Kind
		id   string
		ok   bool
	}{
		{record.KindIdempotency, hash, true},
		{record.KindIdempotency, idA, false},
		{record.KindIdempotency, strings.ToUpper(hash), false},
		{record.KindIdempotency, hash[:63], false},
		{record.KindIdempotency, hash + "0", false},
		{record.KindOutbox, idA, true},
		{record.KindReceipts, record.ReceiptID(idA), true},
		{record.KindOutbox, hash, false},
		{record.KindMessages, strings.ToUpper(idA), false},
		{record.KindMessages, idA + ".json", false},
		{record.KindMessages, "", false},
	} {
		if got := record.ValidID(c.kind, c.id); got != c.ok {
			t.Errorf("ValidID(%s, %q) = %v, want %v", c.kind, c.id, got, c.ok)
		}
		err := record.CheckKindID(c.kind, c.id)
		if (err == nil) != c.ok {
			t.Errorf("CheckKindID(%s, %q) = %v, want ok %v", c.kind, c.id, err, c.ok)
		}
	}
}

func TestKinds(t *testing.T) {
	want := []record.Kind{"observations", "messages", "outbox", "batches", "receipts", "operations", "idempotency", "refusals"}
	if !reflect.DeepEqual(record.Kinds, want) {
		t.Fatalf("Kinds = %v, want %v", record.Kinds, want)
	}
	for _, k := range record.Kinds {
		if !k.Valid() {
			t.Errorf("%s is not valid", k)
		}
	}
	for _, k := range []record.Kind{"", "outbox/", "Outbox", "lost+found", "message"} {
		if k.Valid() {
			t.Errorf("%q is a kind", k)
		}
		if err := record.CheckKindID(k, idA); err == nil {
			t.Errorf("CheckKindID(%q) accepted", k)
		}
	}
	// Each record type is the kind it says, and names itself by its id field.
	for i, r := range validRecords(t) {
		if r.Kind() != record.Kinds[i] {
			t.Errorf("%T is kind %s, want %s", r, r.Kind(), record.Kinds[i])
		}
	}
	if got := record.Path(record.KindOutbox, idA); got != "outbox/"+idA+".json" {
		t.Errorf("Path = %q", got)
	}
	if got := record.FileName(idA); got != idA+".json" {
		t.Errorf("FileName = %q", got)
	}
}

// Clone returns a deep copy: changing any part of the clone leaves the original as it
// was, for every kind.
func TestCloneIsDeep(t *testing.T) {
	full := func() []record.Record {
		rs := validRecords(t)
		o := rs[2].(*record.Outbox)
		o.Lease = &record.Lease{Holder: "c", Until: tCreated}
		o.Held, o.Operator = &record.Action{Op: record.ActionHold, By: "u", At: 1}, &record.Action{Op: record.ActionHold, By: "u", At: 1}
		m := rs[1].(*record.Message)
		m.Held, m.Operator = &record.Action{Op: record.ActionHold, By: "u", At: 1}, &record.Action{Op: record.ActionHold, By: "u", At: 1}
		return rs
	}
	scribble := func(b []byte) {
		for i := range b {
			b[i] = 'X'
		}
	}
	orig, want := full(), full()
	for i, r := range orig {
		c := record.Clone(r)
		if !reflect.DeepEqual(c, r) {
			t.Errorf("%s: the clone differs: %+v", r.Kind(), c)
		}
		switch v := c.(type) {
		case *record.Outbox:
			scribble(v.Envelope)
			v.Lease.Holder, v.Held.By, v.Operator.By, v.EnvelopeID = "x", "x", "x", "x"
		case *record.Batch:
			v.EnvelopeIDs[0], v.BatchID = "x", "x"
		case *record.Message:
			v.Held.By, v.Operator.By, v.MessageID = "x", "x", "x"
		case *record.Receipt:
			v.State = "x"
		case *record.Observation:
			scribble(v.Facts[0])
			v.Published[0] = "x"
			v.Facts = append(v.Facts, json.RawMessage(`{}`))
		case *record.Operation:
			scribble(v.Response)
			v.State = "x"
		case *record.Binding:
			v.OperationID = "x"
		case *record.Refusal:
			scribble(v.Envelope)
			v.Reason = "x"
		default:
			t.Fatalf("Clone of %T returned %T", r, c)
		}
		if !reflect.DeepEqual(r, want[i]) {
			t.Errorf("%s: changing the clone changed the original: %+v", r.Kind(), r)
		}
	}
	// Without the optional parts, the clone has none either.
	o := validOutbox(t)
	if c := record.Clone(o).(*record.Outbox); c.Lease != nil || c.Held != nil || c.Operator != nil {
		t.Errorf("clone of an outbox without lease or actions: %+v", c)
	}
	if record.CloneAction(nil) != nil {
		t.Error("CloneAction(nil) is not nil")
	}
	// Another Record is returned as it is.
	f := foreign{kind: "letters", id: idA}
	if c := record.Clone(f); c != record.Record(f) {
		t.Errorf("Clone of a foreign record: %+v", c)
	}
	// A clone of raw JSON keeps its bytes.
	op := validOperation(t)
	if c := record.Clone(op).(*record.Operation); !bytes.Equal(c.Response, op.Response) {
		t.Errorf("response %s, want %s", c.Response, op.Response)
	}
}
