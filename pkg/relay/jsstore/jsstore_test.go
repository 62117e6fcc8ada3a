package jsstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
)

// wire is a stand-in envelope: the store keeps bytes, it does not parse them.
type wire struct {
	id, digest string
	data       []byte
}

func newWire(tag string) wire {
	id := uuid.NewString()
	data := []byte(fmt.Sprintf(`{"v":1,"payload":{"id":%q,"tag":%q},"sig":"x"}`, id, tag))
	sum := sha256.Sum256(data)
	return wire{id: id, digest: hex.EncodeToString(sum[:]), data: data}
}

func (w wire) other() wire {
	data := append([]byte(nil), w.data...)
	data = append(data, ' ')
	sum := sha256.Sum256(data)
	return wire{id: w.id, digest: hex.EncodeToString(sum[:]), data: data}
}

var (
	alice = identity.DID("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK")
	bob   = identity.DID("did:key:z6MkjchhfUsD6mmvni8mCdXHw216Xrm9bQe2mBH1P5RDjVJG")
	t0    = time.UnixMilli(1767225600000)
)

func openSingle(t *testing.T) (*jsstore.Store, *nats.Conn) {
	t.Helper()
	s := natstest.Node(t)
	nc := natstest.Connect(t, s.ClientURL())
	st, err := jsstore.Open(context.Background(), nc, jsstore.Options{Replicas: 1, SyncAlways: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return st, nc
}

func put(t *testing.T, st *jsstore.Store, to identity.DID, w wire, at time.Time) (jsstore.Held, bool) {
	t.Helper()
	h, dup, err := st.Put(context.Background(), to, w.id, w.digest, w.data, at, at.Add(time.Hour))
	if err != nil {
		t.Fatalf("Put %s: %v", w.id, err)
	}
	return h, dup
}

// fetchAll reads to's whole inbox page by page (limit per page) and returns
// the ids in order.
func fetchAll(t *testing.T, stores []*jsstore.Store, to identity.DID, limit int) []string {
	t.Helper()
	var ids []string
	cursor := ""
	for i := 0; ; i++ {
		page, err := stores[i%len(stores)].Fetch(context.Background(), to, cursor, limit)
		if err != nil {
			t.Fatalf("Fetch after %q: %v", cursor, err)
		}
		if len(page.Envelopes) > limit {
			t.Fatalf("page of %d, limit %d", len(page.Envelopes), limit)
		}
		for _, e := range page.Envelopes {
			ids = append(ids, e.EnvelopeID)
		}
		if !page.More {
			if len(page.Envelopes) > 0 && page.Cursor != page.Envelopes[len(page.Envelopes)-1].Cursor {
				t.Fatalf("page cursor %s is not its last envelope's", page.Cursor)
			}
			return ids
		}
		cursor = page.Cursor
	}
}

func TestPutDuplicateConflictFetchAck(t *testing.T) {
	st, _ := openSingle(t)
	ctx := context.Background()
	ws := []wire{newWire("a"), newWire("b"), newWire("c")}
	var held []jsstore.Held
	for i, w := range ws {
		h, dup := put(t, st, alice, w, t0.Add(time.Duration(i)*time.Millisecond))
		if dup || h.EnvelopeID != w.id || h.Digest != w.digest || h.Recipient != jsstore.RecipientKey(alice) ||
			!h.ReceivedAt.Equal(t0.Add(time.Duration(i)*time.Millisecond)) {
			t.Fatalf("Put %d = %+v, duplicate %t", i, h, dup)
		}
		held = append(held, h)
	}
	bw := newWire("for bob")
	put(t, st, bob, bw, t0)

	// The same envelope again, later: the first Held, not the new receivedAt.
	h, dup := put(t, st, alice, ws[1], t0.Add(time.Hour))
	if !dup || h != held[1] {
		t.Fatalf("re-Put = %+v, %t; want %+v, true", h, dup, held[1])
	}
	// Same id, other digest: conflict, naming the held digest, nothing stored.
	h, dup, err := st.Put(ctx, alice, ws[1].id, ws[1].other().digest, ws[1].other().data, t0, t0.Add(time.Hour))
	if !errors.Is(err, jsstore.ErrConflict) || !dup || h.Digest != ws[1].digest {
		t.Fatalf("conflicting Put = %+v, %t, %v", h, dup, err)
	}
	// Also to another recipient: the id is taken relay-wide.
	if _, _, err := st.Put(ctx, bob, ws[0].id, ws[0].other().digest, ws[0].other().data, t0, t0.Add(time.Hour)); !errors.Is(err, jsstore.ErrConflict) {
		t.Fatalf("conflicting Put to bob: %v", err)
	}

	// Order, paging, bytes: pages of 2 then 1.
	page, err := st.Fetch(ctx, alice, "", 2)
	if err != nil || len(page.Envelopes) != 2 || !page.More || page.Envelopes[0].EnvelopeID != ws[0].id ||
		string(page.Envelopes[1].Wire) != string(ws[1].data) || page.Envelopes[1].Held != held[1] {
		t.Fatalf("first page = %+v, %v", page, err)
	}
	page, err = st.Fetch(ctx, alice, page.Cursor, 2)
	if err != nil || len(page.Envelopes) != 1 || page.More || page.Envelopes[0].EnvelopeID != ws[2].id {
		t.Fatalf("second page = %+v, %v", page, err)
	}
	end := page.Cursor
	page, err = st.Fetch(ctx, alice, end, 2)
	if err != nil || len(page.Envelopes) != 0 || page.More || page.Cursor != end {
		t.Fatalf("page past the end = %+v, %v", page, err)
	}
	if got := fetchAll(t, []*jsstore.Store{st}, bob, 10); len(got) != 1 || got[0] != bw.id {
		t.Fatalf("bob's inbox = %v (the conflicting Put to bob must leave nothing)", got)
	}
	for _, bad := range []string{"x", "-1", "01", " 1"} {
		if _, err := st.Fetch(ctx, alice, bad, 1); !errors.Is(err, jsstore.ErrCursor) {
			t.Errorf("Fetch after %q: %v, want ErrCursor", bad, err)
		}
	}

	// Status.
	s, err := st.Status(ctx, alice)
	wantBytes := int64(len(ws[0].data) + len(ws[1].data) + len(ws[2].data))
	if err != nil || s.Count != 3 || s.Bytes != wantBytes || !s.Oldest.Equal(t0) || !s.Newest.Equal(t0.Add(2*time.Millisecond)) {
		t.Fatalf("Status = %+v, %v; want 3, %d bytes", s, err, wantBytes)
	}

	// Ack: only the caller's own envelopes, idempotent.
	if n, err := st.Ack(ctx, bob, []string{ws[0].id}); err != nil || n != 0 {
		t.Fatalf("bob acks alice's envelope: %d, %v", n, err)
	}
	if n, err := st.Ack(ctx, alice, []string{ws[0].id, ws[2].id, uuid.NewString(), "not-a-uuid"}); err != nil || n != 2 {
		t.Fatalf("Ack = %d, %v; want 2", n, err)
	}
	if n, err := st.Ack(ctx, alice, []string{ws[0].id}); err != nil || n != 0 {
		t.Fatalf("Ack again = %d, %v; want 0", n, err)
	}
	if got := fetchAll(t, []*jsstore.Store{st}, alice, 10); len(got) != 1 || got[0] != ws[1].id {
		t.Fatalf("after ack: %v", got)
	}
	// The record outlives the message: the acked envelope again is a
	// duplicate with the first Held and does not re-enter the inbox.
	h, dup = put(t, st, alice, ws[0], t0.Add(2*time.Hour))
	if !dup || h != held[0] {
		t.Fatalf("re-Put after ack = %+v, %t", h, dup)
	}
	if got := fetchAll(t, []*jsstore.Store{st}, alice, 10); len(got) != 1 {
		t.Fatalf("after re-Put of an acked envelope: %v", got)
	}
	if _, _, err := st.Put(ctx, alice, ws[0].id, ws[0].other().digest, ws[0].other().data, t0, t0.Add(time.Hour)); !errors.Is(err, jsstore.ErrConflict) {
		t.Fatalf("conflict after ack: %v", err)
	}
}

// publishWithoutRecord publishes w for to as a Put does, and nothing else: what
// a Put leaves when it fails or crashes between its publish and its record.
func publishWithoutRecord(t *testing.T, nc *nats.Conn, to identity.DID, w wire, at time.Time) uint64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(jsstore.DefaultSubject + "." + jsstore.RecipientKey(to) + "." + w.id)
	m.Data = w.data
	m.Header.Set("Sealbridge-Envelope-Id", w.id)
	m.Header.Set("Sealbridge-Digest", w.digest)
	m.Header.Set("Sealbridge-Received-At", strconv.FormatInt(at.UnixMilli(), 10))
	m.Header.Set("Sealbridge-Deadline", strconv.FormatInt(at.Add(time.Hour).UnixMilli(), 10))
	ack, err := js.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// A crash between the stream message and the record leaves a message without
// a record: the retry adopts it (its receivedAt, its sequence) and holds it
// once; a retry with another digest completes the first and is a conflict.
func TestPutAdoptsMessageOfCrashedPut(t *testing.T) {
	st, nc := openSingle(t)
	ctx := context.Background()
	crashed := func(w wire, at time.Time) uint64 { return publishWithoutRecord(t, nc, alice, w, at) }
	w := newWire("crashed")
	seq := crashed(w, t0)
	h, dup := put(t, st, alice, w, t0.Add(time.Minute))
	if dup || h.Cursor != strconv.FormatUint(seq, 10) || !h.ReceivedAt.Equal(t0) {
		t.Fatalf("retry = %+v, %t; want the crashed attempt's seq %d and receivedAt", h, dup, seq)
	}
	if got := fetchAll(t, []*jsstore.Store{st}, alice, 10); len(got) != 1 || got[0] != w.id {
		t.Fatalf("inbox = %v, want the envelope once", got)
	}

	v := newWire("crashed, then another digest")
	crashed(v, t0)
	h, dup, err := st.Put(ctx, alice, v.id, v.other().digest, v.other().data, t0, t0.Add(time.Hour))
	if !errors.Is(err, jsstore.ErrConflict) || !dup || h.Digest != v.digest {
		t.Fatalf("other digest after a crash = %+v, %t, %v", h, dup, err)
	}
	if h, dup := put(t, st, alice, v, t0); !dup || h.Digest != v.digest {
		t.Fatalf("the crashed envelope again = %+v, %t", h, dup)
	}
	if got := fetchAll(t, []*jsstore.Store{st}, alice, 10); len(got) != 2 || got[1] != v.id {
		t.Fatalf("inbox = %v", got)
	}
}

// The record lasts deadline + retention (the receipts' lifetime), not
// JetStream's two-minute de-duplication window.
func TestRecordTTLIsDeadlinePlusRetention(t *testing.T) {
	st, nc := openSingle(t)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kvStream, err := js.Stream(ctx, "KV_"+jsstore.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		deadline time.Duration
		want     time.Duration
	}{
		{30 * 24 * time.Hour, 31 * 24 * time.Hour},
		{time.Hour, 25 * time.Hour},
	} {
		w := newWire("ttl")
		if _, _, err := st.Put(ctx, alice, w.id, w.digest, w.data, t0, t0.Add(c.deadline)); err != nil {
			t.Fatal(err)
		}
		m, err := kvStream.GetLastMsgForSubject(ctx, "$KV."+jsstore.DefaultBucket+"."+w.id)
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := time.ParseDuration(m.Header.Get("Nats-TTL"))
		if err != nil {
			ttl, err = time.ParseDuration(m.Header.Get("Nats-TTL") + "s")
		}
		if err != nil || ttl < c.want || ttl > c.want+2*time.Second {
			t.Errorf("deadline %v: record TTL %q (%v), want %v", c.deadline, m.Header.Get("Nats-TTL"), err, c.want)
		}
	}
}

func TestExpireRemovesPastDeadlineKeepsRecord(t *testing.T) {
	st, _ := openSingle(t)
	ctx := context.Background()
	early, late := newWire("early"), newWire("late")
	if _, _, err := st.Put(ctx, alice, early.id, early.digest, early.data, t0, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Put(ctx, bob, late.id, late.digest, late.data, t0, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Expire(ctx, t0.Add(time.Minute)); err != nil || n != 0 {
		t.Fatalf("Expire at the deadline = %d, %v; want 0", n, err)
	}
	if n, err := st.Expire(ctx, t0.Add(2*time.Minute)); err != nil || n != 1 {
		t.Fatalf("Expire = %d, %v; want 1", n, err)
	}
	if got := fetchAll(t, []*jsstore.Store{st}, alice, 10); len(got) != 0 {
		t.Fatalf("alice's inbox after expiry = %v", got)
	}
	if got := fetchAll(t, []*jsstore.Store{st}, bob, 10); len(got) != 1 {
		t.Fatalf("bob's inbox after expiry = %v", got)
	}
	if _, dup := put(t, st, alice, early, t0); !dup {
		t.Fatal("an expired envelope again must be a duplicate, not held anew")
	}
	if s, err := st.Status(ctx, alice); err != nil || s.Count != 0 || s.Bytes != 0 || !s.Oldest.IsZero() {
		t.Fatalf("Status of an empty inbox = %+v, %v", s, err)
	}
}

// Open's durability refusals are decided before anything is created: no
// stream or bucket is left behind by a refused Open, and the error says what
// is wrong in JetStream's terms (a *NotDurableError), never JetStream's bare
// API error 10074 ("replicas > 1 not supported in non-clustered mode").
func TestOpenRefusesUnreplicatedUnsynced(t *testing.T) {
	s := natstest.Node(t)
	nc := natstest.Connect(t, s.ClientURL())
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	streams := func() []string {
		t.Helper()
		var names []string
		l := js.StreamNames(ctx)
		for n := range l.Name() {
			names = append(names, n)
		}
		if l.Err() != nil {
			t.Fatal(l.Err())
		}
		return names
	}
	refused := func(what string, opts jsstore.Options, want jsstore.NotDurableError) {
		t.Helper()
		before := streams()
		_, err := jsstore.Open(ctx, nc, opts)
		var e *jsstore.NotDurableError
		if !errors.Is(err, jsstore.ErrNotDurable) || !errors.As(err, &e) || *e != want {
			t.Fatalf("%s: %v (%+v), want %+v", what, err, e, want)
		}
		if strings.Contains(err.Error(), "10074") || strings.Contains(err.Error(), "non-clustered mode") || strings.Contains(err.Error(), "hint:") {
			t.Fatalf("%s: %v: want the refusal in its own words, no hint of a command's", what, err)
		}
		if after := streams(); len(after) != len(before) {
			t.Fatalf("%s: a refused Open created streams: %v → %v", what, before, after)
		}
	}
	// The default, R3, on a single server.
	refused("R3 on a single server", jsstore.Options{},
		jsstore.NotDurableError{Resource: "stream SEALBRIDGE_INBOX", Stream: "SEALBRIDGE_INBOX", Replicas: 3, SingleServer: true})
	refused("R3 declared synced on a single server", jsstore.Options{SyncAlways: true},
		jsstore.NotDurableError{Resource: "stream SEALBRIDGE_INBOX", Stream: "SEALBRIDGE_INBOX", Replicas: 3, SingleServer: true})
	// R1 without the declaration: refused before the server is asked anything.
	refused("R1 without SyncAlways", jsstore.Options{Replicas: 1}, jsstore.NotDurableError{Replicas: 1, SingleServer: true})
	if _, err := jsstore.Open(ctx, nc, jsstore.Options{Replicas: 1, SyncAlways: true}); err != nil {
		t.Fatalf("Open R1 with SyncAlways: %v", err)
	}
	if n := len(streams()); n != 4 {
		t.Fatalf("%d streams, want the inbox and three buckets", n)
	}
	// The R1 stream and buckets exist: without the declaration they are refused.
	refused("the existing R1 stream", jsstore.Options{},
		jsstore.NotDurableError{Resource: "stream SEALBRIDGE_INBOX", Stream: "SEALBRIDGE_INBOX", Replicas: 1, Existing: true, SingleServer: true})
	// The inbox stream exists (R1), a bucket does not: declared synced with the
	// default R3, the bucket would be created with 3 replicas. Refused before
	// anything is created — not JetStream's raw 10074.
	if err := js.DeleteKeyValue(ctx, jsstore.DefaultRecipientsBucket); err != nil {
		t.Fatal(err)
	}
	refused("a missing bucket at R3 on a single server", jsstore.Options{SyncAlways: true},
		jsstore.NotDurableError{Resource: "bucket SEALBRIDGE_RECIPIENTS", Stream: "KV_SEALBRIDGE_RECIPIENTS", Replicas: 3, SingleServer: true})
}

// Two stores (two relay processes) racing on one id with two digests for two
// recipients agree: one Put holds it, the other gets ErrConflict naming the
// winner's digest, and only the winner's recipient ever sees the id.
func TestRacingPutsAgree(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	var stores []*jsstore.Store
	for range 2 {
		st, err := jsstore.Open(ctx, natstest.Connect(t, s.ClientURL()), jsstore.Options{Replicas: 1, SyncAlways: true})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, st)
	}
	const n = 100
	type result struct {
		h   jsstore.Held
		err error
	}
	for i := range n {
		w := newWire(fmt.Sprint("race ", i))
		ws := []wire{w, w.other()}
		to := []identity.DID{alice, bob}
		var res [2]result
		done := make(chan int)
		for k := range 2 {
			go func() {
				h, _, err := stores[k].Put(ctx, to[k], ws[k].id, ws[k].digest, ws[k].data, t0, t0.Add(time.Hour))
				res[k] = result{h, err}
				done <- k
			}()
		}
		<-done
		<-done
		var win int
		switch {
		case res[0].err == nil && errors.Is(res[1].err, jsstore.ErrConflict):
			win = 0
		case res[1].err == nil && errors.Is(res[0].err, jsstore.ErrConflict):
			win = 1
		default:
			t.Fatalf("race %d: %v / %v; want one success and one conflict", i, res[0].err, res[1].err)
		}
		if res[1-win].h != res[win].h {
			t.Fatalf("race %d: the loser was told %+v, the winner holds %+v", i, res[1-win].h, res[win].h)
		}
	}
	a := fetchAll(t, stores, alice, 256)
	b := fetchAll(t, stores, bob, 256)
	if len(a)+len(b) != n {
		t.Fatalf("%d + %d envelopes held for %d ids: a loser's message was left in an inbox", len(a), len(b), n)
	}
}

// A new Put notifies the watchers of every Store on the stream, naming the
// recipient's key; a duplicate does not.
func TestWatchSeesPutsOfOtherStores(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	open := func() *jsstore.Store {
		st, err := jsstore.Open(ctx, natstest.Connect(t, s.ClientURL()), jsstore.Options{Replicas: 1, SyncAlways: true})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	a, b := open(), open()
	got := make(chan string, 4)
	stop, err := a.Watch(func(k string) { got <- k })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	w := newWire("n")
	put(t, b, bob, w, t0)
	if k := <-got; k != jsstore.RecipientKey(bob) {
		t.Fatalf("notified %s, want bob's key", k)
	}
	put(t, b, bob, w, t0) // duplicate: nothing new
	put(t, b, alice, newWire("m"), t0)
	if k := <-got; k != jsstore.RecipientKey(alice) {
		t.Fatalf("notified %s after a duplicate and alice's put, want alice's key only", k)
	}
}

// The allow-list is shared by every Store on the buckets.
func TestRegisterShared(t *testing.T) {
	s := natstest.Node(t)
	ctx := context.Background()
	var st [2]*jsstore.Store
	for i := range st {
		var err error
		if st[i], err = jsstore.Open(ctx, natstest.Connect(t, s.ClientURL()), jsstore.Options{Replicas: 1, SyncAlways: true}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := st[1].Registered(ctx, bob); err != nil || ok {
		t.Fatalf("registered before: %v %v", ok, err)
	}
	for range 2 { // idempotent
		if err := st[0].Register(ctx, bob); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := st[1].Registered(ctx, bob); err != nil || !ok {
		t.Fatalf("not registered on the other store: %v %v", ok, err)
	}
	if ok, _ := st[1].Registered(ctx, alice); ok {
		t.Fatal("alice registered too")
	}
	for range 2 {
		if err := st[1].Unregister(ctx, bob); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := st[0].Registered(ctx, bob); err != nil || ok {
		t.Fatalf("still registered: %v %v", ok, err)
	}
}

func TestNotifyMustLieOutsideTheStream(t *testing.T) {
	s := natstest.Node(t)
	_, err := jsstore.Open(context.Background(), natstest.Connect(t, s.ClientURL()),
		jsstore.Options{Replicas: 1, SyncAlways: true, Notify: jsstore.DefaultSubject + ".n"})
	if err == nil || !strings.Contains(err.Error(), "hint:") {
		t.Fatalf("Open with a notify subject in the stream: %v", err)
	}
}

// An envelope of the largest size the relay accepts fits the stream with its headers
// (the server counts both against the message size limit).
func TestPutLargestEnvelope(t *testing.T) {
	st, _ := openSingle(t)
	w := newWire("large")
	w.data = append(w.data[:len(w.data)-1], bytes.Repeat([]byte(" "), envelope.MaxSize-len(w.data))...)
	w.data = append(w.data, '}')
	w.data = w.data[:envelope.MaxSize]
	sum := sha256.Sum256(w.data)
	w.digest = hex.EncodeToString(sum[:])
	if _, _, err := st.Put(context.Background(), bob, w.id, w.digest, w.data, t0, t0.Add(time.Hour)); err != nil {
		t.Fatalf("Put of %d bytes: %v", len(w.data), err)
	}
}

// A scan (Status, quotas, Expire) leaves no consumer behind on the stream.
func TestScansLeaveNoConsumers(t *testing.T) {
	st, nc := openSingle(t)
	put(t, st, bob, newWire("a"), t0)
	for range 5 {
		if _, err := st.Status(context.Background(), bob); err != nil {
			t.Fatal(err)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), jsstore.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil || info.State.Consumers != 0 {
		t.Fatalf("%d consumers left after 5 scans (%v), want 0", info.State.Consumers, err)
	}
}
