package record

import (
	"strings"

	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// How the carrier words a closed envelope's lastError, by what closed it: readers
// that must tell the closer from the envelope alone (maintenance, fsck) read these.
const (
	RefusedPrefix = "refused by the relay: "
	ExpiredPrefix = "expired: "
)

// CloserOf returns the closedBy that closed envelope o implies: an operator's cancel
// records its action; the carrier words the relay's refusal, the target's expiry and
// the deadline (errcode OUTBOX_DEADLINE_EXPIRED), and a deadline at or before nowMs
// says deadline. "" when none of these says why.
func CloserOf(o *Outbox, nowMs int64) string {
	switch {
	case o.Operator != nil && o.Operator.Op == ActionCancel:
		return ClosedByCancelled
	case strings.HasPrefix(o.LastError, RefusedPrefix):
		return ClosedByRefused
	case strings.HasPrefix(o.LastError, ExpiredPrefix):
		return ClosedByExpired
	case strings.HasPrefix(o.LastError, errcode.OutboxDeadlineExpired.String()) || o.DeliveryDeadline <= nowMs:
		return ClosedByDeadline
	}
	return ""
}

// Follow is how a message must move to follow its committed members.
type Follow struct {
	// Status is StatusRelayed or StatusClosed; "" when the message is in step.
	Status string
	// ClosedBy (closed) is the closer the envelope implies (CloserOf), "" when it
	// cannot be told; Reason is the envelope's lastError.
	ClosedBy, Reason string
	// Attempts is the envelope's attempts, which the message's must reach.
	Attempts int
	// Envelope is the member that says so.
	Envelope *Outbox
}

// MessageFollow returns how message m must move to follow its committed members, as
// the carrier moves a message in the transaction that settles or closes the member of
// kind message that speaks for it (only such a member does): a queued or relayed
// message with such a member closed closes with the member's closer and reason; a
// queued one with such a member relayed becomes relayed. A crash between the
// publications of that transaction can leave the message behind (both are published
// before one directory fsync each, and either may be lost); maintenance brings it
// forward before it removes the members, and fsck reports it. m nil or in step: the
// zero Follow.
func MessageFollow(m *Message, members []*Outbox, nowMs int64) Follow {
	if m == nil || (m.Status != StatusQueued && m.Status != StatusRelayed) {
		return Follow{}
	}
	var closed, relayed *Outbox
	for _, o := range members {
		if o.EnvelopeKind != EnvelopeMessage {
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
		return Follow{Status: StatusClosed, ClosedBy: CloserOf(closed, nowMs), Reason: closed.LastError,
			Attempts: closed.Attempts, Envelope: closed}
	case relayed != nil && m.Status == StatusQueued:
		return Follow{Status: StatusRelayed, Attempts: relayed.Attempts, Envelope: relayed}
	}
	return Follow{}
}
