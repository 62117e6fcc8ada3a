// Package jsstore keeps the relay's inbox envelopes and their de-duplication
// records in NATS JetStream, so that several relay processes (one relay
// identity, its key on each) can share them: a carrier may post to any of them
// and a recipient may fetch from any of them. It is the JetStream counterpart of
// the relay's file-backed inboxes and receipt records (docs/RELAY.md, "Data");
// it stores bytes and fields, it does not parse envelopes or sign receipts.
//
// # Layout
//
// One stream (default SEALBRIDGE_INBOX) holds the waiting envelopes, each one
// message on the subject PREFIX.<hex sha256(recipient DID)>.<envelopeId>, the
// wire bytes as the payload and the fields in headers (Sealbridge-Envelope-Id,
// -Digest, -Received-At, -Deadline). A recipient's inbox is the filter
// PREFIX.<hex sha256(DID)>.> — the DID itself never becomes a subject, so no
// sender-chosen string does — and its envelopes are in stream order, which is
// acceptance order; the cursor is the stream sequence.
//
// One key-value bucket (default SEALBRIDGE_RECEIPTS) holds the de-duplication
// record of every accepted envelope, keyed by envelopeId: digest, recipient,
// receivedAt, deadline and the stream sequence of the one message it names. It
// is the commit point of an accept and the relay's receipt is a function of it.
// It is created with compare-and-set (kv.Create), so two relay processes racing
// on one id agree on one record, it is never changed afterwards, and it carries
// a per-key TTL of deadline + retention (at least retention), so it lasts as
// long as the file relay's receipt records do — JetStream's own Nats-Msg-Id
// de-duplication only covers a window of two minutes, and a carrier retries for
// days.
//
// A third bucket (default SEALBRIDGE_HEADS) keeps the highest store head
// witnessed per sender (heads.go), and retained delivery statuses are copies
// on PREFIX.statuses.<hex sha256(recipient DID)>.<envelopeId> in the inbox
// stream (statuses.go).
//
// # The rule: a message is served only as its record names it
//
// Fetch serves a message only if the record of its id exists and names that
// message's stream sequence; a message without a record (an accept that
// published it and then failed or crashed before its record) gets its record
// from Fetch first, made from its headers with the same compare-and-set, and a
// message its record does not name is never served (and is removed). Ack makes
// sure the record exists the same way before it deletes the message. Put
// answers any id that has a record as held (duplicate, or ErrConflict) and
// never publishes for it. A record names one sequence forever, and a deleted
// message's sequence never comes back, so an envelope a recipient acknowledged
// is never served again while its record lasts (deadline + retention), and
// after that the relay does not serve it either (its deadline is past), whatever
// failed or interleaved: a publish whose record write failed, a retried accept
// at another process, a fetch and an ack between another accept's lookup and
// its publish (that publish then stores a message no record names: never
// served, removed by that Put, or by a Fetch, or at its deadline), or the
// expiry pass. Every decision to serve or to publish rests on a record found
// or on a compare-and-set, never on a record not found, so a read that is
// behind cannot break it. Records are not raised to a terminal state on ack:
// existence decides, and a record that never changes reads the same from any
// replica once it is there.
//
// # Order of a Put, and what a crash leaves
//
//  1. The record exists: same digest → the held envelope (duplicate); other
//     digest → ErrConflict. Nothing is written.
//  2. The message is published with "expected last sequence 0" for its subject
//     (recipient and id), a compare-and-set on the stream: at most one message
//     per recipient and id waits at a time. If one is already there (an earlier
//     attempt that failed or timed out after the server stored it, or another
//     process in the middle of the same Put), it is adopted: its headers, not
//     the caller's arguments, become the record.
//  3. The record is created (kv.Create), bounded by Options.Timeout even if the
//     caller has gone. Only then does Put return: the envelope is durable and
//     fetchable before it is acknowledged.
//
// A failure or crash between 2 and 3 leaves a message without a record: never
// acknowledged, but durable and valid, and fetchable — as the file relay
// completes an envelope file without a receipt record at start. Whichever comes
// first, the carrier's retry (which adopts the message) or a Fetch or an Ack of
// the recipient, writes its record, so the envelope is answered with one
// receipt and served as one message. The opposite order (record first) could
// leave a record without a message after a crash, which de-duplication would
// then answer as held: acknowledged but not fetchable. An id sent to two
// recipients with two digests gets one record; the loser's message is never
// served and is deleted by its Put (or, if that fails, by a Fetch or Expire).
//
// # Reads go to the stream leaders
//
// Every read whose answer decides something — the record of an id, the
// allow-list, the inbox pages — goes to the leader of its stream (JetStream's
// STREAM.MSG.GET, which only the stream's leader answers, once it has
// processed the writes committed before its election), never to a direct get,
// which any replica answers: a lagging one with "no record" for a record it has
// not applied yet, or "not registered" for a recipient just registered (a 403
// the carrier takes as final), a hung one with nothing until the request times
// out (a 503). The stream and both buckets are therefore kept with
// allow_direct false; nats.go makes buckets with direct gets, so Open turns
// them off on a bucket it creates and on one an older relay made (nats.go reads
// through the leader when the stream configuration it last read says
// allow_direct false). De-duplication does not depend on it (the rule above),
// but its requests no longer fail with a replica. A leader cut off from its
// quorum may still answer reads until it steps down; JetStream has no leases.
//
// # Reads: per-subject gets, not a consumer per recipient
//
// Fetch reads the recipient's messages after the cursor with per-subject gets
// (the stream's MSG.GET with next_by_subj), then their records, Ack finds a
// message by its subject (recipient and id) and deletes it. A durable pull
// consumer per recipient was the alternative; it is not used because the
// relay's inbox protocol is a cursor the recipient holds, not delivery state
// the server holds: a recipient that fetches again from an older cursor (after
// a crash before its ack) must see the same envelopes, any relay process must
// answer any page, and acknowledging is by envelope id. A consumer's
// ack-pending, redelivery and ack-wait would have to be undone to give that,
// and one R3 consumer per recipient is one more Raft group per recipient in the
// cluster. Status and Expire scan headers only, through an ephemeral consumer
// they delete.
//
// # Timeouts
//
// Every JetStream request made under a context without a deadline (the
// relay's requests are) is bounded by Options.Timeout (default 5 s); the record
// write after a publish is bounded by Timeout on its own, detached from the
// caller's context. So a JetStream request nobody answers (quorum lost, a hung
// leader) fails within Timeout, an accept stops at its first failure, and the
// relay answers 503 RELAY_STORAGE_UNAVAILABLE; a quorum lost between an
// accept's publish and its record costs it one Timeout (the record write) and
// leaves the message without its record, which the rule above makes safe.
//
// # Notifications and the allow-list
//
// A Put that holds a new envelope publishes, after it is durable, an empty core
// NATS message on NOTIFY.<hex sha256(recipient DID)> (default NOTIFY
// sealbridge.notify, outside the stream's subjects, so never stored). Watch
// subscribes to them: a relay process holding a long-polled fetch learns of an
// envelope any process accepted. A notification is a hint, not a record: one
// lost (a disconnect, a crash right after the Put) only delays a held fetch
// until its wait ends.
//
// A second key-value bucket (default SEALBRIDGE_RECIPIENTS) is the relay's
// allow-list, keyed by hex sha256(recipient DID), holding the DID, shared by
// every relay process; Register writes it before it returns.
//
// # Durability condition
//
// JetStream acknowledges a publish once the message is stored — by a quorum
// of the stream's replicas when it is replicated, otherwise by the one server.
// By default a server fsyncs its stream files only every two minutes
// (sync_interval), so on a single node an acknowledged message can be lost to
// a power failure or kernel crash for up to two minutes, and the relay would
// have signed "persisted" for it. Open therefore refuses a stream or bucket
// that has fewer than three replicas (a quorum of two nodes then holds every
// acknowledged message, and one node may be lost) unless the operator states
// that every server fsyncs every write (sync_interval: always) with
// Options.SyncAlways. That setting cannot be checked from a client: servers
// report it only in their monitoring data (jsz), which only the system account
// may read, not in the server INFO, the account info or the stream info a relay
// can see. So it is an explicit statement of the operator, named after the
// server setting.
package jsstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Defaults of Options.
const (
	DefaultStream  = "SEALBRIDGE_INBOX"
	DefaultSubject = "sealbridge.inbox"
	DefaultBucket  = "SEALBRIDGE_RECEIPTS"
	// DefaultRecipientsBucket is the allow-list's bucket.
	DefaultRecipientsBucket = "SEALBRIDGE_RECIPIENTS"
	// DefaultNotify is the subject prefix of the accept notifications.
	DefaultNotify = "sealbridge.notify"
	// DefaultHeadsBucket keeps the highest store head witnessed per sender
	// (heads.go).
	DefaultHeadsBucket = "SEALBRIDGE_HEADS"
	DefaultReplicas    = 3
	DefaultRetention   = 24 * time.Hour
	// DefaultTimeout bounds each JetStream request (Options.Timeout): the
	// JetStream client's own default, and well above a healthy cluster's
	// answer, which comes in milliseconds.
	DefaultTimeout = 5 * time.Second
	// MinReplicas is the replication that makes an acknowledged message
	// survive the loss of one node without sync_interval: always.
	MinReplicas = 3
)

// Limits of a page (the relay's own: relayproto's MaxFetchLimit and the
// relay's maxPageBytes).
const (
	maxFetchLimit = 256
	maxPageBytes  = 4 << 20
	// scanBatch is how many headers a scan asks for at once.
	scanBatch = 256
	// maxHeaderBytes is the room the stream's message size limit leaves for the
	// headers of an envelope of envelope.MaxSize (the server counts both).
	maxHeaderBytes = 4 << 10
	// maxRecordTTL bounds the TTL given to a de-duplication record; a record
	// whose deadline lies further out gets none (it is kept).
	maxRecordTTL = 100 * 365 * 24 * time.Hour
	// recordReaders is how many records a Fetch reads at once.
	recordReaders = 8
)

// Message headers.
const (
	hdrID         = "Sealbridge-Envelope-Id"
	hdrDigest     = "Sealbridge-Digest"
	hdrReceivedAt = "Sealbridge-Received-At"
	hdrDeadline   = "Sealbridge-Deadline"
	hdrBodySize   = "Sealbridge-Body-Size"  // the sealed size of a blob body kept beside the message
	hdrSender     = "Sealbridge-Sender"     // hex sha256 of the sender DID
	hdrSenderSeq  = "Sealbridge-Sender-Seq" // the sender's witnessed head seq at accept (absent: 0)
	hdrRetained   = "Sealbridge-Retained"   // "1" on a retained delivery status (statuses.go)
)

// Errors a caller tells apart.
var (
	// ErrConflict: the envelope id is held with another digest (the relay
	// answers 409).
	ErrConflict = errors.New("jsstore: envelope id already used with another digest")
	// ErrCursor: the cursor is not one Fetch returned.
	ErrCursor = errors.New("jsstore: malformed cursor")
	// ErrNotDurable: Open refused a stream or bucket that is neither
	// replicated nor synced on every write (a *NotDurableError says which).
	ErrNotDurable = errors.New("jsstore: JetStream would acknowledge writes it has not made durable")
)

// NotDurableError is Open's refusal of a JetStream on which acknowledged
// writes would not be durable, or which cannot keep the replicas asked for
// (errors.Is(err, ErrNotDurable)). Open decides it before it creates anything:
// a refused Open leaves no stream or bucket behind. Its text names the
// resource and the JetStream settings, not a command's flags; callers that
// have flags say which (pkg/relay).
type NotDurableError struct {
	// Resource is what is refused ("stream SEALBRIDGE_INBOX", "bucket
	// SEALBRIDGE_RECEIPTS"); "" when it is the options themselves (fewer
	// than MinReplicas replicas without SyncAlways).
	Resource string
	// Stream is the JetStream stream of Resource (a bucket's is KV_<bucket>).
	Stream string
	// Replicas is what the resource has (Existing) or would be created with.
	Replicas int
	// Existing: the resource exists with Replicas (fewer than MinReplicas,
	// and SyncAlways is not set).
	Existing bool
	// SingleServer: the server is not clustered, so it keeps one replica of
	// anything: Replicas 1 with SyncAlways (and sync_interval: always on the
	// server) is the only durable choice.
	SingleServer bool
}

func (e *NotDurableError) Error() string {
	switch {
	case e.Resource == "":
		return fmt.Sprintf("%v: %d replica(s) and the servers are not declared to sync every write (SyncAlways: sync_interval: always on every server)",
			ErrNotDurable, e.Replicas)
	case e.Existing:
		return fmt.Sprintf("%v: %s has %d replica(s) and the servers are not declared to sync every write (SyncAlways: sync_interval: always on every server)",
			ErrNotDurable, e.Resource, e.Replicas)
	}
	return fmt.Sprintf("jsstore: %s would be created with %d replicas, and this NATS server is not clustered: it keeps one", e.Resource, e.Replicas)
}

