// Package fsck inspects a sealbridge store directory offline, explains what it finds,
// and repairs it. It is the library behind sealbridge-fsck; docs/FSCK.md is its
// reference (every finding code, its meaning and its repair).
//
// # Checking
//
// Only a directory laid out like a store is checked or repaired: named
// "<data root>/delivery/<64 hex digits>", without a data root's directories, and,
// if it holds names the store never makes at its top, with at least one record of
// its owner. Anything else is ErrDataRoot or ErrNotStoreLayout, and nothing in it is
// read as a record or changed.
//
// Check walks one store directory and reports Findings, each with a stable Code, the
// path, a one-line explanation and the action Repair would take. It checks:
//
//   - the store directory, the kind directories, lost+found and .generation: type,
//     owner and mode (fsx.CheckPrivateDir / CheckPrivateFile), and no symbolic links;
//   - when the store sits in a data root (<root>/delivery/<hex>), the data root and
//     its delivery/, identities/, run/ and relay/ by the data-root rules
//     (dataroot.RootViolations): CodeDataRootUnsafe, not repairable;
//   - every "<kind>/<id>.json" against every validity rule of docs/FORMAT.md §4, by the
//     store's own record.Parse after a bounded, O_NOFOLLOW read (fsx.ReadFile):
//     validity is never re-coded here. Verification runs on every core;
//   - batches: every member a marker lists present, valid and consistent
//     (record.CheckBatch); outbox records that no intact marker lists (orphans);
//   - messages (a queued message no intact batch commits; an intact batch without its
//     message record), receipts against observations (a receipt whose state went
//     back down), the state rules between a message and its members (a status behind
//     its envelopes, a hold left on a closed record or made on one side only),
//     records past retainUntil;
//   - staged temps (with their age) and unknown names (in kind directories a problem;
//     at the top a note, never moved);
//   - the lock (lockfile.Inspect: absent, live with its holder, held, stale,
//     planted) and orphan lock temps;
//   - blobs/ (blobs.go): every name a committed blob "<digest>", a staged
//     ".<uuid>.tmp" or a partial ".<envelopeId>.part", each a private regular file
//     with one link, never followed; each blob against the records that name it (an
//     outbox envelope's blob body, an observation's Blob): absent (blob-missing, or
//     blob-missing-settled for an envelope never sent again), of another size
//     (blob-truncated), not hashing to its name (blob-digest: the SHA-256 is streamed
//     through a fixed buffer per worker), named by no record (blob-unreferenced);
//   - the head (head.go): .head read first, by the store's rules; a head of the owner
//     naming a newer format than store.FormatVersion refuses the run
//     (errcode.StoreFormatNewer) with nothing read further; otherwise head-invalid,
//     head-absent (a note), and the local witness (<data root>/witness/<hex>.head):
//     witness-invalid, or store-rolled-back when it is above .head. Repair never
//     writes, moves or removes either.
//
// Check never writes: it lists, lstats, reads, and tries (and at once releases) the
// lock's flock. It never needs the private key: the owner's DID comes from
// Options.Owner or from the records' signer, confirmed against the store directory's
// name (<data root>/delivery/<hex sha256(DID)>).
//
// # Repairing
//
// Repair refuses to run while the lock is live or a daemon serves the store, and
// confirms before every change that the directory is still the store it checked
// and that no daemon has started. It moves
// (never deletes) every file it will not keep — bad blobs included — into lost+found/ with a JSON note, removes
// stale temps, a stale lock and orphan lock temps, unwinds broken batches marker first,
// fixes modes, and rewrites hard-linked or foreign-owned valid records as private
// copies of the same bytes. Given the owner's key (Options.Signer), it also repairs
// the state rules between a message and its members by a store transaction
// (state.go). Each change is made under the store lock, after checking
// that the file is still the one the check saw, and is durable when made. A second run
// finds nothing to repair.
package fsck
