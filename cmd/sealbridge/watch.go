package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
)

// watchWait is the long poll of each request.
const watchWait = 30 * time.Second

// cmdWatch: sealbridge watch [--topics T,…] [--json] — follows the daemon's change
// feed, one line per change, until interrupted. A reset (no cursor yet, a restarted
// daemon, a cursor past the retained window) prints a line saying so with the size
// of the current snapshot (the sent messages `ls` lists) and continues from the new
// cursor.
func cmdWatch(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("watch")
	w := identityFlags(fs)
	topicsFlag := fs.String("topics", "", "")
	asJSON := fs.Bool("json", false, "")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	var topics []string
	if *topicsFlag != "" {
		for t := range strings.SplitSeq(*topicsFlag, ",") {
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
			if *asJSON {
				if err := enc.Encode(map[string]any{"reset": true, "reason": p.Reason, "snapshotMessages": n}); err != nil {
					return err
				}
			} else if _, err := fmt.Fprintf(stdout, "%s reset (%s): snapshot of %d messages; following changes\n",
				time.Now().UTC().Format(time.RFC3339Nano), p.Reason, n); err != nil {
				return err
			}
		}
		for _, c := range p.Changes {
			if *asJSON {
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
