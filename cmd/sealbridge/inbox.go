package main

import (
	"cmp"
	"context"

	"github.com/spf13/cobra"

	"fmt"
	"github.com/sealbridge/sealbridge/internal/cli"
	"io"
	"strconv"
	"text/tabwriter"
	"unicode/utf8"
)

// inboxFlags are inbox's flags.
type inboxFlags struct {
	limit         int
	after         string
	json, refused bool
}

func inboxCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "inbox [--limit N] [--after ID] [--refused] [--json] [--home DIR] [--identity NAME]",
		Short: "list received messages (--refused: the envelopes the daemon refused)",
		Long: `Lists received messages: id, when received, sender, the body's size and its
first bytes (a large body is not shown: sealbridge get ID writes it out). The daemon
receives only when it runs with --inbox-relay.
With --refused, lists the inbound envelopes the daemon refused instead (bad
signature, wrong recipient, oversize, expired, …): evidence, never delivered; kept
for the daemon's --closed-retention.`,
		Example: `  sealbridge inbox --home ~/sb --identity bob
  sealbridge inbox --refused --json`,
		Args: cli.NoArgs,
	}
	w := identityFlags(c)
	var f inboxFlags
	fl := c.Flags()
	fl.IntVar(&f.limit, "limit", 0, "at most `N` messages (default: the daemon's page size)")
	fl.StringVar(&f.after, "after", "", "start after message `ID` (the \"more:\" line names it)")
	fl.BoolVar(&f.refused, "refused", false, "list the inbound envelopes the daemon refused instead")
	fl.BoolVar(&f.json, "json", false, "JSON lines: one object per message (or refusal), as the daemon reports it")
	c.RunE = func(c *cobra.Command, _ []string) error {
		return runInbox(c.Context(), w, f, c.OutOrStdout(), c.ErrOrStderr())
	}
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit, daemonExit("failure"))
}

func runInbox(ctx context.Context, w *who, f inboxFlags, stdout, stderr io.Writer) error {
	if f.limit < 0 {
		return usageErrorf("inbox: --limit must not be negative")
	}
	if f.refused && (f.limit != 0 || f.after != "") {
		return usageErrorf("inbox: --refused lists every kept refusal; it takes no --limit or --after")
	}
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	if f.refused {
		return inboxRefused(ctx, d, f.json, stdout)
	}
	l, err := d.c.Inbox(ctx, f.limit, f.after)
	if err != nil {
		return d.explain(err)
	}
	if f.json {
		if err := writeJSONLines(stdout, l.Messages); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "MESSAGE\tRECEIVED\tFROM\tSIZE\tBODY")
		for _, m := range l.Messages {
			body := preview(m.Body)
			if m.Blob {
				body = "(sealbridge get " + m.MessageID + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.MessageID, formatTime(m.ReceivedAt), m.From, sizeCell(m.BodySize), body)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if l.Next != "" {
		fmt.Fprintf(stderr, "sealbridge: more: sealbridge inbox %s --after %s\n", w.flags(), shellQuote(l.Next))
	}
	return nil
}

// sizeCell is a body's length as the inbox table shows it: bytes below 1 KiB, else
// in KiB, MiB or GiB with one decimal (--json has it exact, bodySize).
func sizeCell(n int64) string {
	const units = "KMGT"
	if n < 1<<10 {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/(1<<10), 0
	for v >= 1<<10 && i < len(units)-1 {
		v, i = v/(1<<10), i+1
	}
	return fmt.Sprintf("%.1f %ciB", v, units[i])
}

// preview shows a body on one line: quoted text up to 60 bytes, or its size.
func preview(b []byte) string {
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes)", len(b))
	}
	s := string(b)
	if len(s) > 60 {
		cut := 60
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "…"
	}
	return strconv.Quote(s)
}

// inboxRefused prints the daemon's refused inbound envelopes.
func inboxRefused(ctx context.Context, d *daemonConn, asJSON bool, stdout io.Writer) error {
	l, err := d.c.InboxRefused(ctx)
	if err != nil {
		return d.explain(err)
	}
	if asJSON {
		return writeJSONLines(stdout, l.Refused)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RECEIVED\tREASON\tENVELOPE\tFROM\tSIZE\tDIGEST")
	for _, r := range l.Refused {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", formatTime(r.ReceivedAt), r.Reason, cmp.Or(r.EnvelopeID, "-"),
			cmp.Or(r.From, "-"), r.Size, r.EnvelopeDigest)
	}
	return tw.Flush()
}
