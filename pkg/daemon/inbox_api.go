package daemon

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// serveInbox answers GET /v1/inbox?limit=&after=: received messages (observations)
// ordered by reception time (newest last), bodies opened, each with its body's
// length; a large body (a blob) is not in the list, only its length (body_api.go
// serves it). after is the messageId
// of the last message of the previous page.
func (d *Daemon) serveInbox(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after := q.Get("after")
	limit := defaultPageSize
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, codeBadRequest, "limit must be a positive integer")
			return
		}
		limit = min(n, maxPageSize)
	}
	if after != "" && !uuid.Valid(after) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "after must be a message id")
		return
	}
	var all []client.InboxMessage
	err := d.st.Scan(r.Context(), record.KindObservations, func(rec record.Record) error {
		o := rec.(*record.Observation)
		m := client.InboxMessage{MessageID: o.MessageID, From: o.SenderDID, ReceivedAt: msTime(o.CreatedAt)}
		if len(o.Facts) > 0 {
			var fc fact
			if json.Unmarshal(o.Facts[0], &fc) == nil {
				m.ReceivedAt = msTime(fc.ReceivedAt)
				m.Body, _ = base64.StdEncoding.DecodeString(fc.Body)
			}
		}
		if m.Body == nil {
			m.Body = []byte{}
		}
		m.BodySize = int64(len(m.Body))
		if o.Blob != nil {
			// A large body stays in its blob: GET /v1/inbox/{messageId}/body streams it.
			m.Body, m.BodySize, m.Blob = []byte{}, o.Blob.BodySize, true
		}
		all = append(all, m)
		return nil
	})
	if err != nil {
		d.writeStoreError(w, err)
		return
	}
	slices.SortStableFunc(all, func(a, b client.InboxMessage) int {
		return cmp.Or(a.ReceivedAt.Compare(b.ReceivedAt), cmp.Compare(a.MessageID, b.MessageID))
	})
	start := 0
	if after != "" {
		i := slices.IndexFunc(all, func(m client.InboxMessage) bool { return m.MessageID == after })
		if i < 0 {
			writeError(w, http.StatusBadRequest, codeBadRequest, "after names no received message")
			return
		}
		start = i + 1
	}
	out := client.InboxList{Messages: []client.InboxMessage{}}
	rest := all[start:]
	if len(rest) > limit {
		rest = rest[:limit]
		out.Next = rest[len(rest)-1].MessageID
	}
	out.Messages = append(out.Messages, rest...)
	writeJSON(w, http.StatusOK, out)
}

// serveInboxRefused answers GET /v1/inbox/refused: the refused inbound envelopes
// still kept (refusals records), oldest first. They are evidence, never part of
// GET /v1/inbox.
func (d *Daemon) serveInboxRefused(w http.ResponseWriter, r *http.Request) {
	out := client.RefusedList{Refused: []client.RefusedEnvelope{}}
	err := d.st.Scan(r.Context(), record.KindRefusals, func(rec record.Record) error {
		f := rec.(*record.Refusal)
		out.Refused = append(out.Refused, client.RefusedEnvelope{RefusalID: f.RefusalID, Reason: f.Reason,
			EnvelopeID: f.EnvelopeID, From: f.SenderDID, EnvelopeDigest: f.EnvelopeDigest, Size: f.Size,
			ReceivedAt: msTime(f.ReceivedAt), RetainUntil: msTime(f.RetainUntil), Envelope: f.Envelope})
		return nil
	})
	if err != nil {
		d.writeStoreError(w, err)
		return
	}
	slices.SortStableFunc(out.Refused, func(a, b client.RefusedEnvelope) int {
		return cmp.Or(a.ReceivedAt.Compare(b.ReceivedAt), cmp.Compare(a.RefusalID, b.RefusalID))
	})
	writeJSON(w, http.StatusOK, out)
}
