// Command sealbridge-relay runs sealbridge's reference relay (docs/RELAY.md).
//
//	sealbridge-relay [--listen 127.0.0.1:8470] [--home DIR] [--identity-file FILE] [storage flags] [limit flags]
//	sealbridge-relay --version
//
// On first start it creates the relay identity (a PKCS#8 PEM key file, mode
// 0600, default DIR/relay-identity.pem); afterwards it loads it. DIR defaults to
// the data root, as for "sealbridge relay". It prints
// "listening http://ADDR" and "relay DID" on standard output, logs to standard
// error, and shuts down gracefully on SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/buildinfo"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// relayFlags are the command line's flags.
type relayFlags struct {
	listen, home, idFile string
	log                  *cli.LogFlags
	backend              *relay.BackendFlags
	limits               *relay.LimitFlags
	version              bool
}

// newRoot is the command line: its flags, help and exit statuses, from which the
// help, the completions and the man page are made.
func newRoot(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use: "sealbridge-relay [--listen ADDR] [--home DIR] [--identity-file FILE] [--log-format text|json] [--log-level L] " +
			"[--backend file|jetstream --nats-url URLS …] [limit flags]",
		Short: "sealbridge's reference relay",
		Long: `Runs sealbridge's reference relay (docs/RELAY.md) in the foreground: it prints
"listening http://ADDR" and "relay DID" on standard output and logs on standard
error; SIGTERM or SIGINT stops it gracefully. "sealbridge relay" runs the same relay.
It also serves GET /livez, /readyz and /metrics (docs/RELAY.md "Operations").
The storage flags are described in docs/RELAY.md "Storage backends", the limits in
"Limits".`,
		Example: `  sealbridge-relay --home ~/sb-relay
  sealbridge-relay --listen 0.0.0.0:8470 --home /var/lib/sealbridge-relay --log-format json
  SEALBRIDGE_NATS_CREDS=~/sb-relay/relay.creds sealbridge-relay --backend jetstream \
      --nats-url nats://n1:4222,nats://n2:4222,nats://n3:4222`,
		Args: cli.NoArgs,
	}
	cli.Annotate(c, cli.AnnotSynopsis, "--version\ncompletion bash|zsh|fish")
	cli.Annotate(c, cli.AnnotExit, `  0   stopped by SIGTERM or SIGINT (or --help, --version)
  1   failure: cannot listen, cannot open its key or store (a JetStream stream
      neither replicated nor synced on every write is refused), or serving failed
  2   usage error
`)
	var f relayFlags
	fs := c.Flags()
	cli.NonEmptyVar(fs, &f.listen, "listen", relay.DefaultListen, "`ADDR` to listen on (port 0: any)")
	cli.NonEmptyVar(fs, &f.home, "home", "", "the data root `DIR`: the relay's store and inboxes (default: $SEALBRIDGE_HOME, else $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge)")
	cli.NonEmptyVar(fs, &f.idFile, "identity-file", "", "the relay's key `FILE` (default DIR/relay-identity.pem; created if absent)")
	_ = c.MarkFlagDirname("home")
	_ = c.MarkFlagFilename("identity-file")
	f.log = cli.AddLogFlags(fs)
	gfs := flag.NewFlagSet("sealbridge-relay", flag.ContinueOnError)
	f.backend = relay.AddBackendFlags(gfs)
	f.limits = relay.AddLimitFlags(gfs)
	_, _ = cli.AddGoFlags(fs, gfs, relay.BackendFlagsUsage+relay.LimitFlagsUsage) // TestRelayFlagsDescribed
	fs.BoolVar(&f.version, "version", false, "print the version and exit")
	c.RunE = func(*cobra.Command, []string) error { return serve(ctx, f, stdout, stderr) }
	return c
}

// prog is this binary's conventions (internal/cli).
var prog = cli.Program{Name: "sealbridge-relay", UsageExit: 2, ManSection: "8", Version: version()}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := prog.Execute(ctx, newRoot(ctx, stdout, stderr), args, stdout, stderr)
	prog.Report(stderr, err)
	return prog.Exit(err, 1)
}

// serve runs the relay the flags describe until ctx ends.
func serve(ctx context.Context, f relayFlags, stdout, stderr io.Writer) error {
	listen, home, idFile, logFlags, backendFlags, limitFlags := f.listen, f.home, f.idFile, f.log, f.backend, f.limits
	if f.version {
		fmt.Fprintf(stdout, "sealbridge-relay %s\n", version())
		return nil
	}
	if err := limitFlags.Check(); err != nil {
		return cli.AsUsage(err)
	}
	if err := backendFlags.Check(); err != nil {
		return cli.AsUsage(err)
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return err
	}
	return relay.Command{Name: "sealbridge-relay", Listen: listen, Home: home, KeyFile: idFile,
		Version: version(), Logger: log, Backend: backendFlags, Limits: limitFlags}.Run(ctx, stdout)
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }
