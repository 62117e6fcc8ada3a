package jsstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/internal/uuid"
)

// Bodies keeps the relay's large sealed bodies (the blob of a blob-body
// envelope, uploaded in resumable pieces) in a JetStream Object Store, so that
// every relay process sharing the JetStream can take the next piece of an
// upload and serve a download.
//
// # Layout
//
// One object store bucket (default SEALBRIDGE_BODIES, JetStream stream
// OBJ_<bucket>) holds every body as segment objects named
// <envelopeId>/<16 lower-case hex digits: the segment index>, segment i holding
// the body's bytes [i·S, i·S+size). S is the bucket's segment size (default
// SegmentSize, 8 MiB), fixed when the bucket is created and recorded in its
// metadata (sealbridge-segment-size), so every relay process agrees on it.
// Every segment but the last holds exactly S bytes; the last holds 1..S. The
// body's durable offset is the sum of its segments' sizes, which is
// (n-1)·S + size(last) for n segments. Segments are ordinary objects (the
// nats.go object store format: chunks of 128 KiB on $O.<bucket>.C.<nuid>, a
// meta message on $O.<bucket>.M.<base64url(name)>); any object store client
// reads them, with their SHA-256 digests checked. Their object metadata adds
// two entries: sealbridge-chunk-seqs, the stream sequences of the segment's
// chunks in order (a reader requests 8 at once instead of one after another),
// and sealbridge-sha256-state, the SHA-256 state of the body's bytes up to the
// segment's end (Digest reads it instead of the body). Both are computed by
// Append from exactly what it publishes; a segment without them (written by
// another client) is read by subject and hashed by reading.
//
// # Appending, and extending a partial segment
//
// Append streams: it publishes each 128 KiB chunk of the current segment as it
// reads it (at most 16 chunks, 2 MiB, await their acknowledgment at a time; no
// segment is ever held whole in memory) and commits the segment when
// it is full or when the reader ends (EOF or an error: the bytes read so far
// are committed, then the reader's error is returned). A committed segment is
// durable as the bucket's stream is (replicated, or synced with SyncAlways).
// A body whose last segment is partial is extended by writing that segment
// again: a new object of the same name whose content is the old segment's
// bytes (read back from the store, their digest checked) followed by the new
// ones; the new meta message replaces the old one and the old chunks are then
// purged. So a resumed upload costs, inside the JetStream, one copy of at most
// one partial segment.
//
// # The rule for two writers at once
//
// In one process, Appends and Deletes of one envelope are serialized by a
// per-envelope lock (a second waits, bounded by its context). Across relay
// processes sharing the bucket, there is no lock; instead every segment is
// committed with a compare-and-set: its meta message is published with
// "expected last subject sequence" = the sequence of the meta message the
// writer read for that name (0 when there was none, or a deleted marker's),
// after the writer checked that what it read matches the offset it appends at
// (no segment there at a segment boundary, a partial segment of exactly
// offset mod S bytes otherwise). Of two writers of one segment at once at most
// one commits; the other's chunks are purged and it gets an *OffsetError with
// the durable offset it then reads (also when its copy of the partial segment
// failed because the other writer's commit purged it). The content of a
// committed segment is checked before its commit: the acknowledgments of its
// chunks must have strictly increasing stream sequences (so they are stored
// once each, in the order written, on a subject no one else writes), and the
// prefix copied from the partial segment it replaces must have that segment's
// size and digest. A
// full segment never changes again (short of Delete), so a writer that saw
// segment i-1 full may create segment i. Hence two Appends at one offset
// never both commit bytes there, and a stored body is always the bytes of the
// Appends that committed, each at the offset it asked for, in offset order:
// never a mixture of two callers' bytes for one range.
//
// Limits. (1) Delete is serialized with Appends only within one process: a
// Delete in one relay process racing an Append in another may leave a segment
// the Append committed after the Delete passed (the relay deletes a body only
// once it is complete and acknowledged, or after its digest failed, when no
// upload is expected). (2) A relay process that dies while writing a segment
// leaves that segment's chunks published but never referenced: durable bytes
// are never lost, but those chunks stay in the bucket's stream until Sweep
// purges them (a failed or lost commit purges its chunks itself). (3) Bytes
// read by an Append are durable only once their segment is committed, at the
// segment's end or at the end of the reader: a relay killed mid-segment loses
// up to S bytes of that Append, which the carrier sends again from the
// durable offset. (4) A
// reader (Open) of the last segment while an Append extends it fails (its old
// chunks are purged) rather than returning mixed bytes.
//
// # Reads go to the leader
//
// As for the inbox stream, the bucket's stream is kept with allow_direct
// false, so segment meta and chunk reads are answered by the stream's leader
// (OpenBodies turns direct gets off on a bucket nats.go created with them).
// A Bodies is safe for concurrent use.
type Bodies struct {
	js      jetstream.JetStream
	pub     jetstream.JetStream // publishes, its async acknowledgments expiring after timeout
	stream  jetstream.Stream
	bucket  string
	seg     int64
	timeout time.Duration
	hooks   BodiesHooks

	mu      sync.Mutex
	locks   map[string]*bodyLock
	writing map[string]int // chunk subjects of segments being written here
}

// Defaults and formats of Bodies.
const (
	// DefaultBodiesBucket is the object store bucket of the bodies.
	DefaultBodiesBucket = "SEALBRIDGE_BODIES"
	// SegmentSize is the default size of a body's segment objects.
	SegmentSize int64 = 8 << 20
	// bodyChunkSize is the size of a segment's chunk messages (the object
	// store's default chunk size).
	bodyChunkSize = 128 << 10
	// bodyWindow is how many chunk publishes wait for their acknowledgment at
	// once.
	bodyWindow = 16
	// segmentSizeMeta names the bucket metadata holding the segment size.
	segmentSizeMeta = "sealbridge-segment-size"
	// maxSegmentIndex bounds a body's segment count (16 hex digits name any).
	maxSegmentIndex = 1 << 62
	// seqsMeta names a segment's object metadata listing its chunks' stream
	// sequences in order (decimal, comma-separated), so that a reader can
	// request several at once.
	seqsMeta = "sealbridge-chunk-seqs"
	// stateMeta names a segment's object metadata holding the body's SHA-256
	// state after the segment (base64 of crypto/sha256's MarshalBinary), so
	// that the digest of a whole body is known without reading it again.
	stateMeta = "sealbridge-sha256-state"
	// readWindow is how many chunk requests a reader keeps in flight.
	readWindow = 8
)

// Errors of Bodies a caller tells apart.
var (
	// ErrOffsetMismatch: an Append's offset is not the body's durable offset
	// (an *OffsetError says which it is; the relay answers 409
	// UPLOAD_OFFSET_MISMATCH with it).
	ErrOffsetMismatch = errors.New("jsstore: upload offset is not the body's durable offset")
	// ErrBodyRange: Open's offset lies beyond the body's durable bytes.
	ErrBodyRange = errors.New("jsstore: offset beyond the body's durable bytes")
	// ErrBodyCorrupt: the stored segments are not a body (a missing or
	// wrong-sized segment, a chunk missing, a digest that does not match).
	ErrBodyCorrupt = errors.New("jsstore: stored body segments do not form a whole body")
)

// OffsetError is Append's refusal of an offset that is not the body's durable
// offset, or its loss of a race with another writer of the same bytes
// (errors.Is(err, ErrOffsetMismatch)).
type OffsetError struct {
	Offset  int64 // the offset asked for
	Durable int64 // the body's durable offset as read after the refusal
}

func (e *OffsetError) Error() string {
	return fmt.Sprintf("%v: asked %d, durable %d", ErrOffsetMismatch, e.Offset, e.Durable)
}

// Is makes errors.Is(e, ErrOffsetMismatch) hold.
func (e *OffsetError) Is(target error) bool { return target == ErrOffsetMismatch }

// BodiesOptions configure OpenBodies. The zero value uses the defaults.
type BodiesOptions struct {
	// Bucket is the object store bucket (default DefaultBodiesBucket).
	Bucket string
	// Replicas is the bucket's replication when OpenBodies creates it
	// (default DefaultReplicas); an existing bucket is checked, not changed.
	Replicas int
	// SyncAlways: as Options.SyncAlways (allows fewer than MinReplicas).
	SyncAlways bool
	// Timeout bounds each JetStream request and acknowledgment wait of a
	// Bodies (default DefaultTimeout). Requests go on, so bounded, when the
	// caller's context ends, so that the bytes an Append read are committed.
	Timeout time.Duration
	// SegmentSize is the segment size of a bucket OpenBodies creates (default
	// SegmentSize). An existing bucket keeps its own; a different non-zero
	// value is refused.
	SegmentSize int64
	// Hooks, for tests (nil: none).
	Hooks *BodiesHooks
}

// BodiesHooks run at fixed points of an Append, on its goroutine.
type BodiesHooks struct {
	// BeforeSegment runs once the segment an Append writes next has been
	// read and matched to the offset, before its bytes are read or written.
	BeforeSegment func(name string)
	// BeforeCommit runs once a segment's chunks are acknowledged, before its
	// meta message is published (name is the segment object's name).
	BeforeCommit func(name string)
}

// Bodies opens the bodies bucket on the store's JetStream (see OpenBodies);
// opts.Timeout defaults to the store's.
func (s *Store) Bodies(ctx context.Context, opts BodiesOptions) (*Bodies, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = s.timeout
	}
	return OpenBodies(ctx, s.js, opts)
}

// OpenBodies connects to the bodies bucket on js, creating it on first use,
// and refuses it (*NotDurableError) unless it is replicated at least
// MinReplicas times or opts.SyncAlways is set, as Open does for the inbox.
func OpenBodies(ctx context.Context, js jetstream.JetStream, opts BodiesOptions) (*Bodies, error) {
	if opts.Bucket == "" {
		opts.Bucket = DefaultBodiesBucket
	}
	if opts.Replicas == 0 {
		opts.Replicas = DefaultReplicas
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.SegmentSize < 0 || opts.SegmentSize%bodyChunkSize != 0 {
		return nil, fmt.Errorf("jsstore: segment size %d is not a positive multiple of %d", opts.SegmentSize, bodyChunkSize)
	}
	nc := js.Conn()
	if opts.Replicas < MinReplicas && !opts.SyncAlways {
		return nil, &NotDurableError{Replicas: opts.Replicas, SingleServer: !clustered(nc)}
	}
	what, name := "bucket "+opts.Bucket, "OBJ_"+opts.Bucket
	stream, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if opts.Replicas > 1 && !clustered(nc) {
			return nil, &NotDurableError{Resource: what, Stream: name, Replicas: opts.Replicas, SingleServer: true}
		}
		seg := opts.SegmentSize
		if seg == 0 {
			seg = SegmentSize
		}
		_, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      opts.Bucket,
			Description: "sealbridge relay large sealed bodies",
			Storage:     jetstream.FileStorage,
			Replicas:    opts.Replicas,
			Metadata:    map[string]string{segmentSizeMeta: strconv.FormatInt(seg, 10)},
		})
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			if notClustered(err) {
				return nil, &NotDurableError{Resource: what, Stream: name, Replicas: opts.Replicas, SingleServer: true}
			}
			return nil, fmt.Errorf("jsstore: create %s: %w", what, err)
		}
		stream, err = js.Stream(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("jsstore: open %s: %w", what, err)
	}
	info := stream.CachedInfo()
	if info.Config.AllowDirect {
		c := info.Config
		c.AllowDirect = false
		if _, err := js.UpdateStream(ctx, c); err != nil {
			return nil, fmt.Errorf("jsstore: %s allows direct gets, which a lagging replica answers, and turning them off failed: %w; hint: nats stream edit %s --no-allow-direct",
				what, err, name)
		}
		if stream, err = js.Stream(ctx, name); err != nil {
			return nil, fmt.Errorf("jsstore: open %s: %w", what, err)
		}
		if info = stream.CachedInfo(); info.Config.AllowDirect {
			return nil, fmt.Errorf("jsstore: %s: direct gets were turned on again meanwhile; hint: nats stream edit %s --no-allow-direct", what, name)
		}
	}
	if err := checkDurable(what, name, info.Config.Replicas, opts.SyncAlways, nc); err != nil {
		return nil, err
	}
	if info.Config.Storage != jetstream.FileStorage {
		return nil, fmt.Errorf("jsstore: %s must have file storage; hint: recreate it or let the relay create it", what)
	}
	seg, err := strconv.ParseInt(info.Config.Metadata[segmentSizeMeta], 10, 64)
	if err != nil || seg <= 0 || seg%bodyChunkSize != 0 {
		return nil, fmt.Errorf("jsstore: %s has no valid %s metadata (%q); hint: let the relay create the bucket",
			what, segmentSizeMeta, info.Config.Metadata[segmentSizeMeta])
	}
	if opts.SegmentSize != 0 && opts.SegmentSize != seg {
		return nil, fmt.Errorf("jsstore: %s has segments of %d bytes, not the %d asked for", what, seg, opts.SegmentSize)
	}
	// A JetStream context of its own for the chunk publishes, so that one
	// whose acknowledgment never comes is dropped (with its buffer) after
	// Timeout rather than kept pending.
	pub, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(opts.Timeout), jetstream.WithDefaultTimeout(opts.Timeout))
	if err != nil {
		return nil, fmt.Errorf("jsstore: %w", err)
	}
	b := &Bodies{js: js, pub: pub, stream: stream, bucket: opts.Bucket, seg: seg, timeout: opts.Timeout,
		locks: make(map[string]*bodyLock), writing: make(map[string]int)}
	if opts.Hooks != nil {
		b.hooks = *opts.Hooks
	}
	return b, nil
}

// SegmentSize is the bucket's segment size.
func (b *Bodies) SegmentSize() int64 { return b.seg }

// SegmentName is the object name of envelopeID's segment i.
func SegmentName(envelopeID string, i int64) string {
	return fmt.Sprintf("%s/%016x", envelopeID, i)
}

func (b *Bodies) metaSubject(name string) string {
	return "$O." + b.bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
}

func (b *Bodies) chunkSubject(nuid string) string { return "$O." + b.bucket + ".C." + nuid }

// op is a context for one JetStream request: ctx's values, not its end (the
// bytes read must be committed even if the caller has gone), bounded by
// Timeout.
func (b *Bodies) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
}

// bodyLock serializes one envelope's Appends and Deletes in this process.
type bodyLock struct {
	ch   chan struct{}
	refs int
}

func (b *Bodies) lock(ctx context.Context, id string) (unlock func(), err error) {
	b.mu.Lock()
	l := b.locks[id]
	if l == nil {
		l = &bodyLock{ch: make(chan struct{}, 1)}
		b.locks[id] = l
	}
	l.refs++
	b.mu.Unlock()
	release := func() {
		b.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(b.locks, id)
		}
		b.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, fmt.Errorf("jsstore: waiting for another upload of the body: %w", ctx.Err())
	}
}

// segment is what the last meta message of a segment name says.
type segment struct {
	seq  uint64                // the meta message's stream sequence; 0: none
	info *jetstream.ObjectInfo // nil: no segment (none, or a deleted marker)
}

func (b *Bodies) segment(ctx context.Context, id string, i int64) (segment, error) {
	name := SegmentName(id, i)
	octx, cancel := b.op(ctx)
	defer cancel()
	m, err := b.stream.GetLastMsgForSubject(octx, b.metaSubject(name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return segment{}, nil
	}
	if err != nil {
		return segment{}, fmt.Errorf("jsstore: read body segment %s: %w", name, err)
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(m.Data, &info); err != nil {
		return segment{}, fmt.Errorf("%w: segment %s: unreadable meta", ErrBodyCorrupt, name)
	}
	if info.Deleted {
		return segment{seq: m.Sequence}, nil
	}
	if info.Name != name || info.Size == 0 || int64(info.Size) > b.seg || info.NUID == "" {
		return segment{}, fmt.Errorf("%w: segment %s: meta names %q of %d bytes", ErrBodyCorrupt, name, info.Name, info.Size)
	}
	return segment{seq: m.Sequence, info: &info}, nil
}

// bodyState is a body's segment count and last segment.
type bodyState struct {
	n    int64 // segments
	last segment
}

func (st bodyState) durable(seg int64) int64 {
	if st.n == 0 {
		return 0
	}
	return (st.n-1)*seg + int64(st.last.info.Size)
}

// state finds a body's segments: they are always 0..n-1 (a segment is
// created only after the one before it is full, and Delete removes them from
// the last), so n is found by an exponential then a binary search, in about
// 2·log2(n) reads.
func (b *Bodies) state(ctx context.Context, id string) (bodyState, error) {
	probe := func(i int64) (segment, bool, error) {
		s, err := b.segment(ctx, id, i)
		return s, s.info != nil, err
	}
	s, ok, err := probe(0)
	if err != nil || !ok {
		return bodyState{}, err
	}
	lo, loSeg, hi := int64(0), s, int64(1)
	for {
		s, ok, err := probe(hi)
		if err != nil {
			return bodyState{}, err
		}
		if !ok {
			break
		}
		lo, loSeg = hi, s
		if hi >= maxSegmentIndex/2 {
			return bodyState{}, fmt.Errorf("%w: too many segments", ErrBodyCorrupt)
		}
		hi = 2*hi + 1
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		s, ok, err := probe(mid)
		if err != nil {
			return bodyState{}, err
		}
		if ok {
			lo, loSeg = mid, s
		} else {
			hi = mid
		}
	}
	return bodyState{n: lo + 1, last: loSeg}, nil
}

// Offset returns envelopeID's durable offset: the bytes its segments hold (0
// for a body never appended to, or deleted).
func (b *Bodies) Offset(ctx context.Context, envelopeID string) (int64, error) {
	if err := checkID(envelopeID); err != nil {
		return 0, err
	}
	st, err := b.state(ctx, envelopeID)
	if err != nil {
		return 0, err
	}
	return st.durable(b.seg), nil
}

// Append adds the bytes of r to envelopeID's body at offset, which must be the
// body's durable offset (else an *OffsetError with it, and nothing is read).
// It reads r to its end; on return without error every byte read is durable
// and durable = offset + bytes read. If r fails, the bytes read before are
// committed, and Append returns the durable offset with r's error. Any other
// error returns the durable offset as far as Append knows it (what it
// committed); an *OffsetError returned after a lost race carries the offset
// read after it. The caller bounds the body's size (r's length). See Bodies
// for the rule when two callers append at once.
func (b *Bodies) Append(ctx context.Context, envelopeID string, offset int64, r io.Reader) (durable int64, err error) {
	if err := checkID(envelopeID); err != nil {
		return 0, err
	}
	if offset < 0 {
		return 0, fmt.Errorf("jsstore: negative upload offset %d", offset)
	}
	unlock, err := b.lock(ctx, envelopeID)
	if err != nil {
		return 0, err
	}
	defer unlock()
	st, err := b.state(ctx, envelopeID)
	if err != nil {
		return 0, err
	}
	if d := st.durable(b.seg); d != offset {
		return d, &OffsetError{Offset: offset, Durable: d}
	}
	durable = offset
	var chain hash.Hash // the body's SHA-256 state at the start of segment i; nil: not known
	for {
		i, within := durable/b.seg, durable%b.seg
		if i >= maxSegmentIndex {
			return durable, fmt.Errorf("jsstore: body too large")
		}
		if chain == nil {
			if chain, err = b.chainBefore(ctx, envelopeID, i); err != nil {
				return durable, err
			}
		}
		prev, err := b.segment(ctx, envelopeID, i)
		if err != nil {
			return durable, err
		}
		if (prev.info == nil) != (within == 0) || (prev.info != nil && int64(prev.info.Size) != within) {
			return b.lost(ctx, envelopeID, durable)
		}
		if b.hooks.BeforeSegment != nil {
			b.hooks.BeforeSegment(SegmentName(envelopeID, i))
		}
		var added int64
		var full bool
		var rerr error
		added, full, chain, rerr, err = b.putSegment(ctx, envelopeID, i, prev, chain, r, b.seg-within)
		durable += added
		if err != nil && !errors.Is(err, errLost) {
			// A failure while another writer changed the segment (its old
			// chunks, being copied, purged by that writer's commit) is that
			// race's loss; so is a commit of ours whose outcome was unknown
			// and landed after all (the offset read then includes it).
			if now, serr := b.segment(ctx, envelopeID, i); serr == nil && now.seq != prev.seq {
				err = errLost
			}
		}
		switch {
		case errors.Is(err, errLost):
			return b.lost(ctx, envelopeID, durable)
		case err != nil:
			return durable, err
		case rerr != nil:
			return durable, rerr
		case !full:
			return durable, nil
		}
	}
}

// chainBefore returns the body's SHA-256 state after the segments before i
// (a fresh hash for i = 0), from segment i-1's meta; nil if that meta has none.
func (b *Bodies) chainBefore(ctx context.Context, id string, i int64) (hash.Hash, error) {
	if i == 0 {
		return sha256.New(), nil
	}
	s, err := b.segment(ctx, id, i-1)
	if err != nil {
		return nil, err
	}
	if s.info == nil || int64(s.info.Size) != b.seg {
		return nil, fmt.Errorf("%w: segment %s missing or not full", ErrBodyCorrupt, SegmentName(id, i-1))
	}
	return hashState(s.info), nil
}

// hashState is the body's SHA-256 state after segment info, as its meta
// records it (nil if it does not).
func hashState(info *jetstream.ObjectInfo) hash.Hash {
	raw, err := base64.StdEncoding.DecodeString(info.Metadata[stateMeta])
	if err != nil || len(raw) == 0 {
		return nil
	}
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(raw); err != nil {
		return nil
	}
	return h
}

// errLost: another writer changed the segment first.
var errLost = errors.New("jsstore: lost a race for a body segment")

// lost returns the *OffsetError of an append at offset whose segment another
// writer changed first.
func (b *Bodies) lost(ctx context.Context, id string, offset int64) (int64, error) {
	st, err := b.state(ctx, id)
	if err != nil {
		return offset, err
	}
	d := st.durable(b.seg)
	return d, &OffsetError{Offset: offset, Durable: d}
}

// source reads the new bytes of a segment: r up to the room left, an error of
// r becoming the end (recorded in err), counting.
type source struct {
	r   io.Reader
	n   int64
	err error
}

func (s *source) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, io.EOF
	}
	n, err := s.r.Read(p)
	s.n += int64(n)
	if err != nil && err != io.EOF {
		s.err = err
		err = io.EOF
	}
	return n, err
}

