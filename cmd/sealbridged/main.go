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
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"os/signal"
	"syscall"

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

const usage = `usage: sealbridged [--home DIR] [--identity NAME] [--log-format text|json] [--log-level L]
                   [--inbox-relay URL] [flags]
       sealbridged --version

Runs one identity's daemon: its outbox, the carrier that relays it, and the local
API on a unix socket (docs/DAEMON.md). SIGTERM or SIGINT drains in-flight attempts
and exits 0.

  --home DIR           the data root (default: $SEALBRIDGE_HOME, else
                       $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge)
  --identity NAME      identity to serve (default: $SEALBRIDGE_IDENTITY, else
                       "default"; create it with sealbridge init)
  --log-format FORMAT  text or json (default text)
  --log-level LEVEL    debug, info, warn or error (default info)
  --drain-timeout D    bound on draining in-flight attempts at shutdown (default 10s)
  --send-timeout D     bound on one relay attempt (default 150s)
  --lease-for D        lease an attempt takes on its envelopes (default send timeout + 30s)
  --inbox-relay URL    follow this relay's inbox: receive messages and delivery
                       confirmations (default: none, send only)
  --poll-every D       least spacing of empty inbox fetches, which are long polls (default 1s)
  --delivered-retention D
                       keep a delivered message's record this long after its
                       delivery (default 24h)
  --closed-retention D keep a closed (failed or cancelled) message's record, and a
                       refused inbound envelope's, this long (default 168h)
  --version            print the version and exit

Examples:
  sealbridged --home ~/sb --identity alice
  sealbridged --identity bob --inbox-relay http://127.0.0.1:8470 --log-format json

Exit status:
  0   stopped by SIGTERM or SIGINT after draining (or --help, --version)
  1   failure: the daemon could not start (no identity, already running, …) or failed
  2   usage error: a flag or option value is invalid
`

// prog is this binary's conventions (internal/cli).
var prog = cli.Program{Name: "sealbridged", UsageExit: 2}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := runErr(ctx, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	var oe *daemon.OptionError
	if errors.As(err, &oe) {
		err = cli.AsUsage(err) // found by the daemon, but a usage error all the same
	}
	prog.Report(stderr, err)
	return prog.Exit(err, 1)
}

func runErr(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sealbridged", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var home, name string
	cli.HomeFlag(fs, &home)
	cli.IdentityFlag(fs, &name)
	logFlags := cli.AddLogFlags(fs)
	drain := fs.Duration("drain-timeout", daemon.DefaultDrainTimeout, "")
	sendTimeout := fs.Duration("send-timeout", 0, "")
	leaseFor := fs.Duration("lease-for", 0, "")
	inboxRelay := fs.String("inbox-relay", "", "")
	pollEvery := fs.Duration("poll-every", 0, "")
	keepDelivered := fs.Duration("delivered-retention", 0, "")
	keepClosed := fs.Duration("closed-retention", 0, "")
	showVersion := fs.Bool("version", false, "")
	pos, err := cli.ParseFlags(fs, args)
	if err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintf(stdout, "sealbridged %s\n", version())
		return nil
	}
	if len(pos) > 0 {
		return cli.Usagef("unexpected argument %q: sealbridged takes flags only", pos[0])
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return err
	}
	d, err := daemon.New(daemon.Options{Home: home, Identity: name, Logger: log, DrainTimeout: *drain,
		Version: version(), Carrier: carrier.Options{SendTimeout: *sendTimeout, LeaseFor: *leaseFor},
		InboxRelay: *inboxRelay, PollEvery: *pollEvery, DeliveredRetention: *keepDelivered, ClosedRetention: *keepClosed})
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) && errcode.HintOf(err) == "" {
			if root, rerr := dataroot.Resolve(home); rerr == nil {
				err = errcode.WithHint(err, "create it with: sealbridge init --home "+cli.ShellQuote(root)+" --identity "+cli.ShellQuote(name))
			}
		}
		return err
	}
	return d.Run(ctx)
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }
