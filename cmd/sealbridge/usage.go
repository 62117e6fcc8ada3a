package main

import "github.com/sealbridge/sealbridge/pkg/relay"

// exitStatus ends every usage text.
const exitStatus = `Exit status:
  0   success
  1   failure (a command failed, the demo did not relay everything or fsck found problems)
  2   usage error
  3   no daemon is running for the identity
  4   send: the outcome is unknown (the message may have been accepted); run the
      command printed in the hint to finish it without sending it twice
`

// identityFlagsUsage describes --home and --identity, which most commands take.
const identityFlagsUsage = `  --home DIR         the data root (default: $SEALBRIDGE_HOME, else
                     $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge)
  --identity NAME    the identity's name under the data root (default:
                     $SEALBRIDGE_IDENTITY, else "default")
`

// commandUsage is each command's own usage, printed by "sealbridge CMD --help" and
// "sealbridge help CMD". Flags may follow arguments.
var commandUsage = map[string]string{
	"init": `usage: sealbridge init [--home DIR] [--identity NAME]

Creates the identity NAME (an Ed25519 key, <home>/identities/NAME.key, mode 0600)
and prints its did:key. Refuses an identity that exists.

` + identityFlagsUsage + `
Examples:
  sealbridge init --home ~/sb --identity alice
`,
	"whoami": `usage: sealbridge whoami [--home DIR] [--identity NAME]

Prints the identity's did:key.

` + identityFlagsUsage + `
Examples:
  sealbridge whoami --home ~/sb --identity bob
`,
	"send": `usage: sealbridge send --to DID --relay URL [--deadline 24h|TIME]
                       [--idempotency-key K] [--file F] [--home DIR] [--identity NAME]

Sends a message through the identity's daemon and prints its id. The body is read
from --file F, or from standard input (a terminal is refused). A body is at most
97280 bytes (95 KiB, what one envelope carries); a larger one is refused before
anything is sent.

  --to DID               the recipient's did:key (required)
  --relay URL            the http(s) URL of the relay to send through (required)
  --deadline 24h|TIME    when to give up: a duration from now or an RFC 3339 time
                         (default 24h). Retries with one --idempotency-key must send
                         the same request: use the default or a TIME, not a duration
  --idempotency-key K    makes a retry return the first request's message
  --file F               read the body from F ("-": standard input)
` + identityFlagsUsage + `
Examples:
  echo hello | sealbridge send --home ~/sb --identity alice --to did:key:z6Mk… --relay http://127.0.0.1:8470
  sealbridge send --to did:key:z6Mk… --relay http://127.0.0.1:8470 --file note.txt --deadline 2030-01-01T00:00:00Z
`,
	"status": `usage: sealbridge status ID [--json] [--home DIR] [--identity NAME]

Shows one sent message: status, attempts, last error, times.

  ID                 the message id that send printed
  --json             print the daemon's JSON
` + identityFlagsUsage + `
Examples:
  sealbridge status --home ~/sb --identity alice 0190b6a4-…
`,
	"ls": `usage: sealbridge ls [--status S] [--limit N] [--after ID] [--all] [--json]
                     [--home DIR] [--identity NAME]

Lists sent messages by id: kind (message: one you sent; confirmation: the delivery
confirmation the daemon sent back for a message it received), status (with closedBy
and "(held)" when an operator holds it), attempts, next attempt and last error (for a
queued or closed message).

  --status S         only messages with this status (queued, relayed, delivered, closed)
  --limit N          at most N messages (default: the daemon's page size); with
                     --all, the page size
  --after ID         start after message ID (the "more:" line names it)
  --all              page through every message
  --json             one JSON object per line, a message as the daemon reports it
` + identityFlagsUsage + `
Examples:
  sealbridge ls --home ~/sb --identity alice --status queued
  sealbridge ls --all --json --status closed | jq -r .lastError
`,
	"queue": `usage: sealbridge queue [--json] [--home DIR] [--identity NAME]

Shows the backlog of each relay target with pending envelopes: pending (held ones
included), held, in flight, bytes, the oldest one's age, attempts, the state (ready,
backing off until T, unreachable since T with the next probe at T, held) and the
last error; then the pending envelopes by age (under 5m, 10m, 20m, 40m, 80m, 160m,
older) per target and in total.

  --json             print the daemon's JSON (GET /v1/targets)
` + identityFlagsUsage + `
Examples:
  sealbridge queue --home ~/sb --identity alice
`,
	"inbox": `usage: sealbridge inbox [--limit N] [--after ID] [--refused] [--json] [--home DIR] [--identity NAME]

Lists received messages. The daemon receives only when it runs with --inbox-relay.

  --limit N          at most N messages (default: the daemon's page size)
  --after ID         start after message ID (the "more:" line names it)
  --refused          list the inbound envelopes the daemon refused instead (bad
                     signature, wrong recipient, oversize, expired, …): evidence,
                     never delivered; kept for the daemon's --closed-retention
  --json             print the daemon's JSON
` + identityFlagsUsage + `
Examples:
  sealbridge inbox --home ~/sb --identity bob
  sealbridge inbox --refused --json
`,
	"watch": `usage: sealbridge watch [--topics messages,outbox,receipts,observations] [--json]
                        [--home DIR] [--identity NAME]

Follows the daemon's change feed until interrupted, one line per change:
TIME TOPIC ID STATE. A reset (a restarted daemon, a cursor too old) prints a line
saying so and continues.

  --topics T,…       only these topics (default: all)
  --json             one JSON object per line
` + identityFlagsUsage + `
Examples:
  sealbridge watch --home ~/sb --identity alice --topics messages
`,
	"relay": `usage: sealbridge relay [--listen 127.0.0.1:8470] [--home DIR]
                        [--log-format text|json] [--log-level L]
                        [--backend file|jetstream --nats-url URLS …] [limit flags]

Runs a reference relay in the foreground (the same relay as sealbridge-relay). Its
key is <home>/relay-identity.pem, created on first start. It prints
"listening http://ADDR" and "relay DID"; SIGINT or SIGTERM stops it.

  --listen ADDR        address to listen on (default 127.0.0.1:8470; port 0 picks one)
  --home DIR           the data root (default: $SEALBRIDGE_HOME, else
                       $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge)
  --log-format FORMAT  text or json (default text)
  --log-level LEVEL    debug, info, warn or error (default info)

Storage (docs/RELAY.md "Storage backends"):
` + relay.BackendFlagsUsage + `
Limits (docs/RELAY.md "Limits"):
` + relay.LimitFlagsUsage + `
Examples:
  sealbridge relay --listen 127.0.0.1:8470 --home ~/sb-relay
`,
	"demo": `usage: sealbridge demo [--messages 100] [--keep] [--timeout 2m]

Runs two daemons and a relay in a temporary home, sends messages between them and
checks both stores with fsck; it succeeds only if every message was relayed and
delivered.

  --messages N       how many messages to send (default 100)
  --keep             keep the temporary home and its logs
  --timeout D        give up after D (default 2m)

Examples:
  sealbridge demo --messages 20 --keep
`,
}
