package store_test

// Tamper tests (docs/FORMAT.md §4, DESIGN §8): every record that was copied, moved, re-signed,
// truncated, planted, linked, replaced by a special file, loosened, grown past its
// limit or crafted against the strict decoder is refused with OUTBOX_STORE_INVALID on
// read — by a fresh store with no cache, and by a store that had cached the valid
// record before the file was tampered with. Every case ends with a control: once the
// tampering is undone the record reads as valid again, so each refusal is due to the
// tampering and nothing else.

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// ---------------------------------------------------------------------------
// Helpers shared by tamper_test.go, format_test.go and fuzz_test.go.

// tamperForeign returns an identity that is not the store's owner.
func tamperForeign(t testing.TB) *identity.Identity {
	t.Helper()
	seed := testSeed
	seed[0] = 77
	id, err := identity.FromSeed(seed[:])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// tamperQuote returns s as a JSON string.
func tamperQuote(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// tamperFrame builds a record file line from header members given as key, raw
// JSON value pairs, in the order given, with no whitespace, ending in '\n'.
func tamperFrame(members ...string) []byte {
	if len(members)%2 != 0 {
		panic("tamperFrame: odd number of members")
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i := 0; i < len(members); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(tamperQuote(members[i]))
		b.WriteByte(':')
		b.WriteString(members[i+1])
	}
	b.WriteString("}\n")
	return b.Bytes()
}

// tamperSigBytes signs payload as a record of kind/id with signer.
func tamperSigBytes(t testing.TB, signer crypto.Signer, kind record.Kind, id string, payload []byte) []byte {
	t.Helper()
	sig, err := identity.SignDomain(signer, identity.DomainRecord, []byte(kind), []byte(id), payload)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// tamperSigned returns the canonical record line of payload as kind/id, signed by
// signer, naming signerDID in the header.
func tamperSigned(t testing.TB, signer crypto.Signer, signerDID identity.DID, kind record.Kind, id string, payload []byte) []byte {
	t.Helper()
	sig := tamperSigBytes(t, signer, kind, id, payload)
	return tamperFrame("v", "1", "kind", tamperQuote(string(kind)), "id", tamperQuote(id),
		"signer", tamperQuote(string(signerDID)), "payload", string(payload),
		"sig", tamperQuote(base64.RawURLEncoding.EncodeToString(sig)))
}

// tamperOwnerSigned is tamperSigned by the store's owner.
func tamperOwnerSigned(t testing.TB, kind record.Kind, id string, payload []byte) []byte {
	t.Helper()
	own := ownerIdentity(t)
	return tamperSigned(t, own.Signer(), own.DID(), kind, id, payload)
}

// tamperHeader is the lenient view of a record line's header.
type tamperHeader struct {
	V       int             `json:"v"`
	Kind    string          `json:"kind"`
	ID      string          `json:"id"`
	Signer  string          `json:"signer"`
	Payload json.RawMessage `json:"payload"`
	Sig     string          `json:"sig"`
}

// tamperSplit decodes a record line's header leniently; Payload keeps its exact bytes.
func tamperSplit(t testing.TB, data []byte) tamperHeader {
	t.Helper()
	var h tamperHeader
	if err := json.Unmarshal(data, &h); err != nil {
		t.Fatalf("split record line: %v", err)
	}
	return h
}

// tamperReplaceOnce replaces the single occurrence of old in s, failing the test if
// old does not occur exactly once (so a crafted case cannot silently be a no-op).
func tamperReplaceOnce(t testing.TB, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("%q occurs %d times in %s, want once", old, n, s)
	}
	return strings.Replace(s, old, new, 1)
}

// tamperReplacePrefix replaces the prefix old of s, failing the test if s does not
// start with it.
func tamperReplacePrefix(t testing.TB, s, old, new string) string {
	t.Helper()
	if !strings.HasPrefix(s, old) {
		t.Fatalf("%s does not start with %q", s, old)
	}
	return new + s[len(old):]
}

// tamperParse parses data as kind/id for the owner.
func tamperParse(t testing.TB, kind record.Kind, id string, data []byte) (record.Record, error) {
	t.Helper()
	own := ownerIdentity(t)
	return record.Parse(kind, id, data, own.DID(), own.Public())
}

// tamperMustParse parses data as kind/id and fails the test if it is refused.
func tamperMustParse(t testing.TB, kind record.Kind, id string, data []byte) record.Record {
	t.Helper()
	r, err := tamperParse(t, kind, id, data)
	if err != nil {
		t.Fatalf("valid %s/%s refused: %v", kind, id, err)
	}
	return r
}

// tamperWithin runs fn in a goroutine and fails the test if it does not return
// within a generous deadline (a FIFO or a huge file must never block a read).
func tamperWithin(t testing.TB, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not return within 60s (blocked?)", what)
		return nil
	}
}

// tamperGetTyped reads kind/id through Store.GetAs with the kind's concrete type.
func tamperGetTyped(s *store.Store, k record.Kind, id string) (record.Record, error) {
	var (
		r   record.Record
		err error
	)
	switch k {
	case record.KindOutbox:
		var v *record.Outbox
		if v, err = store.GetAs[*record.Outbox](s, id); v != nil {
			r = v
		}
	case record.KindMessages:
		var v *record.Message
		if v, err = store.GetAs[*record.Message](s, id); v != nil {
			r = v
		}
	case record.KindBatches:
		var v *record.Batch
		if v, err = store.GetAs[*record.Batch](s, id); v != nil {
			r = v
		}
	default:
		return s.Get(k, id)
	}
	return r, err
}

// tamperExpectInvalid asserts that Get and GetAs of kind/id are refused with
// OUTBOX_STORE_INVALID, without blocking.
func tamperExpectInvalid(t testing.TB, s *store.Store, k record.Kind, id string) {
	t.Helper()
	for _, typed := range []bool{false, true} {
		var r record.Record
		err := tamperWithin(t, "Get "+string(k)+"/"+id, func() (err error) {
			if typed {
				r, err = tamperGetTyped(s, k, id)
			} else {
				r, err = s.Get(k, id)
			}
			return err
		})
		if !errors.Is(err, errcode.OutboxStoreInvalid) || r != nil {
			t.Fatalf("read %s/%s (typed=%v) = %v, %v; want OUTBOX_STORE_INVALID", k, id, typed, r, err)
		}
	}
}

// tamperExpectValid asserts that Get and GetAs of kind/id return a valid record.
func tamperExpectValid(t testing.TB, s *store.Store, k record.Kind, id string) record.Record {
	t.Helper()
	var r record.Record
	err := tamperWithin(t, "Get "+string(k)+"/"+id, func() (err error) {
		r, err = s.Get(k, id)
		return err
	})
	if err != nil || r == nil || r.Kind() != k || r.RecordID() != id {
		t.Fatalf("Get %s/%s = %v, %v; want the valid record", k, id, r, err)
	}
	tr, err := tamperGetTyped(s, k, id)
	if err != nil || tr == nil || !reflect.DeepEqual(tr, r) {
		t.Fatalf("GetAs %s/%s = %v, %v; want %v", k, id, tr, err, r)
	}
	return r
}

// ---------------------------------------------------------------------------
// A store with one enqueued message of two envelopes, plus a messages record whose id
// is the second envelope's id (so the same id exists in two kinds).

// tamperRecordLimit is Limits.RecordBytes of the tamper stores: small, so an
// oversize file is cheap to make.
const tamperRecordLimit = 8 << 10

type tamperEnv struct {
	dir    string
	limits store.Limits
	e1, e2 string // outbox ids (same batch)
	msgID  string
	orig   map[string][]byte // "kind/id" → the file's valid bytes
}

func tamperSetup(t *testing.T) *tamperEnv {
	t.Helper()
	lim := store.Limits{RecordBytes: tamperRecordLimit}
	s := openStore(t, store.Options{Limits: lim})
	req, _ := enqueue(t, s, 2)
	e := &tamperEnv{dir: s.Dir(), limits: lim, e1: req.Envelopes[0].EnvelopeID, e2: req.Envelopes[1].EnvelopeID,
		msgID: req.MessageID, orig: map[string][]byte{}}
	now := time.Now().UnixMilli()
	m := &record.Message{MessageID: e.e2, Status: record.StatusQueued, PeerOwnerDID: string(peerDID(t)),
		RelayURL: "https://relay.example/in", EnvelopeDigest: envelope.Digest([]byte(`{}`)),
		DeliveryDeadline: now + 3_600_000, CreatedAt: now, UpdatedAt: now, RetainUntil: now + 7_200_000}
	if err := s.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(m) }); err != nil {
		t.Fatal(err)
	}
	for _, ki := range [][2]string{{"outbox", e.e1}, {"outbox", e.e2}, {"messages", e.e2}, {"messages", e.msgID}} {
		data, err := os.ReadFile(e.path(record.Kind(ki[0]), ki[1]))
		if err != nil {
			t.Fatal(err)
		}
		tamperMustParse(t, record.Kind(ki[0]), ki[1], data)
		e.orig[ki[0]+"/"+ki[1]] = data
	}
	return e
}

