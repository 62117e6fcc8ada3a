package record_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// A rule case changes one field of a valid record and says whether the record must
// still be valid: each limit is tried at the limit and one past it.
type rule[R record.Record] struct {
	name   string
	ok     bool
	change func(R)
}

func checkRules[R record.Record](t *testing.T, fresh func(testing.TB) R, rules []rule[R]) {
	t.Helper()
	if err := fresh(t).Validate(); err != nil {
		t.Fatalf("the fixture itself: %v", err)
	}
	for _, c := range rules {
		r := fresh(t)
		c.change(r)
		err := r.Validate()
		if c.ok && err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
		}
		if !c.ok && err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

// relayURLOfLen returns a valid https relay URL exactly n bytes long.
func relayURLOfLen(n int) string {
	const base = "https://relay.example/"
	return base + strings.Repeat("a", n-len(base))
}

// timeRules returns the rules of one time field (docs/FORMAT.md §5: positive
// milliseconds below 2^53).
func timeRules[R record.Record](field string, set func(R, int64)) []rule[R] {
	return []rule[R]{
		{field + " 1", true, func(r R) { set(r, 1) }},
		{field + " 0", false, func(r R) { set(r, 0) }},
		{field + " negative", false, func(r R) { set(r, -1) }},
		{field + " past 2^53", false, func(r R) { set(r, maxTime+1) }},
	}
}

func uuidRules[R record.Record](field string, set func(R, string)) []rule[R] {
	return []rule[R]{
		{field + " empty", false, func(r R) { set(r, "") }},
		{field + " upper case", false, func(r R) { set(r, strings.ToUpper(idA)) }},
		{field + " not hyphenated", false, func(r R) { set(r, strings.ReplaceAll(idA, "-", "")+"0000") }},
	}
}

func digestRules[R record.Record](field string, set func(R, string)) []rule[R] {
	return []rule[R]{
		{field + " upper case", false, func(r R) { set(r, strings.ToUpper(digestOf(testEnvelope))) }},
		{field + " 63 digits", false, func(r R) { set(r, digestOf(testEnvelope)[:63]) }},
	}
}

func didRules[R record.Record](field string, set func(R, string)) []rule[R] {
	return []rule[R]{
		{field + " empty", false, func(r R) { set(r, "") }},
		{field + " not a did:key", false, func(r R) { set(r, "did:web:example.com") }},
	}
}

func relayURLRules[R record.Record](set func(R, string)) []rule[R] {
	return []rule[R]{
		{"relayUrl http", true, func(r R) { set(r, "http://relay.example:8080/x") }},
		{"relayUrl of 2048 bytes", true, func(r R) { set(r, relayURLOfLen(2048)) }},
		{"relayUrl of 2049 bytes", false, func(r R) { set(r, relayURLOfLen(2049)) }},
		{"relayUrl ftp", false, func(r R) { set(r, "ftp://relay.example/") }},
		{"relayUrl without a host", false, func(r R) { set(r, "https:///path") }},
		{"relayUrl with user info", false, func(r R) { set(r, "https://user:pw@relay.example/") }},
		{"relayUrl unparseable", false, func(r R) { set(r, "https://relay.example/%zz") }},
		{"relayUrl relative", false, func(r R) { set(r, "relay.example") }},
	}
}

// actionRules are the rules of an operator action in field held (op must be hold) or
// operator (any op) of a record.
func actionRules[R record.Record](field string, set func(R, *record.Action)) []rule[R] {
	act := func(op, by, reason string, at int64) *record.Action {
		return &record.Action{Op: op, By: by, At: at, Reason: reason}
	}
	rs := []rule[R]{
		{field + " absent", true, func(r R) { set(r, nil) }},
		{field + " hold", true, func(r R) { set(r, act(record.ActionHold, "uid:1000", "", tCreated)) }},
		{field + " unknown op", false, func(r R) { set(r, act("pause", "uid:1000", "", tCreated)) }},
		{field + " empty op", false, func(r R) { set(r, act("", "uid:1000", "", tCreated)) }},
		{field + " by empty", false, func(r R) { set(r, act(record.ActionHold, "", "", tCreated)) }},
		{field + " by of 128 bytes", true, func(r R) {
			set(r, act(record.ActionHold, strings.Repeat("u", record.MaxActionBy), "", tCreated))
		}},
		{field + " by of 129 bytes", false, func(r R) {
			set(r, act(record.ActionHold, strings.Repeat("u", record.MaxActionBy+1), "", tCreated))
		}},
		{field + " reason of 256 bytes", true, func(r R) {
			set(r, act(record.ActionHold, "uid:1000", strings.Repeat("r", record.MaxActionReason), tCreated))
		}},
		{field + " reason of 257 bytes", false, func(r R) {
			set(r, act(record.ActionHold, "uid:1000", strings.Repeat("r", record.MaxActionReason+1), tCreated))
		}},
		{field + " at 0", false, func(r R) { set(r, act(record.ActionHold, "uid:1000", "", 0)) }},
		{field + " at past 2^53", false, func(r R) { set(r, act(record.ActionHold, "uid:1000", "", maxTime+1)) }},
	}
	for _, op := range []string{record.ActionRelease, record.ActionCancel, record.ActionRetry} {
		rs = append(rs, rule[R]{field + " " + op, field == "operator", func(r R) { set(r, act(op, "uid:1000", "", tCreated)) }})
	}
	return rs
}

// rawRules are the rules of a raw JSON object field (an envelope, a fact, a
// response): a compact object, no duplicate key at any depth, at most 48 deep. set
// also keeps whatever must agree with the bytes (a digest) in step.
func rawRules[R record.Record](field string, set func(R, json.RawMessage)) []rule[R] {
	raw := func(s string) func(R) { return func(r R) { set(r, json.RawMessage(s)) } }
	nested := func(depth int) string { // an object holding arrays: depth levels in all
		return `{"a":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`
	}
	var siblings strings.Builder // many closed nested values side by side: depth 3 each
	siblings.WriteString(`{"s":[`)
	for i := range 60 {
		if i > 0 {
			siblings.WriteByte(',')
		}
		siblings.WriteString(`{"k":[1]}`)
	}
	siblings.WriteString(`]}`)
	var many strings.Builder // more keys than the linear duplicate check keeps
	many.WriteString(`{`)
	for i := range 40 {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`"k` + strings.Repeat("x", i) + `":1`)
	}
	manyKeys := many.String() + `}`
	return []rule[R]{
		{field + " empty object", true, raw(`{}`)},
		{field + " an array", false, raw(`[]`)},
		{field + " a string", false, raw(`"x"`)},
		{field + " empty", false, raw(``)},
		{field + " not JSON", false, raw(`{"a":}`)},
		{field + " a space outside strings", false, raw(`{"a": 1}`)},
		{field + " a tab", false, raw("{\"a\":\t1}")},
		{field + " a newline", false, raw("{\"a\":1\n}")},
		{field + " a carriage return", false, raw("{\"a\":1\r}")},
		{field + " spaces inside strings", true, raw(`{"a b":" \t"}`)},
		{field + " a duplicate key", false, raw(`{"a":1,"a":2}`)},
		{field + " a duplicate key after others", false, raw(`{"a":1,"b":2,"c":3,"b":4}`)},
		{field + " a duplicate key nested", false, raw(`{"x":[{"a":1,"a":2}]}`)},
		{field + " a duplicate key after a nested object", false, raw(`{"a":{"b":1},"a":2}`)},
		{field + " a duplicate key spelt with an escape", false, raw(`{"a":1,"\u0061":2}`)},
		{field + " a duplicate of an escaped key", false, raw(`{"\u0061":1,"a":2}`)},
		{field + " a duplicate after an escaped key", false, raw(`{"\u0061":1,"b":1,"b":2}`)},
		{field + " an escaped quote in a key", true, raw(`{"a\"b":1,"a":2,"b":3}`)},
		{field + " a backslash key and its letter", true, raw(`{"a\\":1,"a":2}`)},
		{field + " an escaped key alone", true, raw(`{"\u0061":1}`)},
		{field + " the same key in sibling objects", true, raw(`{"x":{"a":1},"y":{"a":1}}`)},
		{field + " the same key in the parent and a child", true, raw(`{"a":{"a":1}}`)},
		{field + " equal strings in an array", true, raw(`{"a":["x","x"]}`)},
		{field + " a value equal to its key", true, raw(`{"a":"a","b":"a"}`)},
		{field + " brackets and commas inside strings", true, raw(`{"a":"{[,\"","b":"]}","c":1}`)},
		{field + " a duplicate after brackets inside strings", false, raw(`{"a":"{[,","a":1}`)},
		{field + " 48 levels deep", true, raw(nested(48))},
		{field + " 49 levels deep", false, raw(nested(49))},
		{field + " many shallow siblings", true, raw(siblings.String())},
		{field + " many keys", true, raw(manyKeys)},
		{field + " many keys and a duplicate", false, raw(many.String() + `,"kxxx":2}`)},
	}
}

func TestOutboxRules(t *testing.T) {
	var rs []rule[*record.Outbox]
	rs = append(rs, uuidRules("envelopeId", func(r *record.Outbox, v string) { r.EnvelopeID = v })...)
	rs = append(rs, uuidRules("messageId", func(r *record.Outbox, v string) { r.MessageID = v })...)
	rs = append(rs, uuidRules("batchId", func(r *record.Outbox, v string) { r.BatchID = v })...)
	rs = append(rs, relayURLRules(func(r *record.Outbox, v string) { r.RelayURL = v })...)
	rs = append(rs, didRules("peerOwnerDid", func(r *record.Outbox, v string) { r.PeerOwnerDID = v })...)
	rs = append(rs, timeRules("deliveryDeadline", func(r *record.Outbox, v int64) { r.DeliveryDeadline = v })...)
	rs = append(rs, timeRules("retainUntil", func(r *record.Outbox, v int64) { r.RetainUntil = v })...)
	rs = append(rs, digestRules("envelopeDigest", func(r *record.Outbox, v string) { r.EnvelopeDigest = v })...)
	rs = append(rs, rawRules("envelope", func(r *record.Outbox, v json.RawMessage) {
		r.Envelope, r.EnvelopeDigest = v, digestOf(v)
	})...)
	rs = append(rs, actionRules("held", func(r *record.Outbox, a *record.Action) { r.Held = a })...)
	rs = append(rs, actionRules("operator", func(r *record.Outbox, a *record.Action) { r.Operator = a })...)
	rs = append(rs, []rule[*record.Outbox]{
		{"kind delivery-status", true, func(r *record.Outbox) { r.EnvelopeKind = record.EnvelopeDeliveryStatus }},
		{"kind unknown", false, func(r *record.Outbox) { r.EnvelopeKind = "receipt" }},
		{"kind empty", false, func(r *record.Outbox) { r.EnvelopeKind = "" }},
		{"state relayed", true, func(r *record.Outbox) { r.State = record.StateRelayed }},
		{"state closed", true, func(r *record.Outbox) { r.State = record.StateClosed }},
		{"state unknown", false, func(r *record.Outbox) { r.State = "delivered" }},
		{"ordinal 63", true, func(r *record.Outbox) { r.Ordinal = 63 }},
		{"ordinal -1", false, func(r *record.Outbox) { r.Ordinal = -1 }},
		{"attempts 7", true, func(r *record.Outbox) { r.Attempts = 7 }},
		{"attempts -1", false, func(r *record.Outbox) { r.Attempts = -1 }},
		{"nextAttemptAt 0", true, func(r *record.Outbox) { r.NextAttemptAt = 0 }},
		{"nextAttemptAt -1", false, func(r *record.Outbox) { r.NextAttemptAt = -1 }},
		{"unreachableSince 0", true, func(r *record.Outbox) { r.UnreachableSince = 0 }},
		{"unreachableSince set", true, func(r *record.Outbox) { r.UnreachableSince = tCreated }},
		{"unreachableSince -1", false, func(r *record.Outbox) { r.UnreachableSince = -1 }},
		{"envelopeDigest of other bytes", false, func(r *record.Outbox) { r.EnvelopeDigest = digestOf([]byte(`{}`)) }},
		{"envelope changed under its digest", false, func(r *record.Outbox) { r.Envelope = json.RawMessage(`{"v":2}`) }},
		{"lease", true, func(r *record.Outbox) { r.Lease = &record.Lease{Holder: "carrier-1", Until: tCreated} }},
		{"lease holder of 256 bytes", true, func(r *record.Outbox) {
			r.Lease = &record.Lease{Holder: strings.Repeat("h", 256), Until: tCreated}
		}},
		{"lease holder of 257 bytes", false, func(r *record.Outbox) {
			r.Lease = &record.Lease{Holder: strings.Repeat("h", 257), Until: tCreated}
		}},
		{"lease without a holder", false, func(r *record.Outbox) { r.Lease = &record.Lease{Until: tCreated} }},
		{"lease until 1", true, func(r *record.Outbox) { r.Lease = &record.Lease{Holder: "c", Until: 1} }},
		{"lease until 0", false, func(r *record.Outbox) { r.Lease = &record.Lease{Holder: "c", Until: 0} }},
		{"lease until -1", false, func(r *record.Outbox) { r.Lease = &record.Lease{Holder: "c", Until: -1} }},
		{"lastError of 1024 bytes", true, func(r *record.Outbox) { r.LastError = strings.Repeat("e", 1024) }},
		{"lastError of 1025 bytes", false, func(r *record.Outbox) { r.LastError = strings.Repeat("e", 1025) }},
	}...)
	checkRules(t, validOutbox, rs)
}

func TestBatchRules(t *testing.T) {
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = idOf(i)
		}
		return out
	}
	var rs []rule[*record.Batch]
	rs = append(rs, uuidRules("batchId", func(r *record.Batch, v string) { r.BatchID = v })...)
	rs = append(rs, uuidRules("messageId", func(r *record.Batch, v string) { r.MessageID = v })...)
	rs = append(rs, uuidRules("envelopeIds[1]", func(r *record.Batch, v string) { r.EnvelopeIDs[1] = v })...)
	rs = append(rs, relayURLRules(func(r *record.Batch, v string) { r.RelayURL = v })...)
	rs = append(rs, didRules("peerOwnerDid", func(r *record.Batch, v string) { r.PeerOwnerDID = v })...)
	rs = append(rs, timeRules("deliveryDeadline", func(r *record.Batch, v int64) { r.DeliveryDeadline = v })...)
	rs = append(rs, timeRules("createdAt", func(r *record.Batch, v int64) { r.CreatedAt = v })...)
	rs = append(rs, timeRules("retainUntil", func(r *record.Batch, v int64) { r.RetainUntil = v })...)
	rs = append(rs, []rule[*record.Batch]{
		{"one member", true, func(r *record.Batch) { r.EnvelopeIDs = ids(1) }},
		{"64 members", true, func(r *record.Batch) { r.EnvelopeIDs = ids(record.MaxBatchMembers) }},
		{"65 members", false, func(r *record.Batch) { r.EnvelopeIDs = ids(record.MaxBatchMembers + 1) }},
		{"no members", false, func(r *record.Batch) { r.EnvelopeIDs = []string{} }},
		{"nil members", false, func(r *record.Batch) { r.EnvelopeIDs = nil }},
		{"a member twice", false, func(r *record.Batch) { r.EnvelopeIDs = []string{idA, idD, idA} }},
	}...)
	checkRules(t, validBatch, rs)
}

