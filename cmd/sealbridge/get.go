package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

func getCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "get MESSAGE-ID [--out FILE] [--home DIR] [--identity NAME]",
		Short: "write a received message's body to standard output or --out FILE",
		Long: `Writes the body of a received message (sealbridge inbox lists them) to standard
output, or to FILE with --out, streamed: a large body is never held in memory, and
each of its 64 KiB chunks is verified before it is written. A body that does not
verify (a chunk altered, missing or out of order in the daemon's store) ends the
command with exit 1 and BODY_CHUNK_INVALID: on standard output the verified bytes
before it have been written; with --out nothing is left, for the body goes to a
temporary file beside FILE (mode 0600), is fsynced, and replaces FILE only once it
is complete and verified.`,
		Example: `  sealbridge get --home ~/sb --identity bob 0190b6a4-… > report.pdf
  sealbridge get 0190b6a4-… --out report.pdf`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("get: give exactly one message ID")
			}
			return checkMessageID("get", args[0])
		},
	}
	w := identityFlags(c)
	out := c.Flags().String("out", "", "write the body to `FILE` (replaced only once the whole body arrived and verified)")
	_ = c.MarkFlagFilename("out")
	c.RunE = func(c *cobra.Command, args []string) error {
		return runGet(c.Context(), w, args[0], *out, c.OutOrStdout())
	}
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit,
		daemonExit("failure: no such received message, or a body that does not verify (BODY_CHUNK_INVALID)"))
}

func runGet(ctx context.Context, w *who, id, out string, stdout io.Writer) error {
	if out == "-" {
		out = ""
	}
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	body, err := d.c.Body(ctx, id)
	if err != nil {
		return d.explainGet(err)
	}
	defer body.Close()
	if out == "" {
		if _, err := io.Copy(stdout, body); err != nil {
			return d.explainGet(err)
		}
		return nil
	}
	return d.explainGet(writeOut(out, body))
}

// writeOut writes r to the file path: to a fresh temp (mode 0600) beside it, fsynced,
// then renamed over path and the directory fsynced — all through internal/fsx. If r
// fails (or anything else does) the temp is removed and path is left as it was.
func writeOut(path string, r io.Reader) (err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	dir, base := filepath.Split(abs)
	if base == "" || fsx.CheckBase(base) != nil {
		return usageErrorf("get: --out %q is not a file name", path)
	}
	fsys := fsx.NewOS(dir)
	defer fsys.Close()
	tmp := fsx.TempName()
	f, err := fsys.OpenFile(tmp, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("get: --out %s: %w", path, err)
	}
	published := false
	defer func() {
		if !published {
			_ = fsys.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("get: --out %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("get: --out %s: %w", path, err)
	}
	if err := fsys.Rename(tmp, base); err != nil {
		return fmt.Errorf("get: --out %s: %w", path, err)
	}
	published = true
	if err := fsys.SyncDir("."); err != nil {
		return fmt.Errorf("get: --out %s: %w", path, err)
	}
	return nil
}

// explainGet is explain for get: a missing message points at the inbox, and a body
// that does not verify at fsck.
func (d *daemonConn) explainGet(err error) error {
	var ce *client.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce) && ce.Status == http.StatusNotFound:
		return withHint(err, "list received messages with: sealbridge inbox %s", d.w.flags())
	case errors.Is(err, errcode.BodyChunkInvalid), errors.Is(err, errcode.BodyMissing), errors.Is(err, errcode.BodySizeMismatch):
		return withHint(err, "the body's sealed blob in the daemon's store is damaged; check the store with: sealbridge-fsck %s", d.w.flags())
	}
	return d.explain(err)
}
