package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Record is one typed record. Times are Unix milliseconds.
type Record interface {
	// Kind returns the record's kind.
	Kind() Kind
	// RecordID returns the id the record's file must have.
	RecordID() string
	// Validate checks the record's own fields (not its relation to other records).
	Validate() error
}

// Lease marks envelopes (or an operation) as taken by a holder until a time.
type Lease struct {
	Holder string `json:"holder"`
	Until  int64  `json:"until"`
}

// Outbox states.
const (
	StatePending = "pending"
	StateRelayed = "relayed"
	StateClosed  = "closed"
)

// Outbox envelope kinds.
const (
	EnvelopeMessage        = "message"
	EnvelopeDeliveryStatus = "delivery-status"
)

// Outbox is one envelope to deliver. Envelope and EnvelopeDigest never change once written.
type Outbox struct {
	EnvelopeID       string `json:"envelopeId"`
	MessageID        string `json:"messageId"`
	BatchID          string `json:"batchId"`
	EnvelopeKind     string `json:"kind"`
	State            string `json:"state"`
	Ordinal          int    `json:"ordinal"`
	RelayURL         string `json:"relayUrl"`
	PeerOwnerDID     string `json:"peerOwnerDid"`
	DeliveryDeadline int64  `json:"deliveryDeadline"`
	NextAttemptAt    int64  `json:"nextAttemptAt"`
	Attempts         int    `json:"attempts"`
	LastError        string `json:"lastError,omitempty"`
	Lease            *Lease `json:"lease,omitempty"`
	// UnreachableSince, when not 0, is when the carrier first found this envelope's
	// relay unreachable: the persisted target wait (DESIGN §11). It may change.
	UnreachableSince int64 `json:"unreachableSince,omitempty"`
	// Held, when set, is the operator's hold in force (Op hold): the carrier never
	// dispatches a held envelope, and its deadline still closes it. Only a pending
	// envelope is held; settling or closing one clears it.
	Held *Action `json:"held,omitempty"`
	// Operator is the last operator action that changed this envelope (hold,
	// release, cancel, retry); the carrier makes none (it copies a message's cancel
	// onto a member an interrupted cancel left pending).
	Operator       *Action         `json:"operator,omitempty"`
	Envelope       json.RawMessage `json:"envelope"`
	EnvelopeDigest string          `json:"envelopeDigest"`
	RetainUntil    int64           `json:"retainUntil"`
}

// Operator actions (docs/FORMAT.md §5).
const (
	ActionHold    = "hold"
	ActionRelease = "release"
	ActionCancel  = "cancel"
	ActionRetry   = "retry"
)

// Action is one operator action as the records it changed keep it: which action, who
// asked (the caller as the daemon identified it, e.g. "uid:1000"), when, and why. The
// carrier makes none, so a reader can tell an operator's decision from the
// carrier's own.
type Action struct {
	Op     string `json:"op"`
	By     string `json:"by"`
	At     int64  `json:"at"`
	Reason string `json:"reason,omitempty"`
}

// Bounds of an Action's free-text fields, in bytes.
const (
	MaxActionBy     = 128
	MaxActionReason = 256
)

func checkAction(field string, a *Action, wantOp string) error {
	if a == nil {
		return nil
	}
	switch a.Op {
	case ActionHold, ActionRelease, ActionCancel, ActionRetry:
	default:
		return invalid("%s.op %q is not hold, release, cancel or retry", field, a.Op)
	}
	if wantOp != "" && a.Op != wantOp {
		return invalid("%s.op must be %s", field, wantOp)
	}
	if a.By == "" || len(a.By) > MaxActionBy || len(a.Reason) > MaxActionReason {
		return invalid("%s needs a by of 1..%d bytes and a reason of at most %d", field, MaxActionBy, MaxActionReason)
	}
	return checkTime(field+".at", a.At)
}