// Is makes errors.Is(e, ErrNotDurable) hold.
func (e *NotDurableError) Is(target error) bool { return target == ErrNotDurable }

// Options configure a Store. The zero value uses the defaults.
type Options struct {
	// Stream is the inbox stream's name (default DefaultStream).
	Stream string
	// Subject is the subject prefix of the inbox stream (default
	// DefaultSubject); the stream's subjects are Subject + ".>".
	Subject string
	// Bucket is the de-duplication bucket's name (default DefaultBucket).
	Bucket string
	// RecipientsBucket is the allow-list's bucket (default
	// DefaultRecipientsBucket).
	RecipientsBucket string
	// Notify is the subject prefix of the accept notifications (default
	// DefaultNotify); it must not overlap Subject.
	Notify string
	// HeadsBucket is the bucket of the witnessed store heads (default
	// DefaultHeadsBucket).
	HeadsBucket string
	// Replicas is the replication of the stream and bucket when Open creates
	// them (default DefaultReplicas). Existing ones are checked, not changed.
	Replicas int
	// SyncAlways is the operator's statement that every JetStream server of
	// the stream and bucket runs with sync_interval: always (fsync on every
	// write). It allows fewer than MinReplicas replicas. A client cannot check
	// it (see the package doc).
	SyncAlways bool
	// Retention is how long after an envelope's deadline its de-duplication
	// record is kept (default DefaultRetention; the file relay keeps its
	// receipt records as long).
	Retention time.Duration
	// Timeout bounds every JetStream request of the Store made under a
	// context without a deadline, and on its own the record write that follows
	// a Put's publish, which goes on if the caller goes away (default
	// DefaultTimeout).
	Timeout time.Duration
	// Hooks, for tests, run at fixed points of a Put (nil: none).
	Hooks *Hooks
}

// Hooks are called at fixed points of a Put, so that a test can fail the
// cluster or run another operation exactly there. They run on the Put's
// goroutine; nil fields are skipped.
type Hooks struct {
	// BeforePublish runs after the record lookup found none, before the
	// message is published.
	BeforePublish func(envelopeID string)
	// AfterPublish runs once the message is durable (published or adopted),
	// before its record is created.
	AfterPublish func(envelopeID string)
}

// Store is a JetStream-backed set of relay inboxes. It is safe for concurrent
// use, and several Stores (in several processes) may share one stream and
// bucket.
type Store struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	stream    jetstream.Stream
	kv        jetstream.KeyValue
	reg       jetstream.KeyValue // the allow-list
	heads     jetstream.KeyValue // the witnessed store heads (heads.go)
	subject   string
	notify    string
	retention time.Duration
	timeout   time.Duration
	hooks     Hooks
}

// Held is an envelope the store holds (or held: its record outlives the
// message), as its de-duplication record says.
type Held struct {
	EnvelopeID string
	Digest     string
	// Recipient is hex SHA-256 of the recipient DID.
	Recipient  string
	ReceivedAt time.Time // millisecond precision
	Deadline   time.Time // millisecond precision
	// Cursor is the envelope's position in its recipient's inbox.
	Cursor string
	// SenderKey is hex SHA-256 of the sender DID ("" in records of relays
	// before store heads); SenderSeq is the sender's store-head seq the relay
	// had witnessed at accept (0: none).
	SenderKey string
	SenderSeq int64
}

// record is the value of a de-duplication key.
type record struct {
	Digest     string `json:"digest"`
	Recipient  string `json:"recipient"`
	ReceivedAt int64  `json:"receivedAt"`
	Deadline   int64  `json:"deadline"`
	Seq        uint64 `json:"seq"`
	Sender     string `json:"sender,omitempty"`
	SenderSeq  int64  `json:"senderSeq,omitempty"`
}

func (r *record) held(id string) Held {
	return Held{EnvelopeID: id, Digest: r.Digest, Recipient: r.Recipient,
		ReceivedAt: time.UnixMilli(r.ReceivedAt), Deadline: time.UnixMilli(r.Deadline),
		Cursor: strconv.FormatUint(r.Seq, 10), SenderKey: r.Sender, SenderSeq: r.SenderSeq}
}

// withDefaults returns opts with every unset field at its default, or the
// error of a setting no default fixes.
func (opts Options) withDefaults() (Options, error) {
	if opts.Stream == "" {
		opts.Stream = DefaultStream
	}
	if opts.Subject == "" {
		opts.Subject = DefaultSubject
	}
	if opts.Bucket == "" {
		opts.Bucket = DefaultBucket
	}
	if opts.RecipientsBucket == "" {
		opts.RecipientsBucket = DefaultRecipientsBucket
	}
	if opts.Notify == "" {
		opts.Notify = DefaultNotify
	}
	if opts.HeadsBucket == "" {
		opts.HeadsBucket = DefaultHeadsBucket
	}
	if opts.Notify == opts.Subject || strings.HasPrefix(opts.Notify, opts.Subject+".") {
		return opts, fmt.Errorf("jsstore: the notification subject %s lies in the stream's subjects %s.>; hint: choose another Notify prefix", opts.Notify, opts.Subject)
	}
	if opts.Replicas == 0 {
		opts.Replicas = DefaultReplicas
	}
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	return opts, nil
}

// prepare applies the defaults and makes the JetStream handle.
func prepare(nc *nats.Conn, opts Options) (Options, jetstream.JetStream, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return opts, nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(opts.Timeout))
	if err != nil {
		return opts, nil, fmt.Errorf("jsstore: %w", err)
	}
	return opts, js, nil
}

// Check makes the refusals Open would make before it creates anything (the
// *NotDurableError cases), and creates nothing: a command runs it before it
// creates anything of its own (its key, its data root). Open checks again.
func Check(ctx context.Context, nc *nats.Conn, opts Options) error {
	opts, js, err := prepare(nc, opts)
	if err != nil {
		return err
	}
	return preflight(ctx, nc, js, opts)
}

