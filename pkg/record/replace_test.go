package record_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// A change case takes a valid record to its replacement and names the error code
// CheckReplacement must return (nil: the replacement is allowed).
type change[R record.Record] struct {
	name string
	want *errcode.Code
	edit func(prev, next R)
}

func checkChanges[R record.Record](t *testing.T, fresh func(testing.TB) R, changes []change[R]) {
	t.Helper()
	if err := record.CheckReplacement(fresh(t), fresh(t)); err != nil {
		t.Fatalf("replacing a record by itself: %v", err)
	}
	for _, c := range changes {
		prev, next := fresh(t), fresh(t)
		c.edit(prev, next)
		err := record.CheckReplacement(prev, next)
		switch {
		case c.want == nil && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
}

var (
	conflict     = errcode.DeliveryRecordConflict
	badStatus    = errcode.InvalidDeliveryStatus
	statusClash  = errcode.DeliveryStatusConflict
	otherDID     = "did:key:z6Mkon3Necd6NkkyfoGoHxid2znGc59LU3K7mubaRcFbLfLX"
	otherURL     = "https://other.example/"
	otherDigest  = digestOf([]byte("other"))
	operatorHold = &record.Action{Op: record.ActionHold, By: "uid:1000", At: tCreated}
)

// docs/FORMAT.md §5, outbox: envelope, envelopeDigest, messageId, batchId, ordinal,
// kind, peerOwnerDid and relayUrl never change; pending → relayed or closed, both
// final; only a pending envelope is held.
func TestOutboxReplacement(t *testing.T) {
	state := func(from, to string) func(p, n *record.Outbox) {
		return func(p, n *record.Outbox) { p.State, n.State = from, to }
	}
	checkChanges(t, validOutbox, []change[*record.Outbox]{
		{"envelope", conflict, func(_, n *record.Outbox) { n.Envelope = json.RawMessage(`{"v":2}`) }},
		{"envelopeDigest", conflict, func(_, n *record.Outbox) { n.EnvelopeDigest = otherDigest }},
		{"messageId", conflict, func(_, n *record.Outbox) { n.MessageID = idD }},
		{"batchId", conflict, func(_, n *record.Outbox) { n.BatchID = idD }},
		{"ordinal", conflict, func(_, n *record.Outbox) { n.Ordinal = 1 }},
		{"kind", conflict, func(_, n *record.Outbox) { n.EnvelopeKind = record.EnvelopeDeliveryStatus }},
		{"peerOwnerDid", conflict, func(_, n *record.Outbox) { n.PeerOwnerDID = otherDID }},
		{"relayUrl", conflict, func(_, n *record.Outbox) { n.RelayURL = otherURL }},
		{"a conflict and a settled state", conflict, func(p, n *record.Outbox) {
			p.State, n.State, n.RelayURL = record.StateRelayed, record.StatePending, otherURL
		}},

		{"deliveryDeadline", nil, func(_, n *record.Outbox) { n.DeliveryDeadline++ }},
		{"nextAttemptAt", nil, func(_, n *record.Outbox) { n.NextAttemptAt += 1000 }},
		{"attempts", nil, func(_, n *record.Outbox) { n.Attempts = 3 }},
		{"lastError", nil, func(_, n *record.Outbox) { n.LastError = "relay down" }},
		{"lease taken", nil, func(_, n *record.Outbox) { n.Lease = &record.Lease{Holder: "c", Until: tCreated} }},
		{"unreachableSince", nil, func(_, n *record.Outbox) { n.UnreachableSince = tCreated }},
		{"operator", nil, func(_, n *record.Outbox) { n.Operator = operatorHold }},
		{"retainUntil", nil, func(_, n *record.Outbox) { n.RetainUntil++ }},

		{"pending → relayed", nil, state(record.StatePending, record.StateRelayed)},
		{"pending → closed", nil, state(record.StatePending, record.StateClosed)},
		{"relayed → relayed", nil, state(record.StateRelayed, record.StateRelayed)},
		{"closed → closed", nil, state(record.StateClosed, record.StateClosed)},
		{"relayed → pending", badStatus, state(record.StateRelayed, record.StatePending)},
		{"relayed → closed", badStatus, state(record.StateRelayed, record.StateClosed)},
		{"closed → pending", badStatus, state(record.StateClosed, record.StatePending)},
		{"closed → relayed", badStatus, state(record.StateClosed, record.StateRelayed)},

		{"held while pending", nil, func(_, n *record.Outbox) { n.Held = operatorHold }},
		{"held and relayed", badStatus, func(p, n *record.Outbox) { p.Held, n.Held, n.State = operatorHold, operatorHold, record.StateRelayed }},
		{"held and closed", badStatus, func(p, n *record.Outbox) { p.Held, n.Held, n.State = operatorHold, operatorHold, record.StateClosed }},
		{"closing clears the hold", nil, func(p, n *record.Outbox) { p.Held, n.State = operatorHold, record.StateClosed }},
	})
	// A first write has no previous version to keep, but the hold rule holds.
	n := validOutbox(t)
	n.State, n.Held = record.StateRelayed, operatorHold
	if err := record.CheckReplacement(nil, n); !errors.Is(err, badStatus) {
		t.Errorf("first write of a held relayed envelope: %v, want %s", err, badStatus)
	}
	n.State = record.StatePending
	if err := record.CheckReplacement(nil, n); err != nil {
		t.Errorf("first write of a held pending envelope: %v", err)
	}
	n.State, n.Held, n.RelayURL = record.StateClosed, nil, otherURL
	if err := record.CheckReplacement(nil, n); err != nil {
		t.Errorf("first write of a closed envelope: %v", err)
	}
}

// A marker never changes: any field changed is a conflict.
func TestBatchReplacement(t *testing.T) {
	checkChanges(t, validBatch, []change[*record.Batch]{
		{"batchId", conflict, func(_, n *record.Batch) { n.BatchID = idD }},
		{"messageId", conflict, func(_, n *record.Batch) { n.MessageID = idD }},
		{"a member added", conflict, func(_, n *record.Batch) { n.EnvelopeIDs = append(n.EnvelopeIDs, idB) }},
		{"a member dropped", conflict, func(_, n *record.Batch) { n.EnvelopeIDs = n.EnvelopeIDs[:1] }},
		{"members reordered", conflict, func(_, n *record.Batch) { n.EnvelopeIDs[0], n.EnvelopeIDs[1] = n.EnvelopeIDs[1], n.EnvelopeIDs[0] }},
		{"peerOwnerDid", conflict, func(_, n *record.Batch) { n.PeerOwnerDID = otherDID }},
		{"relayUrl", conflict, func(_, n *record.Batch) { n.RelayURL = otherURL }},
		{"deliveryDeadline", conflict, func(_, n *record.Batch) { n.DeliveryDeadline++ }},
		{"createdAt", conflict, func(_, n *record.Batch) { n.CreatedAt++ }},
		{"retainUntil", conflict, func(_, n *record.Batch) { n.RetainUntil++ }},
	})
	if err := record.CheckReplacement(nil, validBatch(t)); err != nil {
		t.Errorf("first write of a marker: %v", err)
	}
}

// docs/FORMAT.md §5, messages: routing never changes; status only moves forward
// (INVALID_DELIVERY_STATUS); a second, different terminal outcome is
// DELIVERY_STATUS_CONFLICT; only a queued or relayed message is held.
func TestMessageReplacement(t *testing.T) {
	type st struct{ status, closedBy string }
	var (
		queued    = st{record.StatusQueued, ""}
		relayed   = st{record.StatusRelayed, ""}
		delivered = st{record.StatusDelivered, ""}
		deadline  = st{record.StatusClosed, record.ClosedByDeadline}
		refused   = st{record.StatusClosed, record.ClosedByRefused}
		cancelled = st{record.StatusClosed, record.ClosedByCancelled}
	)
	move := func(from, to st) func(p, n *record.Message) {
		return func(p, n *record.Message) {
			p.Status, p.ClosedBy = from.status, from.closedBy
			n.Status, n.ClosedBy = to.status, to.closedBy
		}
	}
	name := func(from, to st) string { return from.status + from.closedBy + " → " + to.status + to.closedBy }
	transitions := []struct {
		from, to st
		want     *errcode.Code
	}{
		{queued, queued, nil}, {queued, relayed, nil}, {queued, delivered, nil}, {queued, deadline, nil},
		{relayed, relayed, nil}, {relayed, delivered, nil}, {relayed, refused, nil}, {relayed, cancelled, nil},
		{delivered, delivered, nil}, {deadline, deadline, nil}, {cancelled, cancelled, nil},
		{relayed, queued, badStatus},
		{delivered, queued, badStatus}, {delivered, relayed, badStatus},
		{deadline, queued, badStatus}, {refused, relayed, badStatus},
		{delivered, deadline, statusClash}, {deadline, delivered, statusClash},
		{deadline, refused, statusClash}, {cancelled, deadline, statusClash},
	}
	changes := []change[*record.Message]{
		{"peerOwnerDid", conflict, func(_, n *record.Message) { n.PeerOwnerDID = otherDID }},
		{"relayUrl", conflict, func(_, n *record.Message) { n.RelayURL = otherURL }},
		{"envelopeDigest", conflict, func(_, n *record.Message) { n.EnvelopeDigest = otherDigest }},
		{"createdAt", conflict, func(_, n *record.Message) { n.CreatedAt++ }},
		{"deliveryDeadline", conflict, func(_, n *record.Message) { n.DeliveryDeadline++ }},
		{"a conflict and a backward move", conflict, func(p, n *record.Message) {
			p.Status, n.RelayURL = record.StatusRelayed, otherURL
		}},
		{"updatedAt", nil, func(_, n *record.Message) { n.UpdatedAt++ }},
		{"attempts", nil, func(_, n *record.Message) { n.Attempts = 2 }},
		{"lastError", nil, func(_, n *record.Message) { n.LastError = "relay down" }},
		{"operator", nil, func(_, n *record.Message) { n.Operator = operatorHold }},
		{"retainUntil", nil, func(_, n *record.Message) { n.RetainUntil++ }},
		{"held while queued", nil, func(_, n *record.Message) { n.Held = operatorHold }},
		{"held while relayed", nil, func(p, n *record.Message) {
			p.Status, n.Status, n.Held = record.StatusRelayed, record.StatusRelayed, operatorHold
		}},
		{"held and delivered", badStatus, func(_, n *record.Message) { n.Status, n.Held = record.StatusDelivered, operatorHold }},
		{"held and closed", badStatus, func(_, n *record.Message) {
			n.Status, n.ClosedBy, n.Held = record.StatusClosed, record.ClosedByCancelled, operatorHold
		}},
	}
	for _, tr := range transitions {
		changes = append(changes, change[*record.Message]{name(tr.from, tr.to), tr.want, move(tr.from, tr.to)})
	}
	checkChanges(t, validMessage, changes)
	n := validMessage(t)
	n.Status, n.Held = record.StatusDelivered, operatorHold
	if err := record.CheckReplacement(nil, n); !errors.Is(err, badStatus) {
		t.Errorf("first write of a held delivered message: %v, want %s", err, badStatus)
	}
}

// docs/FORMAT.md §5, receipts: the state only rises; envelopeId, senderDid,
// envelopeDigest, receivedAt and senderSeq never change.
func TestReceiptReplacement(t *testing.T) {
	state := func(from, to string) func(p, n *record.Receipt) {
		return func(p, n *record.Receipt) { p.State, n.State = from, to }
	}
	checkChanges(t, validReceipt, []change[*record.Receipt]{
		{"envelopeId", conflict, func(_, n *record.Receipt) { n.EnvelopeID = idD }},
		{"senderDid", conflict, func(_, n *record.Receipt) { n.SenderDID = otherDID }},
		{"envelopeDigest", conflict, func(_, n *record.Receipt) { n.EnvelopeDigest = otherDigest }},
		{"receivedAt", conflict, func(_, n *record.Receipt) { n.ReceivedAt++ }},
		{"senderSeq", conflict, func(_, n *record.Receipt) { n.SenderSeq++ }},
		{"outcomeCode", nil, func(_, n *record.Receipt) { n.OutcomeCode = "OK" }},
		{"retainUntil", nil, func(_, n *record.Receipt) { n.RetainUntil++ }},
		{"persisted → processed", nil, state(record.ReceiptPersisted, record.ReceiptProcessed)},
		{"persisted → terminal", nil, state(record.ReceiptPersisted, record.ReceiptTerminal)},
		{"processed → terminal", nil, state(record.ReceiptProcessed, record.ReceiptTerminal)},
		{"processed → processed", nil, state(record.ReceiptProcessed, record.ReceiptProcessed)},
		{"terminal → terminal", nil, state(record.ReceiptTerminal, record.ReceiptTerminal)},
		{"processed → persisted", badStatus, state(record.ReceiptProcessed, record.ReceiptPersisted)},
		{"terminal → processed", badStatus, state(record.ReceiptTerminal, record.ReceiptProcessed)},
		{"terminal → persisted", badStatus, state(record.ReceiptTerminal, record.ReceiptPersisted)},
	})
}

// docs/FORMAT.md §5, observations: the fixed fields never change; facts and
// published only grow, the old entries byte-identical and in place.
func TestObservationReplacement(t *testing.T) {
	fact2 := json.RawMessage(`{"fact":2}`)
	checkChanges(t, validObservation, []change[*record.Observation]{
		{"senderDid", conflict, func(_, n *record.Observation) { n.SenderDID = otherDID }},
		{"envelopeDigest", conflict, func(_, n *record.Observation) { n.EnvelopeDigest = otherDigest }},
		{"createdAt", conflict, func(_, n *record.Observation) { n.CreatedAt++ }},
		{"deliveryDeadline", conflict, func(_, n *record.Observation) { n.DeliveryDeadline++ }},
		{"retainUntil", conflict, func(_, n *record.Observation) { n.RetainUntil++ }},
		{"a fact added", nil, func(_, n *record.Observation) { n.Facts = append(n.Facts, fact2) }},
		{"a publication added", nil, func(_, n *record.Observation) { n.Published = append(n.Published, idA) }},
		{"both grown", nil, func(_, n *record.Observation) {
			n.Facts, n.Published = append(n.Facts, fact2), append(n.Published, idA)
		}},
		{"from empty lists", nil, func(p, _ *record.Observation) { p.Facts, p.Published = []json.RawMessage{}, []string{} }},
		{"a fact dropped", conflict, func(_, n *record.Observation) { n.Facts = n.Facts[:0] }},
		{"a publication dropped", conflict, func(_, n *record.Observation) { n.Published = n.Published[:0] }},
		{"a fact changed", conflict, func(_, n *record.Observation) { n.Facts = []json.RawMessage{fact2} }},
		{"a fact re-encoded", conflict, func(_, n *record.Observation) { n.Facts = []json.RawMessage{json.RawMessage(`{"fact":1.0}`)} }},
		{"a publication changed", conflict, func(_, n *record.Observation) { n.Published = []string{idA} }},
		{"a fact inserted before the old", conflict, func(_, n *record.Observation) { n.Facts = append([]json.RawMessage{fact2}, n.Facts...) }},
		{"a publication inserted before the old", conflict, func(_, n *record.Observation) { n.Published = append([]string{idA}, n.Published...) }},
		{"a blob added", conflict, func(_, n *record.Observation) { n.Blob = validBlob() }},
		{"a blob removed", conflict, func(p, _ *record.Observation) { p.Blob = validBlob() }},
		{"a blob kept", nil, func(p, n *record.Observation) { p.Blob, n.Blob = validBlob(), validBlob() }},
		{"a blob's digest changed", conflict, func(p, n *record.Observation) {
			p.Blob, n.Blob = validBlob(), validBlob()
			n.Blob.Digest = otherDigest
		}},
		{"a blob's body size changed", conflict, func(p, n *record.Observation) {
			p.Blob, n.Blob = validBlob(), validBlob()
			n.Blob.BodySize++
		}},
	})
}

// docs/FORMAT.md §5, operations: the request never changes; a done operation's
// response never changes.
func TestOperationReplacement(t *testing.T) {
	inFlight := func(r *record.Operation) { r.State, r.Response = record.OperationInFlight, nil }
	checkChanges(t, validOperation, []change[*record.Operation]{
		{"requestDigest", conflict, func(_, n *record.Operation) { n.RequestDigest = otherDigest }},
		{"createdAt", conflict, func(_, n *record.Operation) { n.CreatedAt++ }},
		{"leaseUntil", nil, func(_, n *record.Operation) { n.LeaseUntil++ }},
		{"retainUntil", nil, func(_, n *record.Operation) { n.RetainUntil++ }},
		{"in flight → done", nil, func(p, _ *record.Operation) { inFlight(p) }},
		{"in flight → in flight", nil, func(p, n *record.Operation) { inFlight(p); inFlight(n) }},
		{"done → in flight", conflict, func(_, n *record.Operation) { inFlight(n) }},
		{"done → done with another response", conflict, func(_, n *record.Operation) { n.Response = json.RawMessage(`{"ok":false}`) }},
		{"in flight, request changed", conflict, func(p, n *record.Operation) { inFlight(p); inFlight(n); n.RequestDigest = otherDigest }},
	})
}

// docs/FORMAT.md §5, idempotency: a binding never changes.
func TestBindingReplacement(t *testing.T) {
	checkChanges(t, validBinding, []change[*record.Binding]{
		{"operationId", conflict, func(_, n *record.Binding) { n.OperationID = idA }},
		{"requestDigest", conflict, func(_, n *record.Binding) { n.RequestDigest = otherDigest }},
	})
}

// A previous record of another kind is no previous version: only the rules of the
// new record alone apply.
func TestReplacementOfAnotherKind(t *testing.T) {
	for _, next := range validRecords(t) {
		for _, prev := range validRecords(t) {
			if prev.Kind() == next.Kind() {
				continue
			}
			if err := record.CheckReplacement(prev, next); err != nil {
				t.Errorf("%s replacing %s: %v", next.Kind(), prev.Kind(), err)
			}
		}
	}
}
