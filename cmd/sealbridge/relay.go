package main

import (
	"context"
	"flag"
	"io"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/buildinfo"
	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

// relayFlags are the flags of sealbridge relay.
type relayFlags struct {
	listen, home string
	log          *cli.LogFlags
	backend      *relay.BackendFlags
	limits       *relay.LimitFlags
}

func relayCommand() *cobra.Command {
	c := &cobra.Command{
		Use: "relay [--listen 127.0.0.1:8470] [--home DIR] [--log-format text|json] [--log-level L] " +
			"[--backend file|jetstream --nats-url URLS …] [limit flags]",
		Short: "run a reference relay in the foreground",
		Long: `Runs a reference relay in the foreground (the same relay as sealbridge-relay). Its
key is <home>/relay-identity.pem, created on first start. It prints
"listening http://ADDR" and "relay DID"; SIGINT or SIGTERM stops it. The storage
flags are described in docs/RELAY.md "Storage backends", the limits in "Limits".`,
		Example: "  sealbridge relay --listen 127.0.0.1:8470 --home ~/sb-relay",
		Args:    cli.NoArgs,
	}
	var f relayFlags
	fl := c.Flags()
	cli.NonEmptyVar(fl, &f.listen, "listen", relay.DefaultListen, "`ADDR` to listen on (port 0: any)")
	cli.HomeFlag(fl, &f.home)
	_ = c.MarkFlagDirname("home")
	f.log = cli.AddLogFlags(fl)
	gfs := flag.NewFlagSet("relay", flag.ContinueOnError)
	f.backend = relay.AddBackendFlags(gfs)
	f.limits = relay.AddLimitFlags(gfs)
	_, _ = cli.AddGoFlags(fl, gfs, relay.BackendFlagsUsage+relay.LimitFlagsUsage) // TestRelayFlagsDescribed
	c.RunE = func(c *cobra.Command, _ []string) error {
		return runRelay(c.Context(), f, c.OutOrStdout(), c.ErrOrStderr())
	}
	return cli.Annotate(c, cli.AnnotExit, exitLineOK+"  1   failure: cannot listen, cannot open its key or store, or serving failed\n"+exitLineUsage)
}

func runRelay(ctx context.Context, f relayFlags, stdout, stderr io.Writer) error {
	listen, home, logFlags, backendFlags, limitFlags := f.listen, f.home, f.log, f.backend, f.limits
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
	return relay.Command{Name: "sealbridge relay", Listen: listen, Home: home,
		Version: buildinfo.Version(), Logger: log, Backend: backendFlags, Limits: limitFlags}.Run(ctx, stdout)
}
