// Command sealbridge-relay runs sealbridge's reference relay (docs/RELAY.md).
//
//	sealbridge-relay --listen 127.0.0.1:0 --home DIR [--identity-file FILE]
//	sealbridge-relay --version
//
// On first start it creates the relay identity (a PKCS#8 PEM key file, mode
// 0600, default DIR/relay-identity.pem); afterwards it loads it. It prints
// "listening http://ADDR" and "relay DID" on standard output, logs to standard
// error, and shuts down gracefully on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/sealbridge/sealbridge/internal/buildinfo"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: sealbridge-relay --listen ADDR --home DIR [--identity-file FILE]
       sealbridge-relay --version

  --listen ADDR         address to listen on (default 127.0.0.1:8470; port 0 picks one)
  --home DIR            data root: the relay's store and inboxes (required)
  --identity-file FILE  the relay's key (default DIR/relay-identity.pem; created if absent)
  --log-level LEVEL     debug, info, warn or error (default info)
  --version             print the version and exit
`

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sealbridge-relay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", "127.0.0.1:8470", "")
	home := fs.String("home", "", "")
	idFile := fs.String("identity-file", "", "")
	logLevel := fs.String("log-level", "info", "")
	showVersion := fs.Bool("version", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return 0
		}
		fmt.Fprintf(stderr, "sealbridge-relay: %v\n%s", err, usage)
		return 2
	}
	if *showVersion {
		fmt.Fprintf(stdout, "sealbridge-relay %s\n", version())
		return 0
	}
	if fs.NArg() > 0 || *home == "" {
		fmt.Fprintf(stderr, "sealbridge-relay: --home is required and no arguments are taken\n%s", usage)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "sealbridge-relay: --log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := os.MkdirAll(*home, 0o700); err != nil {
		fmt.Fprintf(stderr, "sealbridge-relay: %v\n", err)
		return 1
	}
	if err := dataroot.CheckRoot(*home); err != nil {
		fmt.Fprintf(stderr, "sealbridge-relay: error: %v\n", err)
		if hint := errcode.HintOf(err); hint != "" {
			fmt.Fprintf(stderr, "sealbridge-relay: hint: %s\n", hint)
		}
		return 1
	}
	if *idFile == "" {
		*idFile = filepath.Join(*home, "relay-identity.pem")
	}
	id, created, err := identity.LoadOrCreateKeyFile(*idFile)
	if err != nil {
		fmt.Fprintf(stderr, "sealbridge-relay: %v\n", err)
		return 1
	}
	if created {
		log.Info("relay: created identity", "file", *idFile, "did", string(id.DID()))
	}
	r, err := relay.New(relay.Options{Identity: id, Home: *home, Logger: log})
	if err != nil {
		fmt.Fprintf(stderr, "sealbridge-relay: %v\n", err)
		return 1
	}
	defer r.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "sealbridge-relay: %v\n", err)
		return 1
	}
	srv := &http.Server{
		Handler:           r.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	fmt.Fprintf(stdout, "listening http://%s\n", ln.Addr())
	fmt.Fprintf(stdout, "relay %s\n", id.DID())
	if f, ok := stdout.(*os.File); ok {
		_ = f.Sync()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		fmt.Fprintf(stderr, "sealbridge-relay: serve: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	log.Info("relay: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("relay: shutdown", "err", err)
		_ = srv.Close()
		return 1
	}
	log.Info("relay: stopped", "accepted", r.Stats().Accepted)
	return 0
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }
