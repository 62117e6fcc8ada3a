package store

import (
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
)

// Default retentions of a message record once its message ended (Options).
const (
	DefaultDeliveredRetention = 24 * time.Hour
	DefaultClosedRetention    = 7 * 24 * time.Hour
)

// ClosedRetention is how long this store keeps the record of a failure: a closed
// message, or an inbound envelope the daemon refused.
func (s *Store) ClosedRetention() time.Duration { return s.keepClosed }

// EndMessage ends message m at now (Unix ms), in memory: the caller writes it. status
// is record.StatusDelivered, or record.StatusClosed with closedBy and reason (its
// LastError). It clears the hold and sets RetainUntil by how the message ended:
// Options.DeliveredRetention after a delivery, Options.ClosedRetention after a close,
// and never before the API operation that sent it can end (24 h after the message was
// created): a retry of that operation's Idempotency-Key must find the message, or it
// would enqueue it again. Every writer that ends a message goes through it, so the
// retention has one rule.
func (tx *Tx) EndMessage(m *record.Message, status, closedBy, reason string, now int64) {
	keep := tx.s.keepClosed
	if status == record.StatusDelivered {
		keep, closedBy, reason = tx.s.keepDelivered, "", m.LastError
	}
	now = max(now, 1)
	m.Status, m.ClosedBy, m.LastError, m.UpdatedAt, m.Held = status, closedBy, reason, now, nil
	m.RetainUntil = max(now+keep.Milliseconds(), m.CreatedAt+defaultOperationRetention.Milliseconds())
}