// Open connects to the inbox stream and the de-duplication bucket on nc,
// creating them on first use, and refuses them unless they are replicated at
// least MinReplicas times or opts.SyncAlways is set (ErrNotDurable, with the
// setting to change).
func Open(ctx context.Context, nc *nats.Conn, opts Options) (*Store, error) {
	opts, js, err := prepare(nc, opts)
	if err != nil {
		return nil, err
	}
	if err := preflight(ctx, nc, js, opts); err != nil {
		return nil, err
	}
	s := &Store{nc: nc, js: js, subject: opts.Subject, notify: opts.Notify, retention: opts.Retention,
		timeout: opts.Timeout}
	if opts.Hooks != nil {
		s.hooks = *opts.Hooks
	}
	scfg := jetstream.StreamConfig{
		Name:        opts.Stream,
		Description: "sealbridge relay inbox envelopes",
		Subjects:    []string{opts.Subject + ".>"},
		Retention:   jetstream.LimitsPolicy,
		// A full stream refuses new envelopes; it never drops acknowledged ones.
		Discard:     jetstream.DiscardNew,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		MaxMsgSize:  int32(envelope.MaxSize + maxHeaderBytes), // the server counts headers too
		Storage:     jetstream.FileStorage,
		Replicas:    opts.Replicas,
		AllowDirect: false,
	}
	if s.stream, err = js.Stream(ctx, opts.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		s.stream, err = js.CreateStream(ctx, scfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another relay created it meanwhile
			s.stream, err = js.Stream(ctx, opts.Stream)
		}
	}
	if err != nil {
		if notClustered(err) {
			return nil, &NotDurableError{Resource: "stream " + opts.Stream, Stream: opts.Stream, Replicas: opts.Replicas, SingleServer: true}
		}
		return nil, fmt.Errorf("jsstore: open stream %s: %w", opts.Stream, err)
	}
	info := s.stream.CachedInfo()
	if err := checkDurable("stream "+opts.Stream, opts.Stream, info.Config.Replicas, opts.SyncAlways, nc); err != nil {
		return nil, err
	}
	if info.Config.Discard != jetstream.DiscardNew || info.Config.AllowDirect || info.Config.Storage != jetstream.FileStorage {
		return nil, fmt.Errorf("jsstore: stream %s must have file storage, discard new and allow_direct false (has %s, discard %s, allow_direct %t); hint: fix it with nats stream edit or let the relay create it",
			opts.Stream, info.Config.Storage, info.Config.Discard, info.Config.AllowDirect)
	}
	if m := info.Config.MaxMsgSize; m > 0 && m < int32(envelope.MaxSize+maxHeaderBytes) {
		return nil, fmt.Errorf("jsstore: stream %s takes messages of at most %d bytes, too few for an envelope of %d and its headers; hint: nats stream edit %s --max-msg-size %d",
			opts.Stream, m, envelope.MaxSize, opts.Stream, envelope.MaxSize+maxHeaderBytes)
	}
	if s.kv, err = openBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:         opts.Bucket,
		Description:    "sealbridge relay de-duplication records",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       opts.Replicas,
		LimitMarkerTTL: time.Minute,
	}, opts.SyncAlways, nc); err != nil {
		return nil, err
	}
	if s.reg, err = openBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: opts.RecipientsBucket, Description: "sealbridge relay allow-list",
		History: 1, Storage: jetstream.FileStorage, Replicas: opts.Replicas,
	}, opts.SyncAlways, nc); err != nil {
		return nil, err
	}
	if s.heads, err = openBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: opts.HeadsBucket, Description: "sealbridge relay witnessed store heads",
		History: 1, Storage: jetstream.FileStorage, Replicas: opts.Replicas,
	}, opts.SyncAlways, nc); err != nil {
		return nil, err
	}
	return s, nil
}

// openBucket opens the bucket of cfg (creating it on first use), turns off
// direct gets on its stream, and checks it as Open checks the stream. nats.go
// creates every bucket with direct gets, and buckets of older relays have them;
// a bucket whose reads could be answered by a lagging replica is not used.
func openBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, syncAlways bool, nc *nats.Conn) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if notClustered(err) {
		return nil, &NotDurableError{Resource: "bucket " + cfg.Bucket, Stream: bucketStream(cfg.Bucket), Replicas: cfg.Replicas, SingleServer: true}
	}
	if err != nil {
		return nil, fmt.Errorf("jsstore: open bucket %s: %w", cfg.Bucket, err)
	}
	info, err := bucketInfo(ctx, kv)
	if err != nil {
		return nil, err
	}
	if info.Config.AllowDirect {
		// Every relay process that finds it on does this; they agree.
		c := info.Config
		c.AllowDirect = false
		if _, err := js.UpdateStream(ctx, c); err != nil {
			return nil, fmt.Errorf("jsstore: bucket %s allows direct gets, which a lagging replica answers, and turning them off failed: %w; hint: nats stream edit %s --no-allow-direct",
				cfg.Bucket, err, info.Config.Name)
		}
		// bucketInfo re-reads the configuration into the handle: nats.go reads
		// through the leader's MSG.GET once it holds allow_direct false.
		if info, err = bucketInfo(ctx, kv); err != nil {
			return nil, err
		}
		if info.Config.AllowDirect {
			return nil, fmt.Errorf("jsstore: bucket %s: direct gets were turned on again meanwhile (a relay older than this one?); hint: stop it, then nats stream edit %s --no-allow-direct",
				cfg.Bucket, info.Config.Name)
		}
	}
	if err := checkDurable("bucket "+cfg.Bucket, info.Config.Name, info.Config.Replicas, syncAlways, nc); err != nil {
		return nil, err
	}
	if info.Config.Storage != jetstream.FileStorage {
		return nil, fmt.Errorf("jsstore: bucket %s must have file storage; hint: recreate it or let the relay create it", cfg.Bucket)
	}
	if cfg.LimitMarkerTTL > 0 && !info.Config.AllowMsgTTL {
		return nil, fmt.Errorf("jsstore: bucket %s must have per-key TTLs (limit_marker_ttl); hint: recreate it or let the relay create it", cfg.Bucket)
	}
	return kv, nil
}

// bucketInfo reads the configuration and state of kv's stream, which also
// becomes the configuration the handle's reads follow.
func bucketInfo(ctx context.Context, kv jetstream.KeyValue) (*jetstream.StreamInfo, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("jsstore: open bucket %s: %w", kv.Bucket(), err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return nil, fmt.Errorf("jsstore: bucket %s: unexpected status type %T", kv.Bucket(), st)
	}
	return bs.StreamInfo(), nil
}

// Ready reports whether the store answers now: the connection is connected
// (not reconnecting or closed) and the inbox stream's leader answers its info
// request (within ctx, or Options.Timeout). Safe for concurrent use.
func (s *Store) Ready(ctx context.Context) error {
	if err := s.connected(); err != nil {
		return err
	}
	if _, err := s.stream.Info(ctx); err != nil {
		return fmt.Errorf("jsstore: stream info: %w", err)
	}
	return nil
}

