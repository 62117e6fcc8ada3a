package envelope

import (
	"crypto/hpke"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"filippo.io/age"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// MaxBlobSize is the largest sealed blob the format allows (1 TiB). The limits
// in force are lower and belong to the daemon and the relay (--max-body).
const MaxBlobSize int64 = 1 << 40

// BlobChunkSize is the plaintext size of every chunk of a sealed blob but the
// last: age's STREAM chunk of 64 KiB, each sealed with a 16-byte tag.
const BlobChunkSize = 64 << 10

// ErrBlob: a sealed blob does not match its reference (another length or
// SHA-256 than its envelope names), its header is not the one stanza this
// format allows, or a chunk does not verify — altered, reordered, duplicated,
// or the stream truncated or extended.
var ErrBlob = errors.New("envelope: sealed blob does not verify")

// blobStanzaType is the type of the one age recipient stanza of a sealed blob.
const blobStanzaType = "sealbridge-hpke"

// blobKeyDomain starts the HPKE info of a blob's wrapped file key (see
// blobKeyInfo).
const blobKeyDomain = "sealbridge/blob-key/v1"

// fileKeySize is age's file key length; the stanza body is it sealed, plus
// the tag.
const fileKeySize = 16

// BlobRef names a sealed blob and the envelope it was sealed for. The
// envelope's signature covers Digest and Size; the other fields bind the
// wrapped file key (see NewBlobMessage).
type BlobRef struct {
	EnvelopeID string
	MessageID  string
	Sender     identity.DID
	Recipient  identity.DID
	Digest     string // lower-case hex SHA-256 of the sealed bytes
	Size       int64  // the sealed length in bytes
}

// Blob returns the reference of e's sealed blob; ok is false for a message
// with an inline body and for a delivery-status.
func (e *Envelope) Blob() (ref BlobRef, ok bool) {
	if e.p.Kind != KindMessage || e.p.Body == nil || e.p.Body.Blob == "" {
		return BlobRef{}, false
	}
	return BlobRef{EnvelopeID: e.p.EnvelopeID, MessageID: e.p.MessageID, Sender: e.p.SenderDID,
		Recipient: e.p.RecipientDID, Digest: e.p.Body.Blob, Size: e.p.Body.Size}, true
}

// blobKeyInfo is the HPKE info of the file key of the blob ref names:
//
//	"sealbridge/blob-key/v1" 0x00 envelopeId 0x00 messageId 0x00 senderDid 0x00 recipientDid
//
// so a wrapped key opens only for the envelope, message, sender and
// recipient it was sealed for, as a small body's info does (bodyInfo).
func blobKeyInfo(envelopeID, messageID string, sender, recipient identity.DID) []byte {
	info := make([]byte, 0, len(blobKeyDomain)+4+2*36+len(sender)+len(recipient))
	info = append(info, blobKeyDomain...)
	for _, f := range []string{envelopeID, messageID, string(sender), string(recipient)} {
		info = append(info, 0)
		info = append(info, f...)
	}
	return info
}

var stanzaB64 = base64.RawStdEncoding

// blobRecipient wraps age's file key to one recipient with HPKE.
type blobRecipient struct {
	pub  []byte // X25519 public key
	info []byte
}

// WrapWithLabels makes the blob's one stanza, and a label that no other
// recipient type carries, so age refuses to add any other recipient to it.
func (r blobRecipient) WrapWithLabels(fileKey []byte) ([]*age.Stanza, []string, error) {
	pk, err := kem.NewPublicKey(r.pub)
	if err != nil {
		return nil, nil, err
	}
	enc, sender, err := hpke.NewSender(pk, kdf, aead, r.info)
	if err != nil {
		return nil, nil, err
	}
	ct, err := sender.Seal(nil, fileKey)
	if err != nil {
		return nil, nil, err
	}
	return []*age.Stanza{{Type: blobStanzaType, Args: []string{stanzaB64.EncodeToString(enc)}, Body: ct}},
		[]string{blobStanzaType}, nil
}

// Wrap is WrapWithLabels without the label.
func (r blobRecipient) Wrap(fileKey []byte) ([]*age.Stanza, error) {
	s, _, err := r.WrapWithLabels(fileKey)
	return s, err
}

// blobIdentity unwraps the file key of a blob's one stanza.
type blobIdentity struct {
	x      []byte // X25519 private scalar
	info   []byte
	opened bool // the stanza was well-formed but did not open (ErrOpen)
}

// Unwrap accepts exactly one stanza, of blobStanzaType with one argument
// (the canonical encoding of a 32-byte encapsulated key) and a body of the
// sealed file key's length; anything else is ErrBlob.
func (id *blobIdentity) Unwrap(stanzas []*age.Stanza) ([]byte, error) {
	if len(stanzas) != 1 || stanzas[0].Type != blobStanzaType || len(stanzas[0].Args) != 1 ||
		len(stanzas[0].Body) != fileKeySize+tagSize {
		return nil, fmt.Errorf("%w: the header is not one %s stanza", ErrBlob, blobStanzaType)
	}
	enc, err := stanzaB64.Strict().DecodeString(stanzas[0].Args[0])
	if err != nil || len(enc) != encSize || stanzaB64.EncodeToString(enc) != stanzas[0].Args[0] {
		return nil, fmt.Errorf("%w: the stanza's key is not %d bytes in canonical base64", ErrBlob, encSize)
	}
	sk, err := kem.NewPrivateKey(id.x)
	if err != nil {
		return nil, fmt.Errorf("%w: the recipient key", ErrOpen)
	}
	r, err := hpke.NewRecipient(enc, sk, kdf, aead, id.info)
	if err != nil {
		id.opened = true
		return nil, fmt.Errorf("%w: the file key", ErrOpen)
	}
	key, err := r.Open(nil, stanzas[0].Body)
	if err != nil {
		id.opened = true
		return nil, fmt.Errorf("%w: the file key", ErrOpen)
	}
	return key, nil
}

// BlobWriter seals a large body as it is written, for one message envelope
// (NewBlobMessage). Its memory does not grow with the body: age's STREAM
// holds one chunk. It is not safe for concurrent use.
type BlobWriter struct {
	sender *identity.Identity
	p      *payloadJSON
	out    *countingWriter
	stream io.WriteCloser
	plain  int64
	done   bool
	err    error
}

// countingWriter hashes and counts what it passes to w.
type countingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}

// NewBlobMessage starts a message envelope from sender to recipient whose
// body is sealed as a blob into sealed: the age format (age-encryption.org/v1)
// with one recipient stanza of type "sealbridge-hpke" — its argument the HPKE
// encapsulated key (unpadded standard base64), its body age's 16-byte file key
// sealed with the suite of small bodies under blobKeyInfo — then age's STREAM
// payload: BlobChunkSize chunks, each sealed with ChaCha20-Poly1305 under a
// nonce of its 11-byte counter and a last-chunk flag, so truncation,
// reordering and splicing are detected. The envelope's fields (a fresh
// envelopeId, createdAt now, deliveryDeadline deadline) are fixed now and
// checked as NewMessage checks them; Finish signs it with the blob's digest and
// size. The header is written to sealed before NewBlobMessage returns.
func NewBlobMessage(sender *identity.Identity, recipient identity.DID, messageID string,
	deadline, now time.Time, sealed io.Writer) (*BlobWriter, error) {
	p, err := newPayload(sender, KindMessage, recipient, messageID, deadline, now)
	if err != nil {
		return nil, err
	}
	pub, err := identity.ParseDID(string(recipient))
	if err != nil {
		return nil, fmt.Errorf("%w: recipient: %w", ErrMalformed, err)
	}
	x, err := pub.X25519()
	if err != nil {
		return nil, fmt.Errorf("%w: recipient: %w", ErrMalformed, err)
	}
	out := &countingWriter{w: sealed, h: sha256.New()}
	stream, err := age.Encrypt(out, blobRecipient{pub: x, info: blobKeyInfo(p.EnvelopeID, p.MessageID, p.SenderDID, p.RecipientDID)})
	if err != nil {
		return nil, fmt.Errorf("envelope: seal a blob to %s: %w", recipient, err)
	}
	return &BlobWriter{sender: sender, p: p, out: out, stream: stream}, nil
}

// EnvelopeID is the id of the envelope being sealed.
func (w *BlobWriter) EnvelopeID() string { return w.p.EnvelopeID }

// PlainSize is how many plaintext bytes have been written.
func (w *BlobWriter) PlainSize() int64 { return w.plain }

// Write seals p. An error from the sealed writer ends the BlobWriter.
func (w *BlobWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.done {
		return 0, fmt.Errorf("envelope: write to a finished blob %s", w.p.EnvelopeID)
	}
	n, err := w.stream.Write(p)
	w.plain += int64(n)
	if err == nil && w.out.n > MaxBlobSize {
		err = fmt.Errorf("%w: sealed blob over %d bytes", ErrTooLarge, MaxBlobSize)
	}
	if err != nil {
		w.err = err
	}
	return n, err
}

