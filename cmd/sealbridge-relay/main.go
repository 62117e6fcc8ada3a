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
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/buildinfo"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
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
	// Bound first: a relay that cannot listen creates nothing (no data root,
	// key, store or stream).
	ln, err := relay.Listen(listen, limitFlags.MaxConns)
	if err != nil {
		return err
	}
	defer ln.Close()
	// Connected and checked before anything is created (a refused JetStream
	// leaves no data root or key either).
	ropts := relay.Options{Logger: log, Limits: limitFlags.Limits, Version: version()}
	closeConn, err := backendFlags.Open(&ropts, "sealbridge-relay")
	if err != nil {
		return err
	}
	defer closeConn()
	root, err := dataroot.Resolve(home)
	if err != nil {
		return errcode.WithHint(err, "give --home DIR")
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	if err := dataroot.CheckRoot(root); err != nil {
		return err
	}
	if idFile == "" {
		idFile = filepath.Join(root, "relay-identity.pem")
	}
	id, created, err := relay.LoadOrCreateIdentity(idFile)
	if err != nil {
		return err
	}
	if created {
		log.Info("relay: created identity", "file", idFile, "did", string(id.DID()))
	}
	ropts.Identity, ropts.Home = id, root
	r, err := relay.New(ropts) // a JetStream refusal carries its hint
	if err != nil {
		return err
	}
	defer r.Close()
	srv := &http.Server{
		Handler:           r.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	// A held inbox fetch extends its own deadlines past its wait (at most
	// relayproto.MaxInboxWait); on shutdown the held fetches answer at once.
	srv.RegisterOnShutdown(r.StopWaiting)
	fmt.Fprintf(stdout, "listening http://%s\n", ln.Addr())
	fmt.Fprintf(stdout, "relay %s\n", id.DID())
	if f, ok := stdout.(*os.File); ok {
		_ = f.Sync()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("relay: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("relay: stopped", "accepted", r.Stats().Accepted)
	return nil
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }
