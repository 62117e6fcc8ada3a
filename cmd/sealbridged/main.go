// Command sealbridged is sealbridge's daemon: one identity's outbox, its carrier and
// the local API on a unix socket (docs/DAEMON.md).
//
//	sealbridged --home DIR [--identity NAME] [--log-format text|json] [--log-level L]
//	sealbridged --version
//
// SIGTERM or SIGINT drains in-flight attempts (bounded) and exits 0. A second daemon
// for the same identity exits 1 with "already running (pid N)".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/sealbridge/sealbridge/internal/buildinfo"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: sealbridged --home DIR [--identity NAME] [--log-format text|json]
       sealbridged --version

  --home DIR           data root (default $SEALBRIDGE_HOME, $XDG_STATE_HOME/sealbridge,
                       ~/.local/state/sealbridge)
  --identity NAME      identity to serve (default "default"; create it with sealbridge init)
  --log-format FORMAT  text or json (default text)
  --log-level LEVEL    debug, info, warn or error (default info)
  --drain-timeout D    bound on draining in-flight attempts at shutdown (default 10s)
  --send-timeout D     bound on one relay attempt (default 150s)
  --lease-for D        lease an attempt takes on its envelopes (default send timeout + 30s)
  --inbox-relay URL    follow this relay's inbox: receive messages and delivery
                       confirmations (default: none, send only)
  --poll-every D       period of inbox fetches (default 1s)
  --version            print the version and exit
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sealbridged", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	home := fs.String("home", "", "")
	name := fs.String("identity", daemon.DefaultIdentity, "")
	logFormat := fs.String("log-format", "text", "")
	logLevel := fs.String("log-level", "info", "")
	drain := fs.Duration("drain-timeout", daemon.DefaultDrainTimeout, "")
	sendTimeout := fs.Duration("send-timeout", 0, "")
	leaseFor := fs.Duration("lease-for", 0, "")
	inboxRelay := fs.String("inbox-relay", "", "")
	pollEvery := fs.Duration("poll-every", 0, "")
	showVersion := fs.Bool("version", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return 0
		}
		fmt.Fprintf(stderr, "sealbridged: %v\n%s", err, usage)
		return 2
	}
	if *showVersion {
		fmt.Fprintf(stdout, "sealbridged %s\n", version())
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sealbridged: no arguments are taken\n%s", usage)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "sealbridged: --log-level: %v\n", err)
		return 2
	}
	hopts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	switch *logFormat {
	case "text":
		log = slog.New(slog.NewTextHandler(stderr, hopts))
	case "json":
		log = slog.New(slog.NewJSONHandler(stderr, hopts))
	default:
		fmt.Fprintf(stderr, "sealbridged: --log-format must be text or json\n")
		return 2
	}
	d, err := daemon.New(daemon.Options{Home: *home, Identity: *name, Logger: log, DrainTimeout: *drain,
		Version: version(), Carrier: carrier.Options{SendTimeout: *sendTimeout, LeaseFor: *leaseFor},
		InboxRelay: *inboxRelay, PollEvery: *pollEvery})
	if err != nil {
		fmt.Fprintf(stderr, "sealbridged: %v\n", err)
		return 1
	}
	if err := d.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "sealbridged: %v\n", err)
		return 1
	}
	return 0
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }
