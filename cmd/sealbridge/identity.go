package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

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

// identityFlags adds --home and --identity to fs (cli.HomeFlag, cli.IdentityFlag).
func identityFlags(fs *flag.FlagSet) *who {
	w := &who{}
	cli.HomeFlag(fs, &w.home)
	cli.IdentityFlag(fs, &w.name)
	return w
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

// noArgs parses fs and refuses positional arguments.
func noArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("%s: unexpected argument %q", fs.Name(), pos[0])
	}
	return nil
}

// cmdInit: sealbridge init [--home DIR] [--identity NAME]
func cmdInit(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("init")
	w := identityFlags(fs)
	if err := noArgs(fs, args); err != nil {
		return err
	}
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

// cmdWhoami: sealbridge whoami [--home DIR] [--identity NAME] [--socket]
// --socket prints the path of the identity's daemon socket instead of its DID:
// where a running daemon listens, else where one would (client.Locate).
func cmdWhoami(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("whoami")
	w := identityFlags(fs)
	socket := fs.Bool("socket", false, "")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if err := w.resolve(); err != nil {
		return err
	}
	id, err := w.load()
	if err != nil {
		return err
	}
	if *socket {
		fmt.Fprintln(stdout, client.Locate(w.root, string(id.DID())))
		return nil
	}
	fmt.Fprintln(stdout, id.DID())
	return nil
}
