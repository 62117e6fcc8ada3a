package record

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
)

// Kind names a record kind and its directory.
type Kind string

// The record kinds (DESIGN §5; refusals: docs/FORMAT.md §5).
const (
	KindObservations Kind = "observations"
	KindMessages     Kind = "messages"
	KindOutbox       Kind = "outbox"
	KindBatches      Kind = "batches"
	KindReceipts     Kind = "receipts"
	KindOperations   Kind = "operations"
	KindIdempotency  Kind = "idempotency"
	KindRefusals     Kind = "refusals"
)

// Kinds lists every kind, in directory order.
var Kinds = []Kind{KindObservations, KindMessages, KindOutbox, KindBatches, KindReceipts, KindOperations, KindIdempotency, KindRefusals}

// Valid reports whether k is one of the kinds.
func (k Kind) Valid() bool {
	for _, x := range Kinds {
		if k == x {
			return true
		}
	}
	return false
}

// ValidID reports whether id may name a record of kind k: a lower-case UUID, or for
// idempotency 64 lower-case hex digits. Any other file name is invalid.
func ValidID(k Kind, id string) bool {
	if k == KindIdempotency {
		return isHex(id, 64)
	}
	return uuid.Valid(id)
}

func isHex(s string, n int) bool { return envelope.IsHex(s, n) }

// ReceiptID returns the file id of the receipt for an inbound envelope: a UUID (version
// 8, RFC 9562) made from SHA-256("sealbridge/receipt-id/v1" 0x00 envelopeID). A
// sender's envelope id therefore never chooses a file name by itself.
func ReceiptID(envelopeID string) string {
	return uuid.FromDomain("sealbridge/receipt-id/v1", envelopeID)
}

// RefusalID returns the file id of the refusal of the inbound envelope whose bytes
// have SHA-256 digest: a UUID made from SHA-256("sealbridge/refusal-id/v1" 0x00
// digest), so the same bytes refused twice are one record.
func RefusalID(digest string) string {
	return uuid.FromDomain("sealbridge/refusal-id/v1", digest)
}

// IdempotencyID returns the file id of an Idempotency-Key: hex SHA-256 of the key.
func IdempotencyID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Path returns the path of record kind/id relative to the store directory:
// "<kind>/<id>.json".
func Path(k Kind, id string) string { return string(k) + "/" + FileName(id) }

// FileName returns the record file name of id.
func FileName(id string) string { return id + ".json" }

// CheckKindID refuses an unknown kind or a malformed id.
func CheckKindID(k Kind, id string) error {
	if !k.Valid() {
		return fmt.Errorf("unknown kind %q", k)
	}
	if !ValidID(k, id) {
		return fmt.Errorf("malformed %s id %q", k, id)
	}
	return nil
}
