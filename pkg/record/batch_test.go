package record_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// membersOf returns the consistent members of b, in its order.
func membersOf(t testing.TB, b *record.Batch) []*record.Outbox {
	out := make([]*record.Outbox, len(b.EnvelopeIDs))
	for i, id := range b.EnvelopeIDs {
		o := validOutbox(t)
		o.EnvelopeID, o.BatchID, o.MessageID, o.Ordinal = id, b.BatchID, b.MessageID, i
		o.PeerOwnerDID, o.RelayURL, o.DeliveryDeadline = b.PeerOwnerDID, b.RelayURL, b.DeliveryDeadline
		out[i] = o
	}
	return out
}

// docs/FORMAT.md §5, batches: member i has the marker's batchId, messageId,
// peerOwnerDid, relayUrl, deliveryDeadline and ordinal i, and the marker lists
// exactly its members in order.
func TestCheckBatch(t *testing.T) {
	b := validBatch(t)
	if err := record.CheckBatch(b, membersOf(t, b)); err != nil {
		t.Fatalf("consistent members: %v", err)
	}
	for name, edit := range map[string]func(ms []*record.Outbox) []*record.Outbox{
		"a member missing":      func(ms []*record.Outbox) []*record.Outbox { ms[1] = nil; return ms },
		"one member too few":    func(ms []*record.Outbox) []*record.Outbox { return ms[:1] },
		"one member too many":   func(ms []*record.Outbox) []*record.Outbox { return append(ms, ms[1]) },
		"no members":            func(ms []*record.Outbox) []*record.Outbox { return nil },
		"members swapped":       func(ms []*record.Outbox) []*record.Outbox { ms[0], ms[1] = ms[1], ms[0]; return ms },
		"another envelope":      func(ms []*record.Outbox) []*record.Outbox { ms[1].EnvelopeID = idB; return ms },
		"another batchId":       func(ms []*record.Outbox) []*record.Outbox { ms[0].BatchID = idD; return ms },
		"another messageId":     func(ms []*record.Outbox) []*record.Outbox { ms[0].MessageID = idA; return ms },
		"another peer":          func(ms []*record.Outbox) []*record.Outbox { ms[1].PeerOwnerDID = otherDID; return ms },
		"another relay":         func(ms []*record.Outbox) []*record.Outbox { ms[1].RelayURL = otherURL; return ms },
		"another deadline":      func(ms []*record.Outbox) []*record.Outbox { ms[0].DeliveryDeadline++; return ms },
		"another ordinal":       func(ms []*record.Outbox) []*record.Outbox { ms[1].Ordinal = 0; return ms },
		"the same member twice": func(ms []*record.Outbox) []*record.Outbox { ms[1] = ms[0]; return ms },
	} {
		if err := record.CheckBatch(b, edit(membersOf(t, b))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestMemberOf(t *testing.T) {
	b := validBatch(t)
	ms := membersOf(t, b)
	for i, o := range ms {
		if !record.MemberOf(b, i, o) {
			t.Errorf("member %d is not a member", i)
		}
		if record.MemberOf(b, i+1, o) {
			t.Errorf("member %d is member %d too", i, i+1)
		}
	}
	if record.MemberOf(b, 0, nil) {
		t.Error("a missing member is a member")
	}
	for name, edit := range map[string]func(o *record.Outbox){
		"batchId":          func(o *record.Outbox) { o.BatchID = idD },
		"messageId":        func(o *record.Outbox) { o.MessageID = idA },
		"peerOwnerDid":     func(o *record.Outbox) { o.PeerOwnerDID = otherDID },
		"relayUrl":         func(o *record.Outbox) { o.RelayURL = otherURL },
		"deliveryDeadline": func(o *record.Outbox) { o.DeliveryDeadline-- },
		"ordinal":          func(o *record.Outbox) { o.Ordinal = 1 },
	} {
		o := membersOf(t, b)[0]
		edit(o)
		if record.MemberOf(b, 0, o) {
			t.Errorf("a member with another %s is a member", name)
		}
	}
	// What a member may differ in: its state and delivery progress.
	o := membersOf(t, b)[0]
	o.State, o.Attempts, o.EnvelopeKind = record.StateClosed, 4, record.EnvelopeDeliveryStatus
	if !record.MemberOf(b, 0, o) {
		t.Error("a closed member is no longer a member")
	}
}

// docs/FORMAT.md §5, singles: batchId equal to envelopeId with ordinal 0; committed
// by its message record with the same messageId, peerOwnerDid, relayUrl,
// deliveryDeadline and envelopeDigest.
func TestSingles(t *testing.T) {
	if !record.IsSingle(idA, idA, 0) {
		t.Error("batchId = envelopeId, ordinal 0: not a single")
	}
	if record.IsSingle(idA, idA, 1) {
		t.Error("ordinal 1 is a single")
	}
	if record.IsSingle(idC, idA, 0) {
		t.Error("another batchId is a single")
	}

	single := func() *record.Outbox {
		o := validOutbox(t)
		o.BatchID = o.EnvelopeID
		return o
	}
	m := validMessage(t)
	if !record.CommitsSingle(m, single()) {
		t.Fatal("the message does not commit its single")
	}
	if record.CommitsSingle(nil, single()) || record.CommitsSingle(m, nil) {
		t.Error("a missing record commits")
	}
	for name, edit := range map[string]func(m *record.Message, o *record.Outbox){
		"not a single (batchId)":   func(_ *record.Message, o *record.Outbox) { o.BatchID = idC },
		"not a single (ordinal)":   func(_ *record.Message, o *record.Outbox) { o.Ordinal = 1 },
		"another messageId":        func(m *record.Message, _ *record.Outbox) { m.MessageID = idD },
		"another envelopeDigest":   func(m *record.Message, _ *record.Outbox) { m.EnvelopeDigest = otherDigest },
		"another peerOwnerDid":     func(m *record.Message, _ *record.Outbox) { m.PeerOwnerDID = otherDID },
		"another relayUrl":         func(m *record.Message, _ *record.Outbox) { m.RelayURL = otherURL },
		"another deliveryDeadline": func(m *record.Message, _ *record.Outbox) { m.DeliveryDeadline++ },
	} {
		m, o := validMessage(t), single()
		edit(m, o)
		if record.CommitsSingle(m, o) {
			t.Errorf("%s: commits", name)
		}
	}
	m, o := validMessage(t), single()
	m.Status, m.Attempts, o.State = record.StatusRelayed, 2, record.StateRelayed
	if !record.CommitsSingle(m, o) {
		t.Error("progress on either side undoes the commit")
	}
}

// CloserOf: an operator's cancel, then the carrier's wording of a refusal, an
// expiry and a deadline, then a deadline at or before now.
func TestCloserOf(t *testing.T) {
	const now = tDeadline
	deadline := errcode.OutboxDeadlineExpired.String()
	cancel := &record.Action{Op: record.ActionCancel, By: "uid:1000", At: tCreated}
	for _, c := range []struct {
		name      string
		operator  *record.Action
		lastError string
		deadline  int64
		want      string
	}{
		{"cancelled", cancel, "", now + 1, record.ClosedByCancelled},
		{"cancelled, though refused", cancel, record.RefusedPrefix + "no", now + 1, record.ClosedByCancelled},
		{"held is not cancelled", operatorHold, "", now + 1, ""},
		{"refused", nil, record.RefusedPrefix + "recipient unknown", now + 1, record.ClosedByRefused},
		{"refused, past its deadline", nil, record.RefusedPrefix + "x", now, record.ClosedByRefused},
		{"expired", nil, record.ExpiredPrefix + "target gone", now + 1, record.ClosedByExpired},
		{"expired, past its deadline", nil, record.ExpiredPrefix + "x", now - 1, record.ClosedByExpired},
		{"deadline by its error", nil, deadline + ": too late", now + 1, record.ClosedByDeadline},
		{"deadline at now", nil, "", now, record.ClosedByDeadline},
		{"deadline before now", nil, "relay down", now - 1, record.ClosedByDeadline},
		{"deadline just after now", nil, "relay down", now + 1, ""},
		{"a prefix not at the start", nil, "x " + record.RefusedPrefix, now + 1, ""},
	} {
		o := validOutbox(t)
		o.State, o.Operator, o.LastError, o.DeliveryDeadline = record.StateClosed, c.operator, c.lastError, c.deadline
		if got := record.CloserOf(o, now); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// MessageFollow: a queued or relayed message follows the members that speak for it
// (its members of kind message; a confirmation's delivery-status): a closed one closes it (with the member's closer, reason and attempts), a relayed one
// makes a queued message relayed; a closed member wins over a relayed one.
func TestMessageFollow(t *testing.T) {
	const now = tCreated // before every deadline: the closer comes from lastError
	member := func(state, kind, lastError string, attempts int) *record.Outbox {
		o := validOutbox(t)
		o.State, o.EnvelopeKind, o.LastError, o.Attempts = state, kind, lastError, attempts
		return o
	}
	pending := member(record.StatePending, record.EnvelopeMessage, "", 0)
	relayed := member(record.StateRelayed, record.EnvelopeMessage, "", 2)
	refused := member(record.StateClosed, record.EnvelopeMessage, record.RefusedPrefix+"no", 3)
	expired := member(record.StateClosed, record.EnvelopeMessage, record.ExpiredPrefix+"gone", 5)
	closedOther := member(record.StateClosed, record.EnvelopeDeliveryStatus, record.RefusedPrefix+"no", 7)
	relayedOther := member(record.StateRelayed, record.EnvelopeDeliveryStatus, "", 8)
	closedUntold := member(record.StateClosed, record.EnvelopeMessage, "who knows", 1)

	msg := func(status string) *record.Message {
		m := validMessage(t)
		m.Status = status
		if status == record.StatusClosed {
			m.ClosedBy = record.ClosedByDeadline
		}
		return m
	}
	closedBy := func(o *record.Outbox, by string) record.Follow {
		return record.Follow{Status: record.StatusClosed, ClosedBy: by, Reason: o.LastError, Attempts: o.Attempts, Envelope: o}
	}
	relayedBy := func(o *record.Outbox) record.Follow {
		return record.Follow{Status: record.StatusRelayed, Attempts: o.Attempts, Envelope: o}
	}
	for _, c := range []struct {
		name    string
		m       *record.Message
		members []*record.Outbox
		want    record.Follow
	}{
		{"no message", nil, []*record.Outbox{refused}, record.Follow{}},
		{"queued, all pending", msg(record.StatusQueued), []*record.Outbox{pending, pending}, record.Follow{}},
		{"queued, no members", msg(record.StatusQueued), nil, record.Follow{}},
		{"queued, one refused", msg(record.StatusQueued), []*record.Outbox{pending, refused}, closedBy(refused, record.ClosedByRefused)},
		{"relayed, one refused", msg(record.StatusRelayed), []*record.Outbox{refused}, closedBy(refused, record.ClosedByRefused)},
		{"queued, closed untold", msg(record.StatusQueued), []*record.Outbox{closedUntold}, closedBy(closedUntold, "")},
		{"queued, the first closed speaks", msg(record.StatusQueued), []*record.Outbox{expired, refused}, closedBy(expired, record.ClosedByExpired)},
		{"queued, closed after relayed", msg(record.StatusQueued), []*record.Outbox{relayed, refused}, closedBy(refused, record.ClosedByRefused)},
		{"queued, one relayed", msg(record.StatusQueued), []*record.Outbox{pending, relayed}, relayedBy(relayed)},
		{"queued, the first relayed speaks", msg(record.StatusQueued), []*record.Outbox{relayed, member(record.StateRelayed, record.EnvelopeMessage, "", 9)}, relayedBy(relayed)},
		{"relayed, one relayed", msg(record.StatusRelayed), []*record.Outbox{relayed}, record.Follow{}},
		{"delivered, one refused", msg(record.StatusDelivered), []*record.Outbox{refused}, record.Follow{}},
		{"closed, one relayed", msg(record.StatusClosed), []*record.Outbox{relayed}, record.Follow{}},
		// Without a member of kind message (a confirmation), the delivery-status
		// members speak (record.Speaks); beside one, they do not.
		{"queued, only delivery-status members, one closed", msg(record.StatusQueued), []*record.Outbox{closedOther, relayedOther}, closedBy(closedOther, record.ClosedByRefused)},
		{"queued, only a delivery-status member relayed", msg(record.StatusQueued), []*record.Outbox{relayedOther}, relayedBy(relayedOther)},
		{"queued, a delivery-status member closed beside a pending message", msg(record.StatusQueued), []*record.Outbox{closedOther, pending}, record.Follow{}},
		{"queued, a delivery-status member closed first", msg(record.StatusQueued), []*record.Outbox{closedOther, relayed}, relayedBy(relayed)},
	} {
		got := record.MessageFollow(c.m, c.members, now)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// The closer of a closed member past its deadline is the deadline: nowMs is passed on.
	late := member(record.StateClosed, record.EnvelopeMessage, "relay down", 1)
	if got := record.MessageFollow(msg(record.StatusQueued), []*record.Outbox{late}, late.DeliveryDeadline); got.ClosedBy != record.ClosedByDeadline {
		t.Errorf("closed at its deadline: closedBy %q, want %q", got.ClosedBy, record.ClosedByDeadline)
	}
}

// Times are positive integers below 2^53 (docs/FORMAT.md §5): 2^53-1 is a time, 2^53
// is not.
func TestTimesBelow2To53(t *testing.T) {
	for _, c := range []struct {
		v  int64
		ok bool
	}{{1, true}, {1<<53 - 1, true}, {1 << 53, false}, {0, false}} {
		m := validMessage(t)
		m.DeliveryDeadline, m.RetainUntil = c.v, c.v
		m.CreatedAt, m.UpdatedAt = 1, 1
		if err := m.Validate(); (err == nil) != c.ok {
			t.Errorf("a message with deadline %d: Validate %v, want ok=%v", c.v, err, c.ok)
		}
	}
}

// A binding never changes (docs/FORMAT.md §5): no field of it, its times included.
func TestBindingNeverChanges(t *testing.T) {
	prev := &record.Binding{KeyHash: record.IdempotencyID("k"), OperationID: "00000000-0000-4000-8000-000000000001",
		RequestDigest: strings.Repeat("a", 64), CreatedAt: 1, RetainUntil: 2}
	if err := record.CheckReplacement(prev, prev); err != nil {
		t.Fatalf("the same binding again: %v", err)
	}
	for name, change := range map[string]func(b *record.Binding){
		"createdAt":   func(b *record.Binding) { b.CreatedAt++ },
		"retainUntil": func(b *record.Binding) { b.RetainUntil++ },
		"operationId": func(b *record.Binding) { b.OperationID = "00000000-0000-4000-8000-000000000002" },
	} {
		next := *prev
		change(&next)
		if err := record.CheckReplacement(prev, &next); !errors.Is(err, errcode.DeliveryRecordConflict) {
			t.Errorf("a binding with another %s: %v, want DELIVERY_RECORD_CONFLICT", name, err)
		}
	}
}
