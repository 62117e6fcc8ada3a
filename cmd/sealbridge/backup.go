package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/bytesize"
	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// backupExit is the exit table of backup.
const backupExit = exitLineOK +
	"  1   failure: the store could not be read whole (OUTBOX_STORE_BUSY: its lock,\n" +
	"      or it changed faster than the copy; OUTBOX_STORE_INVALID: a file that does\n" +
	"      not verify, run sealbridge-fsck) or DEST could not be written\n" +
	"      (OUTBOX_STORE_UNWRITABLE); nothing is left at DEST\n" +
	"  2   usage error, or DEST unusable: it exists, its parent is missing, not a\n" +
	"      directory of yours, a symbolic link or writable by others, or it lies in\n" +
	"      the store; nothing was written\n"

func backupCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "backup DEST [--home DIR] [--identity NAME] [--scan]",
		Short: "copy the identity's store to DEST, consistently, while the daemon runs",
		Long: `Copies the identity's store directory to DEST, a directory that must not exist
(its parent must: a directory of yours, not a symbolic link). It opens the store
itself, through the store lock, so it runs beside a running daemon (sealbridged) and
needs none: the daemon's writes go on and wait for the lock only during the short
final hold.

The copy is the store as it was at one instant of that hold: every record file,
sealed body (blob) and the store's head, byte for byte, each verified; never the
lock, the generation file, staged temps, partial downloads or lost+found. It is made
in a private temporary directory beside DEST (files 0600, directories 0700, every
one fsynced) and renamed to DEST only when whole: on any failure nothing is left at
DEST.

To restore: stop the daemon, move the store directory aside, move DEST to its place
(the command prints both paths), start the daemon. A store changed after the copy
was made is then behind its head's witness: the daemon refuses it
(STORE_ROLLED_BACK) until sealbridge-fsck --reconcile brings it forward. See
docs/DAEMON.md "Back up and restore".

--scan finds the files changed during the copy by comparing every file's
fingerprint instead of by inotify (for a store on a network file system that other
hosts write, whose changes inotify does not see); its final hold grows with the
store.`,
		Example: `  sealbridge backup --home ~/sb --identity alice ~/backups/alice-2026-12-02
  sealbridge backup /mnt/usb/sealbridge-$(date +%F)`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("backup: give exactly one DEST, a directory that does not exist yet")
			}
			if args[0] == "" {
				return usageErrorf("backup: DEST is empty")
			}
			return nil
		},
	}
	w := identityFlags(c)
	scan := c.Flags().Bool("scan", false, "find changes by comparing fingerprints, not by inotify (network file systems)")
	_ = c.MarkFlagDirname("home")
	c.RunE = func(c *cobra.Command, args []string) error {
		return runBackup(c.Context(), w, args[0], *scan, c.OutOrStdout())
	}
	return cli.Annotate(c, cli.AnnotExit, backupExit)
}

func runBackup(ctx context.Context, w *who, dest string, scan bool, stdout io.Writer) error {
	if err := w.resolve(); err != nil {
		return err
	}
	id, err := w.load()
	if err != nil {
		return err
	}
	s, err := store.Open(id.Signer(), store.Options{Home: w.root})
	if err != nil {
		return err
	}
	rep, err := s.Backup(ctx, dest, store.BackupOptions{Scan: scan})
	var de *store.BackupDestError
	if errors.As(err, &de) {
		return cli.AsUsage(err)
	}
	if err != nil {
		return err
	}
	holds := plural(rep.Holds, "hold", "holds")
	fmt.Fprintf(stdout, "copied %s (%s) of %s to %s\n", plural(rep.Files, "file", "files"), bytesize.Format(rep.Bytes), s.Dir(), rep.Dest)
	fmt.Fprintf(stdout, "the copy is the store as of the backup's last lock hold (%s, longest %s)\n", holds, rep.LongestHold.Round(1000))
	fmt.Fprintf(stdout, "to restore it: stop sealbridged %s, then\n", w.flags())
	fmt.Fprintf(stdout, "  mv %s %s\n", shellQuote(s.Dir()), shellQuote(s.Dir()+".old"))
	fmt.Fprintf(stdout, "  mv %s %s\n", shellQuote(rep.Dest), shellQuote(s.Dir()))
	fmt.Fprintf(stdout, "and start it again; if the store changed after this copy, the daemon refuses it (STORE_ROLLED_BACK)\n")
	fmt.Fprintf(stdout, "until: sealbridge-fsck --reconcile %s\n", w.flags())
	return nil
}
