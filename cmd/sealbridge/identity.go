package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// who is the identity a command acts as: a data root and a name in it.
type who struct {
	home, name string // the flags as given
	root       string // the resolved data root
}

// identityFlags adds --home and --identity to c (cli.HomeFlag, cli.IdentityFlag)
// and makes c complete --identity with the names of the identities in the data
// root.
func identityFlags(c *cobra.Command) *who {
	w := &who{}
	cli.HomeFlag(c.Flags(), &w.home)
	cli.IdentityFlag(c.Flags(), &w.name)
	_ = c.RegisterFlagCompletionFunc("identity", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return w.names(), cobra.ShellCompDirectiveNoFileComp
	})
	_ = c.MarkFlagDirname("home")
	return w
}

// names lists the identities of the data root (for completion); nil when it
// cannot be read.
func (w *who) names() []string {
	root, err := dataroot.Resolve(w.home)
	if err != nil {
		return nil
	}
	ents, err := os.ReadDir(filepath.Dir(daemon.IdentityPath(root, "x")))
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".key"); ok && e.Type().IsRegular() {
			names = append(names, n)
		}
	}
	return names
}

// resolve resolves the data root (--home, $SEALBRIDGE_HOME, …).
func (w *who) resolve() error {
	root, err := dataroot.Resolve(w.home)
	if err != nil {
		return withHint(err, "give --home DIR")
	}
	w.root = root
	if w.name == "" {
		w.name = daemon.DefaultIdentity
	}
	return nil
}

// flags renders the identity as command-line flags for hints.
func (w *who) flags() string {
	return "--home " + shellQuote(w.root) + " --identity " + shellQuote(w.name)
}

// load loads the identity's key.
func (w *who) load() (*identity.Identity, error) {
	id, err := daemon.LoadIdentity(w.root, w.name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, withHint(err, "create it with: sealbridge init %s", w.flags())
		}
		return nil, err
	}
	return id, nil
}

// identityExit is the exit table of init and whoami.
const identityExit = exitLineOK + exitLineFailure + exitLineUsage

func initCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "init [--home DIR] [--identity NAME]",
		Short: "create an identity, print its DID",
		Long: `Creates the identity NAME (an Ed25519 key, <home>/identities/NAME.key, mode 0600)
and prints its did:key. Refuses an identity that exists.`,
		Example: "  sealbridge init --home ~/sb --identity alice",
		Args:    cli.NoArgs,
	}
	w := identityFlags(c)
	c.RunE = func(c *cobra.Command, _ []string) error { return runInit(w, c.OutOrStdout()) }
	return cli.Annotate(c, cli.AnnotExit, identityExit)
}

func runInit(w *who, stdout io.Writer) error {
	if err := w.resolve(); err != nil {
		return err
	}
	if _, err := os.Lstat(daemon.IdentityPath(w.root, w.name)); err == nil {
		return withHint(fmt.Errorf("identity %s already exists in %s", w.name, w.root),
			"print its DID with: sealbridge whoami %s", w.flags())
	}
	id, err := daemon.InitIdentity(w.root, w.name)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, id.DID())
	return nil
}

// whoami --socket prints the path of the identity's daemon socket instead of its
// DID: where a running daemon listens, else where one would (client.Locate).
func whoamiCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "whoami [--home DIR] [--identity NAME] [--socket]",
		Short: "print the identity's DID (--socket: its daemon's socket)",
		Long: `Prints the identity's did:key; with --socket, the path of its daemon's unix socket
instead: where a running daemon listens, else where one would.`,
		Example: "  sealbridge whoami --home ~/sb --identity bob\n  curl --unix-socket \"$(sealbridge whoami --socket)\" http://x/readyz",
		Args:    cli.NoArgs,
	}
	w := identityFlags(c)
	socket := c.Flags().Bool("socket", false, "print the path of the daemon's socket instead of the DID")
	c.RunE = func(c *cobra.Command, _ []string) error { return runWhoami(w, *socket, c.OutOrStdout()) }
	return cli.Annotate(c, cli.AnnotExit, identityExit)
}

func runWhoami(w *who, socket bool, stdout io.Writer) error {
	if err := w.resolve(); err != nil {
		return err
	}
	id, err := w.load()
	if err != nil {
		return err
	}
	if socket {
		fmt.Fprintln(stdout, client.Locate(w.root, string(id.DID())))
		return nil
	}
	fmt.Fprintln(stdout, id.DID())
	return nil
}
