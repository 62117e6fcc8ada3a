package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
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
		Use:   op.name + " [--reason R] [--json] (MESSAGE… | - | --target URL|-) [--home DIR] [--identity NAME]",
		Short: op.what,
		Long: op.about + `

Prints one line per message: ID ` + op.done + ` (N envelopes), ID already ` + op.done + `
or unchanged (nothing to do), or ID refused CODE: why, with the daemon's note if any
(for retry what it does now: attempting now, probing its target now, in flight). Refusal
codes: MESSAGE_CLOSED (delivered or closed), MESSAGE_NOT_FOUND (no such message).
Each change is recorded in the message's and its envelopes' records with who
(uid:N), when and --reason.

"-" for MESSAGE reads the message ids from standard input, and --target - the relay
URLs, one or more a line (as postsuper - does); nothing on standard input does
nothing.`,
		Example: `  sealbridge ` + op.name + ` --home ~/sb --identity alice 0190b6a4-…
  sealbridge ` + op.name + ` --target http://127.0.0.1:8470 --reason "relay maintenance"
  sealbridge ls --json --status queued | jq -r .messageId | sealbridge ` + op.name + ` -`,
	}
	w := identityFlags(c)
	fl := c.Flags()
	reason := fl.String("reason", "", "why (`R`: at most 256 bytes, one line), kept in the records")
	target := fl.String("target", "", "every message with envelopes pending to this relay `URL` now (\"-\": the URLs on standard input)")
	asJSON := fl.Bool("json", false, "JSON lines: one object per message's result, as the daemon reports it")
	c.RunE = func(c *cobra.Command, ids []string) error {
		return op.run(c.Context(), w, ids, *reason, *target, fl.Changed("target"), *asJSON, c.OutOrStdout(), c.ErrOrStderr())
	}
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit, daemonExit("a message refused the action, or another failure"))
}

// actionChunk bounds the ids of one request (the daemon takes at most 1,000).
const actionChunk = 1000

func (op actionOp) run(ctx context.Context, w *who, ids []string, reason, target string, targetSet, asJSON bool, stdout, stderr io.Writer) error {
	switch {
	case targetSet && target == "":
		return usageErrorf("%s: --target is empty", op.name)
	case len(ids) == 0 && !targetSet:
		return usageErrorf("%s: give message ids or --target URL", op.name)
	case len(ids) > 0 && targetSet:
		return usageErrorf("%s: give message ids or --target URL, not both", op.name)
	case len(ids) > 1 && slices.Contains(ids, "-"):
		return usageErrorf("%s: \"-\" reads the message ids from standard input: give it alone", op.name)
	}
	var targets []string
	if targetSet {
		targets = []string{target}
	}
	fromStdin := false
	var err error
	switch {
	case len(ids) == 1 && ids[0] == "-":
		ids, fromStdin = nil, true
		if ids, err = readList(stdin); err != nil {
			return err
		}
	case target == "-":
		targets, fromStdin = nil, true
		if targets, err = readList(stdin); err != nil {
			return err
		}
	}
	for _, id := range ids {
		if err := checkMessageID(op.name, id); err != nil {
			return err
		}
	}
	for i, t := range targets {
		canonical, err := relayproto.CanonicalRelayURL(t)
		if err != nil {
			return withHint(usageErrorf("%s: --target %q: %v", op.name, t, err), "%s", relayproto.RelayURLFix(err))
		}
		targets[i] = canonical
	}
	if fromStdin && len(ids) == 0 && len(targets) == 0 {
		fmt.Fprintf(stderr, "sealbridge: %s: nothing on standard input, nothing done\n", op.name)
		return nil
	}
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	var sels []client.Selector
	for _, t := range targets {
		sels = append(sels, client.Selector{Target: t})
	}
	for chunk := range slices.Chunk(ids, actionChunk) {
		sels = append(sels, client.Selector{MessageIDs: chunk})
	}
	var results []client.ActionResult
	for _, sel := range sels {
		ans, err := op.call(d.c, ctx, sel, reason)
		if err != nil {
			return d.explain(err)
		}
		if sel.Target != "" && len(ans.Results) == 0 {
			fmt.Fprintf(stderr, "sealbridge: no message has envelopes pending to %s\n", sel.Target)
		}
		results = append(results, ans.Results...)
	}
	if asJSON {
		if err := writeJSONLines(stdout, results); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t%s\n", r.MessageID, op.describe(r))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if refused := (client.ActionAnswer{Results: results}).Refused(); len(refused) > 0 {
		return withHint(fmt.Errorf("%s: %d of %s refused (%s)", op.name, len(refused), plural(len(results), "message", "messages"), refused[0].Code),
			"list sent messages with: sealbridge ls %s", w.flags())
	}
	return nil
}

// readList reads the words of r, one or more a line, as postsuper - does: the
// message ids or relay URLs of a bulk action. Empty lines are skipped; the words
// are kept in order, each once.
func readList(r io.Reader) ([]string, error) {
	var words []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if !seen[f] {
				seen[f] = true
				words = append(words, f)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	return words, nil
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
	case r.Effect != "" && r.Message != "":
		// A retry that changed no record still acts: the note says how
		// ("attempting now", "probing its target now", "in flight: …").
	default:
		s = "unchanged"
	}
	if m := oneLine(r.Message); m != "" {
		switch {
		case s == "":
			s = m
		case r.Code != "":
			s += ": " + m
		default:
			s += "; " + m
		}
	}
	return strings.TrimSpace(s)
}