// Batch is the commit marker of 1..N outbox members of one message.
type Batch struct {
	BatchID          string   `json:"batchId"`
	MessageID        string   `json:"messageId"`
	EnvelopeIDs      []string `json:"envelopeIds"`
	PeerOwnerDID     string   `json:"peerOwnerDid"`
	RelayURL         string   `json:"relayUrl"`
	DeliveryDeadline int64    `json:"deliveryDeadline"`
	CreatedAt        int64    `json:"createdAt"`
	RetainUntil      int64    `json:"retainUntil"`
}

// Message statuses and closers.
const (
	StatusQueued    = "queued"
	StatusRelayed   = "relayed"
	StatusDelivered = "delivered"
	StatusClosed    = "closed"

	ClosedByDeadline = "deadline"
	ClosedByRefused  = "refused"
	ClosedByExpired  = "expired"
	// ClosedByCancelled is an operator's cancel (the message's Operator says who).
	ClosedByCancelled = "cancelled"
)

// Message is a sent message's status.
type Message struct {
	MessageID        string `json:"messageId"`
	Status           string `json:"status"`
	ClosedBy         string `json:"closedBy,omitempty"`
	LastError        string `json:"lastError,omitempty"`
	PeerOwnerDID     string `json:"peerOwnerDid"`
	RelayURL         string `json:"relayUrl"`
	EnvelopeDigest   string `json:"envelopeDigest"`
	DeliveryDeadline int64  `json:"deliveryDeadline"`
	CreatedAt        int64  `json:"createdAt"`
	UpdatedAt        int64  `json:"updatedAt"`
	Attempts         int    `json:"attempts"`
	// Held, when set, is the operator's hold on the message's pending envelopes (Op
	// hold); only a queued or relayed message is held, and closing one clears it.
	Held *Action `json:"held,omitempty"`
	// Operator is the last operator action that changed this message.
	Operator    *Action `json:"operator,omitempty"`
	RetainUntil int64   `json:"retainUntil"`
}

// Receipt states, in rank order.
const (
	ReceiptPersisted = "persisted"
	ReceiptProcessed = "processed"
	ReceiptTerminal  = "terminal"
)

// Receipt is an inbound envelope's local receipt.
type Receipt struct {
	EnvelopeID     string `json:"envelopeId"`
	SenderDID      string `json:"senderDid"`
	EnvelopeDigest string `json:"envelopeDigest"`
	State          string `json:"state"`
	OutcomeCode    string `json:"outcomeCode,omitempty"`
	ReceivedAt     int64  `json:"receivedAt"`
	RetainUntil    int64  `json:"retainUntil"`
	// SenderSeq is, in a relay's receipt records, the store-head seq the relay
	// had witnessed from the sender when it accepted the envelope (signed into
	// its receipt as envelope.RelayReceipt.SenderSeq); 0 (omitted) when none.
	SenderSeq int64 `json:"senderSeq,omitempty"`
}

// Observation is an inbound message as observed. Its fixed fields (Blob among
// them) never change and Facts and Published only grow.
type Observation struct {
	MessageID        string `json:"messageId"`
	SenderDID        string `json:"senderDid"`
	EnvelopeDigest   string `json:"envelopeDigest"`
	CreatedAt        int64  `json:"createdAt"`
	DeliveryDeadline int64  `json:"deliveryDeadline"`
	// Blob, when set, names the sealed blob of a large body, held in the
	// store's blobs/ (docs/FORMAT.md, "Blobs"); its facts then hold no body.
	Blob        *ObservedBlob     `json:"blob,omitempty"`
	Facts       []json.RawMessage `json:"facts"`
	Published   []string          `json:"published"`
	RetainUntil int64             `json:"retainUntil"`
}

// ObservedBlob is the sealed blob of an observed message: the envelope it came
// in, the blob's digest (lower-case hex SHA-256 of the sealed bytes) and sealed
// size, and the plaintext length the recipient verified.
type ObservedBlob struct {
	EnvelopeID string `json:"envelopeId"`
	Digest     string `json:"digest"`
	Size       int64  `json:"size"`
	BodySize   int64  `json:"bodySize"`
}