// Depth returns the messages and bytes in the inbox stream (every recipient's,
// as the stream's leader counts them: headers included, and envelopes past
// their deadline until Expire removes them).
func (s *Store) Depth(ctx context.Context) (msgs, bytes uint64, err error) {
	if err := s.connected(); err != nil {
		return 0, 0, err // not a request that would wait out its timeout
	}
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("jsstore: stream info: %w", err)
	}
	return info.State.Msgs, info.State.Bytes, nil
}

// connected refuses at once while the connection is not connected.
func (s *Store) connected() error {
	if st := s.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("jsstore: the NATS connection is %s", strings.ToLower(st.String()))
	}
	return nil
}

// Conn is the store's NATS connection.
func (s *Store) Conn() *nats.Conn { return s.nc }

// Register adds recipient to the allow-list; on return without error it is
// durable. Registering again changes nothing.
func (s *Store) Register(ctx context.Context, recipient identity.DID) error {
	if _, err := s.reg.Put(ctx, RecipientKey(recipient), []byte(recipient)); err != nil {
		return fmt.Errorf("jsstore: register: %w", err)
	}
	return nil
}

// Unregister removes recipient from the allow-list.
func (s *Store) Unregister(ctx context.Context, recipient identity.DID) error {
	if err := s.reg.Delete(ctx, RecipientKey(recipient)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("jsstore: unregister: %w", err)
	}
	return nil
}

// Registered reports whether recipient is on the allow-list.
func (s *Store) Registered(ctx context.Context, recipient identity.DID) (bool, error) {
	_, err := s.reg.Get(ctx, RecipientKey(recipient))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	}
	return false, fmt.Errorf("jsstore: read the allow-list: %w", err)
}

