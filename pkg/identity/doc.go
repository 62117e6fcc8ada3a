// Package identity holds sealbridge identities: Ed25519 keys named by did:key
// DIDs, strict public-key validation, domain-separated signatures, and private
// key files (DESIGN §3).
//
// # Names
//
// An identity's name is its DID, "did:key:z" followed by the base58btc
// (Bitcoin alphabet) encoding of the multicodec prefix 0xed 0x01 (the unsigned
// varint of ed25519-pub) and the 32-byte public key: always 56 ASCII
// characters. [ParseDID] accepts exactly that form and refuses everything else,
// each with its own sentinel error (use [errors.Is]):
//
//   - longer than 128 bytes, before any decoding: [ErrDIDLength];
//   - not starting with "did:key:z" (other DID methods, other multibase
//     encodings, DID URLs are not names): [ErrDIDPrefix];
//   - not base58btc, or not the one canonical base58btc encoding of its bytes
//     (the parsed key must re-format to exactly the input): [ErrDIDBase58];
//   - a multicodec other than ed25519-pub: [ErrDIDMulticodec];
//   - a key that is not 32 bytes: [ErrDIDLength];
//   - a key refused by [ValidatePublicKey] (below).
//
// ParseDID never panics and is fuzzed (FuzzParseDID): whatever it accepts
// re-formats to the identical string and passes ValidatePublicKey.
//
// # Keys
//
// [ValidatePublicKey] decodes a key with filippo.io/edwards25519 and refuses,
// in this order: a length other than 32 ([ErrKeyLength]); bytes that are not a
// point of the curve ([ErrKeyNotOnCurve]); a non-canonical encoding — a
// y coordinate ≥ 2²⁵⁵−19, or x = 0 with the sign bit set, which the decoder
// accepts but which give one point several names ([ErrKeyNonCanonical]); and
// the eight points of small order, whose signatures can verify for many
// messages and whose X25519 form yields a known shared secret
// ([ErrKeySmallOrder]). Keys with a small-order component added to a point of
// large order are not refused: every verifier here uses Go's crypto/ed25519,
// so they cannot make one signature valid in one place and invalid in another.
//
// # Signatures
//
// Every signature is domain-separated: [SignDomain] and [VerifyDomain] sign
// and verify domain 0x00 part₁ 0x00 part₂ … with no terminator. A store record
// uses [DomainRecord] with the parts kind, id and the payload bytes; an
// envelope uses [DomainEnvelope] with the payload bytes alone; any other use
// gets a domain string of its own. The domain must be non-empty and free of
// 0x00; every part but the last must be free of 0x00 (kinds and ids are
// validated by their callers and never contain it; a part that does is
// refused rather than signed ambiguously); the last part (the payload) may hold
// any bytes. A domain fixes its number of parts; this package enforces it for
// DomainRecord (3) and DomainEnvelope (1). Under those rules the signed
// message determines its domain and parts uniquely, so a signature cannot be
// moved to another kind, id or context.
//
// Signing goes through a [crypto.Signer], so a key may later live in an agent
// or in hardware; SignDomain checks the signature it got back before returning
// it. VerifyDomain checks the key and signature lengths first (Go's
// ed25519.Verify panics on a wrong-length key), validates the key strictly,
// and never panics. Ed25519 signatures are not unique: callers must never
// de-duplicate by signature bytes.
//
// # Key files
//
// A private key is stored as a PKCS#8 PEM block ("PRIVATE KEY", RFC 8410) in a
// file of mode 0600. [WriteKeyFile] stages it in a temporary file in the
// destination's directory (O_EXCL|O_NOFOLLOW), fsyncs it, moves it into place
// without ever replacing an existing file ([ErrKeyFileExists]), and fsyncs the
// directory. [LoadKeyFile] opens with O_NOFOLLOW|O_NONBLOCK (so a symlink is
// refused and a FIFO never blocks) and, from fstat, refuses anything but a
// regular file with one link ([ErrKeyFileType]), a file not owned by the
// effective user ([ErrKeyFileOwner]), any permission bit beyond 0600
// ([ErrKeyFileMode]), a file larger than 16 KiB ([ErrKeyFileSize]), and
// content that is not exactly one unencrypted PKCS#8 Ed25519 key
// ([ErrKeyFileFormat]). No error of this package ever contains key bytes.
//
// # Sealing
//
// Payloads are sealed (HPKE, DHKEM(X25519)) to the X25519 form of a
// recipient's key: [PublicKey.X25519] is the birational map of the Edwards
// point to Montgomery u (RFC 7748 §4.1), and [Identity.X25519PrivateKey] is
// the matching scalar, the clamped first half of SHA-512 of the seed
// (RFC 8032 §5.1.5).
package identity