// Refusal reasons: why the daemon refused an inbound envelope (a bounded set, the
// label of its metric).
const (
	RefusedOversize  = "oversize"         // larger than an envelope may be
	RefusedMalformed = "malformed"        // not a canonical, valid envelope (or another version)
	RefusedSignature = "signature"        // its signature does not verify under its sender's key
	RefusedRecipient = "recipient"        // addressed to someone else
	RefusedExpired   = "expired"          // its delivery deadline had passed
	RefusedConflict  = "conflict"         // a known envelope id with other bytes
	RefusedObserved  = "message-observed" // its message id was already observed from another envelope
	RefusedKind      = "unknown-kind"     // a kind this daemon does not handle
	RefusedBody      = "body-unopenable"  // its body does not open with our key
	// The sealed blob of a large body (its codes: BODY_TOO_LARGE,
	// BODY_CHUNK_INVALID, BODY_DIGEST_MISMATCH, BODY_SIZE_MISMATCH).
	RefusedBodyTooLarge = "body-too-large"       // larger than this daemon's --max-body
	RefusedBodyChunk    = "body-chunk-invalid"   // a chunk (or the header) does not verify
	RefusedBodyDigest   = "body-digest-mismatch" // the downloaded bytes kept another SHA-256
	RefusedBodySize     = "body-size-mismatch"   // the relay served another length
)

// RefusalReasons lists every refusal reason.
var RefusalReasons = []string{RefusedOversize, RefusedMalformed, RefusedSignature, RefusedRecipient, RefusedExpired,
	RefusedConflict, RefusedObserved, RefusedKind, RefusedBody,
	RefusedBodyTooLarge, RefusedBodyChunk, RefusedBodyDigest, RefusedBodySize}

// Refusal is the evidence of an inbound envelope the daemon refused: never a receipt,
// never delivered. EnvelopeID and SenderDID are what the envelope claims, when they
// parse (unverified unless the reason comes after the signature check); Envelope
// holds its bytes when they are a compact JSON object of at most MaxRefusalEnvelope
// bytes.
type Refusal struct {
	RefusalID      string          `json:"refusalId"`
	Reason         string          `json:"reason"`
	EnvelopeID     string          `json:"envelopeId,omitempty"`
	SenderDID      string          `json:"senderDid,omitempty"`
	EnvelopeDigest string          `json:"envelopeDigest"`
	Size           int64           `json:"size"`
	ReceivedAt     int64           `json:"receivedAt"`
	Envelope       json.RawMessage `json:"envelope,omitempty"`
	RetainUntil    int64           `json:"retainUntil"`
}

// MaxRefusalEnvelope bounds the envelope bytes a refusal keeps (an envelope's size limit).
const MaxRefusalEnvelope = envelope.MaxSize

func (r *Refusal) Validate() error {
	if err := firstErr(checkUUID("refusalId", r.RefusalID), checkDigest("envelopeDigest", r.EnvelopeDigest),
		checkTime("receivedAt", r.ReceivedAt), checkTime("retainUntil", r.RetainUntil)); err != nil {
		return err
	}
	if r.RefusalID != RefusalID(r.EnvelopeDigest) {
		return invalid("refusalId is not the refusal id of envelopeDigest")
	}
	if !slices.Contains(RefusalReasons, r.Reason) {
		return invalid("reason %q is unknown", r.Reason)
	}
	if r.EnvelopeID != "" {
		if err := checkUUID("envelopeId", r.EnvelopeID); err != nil {
			return err
		}
	}
	if r.SenderDID != "" {
		if err := checkDID("senderDid", r.SenderDID); err != nil {
			return err
		}
	}
	if r.Size < 0 {
		return invalid("size must not be negative")
	}
	if r.Envelope != nil {
		if len(r.Envelope) > MaxRefusalEnvelope || int64(len(r.Envelope)) != r.Size {
			return invalid("envelope must be the refused bytes, at most %d", MaxRefusalEnvelope)
		}
		if err := checkCompactObject("envelope", r.Envelope); err != nil {
			return err
		}
		if envelope.Digest(r.Envelope) != r.EnvelopeDigest {
			return invalid("envelopeDigest does not match the envelope bytes")
		}
	}
	return nil
}

// Operation states.
const (
	OperationInFlight = "in-flight"
	OperationDone     = "done"
)

// Operation is the result of an API operation, with a lease while in flight.
type Operation struct {
	OperationID   string          `json:"operationId"`
	RequestDigest string          `json:"requestDigest"`
	State         string          `json:"state"`
	CreatedAt     int64           `json:"createdAt"`
	LeaseUntil    int64           `json:"leaseUntil"`
	Response      json.RawMessage `json:"response,omitempty"`
	RetainUntil   int64           `json:"retainUntil"`
}

// Binding binds sha256(Idempotency-Key) to an operation.
type Binding struct {
	KeyHash       string `json:"keyHash"`
	OperationID   string `json:"operationId"`
	RequestDigest string `json:"requestDigest"`
	CreatedAt     int64  `json:"createdAt"`
	RetainUntil   int64  `json:"retainUntil"`
}

func (*Outbox) Kind() Kind      { return KindOutbox }
func (*Batch) Kind() Kind       { return KindBatches }
func (*Message) Kind() Kind     { return KindMessages }
func (*Receipt) Kind() Kind     { return KindReceipts }
func (*Observation) Kind() Kind { return KindObservations }
func (*Operation) Kind() Kind   { return KindOperations }
func (*Binding) Kind() Kind     { return KindIdempotency }
func (*Refusal) Kind() Kind     { return KindRefusals }

func (r *Outbox) RecordID() string      { return r.EnvelopeID }
func (r *Batch) RecordID() string       { return r.BatchID }
func (r *Message) RecordID() string     { return r.MessageID }
func (r *Receipt) RecordID() string     { return ReceiptID(r.EnvelopeID) }
func (r *Observation) RecordID() string { return r.MessageID }
func (r *Operation) RecordID() string   { return r.OperationID }
func (r *Binding) RecordID() string     { return r.KeyHash }
func (r *Refusal) RecordID() string     { return r.RefusalID }

// newRecord returns an empty record of kind k.
func newRecord(k Kind) Record {
	switch k {
	case KindOutbox:
		return new(Outbox)
	case KindBatches:
		return new(Batch)
	case KindMessages:
		return new(Message)
	case KindReceipts:
		return new(Receipt)
	case KindObservations:
		return new(Observation)
	case KindOperations:
		return new(Operation)
	case KindIdempotency:
		return new(Binding)
	case KindRefusals:
		return new(Refusal)
	}
	return nil
}

// invalid is the error of a failed field validation.
func invalid(format string, args ...any) error { return fmt.Errorf(format, args...) }

func checkUUID(field, v string) error {
	if !uuid.Valid(v) {
		return invalid("%s is not a lower-case UUID", field)
	}
	return nil
}

func checkDigest(field, v string) error {
	if !isHex(v, 64) {
		return invalid("%s is not 64 lower-case hex digits", field)
	}
	return nil
}

func checkDID(field, v string) error {
	if _, err := identity.ParseDID(v); err != nil {
		return invalid("%s: %v", field, err)
	}
	return nil
}

// ValidRelayURL reports whether v is a relay URL as records keep it: http(s), a host,
// no user info, at most 2048 bytes. The daemon's API and the CLI check with it.
func ValidRelayURL(v string) bool {
	u, err := url.Parse(v)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil && len(v) <= 2048
}

func checkRelayURL(v string) error {
	if !ValidRelayURL(v) {
		return invalid("relayUrl is not an http(s) URL")
	}
	return nil
}

