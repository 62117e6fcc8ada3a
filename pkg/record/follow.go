package record

import (
	"strings"

	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// How the carrier words a closed envelope's lastError, by what closed it: readers
// that must tell the closer from the envelope alone (maintenance, fsck) read these.
const (
	RefusedPrefix = "refused by the relay: "
	// CarrierRefusedPrefix: the carrier itself found the envelope undeliverable
	// for good (its sealed blob is missing or damaged in the store); it closes
	// as refused, as a relay's permanent refusal does.
	CarrierRefusedPrefix = "refused by the carrier: "
	ExpiredPrefix        = "expired: "
)

// CloserOf returns the closedBy that closed envelope o implies: an operator's cancel
// records its action; the carrier words the relay's refusal, the target's expiry and
// the deadline (errcode OUTBOX_DEADLINE_EXPIRED), and a deadline at or before nowMs
// says deadline. "" when none of these says why.
func CloserOf(o *Outbox, nowMs int64) string {
	switch {
	case o.Operator != nil && o.Operator.Op == ActionCancel:
		return ClosedByCancelled
	case strings.HasPrefix(o.LastError, RefusedPrefix), strings.HasPrefix(o.LastError, CarrierRefusedPrefix):
		return ClosedByRefused
	case strings.HasPrefix(o.LastError, ExpiredPrefix):
		return ClosedByExpired
	case strings.HasPrefix(o.LastError, errcode.OutboxDeadlineExpired.String()) || o.DeliveryDeadline <= nowMs:
		return ClosedByDeadline
	}
	return ""
}

// Speaks reports whether envelope o speaks for its message, whose committed members
// are members (o among them): the carrier moves a message only by the envelopes that
// speak for it. An envelope of kind message speaks; an envelope of kind
// delivery-status speaks only when no member is of kind message — a confirmation (the
// delivery-status a recipient's daemon enqueues back, DESIGN §4 steps 10–11) is a
// message whose one envelope is a delivery-status, and it speaks for itself.
func Speaks(o *Outbox, members []*Outbox) bool {
	if o.EnvelopeKind == EnvelopeMessage {
		return true
	}
	for _, x := range members {
		if x.EnvelopeKind == EnvelopeMessage {
			return false
		}
	}
	return true
}

// AnyPending reports whether one of members is pending.
func AnyPending(members []*Outbox) bool {
	for _, o := range members {
		if o.State == StatePending {
			return true
		}
	}
	return false
}

// Follow is how a message must move to follow its committed members.
type Follow struct {
	// Status is StatusRelayed or StatusClosed; "" when the message's status is in
	// step.
	Status string
	// ClosedBy (closed) is the closer the envelope implies (CloserOf), "" when it
	// cannot be told; Reason is the envelope's lastError.
	ClosedBy, Reason string
	// Attempts is the envelope's attempts, which the message's must reach.
	Attempts int
	// Envelope is the member that says so.
	Envelope *Outbox
	// Unhold: the message is held and none of its members is pending. A hold never
	// outlives the last pending envelope of its message: the transaction that settles
	// or closes that envelope clears the message's hold (closing the message clears it
	// anyway). A message that closes (Status closed) has its hold cleared with the
	// close.
	Unhold bool
}

// MessageFollow returns how message m must move to follow its committed members
// (none when its batch is gone), as the carrier moves a message in the transaction
// that settles or closes a member that speaks for it (Speaks): a queued or relayed
// message with such a member closed closes with the member's closer and reason; a
// queued one with such a member relayed becomes relayed; and a held one with no
// member pending loses its hold (Unhold). A crash between the publications of that
// transaction can leave the message behind (both are published before one directory
// fsync each, and either may be lost); maintenance brings it forward before it
// removes the members, and fsck reports it. m nil, delivered or closed, or in step:
// the zero Follow.
func MessageFollow(m *Message, members []*Outbox, nowMs int64) Follow {
	if m == nil || (m.Status != StatusQueued && m.Status != StatusRelayed) {
		return Follow{}
	}
	var f Follow
	var closed, relayed *Outbox
	for _, o := range members {
		if !Speaks(o, members) {
			continue
		}
		switch {
		case o.State == StateClosed && closed == nil:
			closed = o
		case o.State == StateRelayed && relayed == nil:
			relayed = o
		}
	}
	switch {
	case closed != nil:
		f = Follow{Status: StatusClosed, ClosedBy: CloserOf(closed, nowMs), Reason: closed.LastError,
			Attempts: closed.Attempts, Envelope: closed}
	case relayed != nil && m.Status == StatusQueued:
		f = Follow{Status: StatusRelayed, Attempts: relayed.Attempts, Envelope: relayed}
	}
	f.Unhold = m.Held != nil && !AnyPending(members)
	return f
}
