// Command sealbridged is sealbridge's daemon: one identity's outbox, its carrier and
// the local API on a unix socket (docs/DAEMON.md).
//
//	sealbridged [--home DIR] [--identity NAME] [--log-format text|json] [--log-level L]
//	sealbridged --version
//
// SIGTERM or SIGINT drains in-flight attempts (bounded) and exits 0. A second daemon
// for the same identity exits 1 with "already running (pid N)"; an invalid flag or
// option exits 2. Errors are printed as "sealbridged: error:" and "sealbridged: hint:"
// lines.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/buildinfo"
	"github.com/sealbridge/sealbridge/internal/dataroot"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// newRoot is the command line: its flags, help and exit statuses, from which the
// help, the completions and the man page are made.
func newRoot(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "sealbridged [--home DIR] [--identity NAME] [--log-format text|json] [--log-level L] [--inbox-relay URL] [flags]",
		Short: "one identity's daemon: its outbox, its carrier and the local API",
		Long: `Runs one identity's daemon: its outbox, the carrier that relays it, and the local
API on a unix socket (docs/DAEMON.md). SIGTERM or SIGINT drains in-flight attempts
and exits 0. A second daemon for the same identity exits 1 with "already running
(pid N)"; a store found older than its last witnessed head exits 3
(STORE_ROLLED_BACK) and is not changed.`,
		Example: `  sealbridged --home ~/sb --identity alice
  sealbridged --identity bob --inbox-relay http://127.0.0.1:8470 --log-format json`,
		Args: cli.NoArgs,
	}
	cli.Annotate(c, cli.AnnotSynopsis, "--version\ncompletion bash|zsh|fish")
	cli.Annotate(c, cli.AnnotExit, `  0   stopped by SIGTERM or SIGINT after draining (or --help, --version)
  1   failure: the daemon could not start (no identity, already running, …) or failed
  2   usage error: a flag or option value is invalid
  3   the store is rolled back (STORE_ROLLED_BACK): it is older than a head it signed
      earlier, kept by the local witness or a relay; run sealbridge-fsck --reconcile
`)
	fs := c.Flags()
	var home, name string
	cli.HomeFlag(fs, &home)
	cli.IdentityFlag(fs, &name)
	_ = c.MarkFlagDirname("home")
	logFlags := cli.AddLogFlags(fs)
	drain := fs.Duration("drain-timeout", daemon.DefaultDrainTimeout, "bound `D` on draining in-flight attempts at shutdown")
	sendTimeout := fs.Duration("send-timeout", 0, "bound `D` on one relay attempt (default 150s)")
	leaseFor := fs.Duration("lease-for", 0, "the lease `D` an attempt takes on its envelopes (default send timeout + 30s)")
	inboxRelay := fs.String("inbox-relay", "", "follow this relay's inbox (`URL`): receive messages and delivery confirmations (default: none, send only)")
	pollEvery := fs.Duration("poll-every", 0, "least spacing `D` of empty inbox fetches, which are long polls (default 1s)")
	keepDelivered := fs.Duration("delivered-retention", 0, "keep a delivered message's record this long (`D`) after its delivery (default 24h)")
	keepClosed := fs.Duration("closed-retention", 0, "keep a closed (failed or cancelled) message's record, and a refused inbound envelope's, this long (`D`; default 168h)")
	var maxBody int64
	cli.SizeVar(fs, &maxBody, "max-body", daemon.DefaultMaxBody,
		"bound `SIZE` on a large message body sent or received, counted sealed (the body plus 16 bytes per 64 KiB), e.g. 4GiB or 512MiB")
	showVersion := fs.Bool("version", false, "print the version and exit")
	c.RunE = func(*cobra.Command, []string) error {
		if *showVersion {
			fmt.Fprintf(stdout, "sealbridged %s\n", version())
			return nil
		}
		log, err := logFlags.Logger(stderr)
		if err != nil {
			return err
		}
		d, err := daemon.New(daemon.Options{Home: home, Identity: name, Logger: log, DrainTimeout: *drain,
			Version: version(), Carrier: carrier.Options{SendTimeout: *sendTimeout, LeaseFor: *leaseFor},
			InboxRelay: *inboxRelay, PollEvery: *pollEvery, DeliveredRetention: *keepDelivered, ClosedRetention: *keepClosed,
			MaxBody: maxBody})
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) && errcode.HintOf(err) == "" {
				if root, rerr := dataroot.Resolve(home); rerr == nil {
					err = errcode.WithHint(err, "create it with: sealbridge init --home "+cli.ShellQuote(root)+" --identity "+cli.ShellQuote(name))
				}
			}
			return reconcileHint(home, name, err)
		}
		return reconcileHint(home, name, d.Run(ctx))
	}
	return c
}

// reconcileHint gives a STORE_ROLLED_BACK refusal the exact command that ends it,
// naming this daemon's data root and identity (the store's own hint cannot: it
// knows only its directory).
func reconcileHint(home, name string, err error) error {
	if !errors.Is(err, errcode.StoreRolledBack) {
		return err
	}
	root, rerr := dataroot.Resolve(home)
	if rerr != nil {
		return err
	}
	return errcode.WithHint(err, "the store was restored from an older copy: bring it forward with: sealbridge-fsck --reconcile --home "+
		cli.ShellQuote(root)+" --identity "+cli.ShellQuote(name)+" (it never sends an envelope twice), then start sealbridged again")
}

// prog is this binary's conventions (internal/cli).
var prog = cli.Program{Name: "sealbridged", UsageExit: 2, ManSection: "8", Version: version()}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := prog.Execute(ctx, newRoot(ctx, stdout, stderr), args, stdout, stderr)
	var oe *daemon.OptionError
	if errors.As(err, &oe) {
		err = cli.AsUsage(err) // found by the daemon, but a usage error all the same
	}
	prog.Report(stderr, err)
	if errors.Is(err, errcode.StoreRolledBack) {
		return exitRolledBack
	}
	return prog.Exit(err, 1)
}

// exitRolledBack is the exit status of a daemon that found its store rolled back: a
// supervisor must not restart it (docs/systemd: RestartPreventExitStatus=3).
const exitRolledBack = 3

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }
