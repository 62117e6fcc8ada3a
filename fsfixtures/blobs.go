package fsfixtures

import (
	"bytes"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Sealed blobs are random by design (age's file key, HPKE's ephemeral key, a fresh
// envelope id), so the blob fixtures read theirs from testdata/blobs, made once by
// WriteBlobTestdata (go test ./fsfixtures -run TestBlobTestdata -update-blobs):
// each is "<name>.envelope" (the signed wire envelope naming the blob's digest and
// size) and "<name>.sealed" (the sealed bytes), checked by that test with
// envelope.VerifyBlob.
const (
	// BlobOut is a message from the owner to the peer with a blob body.
	BlobOut = "out"
	// BlobIn is a message from the peer to the owner with a blob body.
	BlobIn = "in"
	// BlobOutSettled is another message from the owner to the peer; only its
	// envelope is kept (its fixture's blob is missing).
	BlobOutSettled = "out-settled"
)

// BlobPlainSize is the plaintext length of the testdata blobs: just over
// envelope.MaxBodySize, as the smallest body sent as a blob (two chunks).
const BlobPlainSize = envelope.MaxBodySize + 1

// BlobTestdata describes one testdata blob: its sender and recipient, its message's
// label (ID(label) is its message id) and whether its sealed bytes are kept.
type BlobTestdata struct {
	Name              string
	Sender, Recipient *identity.Identity
	Label             string
	Sealed            bool
}

// BlobsTestdata lists the testdata blobs.
func BlobsTestdata() []BlobTestdata {
	return []BlobTestdata{
		{BlobOut, Owner(), Peer(), "msg-blob", true},
		{BlobIn, Peer(), Owner(), "in-blob/message", true},
		{BlobOutSettled, Owner(), Peer(), "msg-blob-settled", false},
	}
}

// Peer returns the remote party of the fixtures' messages (PeerDID's identity).
func Peer() *identity.Identity { return mustIdentity(peerSeed) }

// BlobPlain is the plaintext of the testdata blobs.
func BlobPlain() []byte {
	b := make([]byte, BlobPlainSize)
	for i := range b {
		b[i] = byte(i*31 + i>>9)
	}
	return b
}

// blobTestdataPath is testdata/blobs/<name><ext>.
func blobTestdataPath(name, ext string) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("fsfixtures: cannot locate the package directory")
	}
	return filepath.Join(filepath.Dir(file), "testdata", "blobs", name+ext)
}

