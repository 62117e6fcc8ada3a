package jsstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Retained delivery statuses (docs/RELAY.md, "Retained delivery statuses").
//
// When a recipient acknowledges a delivery status (AckRetaining), a copy is
// published to the inbox stream on PREFIX.statuses.<hex sha256(recipient
// DID)>.<envelopeId> — outside every inbox's filter (a recipient key is 64 hex
// digits, never "statuses") — with "expected last sequence 0" for its subject,
// so an acknowledgement retried keeps one copy. Its Sealbridge-Deadline header
// is the end of its retention (the relay's: acknowledgement + its retention):
// the expiry pass (Expire, which scans every subject of the stream) removes it
// then, and PageStatuses never serves it at or after that. The copies are in
// stream order, which is the order they were retained; the cursor is the
// stream sequence, as for the inboxes.

func (s *Store) statusFilter(rkey string) string { return s.subject + ".statuses." + rkey + ".*" }

func (s *Store) statusSubject(rkey, id string) string {
	return s.subject + ".statuses." + rkey + "." + id
}

// retainStatus publishes the retained copy of inbox message m (envelope id of
// recipient key rkey).
func (s *Store) retainStatus(ctx context.Context, rkey, id string, m *jetstream.RawStreamMsg, until time.Time) error {
	msg := nats.NewMsg(s.statusSubject(rkey, id))
	msg.Data = m.Data
	msg.Header.Set(hdrID, id)
	msg.Header.Set(hdrDigest, m.Header.Get(hdrDigest))
	msg.Header.Set(hdrReceivedAt, m.Header.Get(hdrReceivedAt))
	msg.Header.Set(hdrDeadline, strconv.FormatInt(until.UnixMilli(), 10))
	msg.Header.Set(hdrRetained, "1")
	_, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil && !isWrongLastSeq(err) { // wrong last sequence: retained already
		return fmt.Errorf("retain status %s: %w", id, err)
	}
	return nil
}

// PageStatuses returns recipient's retained delivery statuses after cursor
// after ("": from the first) in the order they were retained, those received
// (by the relay, as envelopes) at or after since and retained past now, at
// most limit (1..256, default 64) and 4 MiB of them.
func (s *Store) PageStatuses(ctx context.Context, recipient identity.DID, since, now time.Time, after string, limit int) (*Page, error) {
	seq, err := ParseCursor(after)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 64
	}
	limit = min(limit, maxFetchLimit)
	rkey := RecipientKey(recipient)
	filter := s.statusFilter(rkey)
	page := &Page{Envelopes: []Envelope{}, Cursor: strconv.FormatUint(seq, 10)}
	bytes := 0
	for seq < math.MaxUint64 {
		m, err := s.stream.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("jsstore: read statuses: %w", err)
		}
		rec, err := recordOf(m.Header, m.Sequence, rkey)
		if err != nil {
			return nil, err
		}
		if rec.Deadline <= now.UnixMilli() || rec.ReceivedAt < since.UnixMilli() {
			seq = m.Sequence
			page.Cursor = strconv.FormatUint(seq, 10)
			continue
		}
		if len(page.Envelopes) == limit || (len(page.Envelopes) > 0 && bytes+len(m.Data) > maxPageBytes) {
			page.More = true
			break
		}
		seq = m.Sequence
		page.Cursor = strconv.FormatUint(seq, 10)
		bytes += len(m.Data)
		page.Envelopes = append(page.Envelopes, Envelope{Held: rec.held(m.Header.Get(hdrID)), Wire: m.Data})
	}
	return page, nil
}
