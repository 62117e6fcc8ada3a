package record_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The fixtures of the rule tests: one valid record of each kind, built fresh per
// call, so a case may change any field of its own copy.

// Fixed ids, lower-case UUIDs.
const (
	idA = "0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90"
	idB = "1c7e3e9f-2d45-4b8c-8f32-4a6e7d8c9ba1"
	idC = "2d8f4fa0-3e56-4c9d-a043-5b7f8e9dacb2"
	idD = "3e905ab1-4f67-4dae-b154-6c809fa0bdc3"
)

// Fixed times: all valid, in order.
const (
	tCreated  int64 = 1767139200000
	tDeadline int64 = 1767225600000
	tRetain   int64 = 1767830400000
)

// maxTime is the largest time a record may hold (docs/FORMAT.md §5: below 2^53).
const maxTime int64 = 1 << 53

func seedIdentity(t testing.TB, b byte) *identity.Identity {
	t.Helper()
	id, err := identity.FromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// owner signs the store; peer is a recipient or sender; stranger is anyone else.
func owner(t testing.TB) *identity.Identity    { return seedIdentity(t, 1) }
func peer(t testing.TB) *identity.Identity     { return seedIdentity(t, 0) }
func stranger(t testing.TB) *identity.Identity { return seedIdentity(t, 2) }

var testEnvelope = json.RawMessage(`{"v":1,"kind":"message","body":"<&>"}`)

func digestOf(raw []byte) string { return envelope.Digest(raw) }

func validOutbox(t testing.TB) *record.Outbox {
	return &record.Outbox{
		EnvelopeID: idA, MessageID: idB, BatchID: idC, EnvelopeKind: record.EnvelopeMessage,
		State: record.StatePending, Ordinal: 0, RelayURL: "https://relay.example/",
		PeerOwnerDID: string(peer(t).DID()), DeliveryDeadline: tDeadline, NextAttemptAt: tCreated,
		Envelope: bytes.Clone(testEnvelope), EnvelopeDigest: digestOf(testEnvelope), RetainUntil: tRetain,
	}
}

func validBatch(t testing.TB) *record.Batch {
	return &record.Batch{
		BatchID: idC, MessageID: idB, EnvelopeIDs: []string{idA, idD},
		PeerOwnerDID: string(peer(t).DID()), RelayURL: "https://relay.example/",
		DeliveryDeadline: tDeadline, CreatedAt: tCreated, RetainUntil: tRetain,
	}
}

func validMessage(t testing.TB) *record.Message {
	return &record.Message{
		MessageID: idB, Status: record.StatusQueued, PeerOwnerDID: string(peer(t).DID()),
		RelayURL: "https://relay.example/", EnvelopeDigest: digestOf(testEnvelope),
		DeliveryDeadline: tDeadline, CreatedAt: tCreated, UpdatedAt: tCreated, RetainUntil: tRetain,
	}
}

func validReceipt(t testing.TB) *record.Receipt {
	return &record.Receipt{
		EnvelopeID: idA, SenderDID: string(peer(t).DID()), EnvelopeDigest: digestOf(testEnvelope),
		State: record.ReceiptPersisted, ReceivedAt: tCreated, RetainUntil: tRetain,
	}
}

func validObservation(t testing.TB) *record.Observation {
	return &record.Observation{
		MessageID: idB, SenderDID: string(peer(t).DID()), EnvelopeDigest: digestOf(testEnvelope),
		CreatedAt: tCreated, DeliveryDeadline: tDeadline,
		Facts: []json.RawMessage{json.RawMessage(`{"fact":1}`)}, Published: []string{idD},
		RetainUntil: tRetain,
	}
}

func validBlob() *record.ObservedBlob {
	return &record.ObservedBlob{EnvelopeID: idA, Digest: digestOf([]byte("sealed")), Size: 1 << 20, BodySize: 1<<20 - 400}
}

func validOperation(t testing.TB) *record.Operation {
	return &record.Operation{
		OperationID: idD, RequestDigest: digestOf([]byte("request")), State: record.OperationDone,
		CreatedAt: tCreated, LeaseUntil: tCreated + 1000, Response: json.RawMessage(`{"ok":true}`),
		RetainUntil: tRetain,
	}
}

func validBinding(t testing.TB) *record.Binding {
	return &record.Binding{
		KeyHash: record.IdempotencyID("key-1"), OperationID: idD, RequestDigest: digestOf([]byte("request")),
		CreatedAt: tCreated, RetainUntil: tRetain,
	}
}

var refusedBytes = []byte(`{"v":9}`)

func validRefusal(t testing.TB) *record.Refusal {
	d := digestOf(refusedBytes)
	return &record.Refusal{
		RefusalID: record.RefusalID(d), Reason: record.RefusedMalformed, EnvelopeID: idA,
		SenderDID: string(peer(t).DID()), EnvelopeDigest: d, Size: int64(len(refusedBytes)),
		ReceivedAt: tCreated, Envelope: bytes.Clone(refusedBytes), RetainUntil: tRetain,
	}
}

// validRecords returns one valid record of every kind, in record.Kinds order.
func validRecords(t testing.TB) []record.Record {
	return []record.Record{validObservation(t), validMessage(t), validOutbox(t), validBatch(t),
		validReceipt(t), validOperation(t), validBinding(t), validRefusal(t)}
}

// encode returns r's file bytes, signed by owner.
func encode(t testing.TB, r record.Record) []byte {
	t.Helper()
	o := owner(t)
	data, err := record.Encode(o.Signer(), o.DID(), r)
	if err != nil {
		t.Fatalf("Encode %s: %v", r.Kind(), err)
	}
	return data
}

// parse parses data as the file of kind/id in owner's store.
func parse(t testing.TB, kind record.Kind, id string, data []byte) (record.Record, error) {
	t.Helper()
	o := owner(t)
	return record.Parse(kind, id, data, o.DID(), o.Public())
}

// signedLine builds a record line by hand: the canonical header of kind/id and
// signerDID around payload, with a signature by key under domain over kind, id and
// payload. It is how a test writes a line Encode never would.
func signedLine(t testing.TB, key *identity.Identity, domain string, kind record.Kind, id string,
	signerDID identity.DID, payload string) []byte {
	t.Helper()
	var sig []byte
	var err error
	if domain == identity.DomainRecord {
		sig, err = identity.SignDomain(key.Signer(), domain, []byte(kind), []byte(id), []byte(payload))
	} else {
		sig, err = identity.SignDomain(key.Signer(), domain, []byte(string(kind)+"\x00"+id+"\x00"+payload))
	}
	if err != nil {
		t.Fatal(err)
	}
	return assemble(kind, id, signerDID, payload, b64(sig))
}

// assemble is the canonical line template with the parts given.
func assemble(kind record.Kind, id string, signerDID identity.DID, payload, sig string) []byte {
	return []byte(`{"v":1,"kind":"` + string(kind) + `","id":"` + id + `","signer":"` + string(signerDID) +
		`","payload":` + payload + `,"sig":"` + sig + "\"}\n")
}

func b64(sig []byte) string { return base64.RawURLEncoding.EncodeToString(sig) }