func checkTime(field string, v int64) error {
	if v <= 0 || v >= 1<<53 {
		return invalid("%s is not a positive millisecond time below 2^53", field)
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// maxRawDepth bounds the nesting of raw JSON values (envelopes, facts, responses).
const maxRawDepth = 48

// checkCompactObject refuses raw JSON that is not a compact object (no whitespace
// outside strings), has a duplicate key anywhere, or nests deeper than maxRawDepth:
// what the reader would refuse.
func checkCompactObject(field string, raw json.RawMessage) error {
	if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
		return invalid("%s is not a JSON object", field)
	}
	if err := checkRawKeys(raw, maxRawDepth); err != nil {
		return invalid("%s: %v", field, err)
	}
	return nil
}

func (r *Outbox) Validate() error {
	if err := firstErr(checkUUID("envelopeId", r.EnvelopeID), checkUUID("messageId", r.MessageID),
		checkUUID("batchId", r.BatchID), checkRelayURL(r.RelayURL), checkDID("peerOwnerDid", r.PeerOwnerDID),
		checkTime("deliveryDeadline", r.DeliveryDeadline), checkTime("retainUntil", r.RetainUntil),
		checkDigest("envelopeDigest", r.EnvelopeDigest), checkCompactObject("envelope", r.Envelope)); err != nil {
		return err
	}
	if r.EnvelopeKind != EnvelopeMessage && r.EnvelopeKind != EnvelopeDeliveryStatus {
		return invalid("kind %q is not message or delivery-status", r.EnvelopeKind)
	}
	if r.State != StatePending && r.State != StateRelayed && r.State != StateClosed {
		return invalid("state %q is not pending, relayed or closed", r.State)
	}
	if r.Ordinal < 0 || r.Attempts < 0 || r.NextAttemptAt < 0 || r.UnreachableSince < 0 {
		return invalid("ordinal, attempts, nextAttemptAt and unreachableSince must not be negative")
	}
	if envelope.Digest(r.Envelope) != r.EnvelopeDigest {
		return invalid("envelopeDigest does not match the envelope bytes")
	}
	if r.Lease != nil && (r.Lease.Holder == "" || len(r.Lease.Holder) > 256 || r.Lease.Until <= 0) {
		return invalid("lease needs a holder and a time")
	}
	if len(r.LastError) > 1024 {
		return invalid("lastError is too long")
	}
	return firstErr(checkAction("held", r.Held, ActionHold), checkAction("operator", r.Operator, ""))
}

func (r *Batch) Validate() error {
	if err := firstErr(checkUUID("batchId", r.BatchID), checkUUID("messageId", r.MessageID),
		checkRelayURL(r.RelayURL), checkDID("peerOwnerDid", r.PeerOwnerDID),
		checkTime("deliveryDeadline", r.DeliveryDeadline), checkTime("createdAt", r.CreatedAt),
		checkTime("retainUntil", r.RetainUntil)); err != nil {
		return err
	}
	if len(r.EnvelopeIDs) == 0 || len(r.EnvelopeIDs) > MaxBatchMembers {
		return invalid("envelopeIds must list 1..%d members", MaxBatchMembers)
	}
	seen := map[string]bool{}
	for _, id := range r.EnvelopeIDs {
		if err := checkUUID("envelopeIds", id); err != nil {
			return err
		}
		if seen[id] {
			return invalid("envelopeIds lists %s twice", id)
		}
		seen[id] = true
	}
	return nil
}

// MaxBatchMembers bounds the envelopes of one batch, and so of one SendRequest; callers
// that split work into messages (the carrier's benchmarks) size them by it.
const MaxBatchMembers = 64

var messageStatusRank = map[string]int{StatusQueued: 0, StatusRelayed: 1, StatusDelivered: 2, StatusClosed: 2}

func (r *Message) Validate() error {
	if err := firstErr(checkUUID("messageId", r.MessageID), checkRelayURL(r.RelayURL),
		checkDID("peerOwnerDid", r.PeerOwnerDID), checkDigest("envelopeDigest", r.EnvelopeDigest),
		checkTime("deliveryDeadline", r.DeliveryDeadline), checkTime("createdAt", r.CreatedAt),
		checkTime("updatedAt", r.UpdatedAt), checkTime("retainUntil", r.RetainUntil)); err != nil {
		return err
	}
	if _, ok := messageStatusRank[r.Status]; !ok {
		return invalid("status %q is unknown", r.Status)
	}
	switch {
	case r.Status == StatusClosed && r.ClosedBy != ClosedByDeadline && r.ClosedBy != ClosedByRefused &&
		r.ClosedBy != ClosedByExpired && r.ClosedBy != ClosedByCancelled:
		return invalid("closed message needs closedBy deadline, refused, expired or cancelled")
	case r.Status != StatusClosed && r.ClosedBy != "":
		return invalid("closedBy is only for closed messages")
	case r.Attempts < 0:
		return invalid("attempts must not be negative")
	case len(r.LastError) > 1024:
		return invalid("lastError is too long")
	}
	return firstErr(checkAction("held", r.Held, ActionHold), checkAction("operator", r.Operator, ""))
}

var receiptRank = map[string]int{ReceiptPersisted: 0, ReceiptProcessed: 1, ReceiptTerminal: 2}

func (r *Receipt) Validate() error {
	if err := firstErr(checkUUID("envelopeId", r.EnvelopeID), checkDID("senderDid", r.SenderDID),
		checkDigest("envelopeDigest", r.EnvelopeDigest), checkTime("receivedAt", r.ReceivedAt),
		checkTime("retainUntil", r.RetainUntil)); err != nil {
		return err
	}
	if _, ok := receiptRank[r.State]; !ok {
		return invalid("state %q is not persisted, processed or terminal", r.State)
	}
	if len(r.OutcomeCode) > 64 {
		return invalid("outcomeCode is too long")
	}
	if r.SenderSeq < 0 || r.SenderSeq > envelope.MaxTime {
		return invalid("senderSeq is out of range")
	}
	return nil
}

func (r *Observation) Validate() error {
	if err := firstErr(checkUUID("messageId", r.MessageID), checkDID("senderDid", r.SenderDID),
		checkDigest("envelopeDigest", r.EnvelopeDigest), checkTime("createdAt", r.CreatedAt),
		checkTime("deliveryDeadline", r.DeliveryDeadline), checkTime("retainUntil", r.RetainUntil)); err != nil {
		return err
	}
	if r.Facts == nil || r.Published == nil {
		return invalid("facts and published must be lists")
	}
	if b := r.Blob; b != nil {
		if err := firstErr(checkUUID("blob.envelopeId", b.EnvelopeID), checkDigest("blob.digest", b.Digest)); err != nil {
			return err
		}
		if b.Size < 1 || b.Size > envelope.MaxBlobSize || b.BodySize < 0 || b.BodySize >= b.Size {
			return invalid("blob.size is not 1 to %d, or blob.bodySize not below it", envelope.MaxBlobSize)
		}
	}
	for _, f := range r.Facts {
		if err := checkCompactObject("facts", f); err != nil {
			return err
		}
	}
	for _, p := range r.Published {
		if err := checkUUID("published", p); err != nil {
			return err
		}
	}
	return nil
}

func (r *Operation) Validate() error {
	if err := firstErr(checkUUID("operationId", r.OperationID), checkDigest("requestDigest", r.RequestDigest),
		checkTime("createdAt", r.CreatedAt), checkTime("leaseUntil", r.LeaseUntil),
		checkTime("retainUntil", r.RetainUntil)); err != nil {
		return err
	}
	switch r.State {
	case OperationInFlight:
		if len(r.Response) != 0 {
			return invalid("an in-flight operation has no response")
		}
	case OperationDone:
		if err := checkCompactObject("response", r.Response); err != nil {
			return err
		}
	default:
		return invalid("state %q is not in-flight or done", r.State)
	}
	return nil
}

func (r *Binding) Validate() error {
	if !isHex(r.KeyHash, 64) {
		return invalid("keyHash is not 64 lower-case hex digits")
	}
	return firstErr(checkUUID("operationId", r.OperationID), checkDigest("requestDigest", r.RequestDigest),
		checkTime("createdAt", r.CreatedAt), checkTime("retainUntil", r.RetainUntil))
}

// CheckReplacement enforces the write invariants of docs/FORMAT.md §5 when next replaces prev
// (prev may be nil). It returns a coded error.
func CheckReplacement(prev, next Record) error {
	switch n := next.(type) {
	case *Outbox:
		if p, ok := prev.(*Outbox); ok {
			if p.EnvelopeDigest != n.EnvelopeDigest || !bytes.Equal(p.Envelope, n.Envelope) ||
				p.MessageID != n.MessageID || p.BatchID != n.BatchID || p.Ordinal != n.Ordinal ||
				p.EnvelopeKind != n.EnvelopeKind || p.PeerOwnerDID != n.PeerOwnerDID || p.RelayURL != n.RelayURL {
				return conflict(n, "outbox envelope, digest and routing never change")
			}
			if p.State != StatePending && n.State != p.State {
				return statusErr(n, "outbox state %s is final", p.State)
			}
		}
		if n.Held != nil && n.State != StatePending {
			return statusErr(n, "only a pending envelope can be held")
		}
	case *Batch:
		if p, ok := prev.(*Batch); ok && !batchEqual(p, n) {
			return conflict(n, "a batch marker never changes")
		}
	case *Message:
		if p, ok := prev.(*Message); ok {
			if p.PeerOwnerDID != n.PeerOwnerDID || p.RelayURL != n.RelayURL || p.EnvelopeDigest != n.EnvelopeDigest ||
				p.CreatedAt != n.CreatedAt || p.DeliveryDeadline != n.DeliveryDeadline {
				return conflict(n, "message routing fields never change")
			}
			if err := checkMessageTransition(p, n); err != nil {
				return err
			}
		}
		if n.Held != nil && n.Status != StatusQueued && n.Status != StatusRelayed {
			return statusErr(n, "only a queued or relayed message can be held")
		}
	case *Receipt:
		if p, ok := prev.(*Receipt); ok {
			if p.EnvelopeID != n.EnvelopeID || p.SenderDID != n.SenderDID || p.EnvelopeDigest != n.EnvelopeDigest || p.ReceivedAt != n.ReceivedAt ||
				p.SenderSeq != n.SenderSeq {
				return conflict(n, "a receipt's envelope identity never changes")
			}
			if receiptRank[n.State] < receiptRank[p.State] {
				return statusErr(n, "receipt state cannot go from %s back to %s", p.State, n.State)
			}
		}
	case *Observation:
		if p, ok := prev.(*Observation); ok {
			if p.SenderDID != n.SenderDID || p.EnvelopeDigest != n.EnvelopeDigest || p.CreatedAt != n.CreatedAt ||
				p.DeliveryDeadline != n.DeliveryDeadline || p.RetainUntil != n.RetainUntil ||
				(p.Blob == nil) != (n.Blob == nil) || p.Blob != nil && *p.Blob != *n.Blob {
				return conflict(n, "an observation's fixed fields never change")
			}
			if len(n.Facts) < len(p.Facts) || len(n.Published) < len(p.Published) ||
				!slices.EqualFunc(p.Facts, n.Facts[:len(p.Facts)], func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }) ||
				!slices.Equal(p.Published, n.Published[:len(p.Published)]) {
				return conflict(n, "an observation's facts and published lists only grow")
			}
		}
	case *Operation:
		if p, ok := prev.(*Operation); ok {
			if p.RequestDigest != n.RequestDigest || p.CreatedAt != n.CreatedAt {
				return conflict(n, "an operation's request never changes")
			}
			if p.State == OperationDone && (n.State != OperationDone || !bytes.Equal(p.Response, n.Response)) {
				return conflict(n, "a finished operation's response never changes")
			}
		}
	case *Binding:
		if p, ok := prev.(*Binding); ok && *p != *n {
			return conflict(n, "an idempotency binding never changes")
		}
	}
	return nil
}