// Watch calls fn with the recipient key (hex sha256 of the DID) of every
// envelope a Put, in any process, newly holds from now on, until stop is
// called. fn runs on one goroutine of the connection; it must not block.
// Notifications are hints (see the package doc): one may be lost, and a
// recipient may be named when nothing new is visible to it.
func (s *Store) Watch(fn func(recipientKey string)) (stop func(), err error) {
	prefix := s.notify + "."
	sub, err := s.nc.Subscribe(prefix+"*", func(m *nats.Msg) {
		if k, ok := strings.CutPrefix(m.Subject, prefix); ok {
			fn(k)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("jsstore: watch: %w", err)
	}
	// The subscription is registered with the server before Watch returns, so
	// no notification published afterwards is missed.
	if err := s.nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("jsstore: watch: %w", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// errCodeReplicasNotSupported is JetStream's answer to a replicated stream on a
// server that is not clustered ("replicas > 1 not supported in non-clustered mode").
const errCodeReplicasNotSupported jetstream.ErrorCode = 10074

// notClustered reports whether err is JetStream refusing replicas on a single server.
func notClustered(err error) bool {
	var je jetstream.JetStreamError
	return errors.As(err, &je) && je.APIError() != nil && je.APIError().ErrorCode == errCodeReplicasNotSupported
}

// checkDurable refuses an existing resource (what, of JetStream stream
// stream) with fewer than MinReplicas replicas unless syncAlways.
func checkDurable(what, stream string, replicas int, syncAlways bool, nc *nats.Conn) error {
	if replicas >= MinReplicas || syncAlways {
		return nil
	}
	return &NotDurableError{Resource: what, Stream: stream, Replicas: replicas, Existing: true, SingleServer: !clustered(nc)}
}

// clustered reports whether the server nc is connected to is part of a
// cluster (its INFO names one). A single server keeps one replica of
// anything, and refuses more (errCodeReplicasNotSupported).
func clustered(nc *nats.Conn) bool { return nc.ConnectedClusterName() != "" }

// bucketStream is the JetStream stream of key-value bucket b.
func bucketStream(b string) string { return "KV_" + b }

// preflight decides Open's durability refusals before anything is created:
// fewer than MinReplicas replicas asked for without SyncAlways; an existing
// stream or bucket with fewer than MinReplicas without SyncAlways; a missing
// one that would be created with more than one replica on a server that is not
// clustered. Open's own checks after it (checkDurable, notClustered) stay for
// resources created or changed meanwhile by another process.
func preflight(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, opts Options) error {
	if opts.Replicas < MinReplicas && !opts.SyncAlways {
		return &NotDurableError{Replicas: opts.Replicas, SingleServer: !clustered(nc)}
	}
	var missing *NotDurableError
	for _, r := range []struct{ what, stream string }{
		{"stream " + opts.Stream, opts.Stream},
		{"bucket " + opts.Bucket, bucketStream(opts.Bucket)},
		{"bucket " + opts.RecipientsBucket, bucketStream(opts.RecipientsBucket)},
		{"bucket " + opts.HeadsBucket, bucketStream(opts.HeadsBucket)},
	} {
		st, err := js.Stream(ctx, r.stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if missing == nil {
				missing = &NotDurableError{Resource: r.what, Stream: r.stream, Replicas: opts.Replicas, SingleServer: true}
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("jsstore: open %s: %w", r.what, err)
		}
		if err := checkDurable(r.what, r.stream, st.CachedInfo().Config.Replicas, opts.SyncAlways, nc); err != nil {
			return err
		}
	}
	if missing != nil && opts.Replicas > 1 && !clustered(nc) {
		return missing
	}
	return nil
}

// RecipientKey is hex SHA-256 of did: the recipient's token in subjects and
// records (the file relay names its inbox directories the same way).
func RecipientKey(did identity.DID) string {
	sum := sha256.Sum256([]byte(did))
	return hex.EncodeToString(sum[:])
}

func (s *Store) inboxFilter(rkey string) string { return s.subject + "." + rkey + ".>" }

func (s *Store) envelopeSubject(rkey, id string) string { return s.subject + "." + rkey + "." + id }

func checkID(id string) error {
	if !uuid.Valid(id) { // also keeps wildcards and dots out of subjects and keys
		return fmt.Errorf("jsstore: envelope id %q is not a lower-case UUID", id)
	}
	return nil
}

// Put holds wire, the envelope envelopeID with digest for recipient, received
// at receivedAt and due by deadline, and returns what is held: on return
// without error it is durable and fetchable. If the id is already held with the
// same digest, Put returns that (its receivedAt and cursor, not the
// arguments) and duplicate true; with another digest it returns the held one,
// duplicate true and ErrConflict. Any other error means nothing was
// acknowledged; the caller answers "retry later" and the retry completes what
// this call may have begun.
func (s *Store) Put(ctx context.Context, recipient identity.DID, envelopeID, digest string, wire []byte,
	receivedAt, deadline time.Time) (held Held, duplicate bool, err error) {
	return s.PutWithBody(ctx, recipient, envelopeID, digest, wire, 0, receivedAt, deadline)
}

// PutWithBody is Put for an envelope whose blob body of bodySize bytes (0:
// none) is kept beside it (Bodies): the message carries the size in a header,
// which Status counts in Bytes.
func (s *Store) PutWithBody(ctx context.Context, recipient identity.DID, envelopeID, digest string, wire []byte,
	bodySize int64, receivedAt, deadline time.Time) (held Held, duplicate bool, err error) {
	return s.PutFrom(ctx, recipient, envelopeID, digest, wire, bodySize, receivedAt, deadline, "", 0)
}

// PutFrom is PutWithBody naming the envelope's sender and the sender's
// store-head seq the relay witnessed (0: none), both kept in the message's
// headers and its record (Held.SenderKey, Held.SenderSeq; SenderReceipt). A
// duplicate returns the record's, not the arguments.
func (s *Store) PutFrom(ctx context.Context, recipient identity.DID, envelopeID, digest string, wire []byte,
	bodySize int64, receivedAt, deadline time.Time, sender identity.DID, senderSeq int64) (held Held, duplicate bool, err error) {
	if err := checkID(envelopeID); err != nil {
		return Held{}, false, err
	}
	if rec, err := s.getRecord(ctx, envelopeID); err != nil {
		return Held{}, false, err
	} else if rec != nil {
		return s.existing(envelopeID, digest, rec)
	}
	rkey := RecipientKey(recipient)
	subj := s.envelopeSubject(rkey, envelopeID)
	rec := &record{Digest: digest, Recipient: rkey, ReceivedAt: receivedAt.UnixMilli(), Deadline: deadline.UnixMilli(),
		SenderSeq: max(senderSeq, 0)}
	if sender != "" {
		rec.Sender = RecipientKey(sender)
	}
	if s.hooks.BeforePublish != nil {
		s.hooks.BeforePublish(envelopeID)
	}
	msg := nats.NewMsg(subj)
	msg.Data = wire
	msg.Header.Set(hdrID, envelopeID)
	msg.Header.Set(hdrDigest, digest)
	msg.Header.Set(hdrReceivedAt, strconv.FormatInt(rec.ReceivedAt, 10))
	msg.Header.Set(hdrDeadline, strconv.FormatInt(rec.Deadline, 10))
	if bodySize > 0 {
		msg.Header.Set(hdrBodySize, strconv.FormatInt(bodySize, 10))
	}
	if rec.Sender != "" {
		msg.Header.Set(hdrSender, rec.Sender)
	}
	if rec.SenderSeq > 0 {
		msg.Header.Set(hdrSenderSeq, strconv.FormatInt(rec.SenderSeq, 10))
	}
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil:
		rec.Seq = ack.Sequence
	case isWrongLastSeq(err):
		// A message for this recipient and id is there already: adopt it.
		m, gerr := s.stream.GetLastMsgForSubject(ctx, subj)
		if errors.Is(gerr, jetstream.ErrMsgNotFound) {
			// Removed since: acknowledged (whose ack wrote the record), or a
			// loser's removed by the Put that won. The record decides.
			if cur, err := s.getRecord(ctx, envelopeID); err != nil || cur != nil {
				if err != nil {
					return Held{}, false, err
				}
				return s.existing(envelopeID, digest, cur)
			}
		}
		if gerr != nil {
			return Held{}, false, fmt.Errorf("jsstore: read the waiting message of %s: %w", envelopeID, gerr)
		}
		if rec, err = recordOf(m.Header, m.Sequence, rkey); err != nil {
			return Held{}, false, err
		}
	default:
		return Held{}, false, fmt.Errorf("jsstore: publish %s: %w", envelopeID, err)
	}
	if s.hooks.AfterPublish != nil {
		s.hooks.AfterPublish(envelopeID)
	}
	// The message is durable: its record must follow whatever the caller does
	// (a fetch would write it otherwise), so it is bounded on its own.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	cur, err := s.commit(rctx, envelopeID, rec)
	if err != nil {
		return Held{}, false, err
	}
	if cur.Seq != rec.Seq {
		// Another Put of this id committed first, naming another message: ours
		// is never served (the package doc's rule); remove it. A failure leaves
		// it to Fetch or Expire.
		_, _ = s.deleteMsg(rctx, rec.Seq)
	}
	if cur != rec {
		return s.existing(envelopeID, digest, cur) // a Fetch, an Ack or another Put wrote it
	}
	if rec.Digest != digest {
		// We completed an earlier, other envelope of this id.
		return rec.held(envelopeID), true, ErrConflict
	}
	// Durable and fetchable: tell the waiting fetches (a hint; a failure
	// only delays them).
	_ = s.nc.Publish(s.notify+"."+rkey, nil)
	return rec.held(envelopeID), false, nil
}

// commit creates the record of id, rec, unless one exists, and returns the
// record that holds: rec itself (the same pointer) if this call created it,
// else the existing one. Every writer of records goes through it (Put, and
// Fetch and Ack for a message whose Put did not get as far), and the
// compare-and-set makes them agree on one record per id.
func (s *Store) commit(ctx context.Context, id string, rec *record) (*record, error) {
	value, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("jsstore: encode record of %s: %w", id, err)
	}
	// The record outlives the deadline by the retention; a deadline so far out that
	// the server's TTL arithmetic could overflow (and expire it at once) keeps it.
	var ttlOpt []jetstream.KVCreateOpt
	if ttl := time.UnixMilli(rec.Deadline).Add(s.retention).Sub(time.UnixMilli(rec.ReceivedAt)); ttl > 0 && ttl <= maxRecordTTL {
		ttlOpt = append(ttlOpt, jetstream.KeyTTL(max(ttl, s.retention).Truncate(time.Second)+time.Second))
	}
	if _, err := s.kv.Create(ctx, id, value, ttlOpt...); err == nil {
		return rec, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("jsstore: record %s: %w", id, err)
	}
	cur, err := s.getRecord(ctx, id)
	if err != nil || cur == nil {
		return nil, fmt.Errorf("jsstore: record %s: created concurrently, then unreadable: %v", id, err)
	}
	return cur, nil
}

func (s *Store) existing(id, digest string, rec *record) (Held, bool, error) {
	if rec.Digest != digest {
		return rec.held(id), true, ErrConflict
	}
	return rec.held(id), true, nil
}

// Lookup returns the record of envelopeID, or false if none is kept.
func (s *Store) Lookup(ctx context.Context, envelopeID string) (Held, bool, error) {
	if err := checkID(envelopeID); err != nil {
		return Held{}, false, err
	}
	rec, err := s.getRecord(ctx, envelopeID)
	if err != nil || rec == nil {
		return Held{}, false, err
	}
	return rec.held(envelopeID), true, nil
}

func (s *Store) getRecord(ctx context.Context, id string) (*record, error) {
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("jsstore: read record %s: %w", id, err)
	}
	var rec record
	if err := envelope.DecodeStrict(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("jsstore: record %s is malformed: %w", id, err)
	}
	return &rec, nil
}

// recordOf rebuilds the record from a message's headers.
func recordOf(h nats.Header, seq uint64, rkey string) (*record, error) {
	rec := &record{Digest: h.Get(hdrDigest), Recipient: rkey, Seq: seq}
	var err1, err2 error
	rec.ReceivedAt, err1 = strconv.ParseInt(h.Get(hdrReceivedAt), 10, 64)
	rec.Deadline, err2 = strconv.ParseInt(h.Get(hdrDeadline), 10, 64)
	if rec.Digest == "" || err1 != nil || err2 != nil {
		return nil, fmt.Errorf("jsstore: message %d lacks the relay's headers", seq)
	}
	rec.Sender = h.Get(hdrSender)
	if v := h.Get(hdrSenderSeq); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("jsstore: message %d has a malformed %s", seq, hdrSenderSeq)
		}
		rec.SenderSeq = n
	}
	return rec, nil
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// Envelope is one envelope of a Page.
type Envelope struct {
	Held
	Wire []byte
}

// Page is what Fetch returns.
type Page struct {
	Envelopes []Envelope
	// Cursor is the cursor to pass next: the last envelope's, or the one
	// asked for when the page is empty.
	Cursor string
	// More is true when more envelopes wait after Cursor.
	More bool
}

// ParseCursor returns the stream sequence of a cursor ("" is 0, the start).
func ParseCursor(cursor string) (uint64, error) {
	if cursor == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(cursor, 10, 64)
	if err != nil || strconv.FormatUint(n, 10) != cursor {
		return 0, ErrCursor
	}
	return n, nil
}

// Fetch returns recipient's envelopes after cursor after ("": from the start)
// in acceptance order, at most limit (1..256, default 64) and 4 MiB of them (at
// least one when one waits). It serves a message only as its record names it
// (the package doc's rule): it writes the record of a message that has none,
// and skips and removes a message its record does not name, so a page may hold
// fewer envelopes than waited after the cursor, and none with More set.
func (s *Store) Fetch(ctx context.Context, recipient identity.DID, after string, limit int) (*Page, error) {
	seq, err := ParseCursor(after)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 64
	}
	limit = min(limit, maxFetchLimit)
	rkey := RecipientKey(recipient)
	filter := s.inboxFilter(rkey)
	page := &Page{Envelopes: []Envelope{}, Cursor: strconv.FormatUint(seq, 10)}
	var msgs []*jetstream.RawStreamMsg
	var recs []*record
	bytes := 0
	for seq < math.MaxUint64 {
		m, err := s.stream.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("jsstore: read inbox: %w", err)
		}
		if len(msgs) == limit || (len(msgs) > 0 && bytes+len(m.Data) > maxPageBytes) {
			page.More = true
			break
		}
		rec, err := recordOf(m.Header, m.Sequence, rkey)
		if err != nil {
			return nil, err
		}
		if checkID(m.Header.Get(hdrID)) != nil {
			return nil, fmt.Errorf("jsstore: message %d has no valid envelope id", m.Sequence)
		}
		seq = m.Sequence
		msgs, recs = append(msgs, m), append(recs, rec)
		page.Cursor = strconv.FormatUint(seq, 10)
		bytes += len(m.Data)
	}
	held, err := s.heldRecords(ctx, msgs, recs)
	if err != nil {
		return nil, err
	}
	for i, m := range msgs {
		if held[i].Seq != m.Sequence {
			// Never served (another message of this id, or another recipient's,
			// holds its record): remove it; a failure leaves it to Expire.
			_, _ = s.deleteMsg(ctx, m.Sequence)
			continue
		}
		page.Envelopes = append(page.Envelopes, Envelope{Held: held[i].held(m.Header.Get(hdrID)), Wire: m.Data})
	}
	return page, nil
}

