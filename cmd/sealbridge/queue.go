package main

import (
	"context"

	"github.com/spf13/cobra"

	"fmt"
	"github.com/sealbridge/sealbridge/internal/cli"
	"io"
	"slices"
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
backing off with the next attempt, unreachable with the next probe, held) and the
last error's reason; then the pending envelopes by age (under 5m, 10m, 20m, 40m,
80m, 160m, older) per target and in total. Times are relative ("in 4m12s",
"3s ago") and the reason short, as postqueue -p shows them; --wide shows the times
in full and the whole error. A hint line follows when a target waits (retry
--target makes an attempt now).`,
		Example: `  sealbridge queue --home ~/sb --identity alice
  sealbridge queue --json | jq -r 'select(.state == "unreachable") | .relayUrl' | sealbridge retry --target -`,
		Args: cli.NoArgs,
	}
	w := identityFlags(c)
	asJSON := c.Flags().Bool("json", false, "JSON lines: one object per target, as the daemon reports it (GET /v1/targets)")
	wide := c.Flags().Bool("wide", false, "full times and the whole last error")
	c.RunE = func(c *cobra.Command, _ []string) error {
		return runQueue(c.Context(), w, *asJSON, *wide, c.OutOrStdout(), c.ErrOrStderr())
	}
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit, daemonExit("failure"))
}

func runQueue(ctx context.Context, w *who, asJSON, wide bool, stdout, stderr io.Writer) error {
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
	if asJSON {
		err = writeJSONLines(stdout, l.Targets)
	} else {
		err = printQueue(stdout, l, wide)
	}
	for _, h := range queueHints(l) {
		fmt.Fprintf(stderr, "sealbridge: hint: %s\n", h)
	}
	return err
}

// queueHints are the hints of the daemon's view (of the view, then of each
// target), or, when it gives none, the command that makes an attempt now for each
// target that waits.
func queueHints(l *client.TargetList) []string {
	var hints []string
	add := func(h string) {
		if h = oneLine(h); h != "" && !slices.Contains(hints, h) {
			hints = append(hints, h)
		}
	}
	add(l.Hint)
	for _, t := range l.Targets {
		add(t.Hint)
	}
	if len(hints) > 0 {
		return hints
	}
	for _, t := range l.Targets {
		if t.State == "backing-off" || t.State == "unreachable" {
			add("make an attempt to " + t.RelayURL + " now with: sealbridge retry --target " + shellQuote(t.RelayURL))
		}
	}
	return hints
}

// printQueue prints one row per target, then the pending envelopes by age (like
// qshape), each target's row and a TOTAL row.
func printQueue(stdout io.Writer, l *client.TargetList, wide bool) error {
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
		state, reason := shortTargetState(&t, l.At), shortReason(t.LastError)
		if wide {
			state, reason = targetState(&t, l.At), oneLine(t.LastError)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n", t.RelayURL, t.Pending, t.Held, t.InFlight, t.Bytes,
			oldest, t.Attempts, state, reason)
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

// shortTargetState says a target's state with its times relative to at (the
// view's time): "backing off, next in 4m12s", "unreachable for 3s, probe in
// 4m57s", "ready", "held".
func shortTargetState(t *client.Target, at time.Time) string {
	switch t.State {
	case "backing-off":
		return "backing off, next " + relTime(t.BackoffUntil, at)
	case "unreachable":
		return "unreachable for " + at.Sub(t.UnreachableSince).Round(time.Second).String() + ", probe " + relTime(t.NextProbeAt, at)
	}
	return t.State
}

// relTime is x relative to at: "in 4m12s", "3s ago", "now"; "" for no time.
func relTime(x, at time.Time) string {
	if x.IsZero() {
		return ""
	}
	d := x.Sub(at).Round(time.Second)
	switch {
	case d > 0:
		return "in " + d.String()
	case d < 0:
		return (-d).String() + " ago"
	}
	return "now"
}

// shortReason is the gist of an attempt's error: its outcome (the first part of
// the chain) and its cause (the last), as postqueue -p shows "(connect to …:
// Connection refused)": "relay unreachable: connection refused", at most 60
// characters.
func shortReason(s string) string {
	s = oneLine(s)
	parts := strings.Split(s, ": ")
	if len(parts) > 2 {
		s = parts[0] + ": " + parts[len(parts)-1]
	}
	if r := []rune(s); len(r) > 60 {
		s = string(r[:59]) + "…"
	}
	return s
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