func (e *tamperEnv) path(k record.Kind, id string) string {
	return filepath.Join(e.dir, string(k), id+".json")
}

func (e *tamperEnv) bytes(k record.Kind, id string) []byte { return e.orig[string(k)+"/"+id] }

// open returns a new Store on the tamper store; cold disables its cache.
func (e *tamperEnv) open(t testing.TB, cold bool) *store.Store {
	t.Helper()
	opts := store.Options{Dir: e.dir, Limits: e.limits}
	if cold {
		opts.CacheEntries = -1
	}
	return openStore(t, opts)
}

// tamperExpectOpenRefused checks that Open refuses the store with OUTBOX_STORE_INVALID
// naming path.
func tamperExpectOpenRefused(t testing.TB, e *tamperEnv, path string) {
	t.Helper()
	_, err := store.Open(ownerIdentity(t).Signer(), store.Options{Dir: e.dir, Limits: e.limits})
	if !errors.Is(err, errcode.OutboxStoreInvalid) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open = %v, want OUTBOX_STORE_INVALID naming %s", err, path)
	}
}

// tamperWriteRename replaces path with a new 0600 file holding data (a new inode).
func tamperWriteRename(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(filepath.Dir(path)), "tamper-"+uuid.NewString())
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tamperWriteInPlace rewrites the existing regular file path (same inode, same mode).
func tamperWriteInPlace(t testing.TB, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// tamperOutbox returns the parsed original outbox record id of e.
func (e *tamperEnv) outbox(t testing.TB, id string) *record.Outbox {
	t.Helper()
	return tamperMustParse(t, record.KindOutbox, id, e.bytes(record.KindOutbox, id)).(*record.Outbox)
}

// tamperBigOutbox returns a valid, owner-signed outbox record id whose file is larger
// than tamperRecordLimit.
func (e *tamperEnv) bigOutbox(t testing.TB, id string) []byte {
	t.Helper()
	o := e.outbox(t, id)
	o.Envelope = json.RawMessage(`{"envelopeId":"` + id + `","pad":"` + strings.Repeat("x", 2*tamperRecordLimit) + `"}`)
	o.EnvelopeDigest = envelope.Digest(o.Envelope)
	own := ownerIdentity(t)
	data, err := record.Encode(own.Signer(), own.DID(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) <= tamperRecordLimit {
		t.Fatalf("big record is only %d bytes", len(data))
	}
	tamperMustParse(t, record.KindOutbox, id, data)
	return data
}

// tamperPayloadOf returns the exact payload bytes of the original kind/id.
func (e *tamperEnv) payloadOf(t testing.TB, k record.Kind, id string) string {
	t.Helper()
	return string(tamperSplit(t, e.bytes(k, id)).Payload)
}

// tamperResign re-encodes the original kind/id with record.Encode by signer, naming did.
func (e *tamperEnv) resign(t testing.TB, k record.Kind, id string, signer crypto.Signer, did identity.DID) []byte {
	t.Helper()
	r := tamperMustParse(t, k, id, e.bytes(k, id))
	data, err := record.Encode(signer, did, r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// sigOf returns the sig member of the original outbox/e2 file.
func (e *tamperEnv) sigOf(t testing.TB) string {
	h := tamperSplit(t, e.bytes(record.KindOutbox, e.e2))
	return h.Sig
}

// ---------------------------------------------------------------------------

// tamperContentCase replaces the target file's bytes.
type tamperContentCase struct {
	name string
	kind record.Kind // target kind (default outbox); the target id is e.e2
	data func(t *testing.T, e *tamperEnv) []byte
}

func tamperContentCases() []tamperContentCase {
	ownerKey := func(t *testing.T, e *tamperEnv, payload string) []byte {
		return tamperOwnerSigned(t, record.KindOutbox, e.e2, []byte(payload))
	}
	header := func(t *testing.T, e *tamperEnv, members ...string) []byte {
		// a header around e2's exact payload and valid signature
		h := tamperSplit(t, e.bytes(record.KindOutbox, e.e2))
		base := map[string]string{"v": "1", "kind": tamperQuote("outbox"), "id": tamperQuote(e.e2),
			"signer": tamperQuote(string(ownerIdentity(t).DID())), "payload": string(h.Payload), "sig": tamperQuote(h.Sig)}
		var out []string
		for i := 0; i < len(members); i += 2 {
			v := members[i+1]
			if v == "" {
				v = base[members[i]]
			}
			out = append(out, members[i], v)
		}
		return tamperFrame(out...)
	}
	canonical := []string{"v", "", "kind", "", "id", "", "signer", "", "payload", "", "sig", ""}
	with := func(key, val string) []string {
		m := append([]string(nil), canonical...)
		for i := 0; i < len(m); i += 2 {
			if m[i] == key {
				m[i+1] = val
			}
		}
		return m
	}
	return []tamperContentCase{
		{name: "copied-to-another-id", data: func(t *testing.T, e *tamperEnv) []byte {
			return e.bytes(record.KindOutbox, e.e1)
		}},
		{name: "messages-record-moved-into-outbox", data: func(t *testing.T, e *tamperEnv) []byte {
			return e.bytes(record.KindMessages, e.e2)
		}},
		{name: "outbox-record-moved-into-messages", kind: record.KindMessages, data: func(t *testing.T, e *tamperEnv) []byte {
			return e.bytes(record.KindOutbox, e.e2)
		}},
		{name: "resigned-by-foreign-key-naming-owner", data: func(t *testing.T, e *tamperEnv) []byte {
			return e.resign(t, record.KindOutbox, e.e2, tamperForeign(t).Signer(), ownerIdentity(t).DID())
		}},
		{name: "resigned-by-foreign-key-naming-foreigner", data: func(t *testing.T, e *tamperEnv) []byte {
			f := tamperForeign(t)
			return e.resign(t, record.KindOutbox, e.e2, f.Signer(), f.DID())
		}},
		{name: "truncated-to-half", data: func(t *testing.T, e *tamperEnv) []byte {
			b := e.bytes(record.KindOutbox, e.e2)
			return b[:len(b)/2]
		}},
		{name: "empty", data: func(t *testing.T, e *tamperEnv) []byte { return []byte{} }},
		{name: "oversize-but-valid", data: func(t *testing.T, e *tamperEnv) []byte {
			return e.bigOutbox(t, e.e2)
		}},
		{name: "payload-id-differs-from-file-id", data: func(t *testing.T, e *tamperEnv) []byte {
			// e1's payload, properly signed by the owner as outbox/e2
			return ownerKey(t, e, e.payloadOf(t, record.KindOutbox, e.e1))
		}},
		{name: "payload-unknown-field", data: func(t *testing.T, e *tamperEnv) []byte {
			p := e.payloadOf(t, record.KindOutbox, e.e2)
			return ownerKey(t, e, p[:len(p)-1]+`,"note":"x"}`)
		}},
		{name: "payload-duplicate-key", data: func(t *testing.T, e *tamperEnv) []byte {
			p := e.payloadOf(t, record.KindOutbox, e.e2)
			return ownerKey(t, e, `{"state":"pending",`+p[1:])
		}},
		{name: "payload-case-variant-key", data: func(t *testing.T, e *tamperEnv) []byte {
			p := e.payloadOf(t, record.KindOutbox, e.e2)
			return ownerKey(t, e, tamperReplacePrefix(t, p, `{"envelopeId":`, `{"EnvelopeId":`))
		}},
		{name: "header-v2", data: func(t *testing.T, e *tamperEnv) []byte {
			return header(t, e, with("v", "2")...)
		}},
		{name: "header-v0", data: func(t *testing.T, e *tamperEnv) []byte {
			return header(t, e, with("v", "0")...)
		}},
		{name: "header-without-v", data: func(t *testing.T, e *tamperEnv) []byte {
			return header(t, e, canonical[2:]...)
		}},
		{name: "header-extra-key", data: func(t *testing.T, e *tamperEnv) []byte {
			return header(t, e, append(append([]string(nil), canonical...), "note", `"x"`)...)
		}},
		{name: "header-duplicate-key", data: func(t *testing.T, e *tamperEnv) []byte {
			return header(t, e, append(append([]string(nil), canonical...), "kind", "")...)
		}},
		{name: "header-case-variant-key", data: func(t *testing.T, e *tamperEnv) []byte {
			m := append([]string(nil), canonical...)
			m[2] = "Kind"
			m[3] = tamperQuote("outbox")
			return header(t, e, m...)
		}},
		{name: "two-lines-newline-inside", data: func(t *testing.T, e *tamperEnv) []byte {
			b := string(e.bytes(record.KindOutbox, e.e2))
			return []byte(tamperReplaceOnce(t, b, `,"payload":`, ",\n"+`"payload":`))
		}},
		{name: "two-lines-record-twice", data: func(t *testing.T, e *tamperEnv) []byte {
			b := e.bytes(record.KindOutbox, e.e2)
			return append(append([]byte(nil), b...), b...)
		}},
		{name: "missing-trailing-newline", data: func(t *testing.T, e *tamperEnv) []byte {
			b := e.bytes(record.KindOutbox, e.e2)
			return b[:len(b)-1]
		}},
		{name: "sig-with-padding", data: func(t *testing.T, e *tamperEnv) []byte {
			sig, err := base64.RawURLEncoding.DecodeString(e.sigOf(t))
			if err != nil {
				t.Fatal(err)
			}
			padded := base64.URLEncoding.EncodeToString(sig)
			if !strings.HasSuffix(padded, "=") {
				t.Fatal("a 64-byte signature pads")
			}
			return header(t, e, with("sig", tamperQuote(padded))...)
		}},
		{name: "sig-non-canonical-trailing-bits", data: func(t *testing.T, e *tamperEnv) []byte {
			return header(t, e, with("sig", tamperQuote(tamperNonCanonicalSig(t, e.sigOf(t))))...)
		}},
		{name: "sig-standard-alphabet", data: func(t *testing.T, e *tamperEnv) []byte {
			sig, _ := base64.RawURLEncoding.DecodeString(e.sigOf(t))
			std := base64.RawStdEncoding.EncodeToString(sig)
			if std == e.sigOf(t) {
				t.Skip("this signature has no '-' or '_'")
			}
			return header(t, e, with("sig", tamperQuote(std))...)
		}},
	}
}

// tamperNonCanonicalSig returns sig (unpadded base64url of 64 bytes) with the unused
// low bits of its last character set: lenient decoding gives the same bytes.
func tamperNonCanonicalSig(t testing.TB, sig string) string {
	t.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, sig[len(sig)-1])
	if last < 0 || last&0x0f != 0 {
		t.Fatalf("signature %q does not end in a canonical character", sig)
	}
	out := sig[:len(sig)-1] + string(alphabet[last|0x01])
	a, err1 := base64.RawURLEncoding.DecodeString(sig)
	b, err2 := base64.RawURLEncoding.DecodeString(out)
	if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
		t.Fatalf("non-canonical form does not decode leniently to the same bytes: %v %v", err1, err2)
	}
	return out
}

// TestTamperedContentRefused: each content tampering of docs/FORMAT.md §4 is refused on read,
// by a fresh store without cache and by a warm store that had cached the valid record
// (the file then replaced by rename, or rewritten in place on the same inode).
func TestTamperedContentRefused(t *testing.T) {
	for _, tc := range tamperContentCases() {
		for _, mode := range []string{"cold", "warm-rename", "warm-inplace"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				e := tamperSetup(t)
				k := tc.kind
				if k == "" {
					k = record.KindOutbox
				}
				id := e.e2
				data := tc.data(t, e)
				if bytes.Equal(data, e.bytes(k, id)) {
					t.Fatal("the tampered bytes equal the original")
				}
				path := e.path(k, id)
				var s *store.Store
				if mode == "cold" {
					tamperWriteRename(t, path, data)
					s = e.open(t, true)
				} else {
					opts := store.Options{Dir: e.dir, Limits: e.limits}
					if mode == "warm-rename" {
						// A clock an hour ahead: the cache entry is never racy, so only
						// the fingerprint (a new inode here) can reveal the change.
						opts.Now = func() time.Time { return time.Now().Add(time.Hour) }
					}
					s = openStore(t, opts)
					tamperExpectValid(t, s, k, id) // now cached
					if mode == "warm-rename" {
						tamperWriteRename(t, path, data)
					} else {
						tamperWriteInPlace(t, path, data)
					}
				}
				tamperExpectInvalid(t, s, k, id)
				tamperExpectInvalid(t, s, k, id) // a refusal is never cached as valid
				tamperExpectInvalid(t, e.open(t, true), k, id)

				// control: the original bytes read as valid again, also from this store
				tamperWriteRename(t, path, e.bytes(k, id))
				tamperExpectValid(t, s, k, id)
				tamperExpectValid(t, e.open(t, true), k, id)
			})
		}
	}
}

