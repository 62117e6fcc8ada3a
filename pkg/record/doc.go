// Package record is the store's record format: the record types, the rules
// each one keeps on its own (Validate) and across versions (CheckReplacement, the
// batch rule CheckBatch), and the signed one-line file that holds one record
// (Encode, Parse). docs/FORMAT.md is its specification; this package is that
// document in Go and knows nothing of directories, locks or caches.
//
// A record file is
//
//	{"v":1,"kind":K,"id":I,"signer":DID,"payload":{…},"sig":"<base64url>"}\n
//
// signed by the store's owner over "sealbridge/record/v1" 0x00 kind 0x00 id 0x00
// payload. Parse accepts exactly the bytes Encode writes and nothing else, so a
// record is valid to fsck exactly when it is valid to the store.
//
// Times are Unix milliseconds. Every function is safe for concurrent use; records
// are plain values, and Clone returns a deep copy for callers that must not share one.
package record
