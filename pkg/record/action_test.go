package record_test

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

func heldMessage(t *testing.T) *record.Message {
	t.Helper()
	peer, err := identity.FromSeed(make([]byte, ed25519.SeedSize))
	if err != nil {
		t.Fatal(err)
	}
	return &record.Message{MessageID: "0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90", Status: record.StatusQueued,
		PeerOwnerDID: string(peer.DID()), RelayURL: "https://relay.example/",
		EnvelopeDigest: envelope.Digest([]byte(`{"example":true}`)), DeliveryDeadline: 1767225600000,
		CreatedAt: 1767139200000, UpdatedAt: 1767139200000, RetainUntil: 1767830400000,
		Held:     &record.Action{Op: record.ActionHold, By: "uid:1000", At: 1767139300000, Reason: "peer asked to wait"},
		Operator: &record.Action{Op: record.ActionHold, By: "uid:1000", At: 1767139300000}}
}

// An operator's action is checked like every other field: a known op, a caller, a
// time, a bounded reason, and a hold that is a hold.
func TestActionValidation(t *testing.T) {
	if err := heldMessage(t).Validate(); err != nil {
		t.Fatalf("a held message: %v", err)
	}
	for name, change := range map[string]func(m *record.Message){
		"unknown op":        func(m *record.Message) { m.Operator.Op = "pause" },
		"held by a release": func(m *record.Message) { m.Held.Op = record.ActionRelease },
		"no caller":         func(m *record.Message) { m.Held.By = "" },
		"caller too long":   func(m *record.Message) { m.Operator.By = strings.Repeat("u", record.MaxActionBy+1) },
		"reason too long":   func(m *record.Message) { m.Held.Reason = strings.Repeat("r", record.MaxActionReason+1) },
		"no time":           func(m *record.Message) { m.Operator.At = 0 },
		"unknown closedBy":  func(m *record.Message) { m.Held, m.Status, m.ClosedBy = nil, record.StatusClosed, "operator" },
	} {
		m := heldMessage(t)
		change(m)
		if err := m.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	m := heldMessage(t)
	m.Held, m.Status, m.ClosedBy = nil, record.StatusClosed, record.ClosedByCancelled
	if err := m.Validate(); err != nil {
		t.Errorf("a cancelled message: %v", err)
	}
}

// A closed message keeps no hold: a writer that closes a held message must clear it
// (fsck reports one that did not, rather than refusing to read it).
func TestHeldOnlyWhileOpen(t *testing.T) {
	prev := heldMessage(t)
	next := record.Clone(prev).(*record.Message)
	next.Status, next.ClosedBy = record.StatusClosed, record.ClosedByDeadline
	if err := next.Validate(); err != nil {
		t.Fatalf("a held closed message must still read: %v", err)
	}
	if err := record.CheckReplacement(prev, next); !errors.Is(err, errcode.InvalidDeliveryStatus) {
		t.Errorf("closing without clearing the hold: %v, want %s", err, errcode.InvalidDeliveryStatus)
	}
	next.Held = nil
	if err := record.CheckReplacement(prev, next); err != nil {
		t.Errorf("closing and clearing the hold: %v", err)
	}
	next.Held = &record.Action{Op: record.ActionHold, By: "uid:1000", At: 1}
	if err := record.CheckReplacement(nil, next); !errors.Is(err, errcode.InvalidDeliveryStatus) {
		t.Errorf("writing a held closed message: %v", err)
	}
}

// Clone copies the actions, so a caller changing a clone's hold does not change a
// cached record.
func TestCloneCopiesActions(t *testing.T) {
	m := heldMessage(t)
	c := record.Clone(m).(*record.Message)
	c.Held.Reason, c.Operator.Op = "changed", record.ActionRetry
	if m.Held.Reason != "peer asked to wait" || m.Operator.Op != record.ActionHold {
		t.Errorf("the clone shares its actions with the original: %+v %+v", m.Held, m.Operator)
	}
}
