package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The operator's actions on the queue: hold, release, cancel, retry.
func init() {
	for _, op := range actionOps {
		commands = append(commands, command{op.name, op.run})
		commandUsage[op.name] = op.usage()
	}
}

// actionOp is one action command.
type actionOp struct {
	name  string // the command and the daemon's route
	done  string // what a changed message became: "held", …
	what  string // one line for the usage
	about string // the usage's paragraph
	call  func(c *client.Client, ctx context.Context, sel client.Selector, reason string) (client.ActionAnswer, error)
}

var actionOps = []actionOp{
	{"hold", "held", "hold messages: their envelopes are not sent until released",
		`Holds messages: their pending envelopes are not sent until released. The
deadline still closes a held message (closedBy deadline).`, (*client.Client).Hold},
	{"release", "released", "release held messages",
		`Releases held messages. Each envelope's next attempt keeps the time it had: a
release does not skip a backoff (use retry for that).`, (*client.Client).Release},
	{"cancel", "cancelled", "cancel messages: close what is not sent yet",
		`Cancels messages: their pending envelopes are closed and never sent, and the
message is closed with closedBy cancelled. Envelopes already relayed are not
recalled (the answer says so). A delivered or closed message is refused
(MESSAGE_CLOSED).`, (*client.Client).Cancel},
	{"retry", "retried", "try messages again now, not after their backoff",
		`Makes the messages' pending envelopes due now: their backoff and their relay's
unreachable wait are cleared, and one attempt is made at once. Held envelopes are
not retried (release them first).`, (*client.Client).Retry},
}

func (op actionOp) usage() string {
	return `usage: sealbridge ` + op.name + ` [--reason R] [--json] (MESSAGE… | --target URL)
                       [--home DIR] [--identity NAME]

` + op.about + `

Prints one line per message: ID ` + op.done + ` (N envelopes), ID already ` + op.done + `
or unchanged (nothing to do), or ID refused CODE: why, with the daemon's note if any. Refusal
codes: MESSAGE_CLOSED (delivered or closed), MESSAGE_NOT_FOUND (no such message).
Exits 1 if any message refused the action. Each change is recorded in the message's
and its envelopes' records with who (uid:N), when and --reason.

  MESSAGE…           message ids, as send printed them
  --target URL       every message with envelopes pending to this relay URL now
  --reason R         why (at most 256 bytes, one line), kept in the records
  --json             print the daemon's JSON
` + identityFlagsUsage + `
Examples:
  sealbridge ` + op.name + ` --home ~/sb --identity alice 0190b6a4-…
  sealbridge ` + op.name + ` --target http://127.0.0.1:8470 --reason "relay maintenance"
`
}

func (op actionOp) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(op.name)
	w := identityFlags(fs)
	reason := fs.String("reason", "", "")
	target := fs.String("target", "", "")
	asJSON := fs.Bool("json", false, "")
	ids, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	targetSet := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "target" {
			targetSet = true
		}
	})
	switch {
	case targetSet && *target == "":
		return usageErrorf("%s: --target is empty", op.name)
	case len(ids) == 0 && !targetSet:
		return usageErrorf("%s: give message ids or --target URL", op.name)
	case len(ids) > 0 && targetSet:
		return usageErrorf("%s: give message ids or --target URL, not both", op.name)
	}
	for _, id := range ids {
		switch {
		case id == "":
			return usageErrorf("%s: a message id is empty", op.name)
		case !uuid.Valid(id):
			return usageErrorf("%s: %q is not a message id (a lower-case UUID, as sealbridge send printed)", op.name, id)
		}
	}
	if targetSet && !record.ValidRelayURL(*target) {
		return usageErrorf("%s: --target %q is not an http(s) relay URL", op.name, *target)
	}
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	ans, err := op.call(d.c, ctx, client.Selector{MessageIDs: ids, Target: *target}, *reason)
	if err != nil {
		return d.explain(err)
	}
	if *asJSON {
		if ans.Results == nil {
			ans.Results = []client.ActionResult{}
		}
		if err := writeJSON(stdout, ans); err != nil {
			return err
		}
	} else {
		if len(ans.Results) == 0 {
			fmt.Fprintf(stderr, "sealbridge: no message has envelopes pending to %s\n", *target)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		for _, r := range ans.Results {
			fmt.Fprintf(tw, "%s\t%s\n", r.MessageID, op.describe(r))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if refused := ans.Refused(); len(refused) > 0 {
		return withHint(fmt.Errorf("%s: %d of %d messages refused (%s)", op.name, len(refused), len(ans.Results), refused[0].Code),
			"list sent messages with: sealbridge ls %s", w.flags())
	}
	return nil
}

// describe says what the action did to one message.
func (op actionOp) describe(r client.ActionResult) string {
	var s string
	switch {
	case r.Code != "":
		s = "refused " + r.Code
	case r.Changed == 1:
		s = op.done + " (1 envelope)"
	case r.Changed > 0:
		s = fmt.Sprintf("%s (%d envelopes)", op.done, r.Changed)
	case op.name == "hold" || op.name == "release":
		s = "already " + op.done
	default:
		s = "unchanged"
	}
	if m := oneLine(r.Message); m != "" {
		sep := "; "
		if r.Code != "" {
			sep = ": "
		}
		s += sep + m
	}
	return strings.TrimSpace(s)
}