// WriteBlobTestdata seals the testdata blobs anew (for -update-blobs).
func WriteBlobTestdata(t testing.TB) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(blobTestdataPath("x", "")), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range BlobsTestdata() {
		var sealed bytes.Buffer
		w, err := envelope.NewBlobMessage(d.Sender, d.Recipient.DID(), ID(d.Label), Far, T0, &sealed)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(BlobPlain()); err != nil {
			t.Fatal(err)
		}
		_, wire, err := w.Finish()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(blobTestdataPath(d.Name, ".envelope"), wire, 0o644); err != nil {
			t.Fatal(err)
		}
		if d.Sealed {
			if err := os.WriteFile(blobTestdataPath(d.Name, ".sealed"), sealed.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// ReadBlobTestdata returns testdata blob name's envelope, its blob reference and its
// sealed bytes (nil if not kept).
func ReadBlobTestdata(t testing.TB, name string) (*envelope.Envelope, envelope.BlobRef, []byte) {
	t.Helper()
	wire, err := os.ReadFile(blobTestdataPath(name, ".envelope"))
	if err != nil {
		t.Fatalf("fsfixtures: %v (run go test ./fsfixtures -run TestBlobTestdata -update-blobs)", err)
	}
	env, err := envelope.Parse(wire)
	if err != nil {
		t.Fatalf("fsfixtures: testdata blob %s: %v", name, err)
	}
	ref, ok := env.Blob()
	if !ok {
		t.Fatalf("fsfixtures: testdata blob %s: not a blob body", name)
	}
	sealed, err := os.ReadFile(blobTestdataPath(name, ".sealed"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return env, ref, sealed
}

// BlobPath returns the path of a blob, relative to the store directory.
func BlobPath(digest string) string { return path.Join("blobs", digest) }

// writeBlob commits sealed as blobs/<digest> through the store, as a send does
// (store.CreateBlob, Write, Commit).
func (b *builder) writeBlob(digest string, sealed []byte) {
	b.t.Helper()
	w, err := b.s.CreateBlob()
	if err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	if _, err := w.Write(sealed); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	if d, n, err := w.Commit(); err != nil || d != digest || n != int64(len(sealed)) {
		b.t.Fatalf("fsfixtures: commit blob: %s %d %v, want %s", d, n, err, digest)
	}
}

// receiveBlobBytes writes sealed as the partial download of envelopeID through the
// store (store.PartialBlob, Write, Persist) and, if commit, commits it under digest as
// the daemon does once the download is whole.
func (b *builder) receiveBlobBytes(envelopeID, digest string, sealed []byte, commit bool) {
	b.t.Helper()
	p, err := b.s.PartialBlob(envelopeID)
	if err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	if _, err := p.Write(sealed); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	if err := p.Persist(); err != nil {
		b.t.Fatalf("fsfixtures: %v", err)
	}
	if !commit {
		if err := p.Close(); err != nil {
			b.t.Fatalf("fsfixtures: %v", err)
		}
		return
	}
	if err := p.Commit(digest, int64(len(sealed))); err != nil {
		b.t.Fatalf("fsfixtures: commit partial blob: %v", err)
	}
}

// truncateBlob cuts blob digest to half its length.
func (b *builder) truncateBlob(digest string) {
	b.t.Helper()
	data := b.read(BlobPath(digest))
	b.write(BlobPath(digest), data[:len(data)/2], 0o600)
}

// flipBlobByte flips the lowest bit of a byte in the middle of blob digest.
func (b *builder) flipBlobByte(digest string) {
	b.t.Helper()
	data := b.read(BlobPath(digest))
	data[len(data)/2] ^= 0x01
	b.write(BlobPath(digest), data, 0o600)
}

// sendBlob writes testdata blob name and then a committed one-envelope message whose
// envelope names it (member, message record, marker), as a send of a large body does:
// the blob durable before any record that names it. The outbox record is in state.
func (b *builder) sendBlob(name, state string) (*record.Outbox, string) {
	b.t.Helper()
	env, ref, sealed := ReadBlobTestdata(b.t, name)
	if sealed != nil {
		b.writeBlob(ref.Digest, sealed)
	}
	label := ""
	for _, d := range BlobsTestdata() {
		if d.Name == name {
			label = d.Label
		}
	}
	retain := Far.Add(week)
	members, msg, batch := message(label, 1, Far, retain)
	o := members[0]
	wire := env.Bytes()
	o.EnvelopeID, o.Envelope, o.EnvelopeDigest = env.ID(), wire, env.Digest()
	msg.EnvelopeDigest = env.Digest()
	batch.EnvelopeIDs = []string{env.ID()}
	b.tx(func(tx *store.Tx) error {
		if err := tx.PutAll(msg, o); err != nil {
			return err
		}
		return tx.Put(batch)
	})
	if state != record.StatePending {
		o.State, o.Attempts = state, 1
		msg.Status, msg.Attempts = record.StatusRelayed, 1
		b.plant(o, msg)
	}
	return o, ref.Digest
}

// receiveBlob downloads testdata blob BlobIn into the store (a partial blob, then
// committed) and then writes the receipt (processed) and the observation naming it,
// as the daemon stores a received large body.
func (b *builder) receiveBlob() string {
	b.t.Helper()
	env, ref, sealed := ReadBlobTestdata(b.t, BlobIn)
	b.receiveBlobBytes(env.ID(), ref.Digest, sealed, true)
	r, o := inboundRecords("in-blob", record.ReceiptProcessed, Far.Add(week))
	r.EnvelopeID, r.EnvelopeDigest = env.ID(), env.Digest()
	o.MessageID, o.EnvelopeDigest = env.MessageID(), env.Digest()
	o.Blob = &record.ObservedBlob{EnvelopeID: env.ID(), Digest: ref.Digest, Size: ref.Size, BodySize: BlobPlainSize}
	b.tx(func(tx *store.Tx) error { return tx.PutAll(r, o) })
	return ref.Digest
}

// blobPartials leaves what interrupted transfers leave in blobs/: a partial download
// (the first chunk of BlobIn's sealed bytes, through store.PartialBlob) and a staged
// blob (the first half of BlobOut's, a send killed while it wrote the body; written
// directly, since the store names its temps at random).
func (b *builder) blobPartials() {
	b.t.Helper()
	_, _, out := ReadBlobTestdata(b.t, BlobOut)
	in, ref, inSealed := ReadBlobTestdata(b.t, BlobIn)
	b.receiveBlobBytes(in.ID(), ref.Digest, inSealed[:envelope.BlobChunkSize], false)
	b.write(path.Join("blobs", "."+ID("blob-staged")+".tmp"), out[:len(out)/2], 0o600)
}

// BlobOutDigest returns the digest of testdata blob BlobOut.
func BlobOutDigest(t testing.TB) string {
	_, ref, _ := ReadBlobTestdata(t, BlobOut)
	return ref.Digest
}

// blobLayout breaks the layout rules in blobs/: a blob with group and other read
// access, a symbolic link named like a blob (to BlobOut's bytes outside the store:
// followed, it would pass), and a name that is not part of the layout.
func (b *builder) blobLayout() {
	b.t.Helper()
	d := b.receiveBlob()
	b.chmod(BlobPath(d), 0o644)
	_, ref, sealed := ReadBlobTestdata(b.t, BlobOut)
	outside := filepath.Join(b.root, "outside", "blob")
	if err := os.MkdirAll(filepath.Dir(outside), 0o700); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(outside, sealed, 0o600); err != nil {
		b.t.Fatal(err)
	}
	if err := os.Symlink(outside, b.path(BlobPath(ref.Digest))); err != nil {
		b.t.Fatal(err)
	}
	b.write(path.Join("blobs", "README"), []byte("planted\n"), 0o600)
}
