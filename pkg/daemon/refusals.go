package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// maxRefusalRecords bounds the refusals records a store keeps (each is removed after
// the closed retention); beyond it a refused envelope is only counted.
var maxRefusalRecords = 10_000

// refusalReason is the reason code of an error of envelope.Parse, CheckRecipient or
// CheckDeadline.
func refusalReason(err error) string {
	switch {
	case errors.Is(err, envelope.ErrTooLarge):
		return record.RefusedOversize
	case errors.Is(err, envelope.ErrSignature):
		return record.RefusedSignature
	case errors.Is(err, envelope.ErrRecipient):
		return record.RefusedRecipient
	case errors.Is(err, envelope.ErrExpired):
		return record.RefusedExpired
	}
	return record.RefusedMalformed
}

// refuse keeps the evidence of an inbound envelope refused for reason (why is only
// logged): a refusals record (once per envelope bytes), kept the store's closed
// retention, and the count by reason. env is the parsed envelope, nil if it did not
// parse. It returns what processEnvelope returns: acknowledge the envelope at the
// relay (so it is not fetched again) once the evidence is durable; never a receipt.
func (f *follower) refuse(ctx context.Context, ie relayproto.InboxEnvelope, env *envelope.Envelope, reason string, why error, attrs ...any) (*pendingReceipt, bool, error) {
	d := f.d
	raw := []byte(ie.Envelope)
	now := time.Now().UnixMilli()
	rf := &record.Refusal{Reason: reason, EnvelopeDigest: envelope.Digest(raw), Size: int64(len(raw)), ReceivedAt: now,
		RetainUntil: now + d.st.ClosedRetention().Milliseconds()}
	rf.RefusalID = record.RefusalID(rf.EnvelopeDigest)
	if env != nil {
		rf.EnvelopeID, rf.SenderDID = env.ID(), string(env.Sender())
	} else {
		rf.EnvelopeID, rf.SenderDID = claimed(raw)
	}
	if len(raw) <= record.MaxRefusalEnvelope {
		rf.Envelope = raw
		if rf.Validate() != nil {
			rf.Envelope = nil // not a compact object: the digest and size are the evidence
		}
	}
	ids, err := d.st.List(record.KindRefusals)
	if err != nil {
		return nil, false, err
	}
	if len(ids) >= maxRefusalRecords {
		// A sender flooding the inbox with what it knows will be refused must not
		// grow the store without bound: counted, logged, not kept.
		d.m.inboxRefused.WithLabelValues(reason).Inc()
		d.m.refusalsNotKept.Inc()
		d.log.Warn("inbox: refused an envelope, not kept: the store holds the most refusals it keeps",
			append([]any{"envelope", ie.EnvelopeID, "reason", reason, "kept", len(ids), "err", why}, attrs...)...)
		return nil, true, nil
	}
	err = d.st.Transaction(ctx, func(tx *store.Tx) error {
		prev, err := store.TxGet[*record.Refusal](tx, rf.RefusalID)
		if err != nil || prev != nil {
			return err // refused before: one record of the bytes
		}
		return tx.Put(rf)
	})
	if err != nil {
		return nil, false, err
	}
	d.m.inboxRefused.WithLabelValues(reason).Inc()
	d.log.Warn("inbox: refused an envelope", append([]any{"envelope", ie.EnvelopeID, "reason", reason, "refusal", rf.RefusalID,
		"err", why}, attrs...)...)
	return nil, true, nil
}

// claimed returns the envelope id and sender an envelope that did not parse claims,
// each only if it is well-formed.
func claimed(raw []byte) (envelopeID, sender string) {
	var w struct {
		Payload struct {
			EnvelopeID string `json:"envelopeId"`
			SenderDID  string `json:"senderDid"`
		} `json:"payload"`
	}
	if json.Unmarshal(raw, &w) != nil {
		return "", ""
	}
	if uuid.Valid(w.Payload.EnvelopeID) {
		envelopeID = w.Payload.EnvelopeID
	}
	if _, err := identity.ParseDID(w.Payload.SenderDID); err == nil {
		sender = w.Payload.SenderDID
	}
	return envelopeID, sender
}