// idOf returns the i-th of a run of distinct valid UUIDs.
func idOf(i int) string { return fmt.Sprintf("%08x-1c34-4a7b-9e21-3f5d6c7b8a90", i) }

func TestMessageRules(t *testing.T) {
	var rs []rule[*record.Message]
	rs = append(rs, uuidRules("messageId", func(r *record.Message, v string) { r.MessageID = v })...)
	rs = append(rs, relayURLRules(func(r *record.Message, v string) { r.RelayURL = v })...)
	rs = append(rs, didRules("peerOwnerDid", func(r *record.Message, v string) { r.PeerOwnerDID = v })...)
	rs = append(rs, digestRules("envelopeDigest", func(r *record.Message, v string) { r.EnvelopeDigest = v })...)
	rs = append(rs, timeRules("deliveryDeadline", func(r *record.Message, v int64) { r.DeliveryDeadline = v })...)
	rs = append(rs, timeRules("createdAt", func(r *record.Message, v int64) { r.CreatedAt = v })...)
	rs = append(rs, timeRules("updatedAt", func(r *record.Message, v int64) { r.UpdatedAt = v })...)
	rs = append(rs, timeRules("retainUntil", func(r *record.Message, v int64) { r.RetainUntil = v })...)
	rs = append(rs, actionRules("held", func(r *record.Message, a *record.Action) { r.Held = a })...)
	rs = append(rs, actionRules("operator", func(r *record.Message, a *record.Action) { r.Operator = a })...)
	status := func(s, closedBy string) func(*record.Message) {
		return func(r *record.Message) { r.Status, r.ClosedBy = s, closedBy }
	}
	rs = append(rs, []rule[*record.Message]{
		{"relayed", true, status(record.StatusRelayed, "")},
		{"delivered", true, status(record.StatusDelivered, "")},
		{"status unknown", false, status("sent", "")},
		{"status empty", false, status("", "")},
		{"closed by deadline", true, status(record.StatusClosed, record.ClosedByDeadline)},
		{"closed by refused", true, status(record.StatusClosed, record.ClosedByRefused)},
		{"closed by expired", true, status(record.StatusClosed, record.ClosedByExpired)},
		{"closed by cancelled", true, status(record.StatusClosed, record.ClosedByCancelled)},
		{"closed by no one", false, status(record.StatusClosed, "")},
		{"closed by an unknown closer", false, status(record.StatusClosed, "operator")},
		{"queued with a closer", false, status(record.StatusQueued, record.ClosedByDeadline)},
		{"relayed with a closer", false, status(record.StatusRelayed, record.ClosedByRefused)},
		{"delivered with a closer", false, status(record.StatusDelivered, record.ClosedByExpired)},
		{"attempts 3", true, func(r *record.Message) { r.Attempts = 3 }},
		{"attempts -1", false, func(r *record.Message) { r.Attempts = -1 }},
		{"lastError of 1024 bytes", true, func(r *record.Message) { r.LastError = strings.Repeat("e", 1024) }},
		{"lastError of 1025 bytes", false, func(r *record.Message) { r.LastError = strings.Repeat("e", 1025) }},
	}...)
	checkRules(t, validMessage, rs)
}

