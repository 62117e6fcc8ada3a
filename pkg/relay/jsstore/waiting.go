package jsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Waiting returns the wire bytes and deadline of envelope envelopeID if it
// waits in recipient's inbox (ok false if not: never put, acknowledged or
// expired): what the relay checks before it serves the envelope's body.
func (s *Store) Waiting(ctx context.Context, recipient identity.DID, envelopeID string) (wire []byte, deadline time.Time, ok bool, err error) {
	if err := checkID(envelopeID); err != nil {
		return nil, time.Time{}, false, err
	}
	rkey := RecipientKey(recipient)
	m, err := s.stream.GetLastMsgForSubject(ctx, s.envelopeSubject(rkey, envelopeID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, time.Time{}, false, nil
	}
	if err != nil {
		return nil, time.Time{}, false, fmt.Errorf("jsstore: read the waiting message of %s: %w", envelopeID, err)
	}
	rec, err := recordOf(m.Header, m.Sequence, rkey)
	if err != nil {
		return nil, time.Time{}, false, err
	}
	return m.Data, time.UnixMilli(rec.Deadline), true, nil
}