// heldRecords returns the record that holds for each of msgs, reading them
// recordReaders at a time and writing (commit) those that do not exist from
// the messages' own records, recs.
func (s *Store) heldRecords(ctx context.Context, msgs []*jetstream.RawStreamMsg, recs []*record) ([]*record, error) {
	out := make([]*record, len(msgs))
	errs := make([]error, len(msgs))
	sem := make(chan struct{}, recordReaders)
	var wg sync.WaitGroup
	for i, m := range msgs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = s.heldRecord(ctx, m.Header.Get(hdrID), recs[i])
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// heldRecord returns the record of id, writing rec (the record its message
// makes) if there is none.
func (s *Store) heldRecord(ctx context.Context, id string, rec *record) (*record, error) {
	cur, err := s.getRecord(ctx, id)
	if err != nil || cur != nil {
		return cur, err
	}
	return s.commit(ctx, id, rec)
}

// Ack removes the listed envelopes from recipient's inbox (ids not waiting
// there are ignored; nobody can ack another recipient's envelopes) and returns
// how many it removed. It makes sure each one's de-duplication record exists
// before it deletes the message (writing it from the message if its Put did
// not), so the envelope posted again is a duplicate; the records stay until
// their TTL.
func (s *Store) Ack(ctx context.Context, recipient identity.DID, ids []string) (int, error) {
	return s.AckEach(ctx, recipient, ids, nil)
}

// AckEach is Ack calling removed (if set) with the id and wire bytes of each
// envelope it removed, after its removal: the relay removes their bodies.
func (s *Store) AckEach(ctx context.Context, recipient identity.DID, ids []string, removed func(id string, wire []byte)) (int, error) {
	return s.AckRetaining(ctx, recipient, ids, nil, removed)
}

// AckRetaining is AckEach keeping a copy of each envelope for which retain
// (if set) returns a time — a delivery status, kept until then (statuses.go):
// the copy is durable before the inbox message is deleted.
func (s *Store) AckRetaining(ctx context.Context, recipient identity.DID, ids []string, retain func(wire []byte) (until time.Time),
	removed func(id string, wire []byte)) (int, error) {
	rkey := RecipientKey(recipient)
	n := 0
	for _, id := range ids {
		if checkID(id) != nil {
			continue
		}
		m, err := s.stream.GetLastMsgForSubject(ctx, s.envelopeSubject(rkey, id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("jsstore: ack: %w", err)
		}
		rec, err := recordOf(m.Header, m.Sequence, rkey)
		if err != nil {
			return n, fmt.Errorf("jsstore: ack: %w", err)
		}
		held, err := s.heldRecord(ctx, id, rec)
		if err != nil {
			return n, fmt.Errorf("jsstore: ack: %w", err)
		}
		if retain != nil && held.Seq == m.Sequence {
			if until := retain(m.Data); !until.IsZero() {
				if err := s.retainStatus(ctx, rkey, id, m, until); err != nil {
					return n, fmt.Errorf("jsstore: ack: %w", err)
				}
			}
		}
		switch deleted, err := s.deleteMsg(ctx, m.Sequence); {
		case err != nil:
			return n, fmt.Errorf("jsstore: ack: %w", err)
		case deleted:
			n++
			if removed != nil {
				removed(id, m.Data)
			}
		}
	}
	return n, nil
}

// errCodeSequenceNotFound is JetStream's answer to the deletion of a message
// that is not there (one of its answers: see deleteMsg).
const errCodeSequenceNotFound jetstream.ErrorCode = 10043

// deleteMsg deletes message seq and reports whether this call removed it:
// false without error when it was gone already (removed by another request
// meanwhile). JetStream answers a deletion of a message that is not there in
// several ways (sequence not found; deletion failed: no message found, or
// end of file), so a failure is checked against the stream itself.
func (s *Store) deleteMsg(ctx context.Context, seq uint64) (bool, error) {
	err := s.stream.DeleteMsg(ctx, seq)
	if err == nil {
		return true, nil
	}
	if isNotFound(err) {
		return false, nil
	}
	if _, gerr := s.stream.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	return false, err
}

func isNotFound(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrMsgNotFound) ||
		(errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound ||
			apiErr.ErrorCode == errCodeSequenceNotFound || apiErr.Code == 404))
}