func TestReceiptRules(t *testing.T) {
	var rs []rule[*record.Receipt]
	rs = append(rs, uuidRules("envelopeId", func(r *record.Receipt, v string) { r.EnvelopeID = v })...)
	rs = append(rs, didRules("senderDid", func(r *record.Receipt, v string) { r.SenderDID = v })...)
	rs = append(rs, digestRules("envelopeDigest", func(r *record.Receipt, v string) { r.EnvelopeDigest = v })...)
	rs = append(rs, timeRules("receivedAt", func(r *record.Receipt, v int64) { r.ReceivedAt = v })...)
	rs = append(rs, timeRules("retainUntil", func(r *record.Receipt, v int64) { r.RetainUntil = v })...)
	rs = append(rs, []rule[*record.Receipt]{
		{"processed", true, func(r *record.Receipt) { r.State = record.ReceiptProcessed }},
		{"terminal", true, func(r *record.Receipt) { r.State = record.ReceiptTerminal }},
		{"state unknown", false, func(r *record.Receipt) { r.State = "done" }},
		{"outcomeCode of 64 bytes", true, func(r *record.Receipt) { r.OutcomeCode = strings.Repeat("C", 64) }},
		{"outcomeCode of 65 bytes", false, func(r *record.Receipt) { r.OutcomeCode = strings.Repeat("C", 65) }},
		{"senderSeq 1", true, func(r *record.Receipt) { r.SenderSeq = 1 }},
		{"senderSeq MaxTime", true, func(r *record.Receipt) { r.SenderSeq = envelope.MaxTime }},
		{"senderSeq past MaxTime", false, func(r *record.Receipt) { r.SenderSeq = envelope.MaxTime + 1 }},
		{"senderSeq negative", false, func(r *record.Receipt) { r.SenderSeq = -1 }},
	}...)
	checkRules(t, validReceipt, rs)
}