// putSegment writes segment i of id: prev's bytes (if prev is a partial
// segment) then up to room bytes of r, and commits it with a compare-and-set
// on prev's meta sequence. chain is the body's SHA-256 state at the start of
// the segment (nil: unknown); the state at its end is recorded in the
// segment's meta and returned. It returns the bytes of r committed, whether
// the segment is now full, r's error (the bytes before it are committed), and
// errLost if another writer committed the segment first. Nothing is written
// when r has no byte left.
func (b *Bodies) putSegment(ctx context.Context, id string, i int64, prev segment, chain hash.Hash, r io.Reader, room int64) (added int64, full bool, end hash.Hash, rerr, err error) {
	name := SegmentName(id, i)
	src := &source{r: io.LimitReader(r, room)}
	first := make([]byte, bodyChunkSize)
	n, _ := io.ReadFull(src, first)
	if n == 0 {
		return 0, false, chain, src.err, nil
	}
	var old io.Reader = bytes.NewReader(nil)
	var oldN countReader
	if prev.info != nil {
		sr := b.openSegment(context.WithoutCancel(ctx), prev.info) // the bytes of r read must be committed
		oldN.r = sr
		old = &oldN
	}
	in := io.MultiReader(old, bytes.NewReader(first[:n]), src)

	nuid := strings.ReplaceAll(uuid.NewString(), "-", "")
	subj := b.chunkSubject(nuid)
	b.mu.Lock()
	b.writing[subj]++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		if b.writing[subj]--; b.writing[subj] == 0 {
			delete(b.writing, subj)
		}
		b.mu.Unlock()
	}()
	purge := func() {
		pctx, cancel := b.op(ctx)
		defer cancel()
		_ = b.stream.Purge(pctx, jetstream.WithPurgeSubject(subj)) // best effort: leftovers are garbage, never read
	}
	h := sha256.New()
	var size int64
	var chunks uint32
	var pending []jetstream.PubAckFuture
	var lastSeq uint64
	seqs := make([]string, 0, (prevSize(prev)+room)/bodyChunkSize+1)
	wait := func(f jetstream.PubAckFuture) error {
		t := time.NewTimer(b.timeout)
		defer t.Stop()
		select {
		case ack := <-f.Ok():
			if ack.Sequence <= lastSeq {
				return fmt.Errorf("%w: segment %s: chunk stored out of order (seq %d after %d)", ErrBodyCorrupt, name, ack.Sequence, lastSeq)
			}
			lastSeq = ack.Sequence
			seqs = append(seqs, strconv.FormatUint(ack.Sequence, 10))
			return nil
		case err := <-f.Err():
			return fmt.Errorf("jsstore: store body segment %s: %w", name, err)
		case <-t.C:
			return fmt.Errorf("jsstore: store body segment %s: no acknowledgment within %v", name, b.timeout)
		}
	}
	fail := func(err error) (int64, bool, hash.Hash, error, error) {
		purge()
		return 0, false, nil, nil, err
	}
	for {
		buf := make([]byte, bodyChunkSize) // a fresh buffer: a publish may still hold the last one
		m, readErr := io.ReadFull(in, buf)
		if m > 0 {
			h.Write(buf[:m])
			if chain != nil {
				chain.Write(buf[:m])
			}
			size += int64(m)
			chunks++
			f, err := b.pub.PublishMsgAsync(&nats.Msg{Subject: subj, Data: buf[:m]}, jetstream.WithRetryAttempts(0))
			if err != nil {
				return fail(fmt.Errorf("jsstore: store body segment %s: %w", name, err))
			}
			if pending = append(pending, f); len(pending) >= bodyWindow {
				if err := wait(pending[0]); err != nil {
					return fail(err)
				}
				pending = pending[1:]
			}
		}
		if readErr == io.EOF || readErr == io.ErrUnexpectedEOF {
			break
		}
		if readErr != nil { // the old segment's bytes failed: src never fails
			return fail(readErr)
		}
	}
	for _, f := range pending {
		if err := wait(f); err != nil {
			return fail(err)
		}
	}
	if prev.info != nil && oldN.n != int64(prev.info.Size) {
		return fail(fmt.Errorf("%w: segment %s: read %d bytes of %d", ErrBodyCorrupt, name, oldN.n, prev.info.Size))
	}
	added = src.n
	meta := map[string]string{seqsMeta: strings.Join(seqs, ",")}
	if chain != nil {
		st, err := chain.(encoding.BinaryMarshaler).MarshalBinary()
		if err != nil {
			return fail(fmt.Errorf("jsstore: body hash state: %w", err))
		}
		meta[stateMeta] = base64.StdEncoding.EncodeToString(st)
	}
	info := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: name, Metadata: meta, Opts: &jetstream.ObjectMetaOptions{ChunkSize: bodyChunkSize}},
		Bucket:     b.bucket, NUID: nuid, Size: uint64(size), Chunks: chunks,
		Digest: jetstream.GetObjectDigestValue(h),
	}
	data, err := json.Marshal(&info)
	if err != nil {
		return fail(fmt.Errorf("jsstore: body segment meta: %w", err))
	}
	if b.hooks.BeforeCommit != nil {
		b.hooks.BeforeCommit(name)
	}
	mm := nats.NewMsg(b.metaSubject(name))
	mm.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	mm.Data = data
	cctx, cancel := b.op(ctx)
	_, err = b.pub.PublishMsg(cctx, mm, jetstream.WithExpectLastSequencePerSubject(prev.seq))
	cancel()
	if err != nil {
		// The outcome may be unknown (a timeout after the server stored it):
		// the segment's meta, read again, says.
		now, rerr2 := b.segment(ctx, id, i)
		switch {
		case rerr2 == nil && now.info != nil && now.info.NUID == nuid:
			// committed after all
		case isWrongLastSeq(err) || (rerr2 == nil && now.seq != prev.seq):
			purge()
			return 0, false, nil, nil, errLost
		default: // unknown: our chunks may be referenced; leave them
			return 0, false, nil, nil, fmt.Errorf("jsstore: commit body segment %s: %w", name, err)
		}
	}
	if prev.info != nil {
		pctx, cancel := b.op(ctx)
		_ = b.stream.Purge(pctx, jetstream.WithPurgeSubject(b.chunkSubject(prev.info.NUID))) // best effort: the old chunks are no longer referenced
		cancel()
	}
	return added, size == b.seg, chain, src.err, nil
}