// Finish seals the last chunk and signs the envelope naming the blob's digest
// and size; it returns the envelope and its wire bytes as NewMessage does. The
// sealed writer then holds the whole blob (its durability is the caller's:
// store it durably before the envelope).
func (w *BlobWriter) Finish() (*Envelope, []byte, error) {
	if w.err != nil {
		return nil, nil, w.err
	}
	if w.done {
		return nil, nil, fmt.Errorf("envelope: blob %s already finished", w.p.EnvelopeID)
	}
	w.done = true
	if err := w.stream.Close(); err != nil {
		w.err = err
		return nil, nil, err
	}
	if w.out.n > MaxBlobSize {
		return nil, nil, fmt.Errorf("%w: sealed blob over %d bytes", ErrTooLarge, MaxBlobSize)
	}
	w.p.Body = &sealedJSON{Blob: hex.EncodeToString(w.out.h.Sum(nil)), Size: w.out.n}
	return sign(w.sender, w.p)
}

// OpenBlob returns the plaintext of sealed, the blob that ref names, for
// recipient. It refuses a ref addressed to another identity (ErrRecipient) and
// a header that does not open with recipient's key under ref's envelope
// (ErrOpen). The reader verifies every chunk before it returns its plaintext;
// a chunk that does not verify, a stream that ends early or goes on, or
// bytes whose length or SHA-256 differ from ref's are ErrBlob from Read, at
// the latest at the end — so a caller that must not act on unverified
// plaintext reads to io.EOF first (VerifyBlob), and a reader that got io.EOF
// got exactly the sealed body. OpenBlob reads at most ref.Size+1 bytes of
// sealed.
func OpenBlob(recipient *identity.Identity, ref BlobRef, sealed io.Reader) (io.Reader, error) {
	switch {
	case recipient == nil:
		return nil, fmt.Errorf("%w: nil identity", ErrRecipient)
	case ref.Recipient != recipient.DID():
		return nil, fmt.Errorf("%w: blob of envelope %s is for %s", ErrRecipient, ref.EnvelopeID, ref.Recipient)
	case !IsHex(ref.Digest, 2*sha256.Size) || ref.Size < 1 || ref.Size > MaxBlobSize:
		return nil, fmt.Errorf("%w: reference of envelope %s", ErrMalformed, ref.EnvelopeID)
	}
	in := &countingReader{r: io.LimitReader(sealed, ref.Size+1), h: sha256.New()}
	id := &blobIdentity{x: recipient.X25519PrivateKey(), info: blobKeyInfo(ref.EnvelopeID, ref.MessageID, ref.Sender, ref.Recipient)}
	defer clear(id.x)
	plain, err := age.Decrypt(in, id)
	if err != nil {
		if id.opened || errors.Is(err, ErrOpen) {
			return nil, fmt.Errorf("%w: blob of envelope %s", ErrOpen, ref.EnvelopeID)
		}
		return nil, fmt.Errorf("%w: envelope %s: the header: %v", ErrBlob, ref.EnvelopeID, err)
	}
	return &blobReader{plain: plain, in: in, ref: ref}, nil
}

// countingReader hashes and counts what it reads from r.
type countingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// blobReader is OpenBlob's reader: age's, with the reference checked at the
// end.
type blobReader struct {
	plain io.Reader
	in    *countingReader
	ref   BlobRef
	err   error
}

func (b *blobReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.plain.Read(p)
	switch {
	case err == io.EOF:
		err = b.finish()
	case err != nil:
		err = fmt.Errorf("%w: envelope %s: %v", ErrBlob, b.ref.EnvelopeID, err)
	}
	if err != nil {
		b.err = err
		if err != io.EOF {
			return 0, err
		}
	}
	return n, err
}

// finish checks, once age's reader ended, that the sealed input ended there
// too and had the reference's size and digest.
func (b *blobReader) finish() error {
	if _, err := io.Copy(io.Discard, b.in); err != nil {
		return fmt.Errorf("%w: envelope %s: reading the blob: %v", ErrBlob, b.ref.EnvelopeID, err)
	}
	if b.in.n != b.ref.Size {
		return fmt.Errorf("%w: envelope %s: %d sealed bytes, the envelope names %d", ErrBlob, b.ref.EnvelopeID, b.in.n, b.ref.Size)
	}
	if hex.EncodeToString(b.in.h.Sum(nil)) != b.ref.Digest {
		return fmt.Errorf("%w: envelope %s: the sealed bytes have another SHA-256 than the envelope names", ErrBlob, b.ref.EnvelopeID)
	}
	return io.EOF
}

// VerifyBlob reads all of sealed through OpenBlob, discarding the plaintext,
// and returns its length: nil means every chunk verified and the blob is the
// one ref names.
func VerifyBlob(recipient *identity.Identity, ref BlobRef, sealed io.Reader) (int64, error) {
	r, err := OpenBlob(recipient, ref, sealed)
	if err != nil {
		return 0, err
	}
	return io.Copy(io.Discard, r)
}
