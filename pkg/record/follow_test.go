package record_test

import (
	"testing"

	"github.com/sealbridge/sealbridge/pkg/record"
)

func member(kind, state string) *record.Outbox {
	return &record.Outbox{EnvelopeKind: kind, State: state}
}

// MessageFollow: only the envelopes that speak for a message move it — its envelopes
// of kind message, or, for a confirmation (no envelope of kind message), its
// delivery-status; and a held message with nothing pending loses its hold.
func TestMessageFollowSpeaksAndUnholds(t *testing.T) {
	const (
		msg = record.EnvelopeMessage
		ds  = record.EnvelopeDeliveryStatus
	)
	hold := &record.Action{Op: record.ActionHold, By: "uid:1000", At: 1}
	for _, tc := range []struct {
		name    string
		status  string
		held    bool
		members []*record.Outbox
		want    string // Status
		unhold  bool
	}{
		{"message relayed", record.StatusQueued, false, []*record.Outbox{member(msg, record.StateRelayed)}, record.StatusRelayed, false},
		{"confirmation relayed", record.StatusQueued, false, []*record.Outbox{member(ds, record.StateRelayed)}, record.StatusRelayed, false},
		{"confirmation closed", record.StatusQueued, false, []*record.Outbox{member(ds, record.StateClosed)}, record.StatusClosed, false},
		{"delivery-status beside a message does not speak", record.StatusQueued, false,
			[]*record.Outbox{member(msg, record.StatePending), member(ds, record.StateClosed)}, "", false},
		{"relayed stays relayed", record.StatusRelayed, false, []*record.Outbox{member(ds, record.StateRelayed)}, "", false},
		{"held, all settled", record.StatusRelayed, true,
			[]*record.Outbox{member(msg, record.StateRelayed), member(ds, record.StateRelayed)}, "", true},
		{"held, one still pending", record.StatusRelayed, true,
			[]*record.Outbox{member(msg, record.StateRelayed), member(ds, record.StatePending)}, "", false},
		{"held, batch removed", record.StatusRelayed, true, nil, "", true},
		{"held and behind", record.StatusQueued, true, []*record.Outbox{member(msg, record.StateRelayed)}, record.StatusRelayed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &record.Message{Status: tc.status}
			if tc.held {
				m.Held = hold
			}
			f := record.MessageFollow(m, tc.members, 1)
			if f.Status != tc.want || f.Unhold != tc.unhold {
				t.Fatalf("status %q unhold %v, want %q %v", f.Status, f.Unhold, tc.want, tc.unhold)
			}
		})
	}
	delivered := &record.Message{Status: record.StatusDelivered, Held: hold}
	if f := record.MessageFollow(delivered, nil, 1); f != (record.Follow{}) {
		t.Fatalf("a delivered message follows nothing: %+v", f)
	}
}
