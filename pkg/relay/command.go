package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// DefaultKeyFile is the name of a relay command's key file in its data root.
const DefaultKeyFile = "relay-identity.pem"

// Command is one run of a relay command, sealbridge-relay or "sealbridge relay":
// both run it, so that they start, serve and stop alike. Its flags were checked
// (LimitFlags.Check, BackendFlags.Check) and its logger made by the caller.
type Command struct {
	Name    string // the program, in the storage's messages ("sealbridge-relay")
	Listen  string // the TCP address to listen on
	Home    string // the data root as given (--home; "": the default, dataroot.Resolve)
	KeyFile string // the relay's key file ("": DefaultKeyFile in the data root)
	Version string // the binary's version, in /metrics
	Logger  *slog.Logger
	Backend *BackendFlags
	Limits  *LimitFlags
}

// Run serves the relay until ctx ends, then shuts it down (held fetches answer at
// once, requests in progress get 10 s). It listens first and opens and checks the
// storage next, and only then makes the data root and the key (created on first
// start), so a busy address or a refused JetStream creates nothing. It prints
// "listening http://ADDR" and "relay DID" on stdout once it serves.
func (c Command) Run(ctx context.Context, stdout io.Writer) error {
	log := c.Logger
	ln, err := Listen(c.Listen, c.Limits.MaxConns)
	if err != nil {
		return err
	}
	defer ln.Close()
	ropts := Options{Logger: log, Limits: c.Limits.Limits, Version: c.Version,
		StatusRetention: c.Limits.StatusRetentionOption()}
	closeConn, err := c.Backend.Open(&ropts, c.Name)
	if err != nil {
		return err
	}
	defer closeConn()
	root, err := dataroot.Resolve(c.Home)
	if err != nil {
		return errcode.WithHint(err, "give --home DIR")
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	if err := dataroot.CheckRoot(root); err != nil {
		return err
	}
	keyFile := c.KeyFile
	if keyFile == "" {
		keyFile = filepath.Join(root, DefaultKeyFile)
	}
	id, created, err := LoadOrCreateIdentity(keyFile)
	if err != nil {
		return err
	}
	if created {
		log.Info("relay: created identity", "file", keyFile, "did", string(id.DID()))
	}
	ropts.Identity, ropts.Home = id, root
	r, err := New(ropts) // a JetStream refusal carries its hint
	if err != nil {
		return err
	}
	defer r.Close()
	srv := NewServer(r, log)
	fmt.Fprintf(stdout, "listening http://%s\n", ln.Addr())
	fmt.Fprintf(stdout, "relay %s\n", id.DID())
	if f, ok := stdout.(*os.File); ok {
		_ = f.Sync()
	}
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

// NewServer is the HTTP server of relay r as the relay commands run it: bounded
// header and body times and sizes, errors logged to log, and the held inbox
// fetches answered at once when it shuts down (a held fetch extends its own
// deadlines past its wait, at most relayproto.MaxInboxWait).
func NewServer(r *Relay, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           r.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	srv.RegisterOnShutdown(r.StopWaiting)
	return srv
}
