package relay

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// storage is where a Relay keeps what it accepted: the inbox envelopes, their
// de-duplication records and the allow-list. Two implementations: the files
// next to the relay's store (fileStore, the default) and NATS JetStream
// (jsBackend, pkg/relay/jsstore), which several relay processes share.
//
// Above it, shared by both, stay the HTTP layer, the signed-request checks,
// the envelopes' verification, the receipts' signing (a function of the
// record's fields and the relay's key), the batch's per-item answers, the
// limits' decisions and the held fetches. Errors a storage returns are
// *relayproto.Error values (a 503 for anything the sender should retry).
//
// Cursors are the storage's own: each parses the other's format as "from the
// start" (see parseFileCursor, jsBackend.cursor), so a recipient whose relay
// changed backend is served its inbox again instead of nothing forever.
type storage interface {
	// lookup returns the de-duplication record of envelope id, nil if none.
	lookup(ctx context.Context, id string) (*held, error)
	// put holds the new envelopes items — checked, admitted, their ids
	// without records when looked up — in order and sets each item's held and
	// outcome. An error concerns them all: none is acknowledged.
	put(ctx context.Context, items []*newEnvelope) error
	// fetch returns recipient's envelopes after cursor after ("": from the
	// start), at most limit (1..relayproto.MaxFetchLimit) and maxPageBytes of
	// them, never one at or past its deadline. When recipient's inbox gains an
	// envelope visible to fetch, the storage calls the Relay's wake.
	fetch(ctx context.Context, recipient identity.DID, after string, limit int) (*relayproto.InboxPage, error)
	// ack removes the listed envelopes from recipient's inbox and returns how
	// many it removed.
	ack(ctx context.Context, recipient identity.DID, ids []string) (int, error)
	// fetchable returns the body size (0: an inline body) of envelope id if
	// it waits, visible and unexpired, in recipient's inbox; ok false if not.
	fetchable(ctx context.Context, recipient identity.DID, id string) (bodySize int64, ok bool, err error)
	// status is what a fetch from the start would page through.
	status(ctx context.Context, recipient identity.DID) (relayproto.InboxStatus, error)
	// usage is what waits in recipient's inbox, for its quota.
	usage(ctx context.Context, recipient identity.DID) (usage, error)
	// expire removes the inbox envelopes whose deadline is at or before now
	// and returns how many.
	expire(ctx context.Context, now time.Time) (int, error)
	// registered, register and unregister are the allow-list; register and
	// unregister are durable before they return.
	registered(ctx context.Context, recipient identity.DID) (bool, error)
	register(ctx context.Context, recipient identity.DID) error
	unregister(ctx context.Context, recipient identity.DID) error
	// probe checks that the storage answers now (Relay.Ready), depth counts
	// the envelopes and bytes in every inbox, conn is the NATS connection (nil
	// for the files): the operations endpoints' (ops.go).
	probe(ctx context.Context) error
	depth(ctx context.Context) (n, bytes int64, err error)
	conn() *nats.Conn
	close() error

	// The witness of store heads (witness.go). senderHead returns the highest
	// head witnessed from sender (nil: none); raiseHead keeps head (data, sh
	// parsed) unless one with a seq at least as high is kept, durably before
	// it returns, and returns the seq kept — never lowering it, across
	// processes too. sent is what is known of envelope id for its sender: its
	// record (nil: none) and whether it waits in its recipient's inbox.
	senderHead(ctx context.Context, sender identity.DID) ([]byte, error)
	raiseHead(ctx context.Context, data []byte, sh *envelope.StoreHead) (int64, error)
	sent(ctx context.Context, id string) (h *held, waiting bool, err error)
	// statusesPage is a page of the delivery statuses retained for
	// recipient (acknowledged within the status retention), received at or
	// after since (Unix ms), after cursor, at most limit of them. The
	// storage's ack retains them.
	statusesPage(ctx context.Context, recipient identity.DID, since int64, after string, limit int) (*relayproto.InboxPage, error)
}

// held is what a storage keeps of an accepted envelope: the fields its
// receipt is signed from.
type held struct {
	envelopeID string
	digest     string
	receivedAt int64 // Unix ms
	// senderKey is hex SHA-256 of the sender DID ("" in JetStream records of
	// relays before store heads); senderSeq the sender's store-head seq the
	// relay had witnessed at accept (0: none), signed into the receipt.
	senderKey string
	senderSeq int64
}

// putOutcome is what storage.put made of a new envelope.
type putOutcome int

const (
	putNew       putOutcome = iota // held now
	putDuplicate                   // held already (another accept won the race): answer its receipt
	putConflict                    // its id is held with another digest: 409
)

// newEnvelope is one envelope for storage.put.
type newEnvelope struct {
	env        *envelope.Envelope
	wire       []byte
	receivedAt time.Time
	// senderSeq is the sender's witnessed store-head seq at accept, for its
	// record (the receipt signs the record's, which for an envelope another
	// accept held first is that one's).
	senderSeq int64
	// Set by put.
	held    held
	outcome putOutcome
}
