package identity

import "errors"

// Every sentinel here stays exported, including those only the package's tests
// match: they are the error classes the package documentation promises callers.

// Errors returned by ParseDID. Each is wrapped with context (the DID, when it
// is short enough to quote); test with errors.Is.
var (
	// ErrDIDPrefix: the string does not start with "did:key:z".
	ErrDIDPrefix = errors.New("identity: not a did:key DID in base58btc (want prefix \"did:key:z\")")
	// ErrDIDBase58: the method-specific id is not base58btc, or not the
	// canonical base58btc encoding of the bytes it decodes to.
	ErrDIDBase58 = errors.New("identity: did:key is not canonical base58btc")
	// ErrDIDMulticodec: the key is not tagged ed25519-pub (0xed 0x01).
	ErrDIDMulticodec = errors.New("identity: did:key multicodec is not ed25519-pub (0xed01)")
	// ErrDIDLength: the DID is too long to be an Ed25519 did:key, or its key
	// is not 32 bytes.
	ErrDIDLength = errors.New("identity: did:key has the wrong length")
)

// Errors returned by ValidatePublicKey, and wrapped by ParseDID, VerifyDomain
// callers and the constructors of Identity.
var (
	// ErrKeyLength: a public key is not 32 bytes.
	ErrKeyLength = errors.New("identity: Ed25519 public key is not 32 bytes")
	// ErrKeyNotOnCurve: the bytes do not decode to a point of edwards25519.
	ErrKeyNotOnCurve = errors.New("identity: Ed25519 public key is not a curve point")
	// ErrKeyNonCanonical: the bytes decode to a point whose canonical
	// encoding differs from them.
	ErrKeyNonCanonical = errors.New("identity: Ed25519 public key encoding is not canonical")
	// ErrKeySmallOrder: the point is one of the eight points of small order.
	ErrKeySmallOrder = errors.New("identity: Ed25519 public key has small order")
	// ErrPrivateKey: a private key or seed has the wrong length, or its
	// public half does not match its seed.
	ErrPrivateKey = errors.New("identity: malformed Ed25519 private key")
)

// ErrDomain is returned by SignDomain for a domain or parts that cannot be
// signed unambiguously (see the package documentation).
var ErrDomain = errors.New("identity: invalid signature domain or parts")

// Errors returned by WriteKeyFile and LoadKeyFile, wrapped with the path and,
// where there is one, the underlying system error.
var (
	// ErrKeyFileExists: WriteKeyFile found something at the destination.
	ErrKeyFileExists = errors.New("identity: key file already exists")
	// ErrKeyFileType: not a regular file with exactly one link (a symlink,
	// FIFO, device, directory, or a hard-linked file).
	ErrKeyFileType = errors.New("identity: key file is not a single-link regular file")
	// ErrKeyFileOwner: the file is not owned by the effective user.
	ErrKeyFileOwner = errors.New("identity: key file is not owned by the current user")
	// ErrKeyFileMode: the file grants more than owner read and write.
	ErrKeyFileMode = errors.New("identity: key file permissions are not 0600 or stricter")
	// ErrKeyFileSize: the file is larger than any key file this package writes.
	ErrKeyFileSize = errors.New("identity: key file is too large")
	// ErrKeyFileFormat: the content is not exactly one unencrypted PKCS#8
	// Ed25519 "PRIVATE KEY" PEM block.
	ErrKeyFileFormat = errors.New("identity: key file is not a PKCS#8 Ed25519 PEM private key")
)