func TestObservationRules(t *testing.T) {
	var rs []rule[*record.Observation]
	rs = append(rs, uuidRules("messageId", func(r *record.Observation, v string) { r.MessageID = v })...)
	rs = append(rs, didRules("senderDid", func(r *record.Observation, v string) { r.SenderDID = v })...)
	rs = append(rs, digestRules("envelopeDigest", func(r *record.Observation, v string) { r.EnvelopeDigest = v })...)
	rs = append(rs, timeRules("createdAt", func(r *record.Observation, v int64) { r.CreatedAt = v })...)
	rs = append(rs, timeRules("deliveryDeadline", func(r *record.Observation, v int64) { r.DeliveryDeadline = v })...)
	rs = append(rs, timeRules("retainUntil", func(r *record.Observation, v int64) { r.RetainUntil = v })...)
	rs = append(rs, rawRules("facts[1]", func(r *record.Observation, v json.RawMessage) {
		r.Facts = append(r.Facts, v)
	})...)
	rs = append(rs, uuidRules("published[1]", func(r *record.Observation, v string) { r.Published = append(r.Published, v) })...)
	rs = append(rs, []rule[*record.Observation]{
		{"no facts yet", true, func(r *record.Observation) { r.Facts = []json.RawMessage{} }},
		{"nothing published yet", true, func(r *record.Observation) { r.Published = []string{} }},
		{"facts not a list", false, func(r *record.Observation) { r.Facts = nil }},
		{"published not a list", false, func(r *record.Observation) { r.Published = nil }},
		{"a blob", true, func(r *record.Observation) { r.Blob = validBlob() }},
		{"a blob of the largest size", true, func(r *record.Observation) {
			r.Blob = validBlob()
			r.Blob.Size = envelope.MaxBlobSize
		}},
		{"a blob of an empty body", true, func(r *record.Observation) { r.Blob = validBlob(); r.Blob.BodySize = 0 }},
		{"a blob of size 0", false, func(r *record.Observation) { r.Blob = validBlob(); r.Blob.Size = 0 }},
		{"a blob over the bound", false, func(r *record.Observation) {
			r.Blob = validBlob()
			r.Blob.Size = envelope.MaxBlobSize + 1
		}},
		{"a blob whose body is not smaller", false, func(r *record.Observation) { r.Blob = validBlob(); r.Blob.BodySize = r.Blob.Size }},
		{"a blob of a negative body", false, func(r *record.Observation) { r.Blob = validBlob(); r.Blob.BodySize = -1 }},
		{"a blob with a bad digest", false, func(r *record.Observation) { r.Blob = validBlob(); r.Blob.Digest = "AB" }},
		{"a blob with a bad envelope id", false, func(r *record.Observation) { r.Blob = validBlob(); r.Blob.EnvelopeID = "x" }},
	}...)
	checkRules(t, validObservation, rs)
}

func TestOperationRules(t *testing.T) {
	var rs []rule[*record.Operation]
	rs = append(rs, uuidRules("operationId", func(r *record.Operation, v string) { r.OperationID = v })...)
	rs = append(rs, digestRules("requestDigest", func(r *record.Operation, v string) { r.RequestDigest = v })...)
	rs = append(rs, timeRules("createdAt", func(r *record.Operation, v int64) { r.CreatedAt = v })...)
	rs = append(rs, timeRules("leaseUntil", func(r *record.Operation, v int64) { r.LeaseUntil = v })...)
	rs = append(rs, timeRules("retainUntil", func(r *record.Operation, v int64) { r.RetainUntil = v })...)
	rs = append(rs, rawRules("response", func(r *record.Operation, v json.RawMessage) { r.Response = v })...)
	rs = append(rs, []rule[*record.Operation]{
		{"in flight without a response", true, func(r *record.Operation) { r.State, r.Response = record.OperationInFlight, nil }},
		{"in flight with a response", false, func(r *record.Operation) { r.State = record.OperationInFlight }},
		{"done without a response", false, func(r *record.Operation) { r.Response = nil }},
		{"state unknown", false, func(r *record.Operation) { r.State = "failed" }},
		{"state empty", false, func(r *record.Operation) { r.State = "" }},
	}...)
	checkRules(t, validOperation, rs)
}

