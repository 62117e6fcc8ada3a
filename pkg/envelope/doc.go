// Package envelope builds, signs, verifies, digests, seals and opens
// sealbridge wire envelopes (DESIGN §3, §4): the signed unit that a
// sender's outbox stores, the carrier delivers, a relay de-duplicates and a
// recipient verifies and opens. This comment is the specification of
// version 1; a stranger with a JSON parser, SHA-256, base64url, base58, an
// Ed25519 verifier and an RFC 9180 HPKE library can implement it from here.
//
// # Wire format
//
// A wire envelope is exactly these bytes — one compact JSON object, keys in
// this order, no whitespace anywhere, no trailing newline:
//
//	{"v":1,"payload":PAYLOAD,"sig":"SIG"}
//
// PAYLOAD, for kind "message", is exactly
//
//	{"envelopeId":"E","kind":"message","messageId":"M","senderDid":"S","recipientDid":"R",
//	 "createdAt":C,"deliveryDeadline":D,"body":{"enc":"ENC","ct":"CT"}}
//
// and for kind "delivery-status" exactly
//
//	{"envelopeId":"E","kind":"delivery-status","messageId":"M","senderDid":"S","recipientDid":"R",
//	 "createdAt":C,"deliveryDeadline":D,"confirms":{"messageId":"M","envelopeDigest":"G","status":"delivered"}}
//
// (each shown on two lines here; on the wire it is one). The fields:
//
//	E    envelopeId: this envelope's id, a lower-case hyphenated UUID
//	     (8-4-4-4-12 hex digits a-f0-9). The builders use random version-4
//	     UUIDs; any version is accepted.
//	M    messageId: a lower-case UUID. For a message, the message it carries;
//	     for a delivery-status, the message it confirms (and then it must
//	     equal confirms.messageId).
//	S, R senderDid, recipientDid: did:key names of Ed25519 keys, strictly
//	     valid (pkg/identity.ParseDID: the one canonical "did:key:z6Mk…"
//	     base58btc spelling of multicodec 0xed01 + a 32-byte key that is a
//	     canonically encoded curve point not of small order).
//	C, D createdAt, deliveryDeadline: Unix times in milliseconds, integers
//	     with 0 < C < D ≤ 2⁵³−1.
//	ENC  body.enc: the HPKE encapsulated key, 32 bytes.
//	CT   body.ct: the HPKE ciphertext, the body's length + 16 bytes.
//	     A large body is not in the envelope: "body" is then exactly
//	     {"blob":"B","size":Z}, B the lower-case hex SHA-256 of the sealed
//	     blob (64 digits) and Z its length in bytes, 1 ≤ Z ≤ MaxBlobSize
//	     (see "Sealed blob"). The two forms never mix.
//	G    confirms.envelopeDigest: the digest (below) of the message envelope
//	     being confirmed, 64 lower-case hex digits.
//	SIG  the signature, 64 bytes.
//
// Binary values (ENC, CT, SIG) are base64url (RFC 4648 §5) without padding,
// in their one canonical spelling (no '=', no line breaks, unused trailing
// bits zero). Integers are plain decimal (no sign, leading zero, fraction or
// exponent). A message has "body" and no "confirms"; a delivery-status has
// "confirms" and no "body"; no other key may appear. The only status of
// version 1 is "delivered": the recipient verified that envelope and stored
// its opened body durably.
//
// Only the canonical bytes are an envelope. After strict decoding (unknown
// keys, duplicate keys and keys differing only in case refused), encoding the
// decoded values again in the order above must reproduce the input byte for
// byte, so whitespace, reordered keys, escaped characters ("\u0076", "\/"),
// padded or non-canonical base64url, and numbers spelled otherwise are all
// refused. As every string of a valid envelope is an id, a DID, base64url, hex
// or a fixed word, a valid envelope consists of printable ASCII (0x21–0x7e)
// without a backslash; Parse refuses any other byte before decoding.
//
// An envelope is at most [MaxSize] = 131,072 bytes (128 KiB); larger input is
// refused before any decoding. [MaxBodySize] is the largest body the builder
// always fits.
//
// # Signature
//
// SIG is the Ed25519 signature (RFC 8032, pure) by the key of senderDid over
//
//	"sealbridge/envelope/v1" 0x00 PAYLOAD
//
// where PAYLOAD is the payload's bytes exactly as they stand in the envelope
// (identity.SignDomain with identity.DomainEnvelope): no re-encoding or
// canonicalisation step between the bytes and the verifier. The signature
// covers the sealed body, so nobody but the sender can change, add or move
// it. Ed25519 signatures are not unique: never de-duplicate by signature.
//
// # Digest
//
// The envelope digest (envelopeDigest in the store, the relay's receipts and
// delivery-status envelopes) is the lower-case hex SHA-256 of the exact wire
// bytes ([Digest]); `sha256sum` of a file holding just the envelope prints
// it. Two envelopes with one envelopeId and different digests are a conflict
// (the relay answers 409).
//
// # Sealed body
//
// A message's body is sealed with HPKE (RFC 9180, mode base) in the
// ciphersuite DHKEM(X25519, HKDF-SHA256) (KEM 0x0020), HKDF-SHA256 (KDF
// 0x0001), ChaCha20-Poly1305 (AEAD 0x0003), to the X25519 form of the
// recipient's Ed25519 key: the Montgomery u-coordinate of its point (RFC 7748
// §4.1; identity.PublicKey.X25519), whose private scalar is the clamped first
// half of SHA-512 of the recipient's seed (RFC 8032 §5.1.5;
// identity.Identity.X25519PrivateKey). The HPKE info is
//
//	"sealbridge/envelope-body/v1" 0x00 envelopeId 0x00 messageId 0x00 senderDid 0x00 recipientDid
//
// and the single AEAD call uses empty associated data (sequence number 0). ENC
// is the encapsulated key, CT the sealed plaintext. The info binds the body
// to its envelope: copied into another envelope — with another envelopeId or
// messageId, re-addressed, or taken by another sender into an envelope of
// its own — it does not open, even when the sender re-signs.
//
// # Sealed blob
//
// A body too large for an envelope (more than MaxBodySize) travels beside it
// as a sealed blob, in the age format (C2SP age-encryption.org/v1) with
// exactly one recipient stanza:
//
//	-> sealbridge-hpke ENC
//	CT
//
// ENC is the HPKE encapsulated key (32 bytes, unpadded standard base64 as
// age writes stanza arguments), CT age's 16-byte file key sealed with the
// ciphersuite above (32 bytes, the stanza body), under the info
//
//	"sealbridge/blob-key/v1" 0x00 envelopeId 0x00 messageId 0x00 senderDid 0x00 recipientDid
//
// Then come age's header MAC, its 16-byte nonce and its STREAM payload:
// chunks of BlobChunkSize (64 KiB) plaintext, each sealed with
// ChaCha20-Poly1305 under the key HKDF-SHA256(file key, nonce, "payload") and a
// nonce of an 11-byte big-endian chunk counter and a last-chunk flag byte, so a
// truncated, extended, reordered, duplicated or spliced stream does not
// verify. The envelope names the blob's SHA-256 and length under its
// signature, so no byte of it can change; the info binds the file key to the
// envelope as a small body's info does. OpenBlob and VerifyBlob check all of
// it; NewBlobMessage makes it.
//
// # Verification
//
// [Parse] refuses, in order: more than MaxSize bytes ([ErrTooLarge]); a byte
// outside printable ASCII, or a space or backslash ([ErrMalformed]); anything
// but one strict JSON object ([ErrMalformed]); a "v" other than 1
// ([ErrVersion]); non-canonical bytes ([ErrMalformed]); a payload that is not
// strict, canonical and valid as above, including a DID identity.ParseDID
// refuses ([ErrMalformed], also wrapping identity's error, such as
// identity.ErrKeySmallOrder); a signature that does not verify under the
// sender's key ([ErrSignature]). Every *Envelope came from Parse (the builders
// parse what they built), so holding one means all of that holds. What a
// receiver checks next is its own context: [Envelope.CheckRecipient] (addressed
// to us, [ErrRecipient]), [Envelope.CheckDeadline] (not expired,
// [ErrExpired]), then [Open] ([ErrOpen] if the body does not open). A sender
// receiving a delivery-status checks [Envelope.ConfirmsDelivery]: signed by
// the message's recipient ([ErrSender]), addressed to us, for that messageId
// and digest ([ErrConfirmation]).
//
// Errors are the exported sentinels, wrapped with context that names fields,
// sizes, byte offsets, ids and DIDs — never body plaintext or key material,
// and no quoted piece of the input but a DID (at most 128 bytes).
//
// # Test vectors
//
// testdata/vector-message.json and testdata/vector-delivery-status.json are
// a message from the identity with seed 32×0x01 to the one with seed
// 32×0x02 and its confirmation (messageId, times and body in vector_test.go),
// each exactly the wire bytes; their sha256sum is their digest.
package envelope
