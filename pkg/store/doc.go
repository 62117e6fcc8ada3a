// Package store is sealbridge's per-identity, signed, file-backed outbox store.
//
// One identity owns one store directory. Every record — an outgoing envelope (outbox),
// a batch marker (batches), a message's status (messages), a receipt, an observation,
// an operation and its idempotency binding — is its own one-line JSON file signed by
// the owner. docs/FORMAT.md is the byte-level specification; record.Encode and
// record.Parse implement it, and fsck uses record.Parse rather than re-coding validity.
//
// # Durability
//
// A write returns only once durable: the record is staged in a fresh temp file,
// fsynced, renamed over its name, and its directory fsynced. A removal is an unlink
// followed by a directory fsync. Every publication also appends its kind's mark to the
// generation file, so listing stamps change even when two changes share a timestamp
// tick; at 64 KiB the file is replaced under the lock by one of a new epoch, which no
// earlier stamp or plan matches (docs/FORMAT.md §7).
// A failed fsync is never retried; the write fails and nothing is acknowledged.
//
// # Concurrency
//
// A Store is safe for concurrent use by many goroutines, and many processes may open
// the same store: every change happens under the store lock (internal/lockfile),
// taken with a bounded wait (then OUTBOX_STORE_BUSY) and never held across network
// I/O. Within one process, lock holds are serialized. Reads take no lock: they check
// the file's fingerprint, read it bounded and without following links, verify the
// signature and the schema, and cache the verified record only if the file did not
// change while it was read. Callers always receive copies.
//
// # Transactions
//
// Transaction runs fn once under the lock; each Put or Delete is durable when it
// returns. PreparedTransaction plans under the lock, signs and fsyncs outside it, and
// publishes in a group commit; it is serializable and durable when it returns nil.
//
// # Errors
//
// Every error carries one of the codes of pkg/errcode (test with errors.Is), the kind
// and id or path involved, and the cause (errors.Unwrap) — never key material or
// payload contents.
package store
