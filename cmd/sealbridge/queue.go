package main

import (
	"context"

	"github.com/spf13/cobra"

	"fmt"
	"github.com/sealbridge/sealbridge/internal/cli"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
)

func queueCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "queue [--wide] [--json] [--home DIR] [--identity NAME]",
		Short: "show each relay target's backlog",
		Long: `Shows the backlog of each relay target with pending envelopes: pending (held ones
included), held, in flight, bytes, the oldest one's age, attempts, the state (ready,
backing off until T, unreachable since T with the next probe at T, held) and the
last error; then the pending envelopes by age (under 5m, 10m, 20m, 40m, 80m, 160m,
older) per target and in total.`,
		Example: `  sealbridge queue --home ~/sb --identity alice
  sealbridge queue --json | jq -r 'select(.state == "unreachable") | .relayUrl' | sealbridge retry --target -`,
		Args: cli.NoArgs,
	}
	w := identityFlags(c)
	asJSON := c.Flags().Bool("json", false, "print the daemon's JSON (GET /v1/targets)")
	c.RunE = func(c *cobra.Command, _ []string) error { return runQueue(c.Context(), w, *asJSON, c.OutOrStdout()) }
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit, daemonExit("failure"))
}

func runQueue(ctx context.Context, w *who, asJSONv bool, stdout io.Writer) error {
	asJSON := &asJSONv
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	l, err := d.c.Targets(ctx)
	if err != nil {
		return d.explain(err)
	}
	if *asJSON {
		return writeJSON(stdout, l)
	}
	return printQueue(stdout, l)
}

// printQueue prints one row per target, then the pending envelopes by age (like
// qshape), each target's row and a TOTAL row.
func printQueue(stdout io.Writer, l *client.TargetList) error {
	if len(l.Targets) == 0 {
		_, err := fmt.Fprintln(stdout, "no pending envelopes")
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tPENDING\tHELD\tIN FLIGHT\tBYTES\tOLDEST\tATTEMPTS\tSTATE\tLAST ERROR")
	for _, t := range l.Targets {
		oldest := ""
		if !t.OldestPendingAt.IsZero() {
			oldest = l.At.Sub(t.OldestPendingAt).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n", t.RelayURL, t.Pending, t.Held, t.InFlight, t.Bytes,
			oldest, t.Attempts, targetState(&t, l.At), oneLine(t.LastError))
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "TARGET\tTOTAL\t%s\n", strings.Join(l.AgeBuckets, "\t"))
	total := make([]int, len(l.AgeBuckets))
	sum := 0
	row := func(name string, n int, ages []int) {
		fmt.Fprintf(tw, "%s\t%d", name, n)
		for _, a := range ages {
			fmt.Fprintf(tw, "\t%d", a)
		}
		fmt.Fprintln(tw)
	}
	for _, t := range l.Targets {
		for i := range min(len(t.Ages), len(total)) {
			total[i] += t.Ages[i]
		}
		sum += t.Pending
		row(t.RelayURL, t.Pending, t.Ages)
	}
	row("TOTAL", sum, total)
	return tw.Flush()
}

// targetState says a target's state with its times, relative to at (the view's time).
func targetState(t *client.Target, at time.Time) string {
	when := func(x time.Time) string {
		if !x.After(at) {
			return formatTime(x) + " (due)"
		}
		return formatTime(x) + " (in " + x.Sub(at).Round(time.Second).String() + ")"
	}
	switch t.State {
	case "backing-off":
		return "backing off until " + when(t.BackoffUntil)
	case "unreachable":
		return "unreachable since " + formatTime(t.UnreachableSince) + ", next probe at " + when(t.NextProbeAt)
	}
	return t.State
}
