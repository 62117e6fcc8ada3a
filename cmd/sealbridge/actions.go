package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/record"
)

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

func (op actionOp) command() *cobra.Command {
	c := &cobra.Command{
		Use:   op.name + " [--reason R] [--json] (MESSAGE… | --target URL) [--home DIR] [--identity NAME]",
		Short: op.what,
		Long: op.about + `

Prints one line per message: ID ` + op.done + ` (N envelopes), ID already ` + op.done + `
or unchanged (nothing to do), or ID refused CODE: why, with the daemon's note if any. Refusal
codes: MESSAGE_CLOSED (delivered or closed), MESSAGE_NOT_FOUND (no such message).
Each change is recorded in the message's and its envelopes' records with who
(uid:N), when and --reason.`,
		Example: `  sealbridge ` + op.name + ` --home ~/sb --identity alice 0190b6a4-…
  sealbridge ` + op.name + ` --target http://127.0.0.1:8470 --reason "relay maintenance"`,
	}
	w := identityFlags(c)
	fl := c.Flags()
	reason := fl.String("reason", "", "why (`R`: at most 256 bytes, one line), kept in the records")
	target := fl.String("target", "", "every message with envelopes pending to this relay `URL` now")
	asJSON := fl.Bool("json", false, "print the daemon's JSON")
	c.RunE = func(c *cobra.Command, ids []string) error {
		return op.run(c.Context(), w, ids, *reason, *target, fl.Changed("target"), *asJSON, c.OutOrStdout(), c.ErrOrStderr())
	}
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit, daemonExit("a message refused the action, or another failure"))
}

func (op actionOp) run(ctx context.Context, w *who, ids []string, reasonv, targetv string, targetSet, asJSONv bool, stdout, stderr io.Writer) error {
	reason, target, asJSON := &reasonv, &targetv, &asJSONv
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
		case checkMessageID(op.name, id) != nil:
			return checkMessageID(op.name, id)
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
		return withHint(fmt.Errorf("%s: %d of %s refused (%s)", op.name, len(refused), plural(len(ans.Results), "message", "messages"), refused[0].Code),
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
