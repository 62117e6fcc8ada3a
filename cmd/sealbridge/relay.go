package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

// relayKeyFile is the reference relay's key under its data root (the same name
// sealbridge-relay uses, so both serve the same relay from one directory).
const relayKeyFile = "relay-identity.pem"

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
	// Bound first, then connected and checked: a relay that cannot listen, or
	// whose JetStream is refused, creates nothing (no data root, key or store).
	ln, err := relay.Listen(listen, limitFlags.MaxConns)
	if err != nil {
		return err
	}
	defer ln.Close()
	ropts := relay.Options{Logger: log, Limits: limitFlags.Limits}
	closeConn, err := backendFlags.Open(&ropts, "sealbridge relay")
	if err != nil {
		return err
	}
	defer closeConn()
	root, err := dataroot.Resolve(home)
	if err != nil {
		return withHint(err, "give --home DIR")
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	if err := dataroot.CheckRoot(root); err != nil {
		return err
	}
	keyFile := filepath.Join(root, relayKeyFile)
	id, created, err := relay.LoadOrCreateIdentity(keyFile)
	if err != nil {
		return err
	}
	if created {
		log.Info("relay: created identity", "file", keyFile, "did", string(id.DID()))
	}
	ropts.Identity, ropts.Home = id, root
	r, err := relay.New(ropts) // a JetStream refusal carries its hint
	if err != nil {
		return err
	}
	defer r.Close()
	srv := newRelayServer(r, log)
	fmt.Fprintf(stdout, "listening http://%s\n", ln.Addr())
	fmt.Fprintf(stdout, "relay %s\n", id.DID())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("relay: serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("relay: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("relay: shutdown: %w", err)
	}
	log.Info("relay: stopped", "accepted", r.Stats().Accepted, "duplicates", r.Stats().Duplicates)
	return nil
}

// newRelayServer is the HTTP server of a reference relay.
func newRelayServer(r *relay.Relay, log *slog.Logger) *http.Server {
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
	return srv
}