// Status is the state of one inbox.
type Status struct {
	Count  int
	Bytes  int64     // wire bytes of the waiting envelopes and the sizes of their blob bodies
	Oldest time.Time // receivedAt of the oldest waiting envelope (zero if none)
	Newest time.Time // receivedAt of the newest
}

// Status returns recipient's inbox state. It reads every waiting envelope's
// headers (not its bytes).
func (s *Store) Status(ctx context.Context, recipient identity.DID) (Status, error) {
	return s.StatusAt(ctx, recipient, time.Time{})
}

// StatusAt is Status counting only the envelopes whose deadline is after now
// (those a fetch at now serves); the zero now counts every waiting envelope.
func (s *Store) StatusAt(ctx context.Context, recipient identity.DID, now time.Time) (Status, error) {
	var st Status
	rkey := RecipientKey(recipient)
	err := s.scan(ctx, s.inboxFilter(rkey), func(seq uint64, h nats.Header, size int) error {
		rec, err := recordOf(h, seq, rkey)
		if err != nil {
			return err
		}
		if !now.IsZero() && rec.Deadline <= now.UnixMilli() {
			return nil // never served again; the expiry pass removes it
		}
		at := time.UnixMilli(rec.ReceivedAt)
		if st.Count == 0 {
			st.Oldest = at
		}
		st.Newest = at
		st.Count++
		st.Bytes += int64(size)
		if b, err := strconv.ParseInt(h.Get(hdrBodySize), 10, 64); err == nil && b > 0 {
			st.Bytes += b
		}
		return nil
	})
	return st, err
}

// Expire removes every waiting envelope whose deadline is before now and
// returns how many it removed; it also removes the retained delivery statuses
// whose retention ended before now (statuses.go), which it does not count. Their de-duplication records stay until their
// TTL, so a late copy is still answered as a duplicate. It reads every waiting
// envelope's headers; the relay runs it periodically.
func (s *Store) Expire(ctx context.Context, now time.Time) (int, error) {
	return s.ExpireEach(ctx, now, nil)
}

// ExpireEach is Expire calling removed (if set) with the envelope id of each
// envelope it removed, after its removal: the relay removes their bodies.
func (s *Store) ExpireEach(ctx context.Context, now time.Time, removed func(id string)) (int, error) {
	n := 0
	err := s.scan(ctx, s.subject+".>", func(seq uint64, h nats.Header, _ int) error {
		dl, err := strconv.ParseInt(h.Get(hdrDeadline), 10, 64)
		if err != nil || dl >= now.UnixMilli() {
			return nil // not ours, or not due
		}
		deleted, err := s.deleteMsg(ctx, seq)
		if err != nil {
			return fmt.Errorf("jsstore: expire: %w", err)
		}
		if deleted && h.Get(hdrRetained) == "" { // a retained status is not an inbox envelope
			n++
			if removed != nil {
				removed(h.Get(hdrID))
			}
		}
		return nil
	})
	return n, err
}

// scan calls fn with the sequence, headers and payload size of every message
// on filter, in order, through an ordered consumer that delivers headers only.
// Messages stored after the scan began may or may not be seen.
func (s *Store) scan(ctx context.Context, filter string, fn func(seq uint64, h nats.Header, size int) error) error {
	if _, err := s.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(filter)); errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // empty: a consumer would only wait
	} else if err != nil {
		return fmt.Errorf("jsstore: scan: %w", err)
	}
	// A plain ephemeral consumer of the scan's own (an ordered one may replace
	// itself under another name, which its deletion below would miss), deleted at
	// the end: one left per scan for the inactivity threshold adds up.
	cons, err := s.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubjects: []string{filter}, HeadersOnly: true, AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("jsstore: scan: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch, err := cons.Fetch(scanBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("jsstore: scan: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("jsstore: scan: %w", err)
			}
			size, _ := strconv.Atoi(m.Headers().Get(nats.MsgSize))
			if err := fn(md.Sequence.Stream, m.Headers(), size); err != nil {
				return err
			}
			if md.NumPending == 0 {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("jsstore: scan: %w", err)
		}
		if got == 0 {
			return nil // the rest was removed meanwhile
		}
	}
}