// checkMessageTransition allows only forward moves: queued → relayed → delivered, and
// queued|relayed → closed. A backward move is INVALID_DELIVERY_STATUS; a second,
// different terminal outcome (delivered vs closed, or another closer) is
// DELIVERY_STATUS_CONFLICT.
func checkMessageTransition(p, n *Message) error {
	switch {
	case p.Status == n.Status && (p.Status != StatusClosed || p.ClosedBy == n.ClosedBy):
		return nil
	case messageStatusRank[n.Status] < messageStatusRank[p.Status]:
		return statusErr(n, "message status cannot go from %s back to %s", p.Status, n.Status)
	case p.Status == StatusDelivered || p.Status == StatusClosed:
		// Two different terminal outcomes.
		return statusConflict(n, "message is already %s", p.Status)
	}
	return nil
}

// CheckBatch reports whether members (as read, nil for a missing one) are exactly the
// consistent members of marker b, in its order: the rule a marker is written under
// and that fsck checks.
func CheckBatch(b *Batch, members []*Outbox) error {
	if len(members) != len(b.EnvelopeIDs) {
		return fmt.Errorf("batch lists %d members, %d given", len(b.EnvelopeIDs), len(members))
	}
	for i, o := range members {
		if o == nil {
			return fmt.Errorf("member %d (%s) is missing", i, b.EnvelopeIDs[i])
		}
		if o.EnvelopeID != b.EnvelopeIDs[i] || !MemberOf(b, i, o) {
			return fmt.Errorf("member %d (%s) is inconsistent with the marker", i, b.EnvelopeIDs[i])
		}
	}
	return nil
}

