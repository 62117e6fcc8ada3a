package jsstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Witnessed store heads (docs/RELAY.md, "Store heads").
//
// A third key-value bucket (default SEALBRIDGE_HEADS) keeps, per sender (key:
// hex sha256 of the DID), the highest store head the relay witnessed: its
// exact bytes, which verify on their own (envelope.ParseStoreHead). RaiseHead
// replaces a head only by one with a higher seq, with a compare-and-set on the
// key's revision (kv.Create for the first, kv.Update at the revision it read),
// so relay processes sharing the bucket never lower it, whatever the
// interleaving: a writer that lost the race reads again and compares again.
// Heads are kept without a TTL: one key per sender that ever sent a head.

// maxHeadRounds bounds RaiseHead's compare-and-set rounds; each lost round
// means another writer raised the head meanwhile.
const maxHeadRounds = 64

// Head returns the highest head witnessed from sender (its bytes), or nil.
func (s *Store) Head(ctx context.Context, sender identity.DID) ([]byte, error) {
	data, _, _, err := s.head(ctx, sender)
	return data, err
}

// head reads sender's head: bytes, seq and the key's revision (0: none).
func (s *Store) head(ctx context.Context, sender identity.DID) ([]byte, int64, uint64, error) {
	e, err := s.heads.Get(ctx, RecipientKey(sender))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, 0, nil
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("jsstore: read the head of %s: %w", sender, err)
	}
	h, err := envelope.ParseStoreHead(e.Value())
	if err != nil || h.Owner != sender {
		return nil, 0, 0, fmt.Errorf("jsstore: the head kept for %s is not one of its heads: %v", sender, err)
	}
	return e.Value(), h.Seq, e.Revision(), nil
}

// RaiseHead keeps data, a store head (it must parse), as its owner's witnessed
// head if its seq is higher than the one kept, and returns the seq kept now
// (data's, or the higher one already there). On return without error that
// seq is durable. Safe concurrently, across processes.
func (s *Store) RaiseHead(ctx context.Context, data []byte) (int64, error) {
	h, err := envelope.ParseStoreHead(data)
	if err != nil {
		return 0, fmt.Errorf("jsstore: raise head: %w", err)
	}
	key := RecipientKey(h.Owner)
	for range maxHeadRounds {
		_, seq, rev, err := s.head(ctx, h.Owner)
		if err != nil {
			return 0, err
		}
		if seq >= h.Seq {
			return seq, nil
		}
		if rev == 0 {
			_, err = s.heads.Create(ctx, key, data)
		} else {
			_, err = s.heads.Update(ctx, key, data, rev)
		}
		switch {
		case err == nil:
			return h.Seq, nil
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch), isWrongLastSeq(err):
			continue // another writer changed it: compare again
		default:
			return 0, fmt.Errorf("jsstore: raise the head of %s: %w", h.Owner, err)
		}
	}
	return 0, fmt.Errorf("jsstore: raise the head of %s: still contended after %d rounds", h.Owner, maxHeadRounds)
}

// Sent is what the store knows of an envelope for its sender: its record, if
// one is kept (ok), and whether its message still waits in the recipient's
// inbox (waiting), as its record names it, with a deadline after now.
func (s *Store) Sent(ctx context.Context, envelopeID string, nowMs int64) (h Held, waiting, ok bool, err error) {
	if checkID(envelopeID) != nil {
		return Held{}, false, false, nil
	}
	rec, err := s.getRecord(ctx, envelopeID)
	if err != nil || rec == nil {
		return Held{}, false, false, err
	}
	m, err := s.stream.GetLastMsgForSubject(ctx, s.envelopeSubject(rec.Recipient, envelopeID))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return Held{}, false, false, fmt.Errorf("jsstore: read the waiting message of %s: %w", envelopeID, err)
	default:
		waiting = m.Sequence == rec.Seq && rec.Deadline > nowMs
	}
	return rec.held(envelopeID), waiting, true, nil
}
