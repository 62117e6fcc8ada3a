package main

import (
	"context"

	"github.com/spf13/cobra"

	"encoding/json"
	"errors"
	"fmt"
	"github.com/sealbridge/sealbridge/internal/cli"
	"io"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
)

// watchWait is the long poll of each request.
const watchWait = 30 * time.Second

// watch follows the daemon's change feed, one line per change, until
// interrupted. A reset (no cursor yet, a restarted daemon, a cursor past the
// retained window) prints a line saying so with the size of the current snapshot
// (the sent messages `ls` lists) and continues from the new cursor.
func watchCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "watch [--topics messages,outbox,receipts,observations] [--json] [--home DIR] [--identity NAME]",
		Short: "follow the daemon's change feed: TIME TOPIC ID STATE per change",
		Long: `Follows the daemon's change feed until interrupted, one line per change:
TIME TOPIC ID STATE. A reset (a restarted daemon, a cursor too old) prints a line
saying so and continues.`,
		Example: "  sealbridge watch --home ~/sb --identity alice --topics messages",
		Args:    cli.NoArgs,
	}
	w := identityFlags(c)
	topicsFlag := c.Flags().String("topics", "", "only these topics, comma-separated (`T,…`; default: all): "+strings.Join(client.Topics, ", "))
	asJSON := c.Flags().Bool("json", false, "JSON lines: one object per change")
	_ = c.RegisterFlagCompletionFunc("topics", cobra.FixedCompletions(client.Topics, cobra.ShellCompDirectiveNoFileComp))
	c.RunE = func(c *cobra.Command, _ []string) error {
		return runWatch(c.Context(), w, *topicsFlag, *asJSON, c.OutOrStdout())
	}
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit,
		"  0   interrupted (SIGINT or SIGTERM)\n  1   failure\n"+exitLineUsage+exitLineNoDaemon)
}

func runWatch(ctx context.Context, w *who, topicsFlag string, asJSON bool, stdout io.Writer) error {
	var topics []string
	if topicsFlag != "" {
		for t := range strings.SplitSeq(topicsFlag, ",") {
			t = strings.TrimSpace(t)
			ok := false
			for _, x := range client.Topics {
				ok = ok || x == t
			}
			if !ok {
				return usageErrorf("watch: unknown topic %q (topics: %s)", t, strings.Join(client.Topics, ","))
			}
			topics = append(topics, t)
		}
	}
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	cursor := ""
	for {
		p, err := d.c.Changes(ctx, cursor, topics, watchWait)
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return nil // interrupted: a normal end
			}
			return d.explain(err)
		}
		if p.Reset {
			n, err := snapshotSize(ctx, d.c)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return d.explain(err)
			}
			if asJSON {
				if err := enc.Encode(map[string]any{"reset": true, "reason": p.Reason, "snapshotMessages": n}); err != nil {
					return err
				}
			} else if _, err := fmt.Fprintf(stdout, "%s reset (%s): snapshot of %s; following changes\n",
				time.Now().UTC().Format(time.RFC3339Nano), p.Reason, plural(n, "message", "messages")); err != nil {
				return err
			}
		}
		for _, c := range p.Changes {
			if asJSON {
				err = enc.Encode(c)
			} else {
				_, err = fmt.Fprintf(stdout, "%s %s %s %s\n", c.At.UTC().Format(time.RFC3339Nano), c.Topic, c.ID, c.State)
			}
			if err != nil {
				return err
			}
		}
		cursor = p.Cursor
	}
}

// snapshotSize counts the sent messages, as `sealbridge ls` would list them.
func snapshotSize(ctx context.Context, c *client.Client) (int, error) {
	n, after := 0, ""
	for {
		l, err := c.Messages(ctx, "", 1000, after)
		if err != nil {
			return 0, err
		}
		n += len(l.Messages)
		if l.Next == "" {
			return n, nil
		}
		after = l.Next
	}
}