// MemberOf reports whether o is a consistent i-th member of batch b: same batch,
// message, peer, relay and deadline, and ordinal i.
func MemberOf(b *Batch, i int, o *Outbox) bool {
	return o != nil && o.BatchID == b.BatchID && o.MessageID == b.MessageID && o.PeerOwnerDID == b.PeerOwnerDID &&
		o.RelayURL == b.RelayURL && o.DeliveryDeadline == b.DeliveryDeadline && o.Ordinal == i
}

// IsSingle reports whether an outbox member with these fields is a single: the one
// member of a one-envelope message, committed by its message record instead of a
// marker (docs/FORMAT.md §5). Its batchId is its own envelopeId and its ordinal 0. A
// marker of that id, if one exists, governs it instead.
func IsSingle(batchID, envelopeID string, ordinal int) bool {
	return batchID == envelopeID && ordinal == 0
}

// CommitsSingle reports whether message m commits the single o: same message, peer,
// relay and deadline, and m's first-envelope digest is o's.
func CommitsSingle(m *Message, o *Outbox) bool {
	return m != nil && o != nil && IsSingle(o.BatchID, o.EnvelopeID, o.Ordinal) && m.MessageID == o.MessageID &&
		m.EnvelopeDigest == o.EnvelopeDigest && m.PeerOwnerDID == o.PeerOwnerDID && m.RelayURL == o.RelayURL &&
		m.DeliveryDeadline == o.DeliveryDeadline
}

func batchEqual(a, b *Batch) bool {
	return a.BatchID == b.BatchID && a.MessageID == b.MessageID && slices.Equal(a.EnvelopeIDs, b.EnvelopeIDs) &&
		a.PeerOwnerDID == b.PeerOwnerDID && a.RelayURL == b.RelayURL && a.DeliveryDeadline == b.DeliveryDeadline &&
		a.CreatedAt == b.CreatedAt && a.RetainUntil == b.RetainUntil
}