func prevSize(s segment) int64 {
	if s.info == nil {
		return 0
	}
	return int64(s.info.Size)
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// segmentReader reads one segment's chunks from the stream's leader, up to
// readWindow chunk requests in flight (by the sequences its meta lists; one at
// a time by subject if it lists none), checking their subject, count and
// sizes and the segment's digest.
type segmentReader struct {
	b     *Bodies
	ctx   context.Context
	info  *jetstream.ObjectInfo
	subj  string
	seqs  []uint64 // the chunks' sequences, nil: not listed
	q     []chan chunkResult
	sent  int    // chunk requests made (with seqs)
	next  uint64 // stream sequence to look from (without seqs)
	got   uint32 // chunks read
	n     int64  // bytes read
	h     hash.Hash
	buf   []byte
	err   error
	chunk int64
}

type chunkResult struct {
	m   *jetstream.RawStreamMsg
	err error
}

// openSegment reads the segment of info; its requests end with ctx.
func (b *Bodies) openSegment(ctx context.Context, info *jetstream.ObjectInfo) *segmentReader {
	chunk := int64(bodyChunkSize)
	if info.Opts != nil && info.Opts.ChunkSize > 0 {
		chunk = int64(info.Opts.ChunkSize)
	}
	s := &segmentReader{b: b, ctx: ctx, info: info, subj: b.chunkSubject(info.NUID), next: 1, h: sha256.New(), chunk: chunk}
	if list := info.Metadata[seqsMeta]; list != "" {
		parts := strings.Split(list, ",")
		seqs := make([]uint64, 0, len(parts))
		for _, p := range parts {
			q, err := strconv.ParseUint(p, 10, 64)
			if err != nil {
				seqs = nil
				break
			}
			seqs = append(seqs, q)
		}
		if len(seqs) == int(info.Chunks) {
			s.seqs = seqs
		}
	}
	return s
}

func (s *segmentReader) Read(p []byte) (int, error) {
	for len(s.buf) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		s.err = s.fill()
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	return n, nil
}

// get is one chunk request, ending with the reader's context or Timeout.
func (s *segmentReader) get(seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.b.timeout)
	defer cancel()
	return s.b.stream.GetMsg(ctx, seq, opts...)
}

// fill reads the next chunk into buf, or returns io.EOF after the last chunk
// once the digest matches.
func (s *segmentReader) fill() error {
	name := s.info.Name
	if s.got == s.info.Chunks {
		if s.n != int64(s.info.Size) {
			return fmt.Errorf("%w: segment %s: %d bytes in its chunks, %d in its meta", ErrBodyCorrupt, name, s.n, s.info.Size)
		}
		if jetstream.GetObjectDigestValue(s.h) != s.info.Digest {
			return fmt.Errorf("%w: segment %s: digest mismatch", ErrBodyCorrupt, name)
		}
		return io.EOF
	}
	if err := s.ctx.Err(); err != nil {
		return err
	}
	var m *jetstream.RawStreamMsg
	var err error
	if s.seqs != nil {
		for len(s.q) < readWindow && s.sent < len(s.seqs) {
			ch, seq := make(chan chunkResult, 1), s.seqs[s.sent]
			go func() {
				m, err := s.get(seq)
				ch <- chunkResult{m, err}
			}()
			s.q, s.sent = append(s.q, ch), s.sent+1
		}
		r := <-s.q[0] // each request ends within Timeout
		s.q = s.q[1:]
		m, err = r.m, r.err
		if err == nil && m.Subject != s.subj {
			err = jetstream.ErrMsgNotFound // another message took the sequence's place: the chunk is gone
		}
	} else {
		m, err = s.get(s.next, jetstream.WithGetMsgSubject(s.subj))
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("%w: segment %s: chunk %d of %d missing (replaced or deleted meanwhile?)", ErrBodyCorrupt, name, s.got+1, s.info.Chunks)
	}
	if err != nil {
		return fmt.Errorf("jsstore: read body segment %s: %w", name, err)
	}
	s.got++
	last := s.got == s.info.Chunks
	if int64(len(m.Data)) > s.chunk || (!last && int64(len(m.Data)) != s.chunk) || len(m.Data) == 0 {
		return fmt.Errorf("%w: segment %s: chunk %d has %d bytes", ErrBodyCorrupt, name, s.got, len(m.Data))
	}
	s.next = m.Sequence + 1
	s.n += int64(len(m.Data))
	s.h.Write(m.Data)
	s.buf = m.Data
	return nil
}

// Open returns a reader of envelopeID's body from offset to the durable
// offset at the time of the call (ErrBodyRange beyond it). It streams, with at
// most readWindow chunks (1 MiB) requested ahead; each segment's size and
// digest are checked as it is read (ErrBodyCorrupt), and a start inside a
// segment reads that segment from its start (to check it). Its reads end when
// ctx ends or it is closed. Open while an Append extends the body's last
// partial segment may fail with ErrBodyCorrupt (its old chunks are purged);
// the relay opens complete bodies.
func (b *Bodies) Open(ctx context.Context, envelopeID string, offset int64) (io.ReadCloser, error) {
	if err := checkID(envelopeID); err != nil {
		return nil, err
	}
	st, err := b.state(ctx, envelopeID)
	if err != nil {
		return nil, err
	}
	d := st.durable(b.seg)
	if offset < 0 || offset > d {
		return nil, fmt.Errorf("%w: offset %d, durable %d", ErrBodyRange, offset, d)
	}
	ctx, cancel := context.WithCancel(ctx)
	return &bodyReader{b: b, ctx: ctx, cancel: cancel, id: envelopeID, i: offset / b.seg, skip: offset % b.seg, st: st}, nil
}

type bodyReader struct {
	b      *Bodies
	ctx    context.Context
	cancel context.CancelFunc
	id     string
	i      int64 // the segment being read (or next to open)
	skip   int64 // bytes of it still to skip
	st     bodyState
	cur    *segmentReader
	err    error
}

func (r *bodyReader) Read(p []byte) (int, error) {
	for r.err == nil {
		if r.cur == nil {
			if r.i >= r.st.n {
				r.err = io.EOF
				break
			}
			s := r.st.last
			if r.i != r.st.n-1 {
				var err error
				if s, err = r.b.segment(r.ctx, r.id, r.i); err != nil {
					r.err = err
					break
				}
				if s.info == nil || int64(s.info.Size) != r.b.seg {
					r.err = fmt.Errorf("%w: segment %s missing or not full", ErrBodyCorrupt, SegmentName(r.id, r.i))
					break
				}
			}
			r.cur = r.b.openSegment(r.ctx, s.info)
			if r.skip > 0 {
				if _, err := io.CopyN(io.Discard, r.cur, r.skip); err != nil {
					r.err = err
					break
				}
				r.skip = 0
			}
		}
		n, err := r.cur.Read(p)
		if err == io.EOF {
			r.cur, r.i = nil, r.i+1
			err = nil
		}
		if n > 0 || err != nil {
			if err != nil {
				r.err = err
			}
			return n, err
		}
	}
	return 0, r.err
}

// Close ends the reader's requests.
func (r *bodyReader) Close() error {
	r.cancel()
	r.cur, r.err = nil, errors.New("jsstore: body reader closed")
	return nil
}

// Digest returns the lower-case hex SHA-256 and the length of envelopeID's
// durable bytes without reading them: from the hash state its last segment's
// meta records (the state of the SHA-256 of exactly the bytes written into
// the segments, carried from segment to segment by Append). For a body whose
// last segment records none it reads the body (ReadDigest).
func (b *Bodies) Digest(ctx context.Context, envelopeID string) (digest string, size int64, err error) {
	if err := checkID(envelopeID); err != nil {
		return "", 0, err
	}
	st, err := b.state(ctx, envelopeID)
	if err != nil {
		return "", 0, err
	}
	if st.n == 0 {
		return hex.EncodeToString(sha256.New().Sum(nil)), 0, nil
	}
	if h := hashState(st.last.info); h != nil {
		return hex.EncodeToString(h.Sum(nil)), st.durable(b.seg), nil
	}
	return b.ReadDigest(ctx, envelopeID)
}

// ReadDigest returns the lower-case hex SHA-256 and the length of
// envelopeID's durable bytes by reading them through Open (streaming, every
// segment's size and digest checked): a check of what is stored.
func (b *Bodies) ReadDigest(ctx context.Context, envelopeID string) (digest string, size int64, err error) {
	rc, err := b.Open(ctx, envelopeID, 0)
	if err != nil {
		return "", 0, err
	}
	defer rc.Close()
	h := sha256.New()
	if size, err = io.Copy(h, rc); err != nil {
		return "", size, err
	}
	return hex.EncodeToString(h.Sum(nil)), size, nil
}

// Delete removes envelopeID's body: its segments from the last to the first
// (so that what a crash leaves is still a body's prefix), each by purging its
// meta then its chunks. Deleting an absent body does nothing. See Bodies for
// its limit against an Append in another process.
func (b *Bodies) Delete(ctx context.Context, envelopeID string) error {
	if err := checkID(envelopeID); err != nil {
		return err
	}
	unlock, err := b.lock(ctx, envelopeID)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := b.state(ctx, envelopeID)
	if err != nil {
		return err
	}
	for i := st.n - 1; i >= 0; i-- {
		s := st.last
		if i != st.n-1 {
			if s, err = b.segment(ctx, envelopeID, i); err != nil {
				return err
			}
		}
		name := SegmentName(envelopeID, i)
		octx, cancel := b.op(ctx)
		err := b.stream.Purge(octx, jetstream.WithPurgeSubject(b.metaSubject(name)))
		if err == nil && s.info != nil {
			err = b.stream.Purge(octx, jetstream.WithPurgeSubject(b.chunkSubject(s.info.NUID)))
		}
		cancel()
		if err != nil {
			return fmt.Errorf("jsstore: delete body segment %s: %w", name, err)
		}
	}
	return nil
}

// Sweep purges the chunks that no segment names and that no Append of this
// Bodies is writing, if the last of them was stored before before: what a
// relay process that died while writing a segment left (a failed or lost
// commit purges its own chunks). It returns how many chunk subjects it purged.
// Run it with before well in the past (an hour): an Append of another process
// that has been writing one segment since before would lose it (its commit
// then names missing chunks, which its readers report as ErrBodyCorrupt); the
// relay's request read timeouts keep an Append from stalling that long.
func (b *Bodies) Sweep(ctx context.Context, before time.Time) (int, error) {
	info, err := b.stream.Info(ctx, jetstream.WithSubjectFilter(b.chunkSubject(">")))
	if err != nil {
		return 0, fmt.Errorf("jsstore: sweep bodies: %w", err)
	}
	if len(info.State.Subjects) == 0 {
		return 0, nil
	}
	objs, err := b.objects(ctx)
	if err != nil {
		return 0, fmt.Errorf("jsstore: sweep bodies: %w", err)
	}
	named := make(map[string]bool, len(objs))
	for _, o := range objs {
		named[b.chunkSubject(o.NUID)] = true
	}
	purged := 0
	for subj := range info.State.Subjects {
		b.mu.Lock()
		busy := b.writing[subj] > 0
		b.mu.Unlock()
		if named[subj] || busy {
			continue
		}
		m, err := b.stream.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return purged, fmt.Errorf("jsstore: sweep bodies: %w", err)
		}
		if !m.Time.Before(before) {
			continue
		}
		if err := b.stream.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
			return purged, fmt.Errorf("jsstore: sweep bodies: %w", err)
		}
		purged++
	}
	return purged, nil
}

// objects lists the live objects of the bucket (one pass over the last meta
// message of every name).
func (b *Bodies) objects(ctx context.Context) ([]*jetstream.ObjectInfo, error) {
	obs, err := b.js.ObjectStore(ctx, b.bucket)
	if err != nil {
		return nil, err
	}
	objs, err := obs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, err
	}
	return objs, nil
}

// BodyInfo is one stored body, as List finds it.
type BodyInfo struct {
	EnvelopeID string
	// Size is the bytes its segments hold (its durable offset, if its
	// segments are whole).
	Size int64
	// Segments is how many segment objects it has.
	Segments int
	// Modified is when its last written segment was committed.
	Modified time.Time
}

// List returns every body the bucket holds, in envelope id order, so that a
// relay's maintenance can remove those no pending or waiting envelope names
// (an upload its sender abandoned, whose pending envelope no running relay
// process holds). Objects that are not segments are skipped.
func (b *Bodies) List(ctx context.Context) ([]BodyInfo, error) {
	objs, err := b.objects(ctx)
	if err != nil {
		return nil, fmt.Errorf("jsstore: list bodies: %w", err)
	}
	by := map[string]*BodyInfo{}
	for _, o := range objs {
		id, idx, ok := strings.Cut(o.Name, "/")
		if !ok || len(idx) != 16 || checkID(id) != nil {
			continue
		}
		if _, err := strconv.ParseUint(idx, 16, 64); err != nil {
			continue
		}
		bi := by[id]
		if bi == nil {
			bi = &BodyInfo{EnvelopeID: id}
			by[id] = bi
		}
		bi.Size += int64(o.Size)
		bi.Segments++
		if o.ModTime.After(bi.Modified) {
			bi.Modified = o.ModTime
		}
	}
	out := make([]BodyInfo, 0, len(by))
	for _, bi := range by {
		out = append(out, *bi)
	}
	slices.SortFunc(out, func(x, y BodyInfo) int { return strings.Compare(x.EnvelopeID, y.EnvelopeID) })
	return out, nil
}