func TestBindingRules(t *testing.T) {
	var rs []rule[*record.Binding]
	rs = append(rs, digestRules("keyHash", func(r *record.Binding, v string) { r.KeyHash = v })...)
	rs = append(rs, uuidRules("operationId", func(r *record.Binding, v string) { r.OperationID = v })...)
	rs = append(rs, digestRules("requestDigest", func(r *record.Binding, v string) { r.RequestDigest = v })...)
	rs = append(rs, timeRules("createdAt", func(r *record.Binding, v int64) { r.CreatedAt = v })...)
	rs = append(rs, timeRules("retainUntil", func(r *record.Binding, v int64) { r.RetainUntil = v })...)
	rs = append(rs, rule[*record.Binding]{"keyHash a UUID", false, func(r *record.Binding) { r.KeyHash = idA }})
	checkRules(t, validBinding, rs)
}

func TestRefusalRules(t *testing.T) {
	// setEnvelope keeps size, digest and id those of the bytes.
	setEnvelope := func(r *record.Refusal, v []byte) {
		r.Envelope, r.Size, r.EnvelopeDigest = v, int64(len(v)), digestOf(v)
		r.RefusalID = record.RefusalID(r.EnvelopeDigest)
	}
	ofLen := func(n int) []byte { // a compact object of exactly n bytes
		return []byte(`{"a":"` + strings.Repeat("x", n-8) + `"}`)
	}
	var rs []rule[*record.Refusal]
	rs = append(rs, uuidRules("refusalId", func(r *record.Refusal, v string) { r.RefusalID = v })...)
	rs = append(rs, digestRules("envelopeDigest", func(r *record.Refusal, v string) { r.EnvelopeDigest = v })...)
	rs = append(rs, timeRules("receivedAt", func(r *record.Refusal, v int64) { r.ReceivedAt = v })...)
	rs = append(rs, timeRules("retainUntil", func(r *record.Refusal, v int64) { r.RetainUntil = v })...)
	rs = append(rs, []rule[*record.Refusal]{
		{"envelopeId upper case", false, func(r *record.Refusal) { r.EnvelopeID = strings.ToUpper(idA) }},
		{"envelopeId not a UUID", false, func(r *record.Refusal) { r.EnvelopeID = "envelope-1" }},
	}...)
	rs = append(rs, rule[*record.Refusal]{"senderDid not a did:key", false, func(r *record.Refusal) { r.SenderDID = "did:web:x" }})
	rs = append(rs, rawRules("envelope", func(r *record.Refusal, v json.RawMessage) { setEnvelope(r, v) })...)
	for _, reason := range record.RefusalReasons {
		rs = append(rs, rule[*record.Refusal]{"reason " + reason, true, func(r *record.Refusal) { r.Reason = reason }})
	}
	rs = append(rs, []rule[*record.Refusal]{
		{"reason unknown", false, func(r *record.Refusal) { r.Reason = "rude" }},
		{"reason empty", false, func(r *record.Refusal) { r.Reason = "" }},
		{"refusalId of another digest", false, func(r *record.Refusal) { r.RefusalID = record.RefusalID(digestOf([]byte("x"))) }},
		{"refusalId a random UUID", false, func(r *record.Refusal) { r.RefusalID = idA }},
		{"no envelopeId", true, func(r *record.Refusal) { r.EnvelopeID = "" }},
		{"no senderDid", true, func(r *record.Refusal) { r.SenderDID = "" }},
		{"no envelope bytes kept", true, func(r *record.Refusal) { r.Envelope = nil }},
		{"no envelope, size 0", true, func(r *record.Refusal) { r.Envelope, r.Size = nil, 0 }},
		{"no envelope, size -1", false, func(r *record.Refusal) { r.Envelope, r.Size = nil, -1 }},
		{"size one more than the envelope", false, func(r *record.Refusal) { r.Size++ }},
		{"size one less than the envelope", false, func(r *record.Refusal) { r.Size-- }},
		{"envelope of other bytes than the digest", false, func(r *record.Refusal) { r.Envelope = []byte(`{"v":8}`) }},
		{"envelope of the limit", true, func(r *record.Refusal) { setEnvelope(r, ofLen(record.MaxRefusalEnvelope)) }},
		{"envelope one past the limit", false, func(r *record.Refusal) { setEnvelope(r, ofLen(record.MaxRefusalEnvelope+1)) }},
	}...)
	checkRules(t, validRefusal, rs)
}