// tamperFileCase changes what the target path is, not (only) its bytes.
type tamperFileCase struct {
	name    string
	mutate  func(t *testing.T, e *tamperEnv, path string)
	also    func(t *testing.T, e *tamperEnv) // further checks while mutated
	restore func(t *testing.T, e *tamperEnv, path string)
	// refusedAtOpen: while mutated, Open itself refuses the store (a kind
	// directory that breaks the data-root rules); a store opened before still
	// refuses the record on read.
	refusedAtOpen bool
}

func tamperFileCases() []tamperFileCase {
	var (
		outside string // symlink target / moved file / second store
	)
	return []tamperFileCase{
		{
			name: "symlink-to-valid-record-outside-store",
			mutate: func(t *testing.T, e *tamperEnv, path string) {
				outside = filepath.Join(t.TempDir(), filepath.Base(path))
				if err := os.Rename(path, outside); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(outside, path); err != nil {
					t.Fatal(err)
				}
			},
			restore: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(outside, path); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "relative-symlink-to-valid-record-inside-store",
			mutate: func(t *testing.T, e *tamperEnv, path string) {
				outside = filepath.Join(e.dir, "kept.json")
				if err := os.Rename(path, outside); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("../kept.json", path); err != nil {
					t.Fatal(err)
				}
			},
			restore: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(outside, path); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "kind-directory-is-a-symlink",
			mutate: func(t *testing.T, e *tamperEnv, path string) {
				dir := filepath.Dir(path)
				if err := os.Rename(dir, dir+".real"); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Base(dir)+".real", dir); err != nil {
					t.Fatal(err)
				}
			},
			restore: func(t *testing.T, e *tamperEnv, path string) {
				dir := filepath.Dir(path)
				if err := os.Remove(dir); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(dir+".real", dir); err != nil {
					t.Fatal(err)
				}
			},
			refusedAtOpen: true,
		},
		{
			// Both names of a hard-linked record are refused (nlink 2), even though
			// the bytes are valid for both: the second name is the same id in
			// another store of the same owner, and a planted name in this store.
			name: "hard-link",
			mutate: func(t *testing.T, e *tamperEnv, path string) {
				outside = filepath.Join(filepath.Dir(e.dir), "second-"+uuid.NewString())
				if err := os.MkdirAll(filepath.Join(outside, "outbox"), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Link(path, filepath.Join(outside, "outbox", e.e2+".json")); err != nil {
					t.Fatal(err)
				}
			},
			also: func(t *testing.T, e *tamperEnv) {
				second := openStore(t, store.Options{Dir: outside, CacheEntries: -1, Limits: e.limits})
				tamperExpectInvalid(t, second, record.KindOutbox, e.e2)
				// a third name planted in this store under another id
				planted := uuid.NewString()
				if err := os.Link(e.path(record.KindOutbox, e.e2), e.path(record.KindOutbox, planted)); err != nil {
					t.Fatal(err)
				}
				tamperExpectInvalid(t, e.open(t, true), record.KindOutbox, planted)
				if err := os.Remove(e.path(record.KindOutbox, planted)); err != nil {
					t.Fatal(err)
				}
				tamperExpectInvalid(t, second, record.KindOutbox, e.e2) // still two links
			},
			restore: func(t *testing.T, e *tamperEnv, path string) {
				// the second store's name alone is valid once it has one link
				link := filepath.Join(outside, "outbox", e.e2+".json")
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				second := openStore(t, store.Options{Dir: outside, CacheEntries: -1, Limits: e.limits})
				tamperExpectValid(t, second, record.KindOutbox, e.e2)
				if err := os.Rename(link, path); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "fifo",
			mutate: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if err := unix.Mkfifo(path, 0o600); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					// If a reader is (wrongly) blocked in open(2), a writer unblocks it.
					if fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
						unix.Close(fd)
					}
				})
			},
			restore: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				tamperWriteRename(t, path, e.bytes(record.KindOutbox, e.e2))
			},
		},
		{
			name: "mode-0644",
			mutate: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Chmod(path, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			restore: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Chmod(path, 0o600); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "mode-0620",
			mutate: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Chmod(path, 0o620); err != nil {
					t.Fatal(err)
				}
			},
			restore: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Chmod(path, 0o600); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "foreign-owner",
			mutate: func(t *testing.T, e *tamperEnv, path string) {
				if os.Geteuid() != 0 {
					t.Skip("chown to another user needs root")
				}
				if err := os.Lchown(path, 4242, 4242); err != nil {
					t.Fatal(err)
				}
			},
			restore: func(t *testing.T, e *tamperEnv, path string) {
				if err := os.Lchown(path, os.Geteuid(), os.Getegid()); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
}

// TestTamperedFileRefused: a record path that is a symlink (or under one), a hard
// link, a FIFO, loosely permissioned or foreign-owned is refused on read, cold and
// warm, without blocking; undoing the change makes the record valid again.
func TestTamperedFileRefused(t *testing.T) {
	for i, tc := range tamperFileCases() {
		for _, mode := range []string{"cold", "warm"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				tc := tamperFileCases()[i] // fresh closure state per run
				e := tamperSetup(t)
				path := e.path(record.KindOutbox, e.e2)
				var s *store.Store
				if mode == "cold" {
					tc.mutate(t, e, path)
					if tc.refusedAtOpen {
						tamperExpectOpenRefused(t, e, filepath.Dir(path))
					} else {
						s = e.open(t, true)
					}
				} else {
					s = e.open(t, false)
					tamperExpectValid(t, s, record.KindOutbox, e.e2)
					tc.mutate(t, e, path)
				}
				if s != nil {
					tamperExpectInvalid(t, s, record.KindOutbox, e.e2)
					tamperExpectInvalid(t, s, record.KindOutbox, e.e2)
				}
				if tc.refusedAtOpen {
					tamperExpectOpenRefused(t, e, filepath.Dir(path))
				} else {
					tamperExpectInvalid(t, e.open(t, true), record.KindOutbox, e.e2)
				}
				if tc.also != nil {
					tc.also(t, e)
				}
				tc.restore(t, e, path)
				if s != nil {
					tamperExpectValid(t, s, record.KindOutbox, e.e2)
				}
				tamperExpectValid(t, e.open(t, true), record.KindOutbox, e.e2)
			})
		}
	}
}

// tamperCountingFS counts the bytes read through every file it opens.
type tamperCountingFS struct {
	fsx.FS
	read *atomic.Int64
}

func (c tamperCountingFS) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return tamperCountingFile{File: f, read: c.read}, nil
}

type tamperCountingFile struct {
	fsx.File
	read *atomic.Int64
}

func (f tamperCountingFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.read.Add(int64(n))
	return n, err
}

// TestOversizeRecordRefusedWithoutReadingIt: a valid owner-signed record larger than
// its kind's limit (RecordBytes; OperationBytes for operations) is refused, and the
// store reads at most the limit of its bytes (docs/FORMAT.md §4: "a larger file is refused
// without being read"). With a larger limit the same file is valid.
func TestOversizeRecordRefusedWithoutReadingIt(t *testing.T) {
	e := tamperSetup(t)
	big := e.bigOutbox(t, e.e2)
	// make it much larger still: a 1 MiB envelope
	o := e.outbox(t, e.e2)
	o.Envelope = json.RawMessage(`{"pad":"` + strings.Repeat("y", 1<<20) + `"}`)
	o.EnvelopeDigest = envelope.Digest(o.Envelope)
	own := ownerIdentity(t)
	huge, err := record.Encode(own.Signer(), own.DID(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range [][]byte{big, huge} {
		tamperWriteRename(t, e.path(record.KindOutbox, e.e2), data)
		var read atomic.Int64
		s := openStore(t, store.Options{Dir: e.dir, Limits: e.limits, CacheEntries: -1,
			WrapFS: func(f fsx.FS) fsx.FS { return tamperCountingFS{FS: f, read: &read} }})
		tamperExpectInvalid(t, s, record.KindOutbox, e.e2)
		if n := read.Load(); n > tamperRecordLimit {
			t.Errorf("refusing a %d-byte file read %d bytes; want at most the %d-byte limit", len(data), n, tamperRecordLimit)
		}
		// control: the same file under a larger limit is a valid record
		roomy := openStore(t, store.Options{Dir: e.dir, Limits: store.Limits{RecordBytes: 4 << 20}, CacheEntries: -1})
		tamperExpectValid(t, roomy, record.KindOutbox, e.e2)
	}

	// Operations have their own, smaller limit.
	now := time.Now().UnixMilli()
	op := &record.Operation{OperationID: uuid.NewString(), RequestDigest: envelope.Digest([]byte("req")),
		State: record.OperationDone, CreatedAt: now, LeaseUntil: now + 120_000,
		Response: json.RawMessage(`{"body":"` + strings.Repeat("z", 6<<10) + `"}`), RetainUntil: now + 86_400_000}
	lim := store.Limits{RecordBytes: 64 << 10, OperationBytes: 4 << 10}
	ws := openStore(t, store.Options{Dir: e.dir, Limits: store.Limits{RecordBytes: 64 << 10, OperationBytes: 64 << 10}})
	if err := ws.Transaction(context.Background(), func(tx *store.Tx) error { return tx.Put(op) }); err != nil {
		t.Fatal(err)
	}
	var read atomic.Int64
	s := openStore(t, store.Options{Dir: e.dir, Limits: lim, CacheEntries: -1,
		WrapFS: func(f fsx.FS) fsx.FS { return tamperCountingFS{FS: f, read: &read} }})
	tamperExpectInvalid(t, s, record.KindOperations, op.OperationID)
	if n := read.Load(); n > lim.OperationBytes {
		t.Errorf("refusing an oversize operation read %d bytes; want at most %d", n, lim.OperationBytes)
	}
	// an outbox record of the same size is within RecordBytes
	tamperWriteRename(t, e.path(record.KindOutbox, e.e2), big)
	tamperExpectValid(t, s, record.KindOutbox, e.e2)
}

// TestParseRecordRefusesEverySingleByteChange: XOR-ing any one byte of a valid outbox
// record file with 0x01 or 0x80, or cutting it to any shorter length, makes
// record.Parse refuse it.
func TestParseRecordRefusesEverySingleByteChange(t *testing.T) {
	e := tamperSetup(t)
	// the enqueued record, and one with every optional field set
	full := tamperRecords(t)[0].(*record.Outbox)
	own := ownerIdentity(t)
	fullData, err := record.Encode(own.Signer(), own.DID(), full)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range []struct {
		id   string
		data []byte
	}{{e.e2, e.bytes(record.KindOutbox, e.e2)}, {full.EnvelopeID, fullData}} {
		orig := rc.data
		tamperMustParse(t, record.KindOutbox, rc.id, orig)
		buf := make([]byte, len(orig))
		for i := range orig {
			for _, x := range []byte{0x01, 0x80} {
				copy(buf, orig)
				buf[i] ^= x
				if r, err := tamperParse(t, record.KindOutbox, rc.id, buf); err == nil || r != nil {
					t.Errorf("byte %d (%q) ^ %#x accepted: %q", i, orig[i], x, buf)
				}
			}
		}
		for n := 0; n < len(orig); n++ {
			if r, err := tamperParse(t, record.KindOutbox, rc.id, orig[:n]); err == nil || r != nil {
				t.Errorf("prefix of %d/%d bytes accepted", n, len(orig))
			}
		}
	}
}

// TestGetRefusesSingleByteChanges: the same through the file system for a sample of
// positions (every 37th byte, and every 37th truncation), read by a fresh store with
// no cache and by one warm store that re-caches the valid record before each change
// (the change is an in-place rewrite of the same size on the same inode).
func TestGetRefusesSingleByteChanges(t *testing.T) {
	e := tamperSetup(t)
	path := e.path(record.KindOutbox, e.e2)
	orig := e.bytes(record.KindOutbox, e.e2)
	warm := e.open(t, false)
	try := func(what string, data []byte) {
		t.Helper()
		tamperWriteInPlace(t, path, orig)
		tamperExpectValid(t, warm, record.KindOutbox, e.e2)
		tamperWriteInPlace(t, path, data)
		cold := e.open(t, true)
		if r, err := cold.Get(record.KindOutbox, e.e2); !errors.Is(err, errcode.OutboxStoreInvalid) || r != nil {
			t.Errorf("%s: cold Get = %v, %v; want OUTBOX_STORE_INVALID", what, r, err)
		}
		if r, err := warm.Get(record.KindOutbox, e.e2); !errors.Is(err, errcode.OutboxStoreInvalid) || r != nil {
			t.Errorf("%s: warm Get = %v, %v; want OUTBOX_STORE_INVALID", what, r, err)
		}
	}
	for i := 0; i < len(orig); i += 37 {
		for _, x := range []byte{0x01, 0x80} {
			buf := bytes.Clone(orig)
			buf[i] ^= x
			try(fmt.Sprintf("byte %d ^ %#x", i, x), buf)
		}
	}
	for n := 0; n < len(orig); n += 37 {
		try(fmt.Sprintf("prefix of %d bytes", n), orig[:n])
	}
	tamperWriteInPlace(t, path, orig)
	tamperExpectValid(t, warm, record.KindOutbox, e.e2)
}

// tamperFrozenFS reports every regular file's mtime and ctime as at, as a file system
// with coarse timestamps would for changes within one tick.
type tamperFrozenFS struct {
	fsx.FS
	at int64
}

func (f tamperFrozenFS) freeze(info fsx.Info) fsx.Info {
	if info.IsRegular() {
		info.MtimeNs, info.CtimeNs = f.at, f.at
	}
	return info
}

func (f tamperFrozenFS) Lstat(name string) (fsx.Info, error) {
	info, err := f.FS.Lstat(name)
	return f.freeze(info), err
}

func (f tamperFrozenFS) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return tamperFrozenFile{File: file, fs: f}, nil
}

type tamperFrozenFile struct {
	fsx.File
	fs tamperFrozenFS
}

func (f tamperFrozenFile) Stat() (fsx.Info, error) {
	info, err := f.File.Stat()
	return f.fs.freeze(info), err
}

// TestTamperedInPlaceWithinOneTickRefused: a cached record whose file is rewritten in
// place with tampered bytes of the same size, within one timestamp tick (same inode,
// size, mtime and ctime: the fingerprint cannot tell), is refused — the cache entry
// was racy, so its next hit compares the bytes (DESIGN §8).
func TestTamperedInPlaceWithinOneTickRefused(t *testing.T) {
	e := tamperSetup(t)
	tick := time.Now().UnixNano()
	s := openStore(t, store.Options{Dir: e.dir, Limits: e.limits,
		Now:    func() time.Time { return time.Unix(0, tick).Add(time.Millisecond) },
		WrapFS: func(inner fsx.FS) fsx.FS { return tamperFrozenFS{FS: inner, at: tick} }})
	path := e.path(record.KindOutbox, e.e2)
	orig := e.bytes(record.KindOutbox, e.e2)
	for _, i := range []int{0, len(orig) / 3, len(orig) / 2, len(orig) - 2} {
		tamperWriteInPlace(t, path, orig)
		tamperExpectValid(t, s, record.KindOutbox, e.e2) // cached (racy)
		bad := bytes.Clone(orig)
		bad[i] ^= 0x01
		tamperWriteInPlace(t, path, bad)
		tamperExpectInvalid(t, s, record.KindOutbox, e.e2)
	}
	tamperWriteInPlace(t, path, orig)
	tamperExpectValid(t, s, record.KindOutbox, e.e2)
}

// tamperSwapFS runs swap once, right after the first Lstat of target: the file is
// changed between the reader's lstat and its open (a race the reader must survive).
type tamperSwapFS struct {
	fsx.FS
	target string
	swap   func()
	done   *atomic.Bool
}

func (f tamperSwapFS) Lstat(name string) (fsx.Info, error) {
	info, err := f.FS.Lstat(name)
	if name == f.target && f.done.CompareAndSwap(false, true) {
		f.swap()
	}
	return info, err
}

// TestTamperedBetweenLstatAndOpenRefused: the checks after open (fstat: type, links,
// mode, size; O_NOFOLLOW; O_NONBLOCK) hold even when the path passed the lstat checks
// and is then replaced by a FIFO, a symlink, a hard-linked or loosened file, or an
// oversize file. A FIFO must not block the reader.
func TestTamperedBetweenLstatAndOpenRefused(t *testing.T) {
	// Each case prepares in the test goroutine and returns the swap itself, which
	// runs inside the reader's Lstat and only reports an error.
	cases := map[string]func(t *testing.T, e *tamperEnv, path string) func() error{
		"fifo": func(t *testing.T, e *tamperEnv, path string) func() error {
			tmp := filepath.Join(e.dir, "fifo")
			if err := unix.Mkfifo(tmp, 0o600); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// if a reader is (wrongly) blocked opening the FIFO, release it
				if fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
					unix.Close(fd)
				}
			})
			return func() error { return os.Rename(tmp, path) }
		},
		"symlink": func(t *testing.T, e *tamperEnv, path string) func() error {
			return func() error {
				kept := filepath.Join(e.dir, "kept.json")
				if err := os.Rename(path, kept); err != nil {
					return err
				}
				return os.Symlink("../kept.json", path)
			}
		},
		"hard-link": func(t *testing.T, e *tamperEnv, path string) func() error {
			return func() error { return os.Link(path, filepath.Join(e.dir, "second.json")) }
		},
		"mode-0644": func(t *testing.T, e *tamperEnv, path string) func() error {
			return func() error { return os.Chmod(path, 0o644) }
		},
		"oversize": func(t *testing.T, e *tamperEnv, path string) func() error {
			tmp := filepath.Join(e.dir, "big.json")
			if err := os.WriteFile(tmp, e.bigOutbox(t, e.e2), 0o600); err != nil {
				t.Fatal(err)
			}
			return func() error { return os.Rename(tmp, path) }
		},
	}
	for name, prepare := range cases {
		t.Run(name, func(t *testing.T) {
			e := tamperSetup(t)
			path := e.path(record.KindOutbox, e.e2)
			swap := prepare(t, e, path)
			var (
				done    atomic.Bool
				swapErr error
			)
			s := openStore(t, store.Options{Dir: e.dir, Limits: e.limits, CacheEntries: -1,
				WrapFS: func(inner fsx.FS) fsx.FS {
					return tamperSwapFS{FS: inner, target: "outbox/" + e.e2 + ".json", done: &done,
						swap: func() { swapErr = swap() }}
				}})
			var r record.Record
			err := tamperWithin(t, "Get", func() (err error) {
				r, err = s.Get(record.KindOutbox, e.e2)
				return err
			})
			if !done.Load() || swapErr != nil {
				t.Fatalf("precondition: the swap did not run: %v", swapErr)
			}
			if !errors.Is(err, errcode.OutboxStoreInvalid) || r != nil {
				t.Fatalf("Get = %v, %v; want OUTBOX_STORE_INVALID", r, err)
			}
		})
	}
}
