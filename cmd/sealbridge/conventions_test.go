package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

// command is one of sealbridge's commands.
type command struct {
	name string
	cmd  *cobra.Command
}

// commands are sealbridge's commands (not the completion scripts').
func commands() []command {
	var cs []command
	for _, c := range newRoot().Commands() {
		if c.Name() != "completion" {
			cs = append(cs, command{c.Name(), c})
		}
	}
	return cs
}

// Every command has its own usage: "sealbridge CMD --help", "-h" and
// "sealbridge help CMD" print it on stdout (not the global one), with the exit codes.
func TestCommandHelp(t *testing.T) {
	for _, c := range commands() {
		for _, args := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {"help", c.name}} {
			code, out, errs := sb(t, args...)
			if code != exitOK || errs != "" || !strings.HasPrefix(out, "usage: sealbridge "+c.name+" ") {
				t.Errorf("%v: exit %d, stdout %.60q, stderr %q: want %q's own usage", args, code, out, errs, c.name)
			}
			if strings.Contains(out, "Commands:") || !strings.Contains(out, "Exit status:") || !strings.Contains(out, "Examples:") {
				t.Errorf("%v: want the command's flags, examples and exit status, not the global usage:\n%s", args, out)
			}
		}
	}
	_, out, _ := sb(t, "send", "--help")
	for _, flag := range []string{"--to DID", "--relay URL", "--deadline", "--idempotency-key", "--file", "--home DIR", "--identity NAME"} {
		if !strings.Contains(out, flag) {
			t.Errorf("send --help does not describe %s", flag)
		}
	}
	// One default relay address, the one sealbridge-relay uses too.
	if _, out, _ := sb(t, "relay", "--help"); !strings.Contains(strings.Join(strings.Fields(out), " "), "(default "+relay.DefaultListen+")") {
		t.Errorf("relay --help does not give the default --listen %s:\n%s", relay.DefaultListen, out)
	}
	if code, _, errs := sb(t, "help", "nope"); code != exitUsage || !strings.Contains(errs, `unknown command "nope"`) {
		t.Errorf("help nope: %d %q", code, errs)
	}
	// A usage error points to the command's own help.
	if _, _, errs := sb(t, "send", "--nope"); !strings.Contains(errs, "sealbridge: hint: run 'sealbridge send --help' for usage") {
		t.Errorf("send --nope: %q", errs)
	}
	if _, _, errs := sb(t, "ls", "--limit", "-1"); !strings.Contains(errs, "run 'sealbridge ls --help'") {
		t.Errorf("ls --limit -1: %q", errs)
	}
}

// An explicitly empty --home, --identity or argument (a script's unset variable) is
// a usage error, never the default or ".".
func TestEmptyArgumentsRefused(t *testing.T) {
	// Were an empty value taken for the default, nothing must touch the real one,
	// and a relay must stop at once.
	t.Setenv("SEALBRIDGE_HOME", shortHome(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sb := func(t *testing.T, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := runContext(ctx, args, &out, &errb)
		return code, out.String(), errb.String()
	}
	for _, c := range commands() {
		if c.name == "demo" || c.name == "help" {
			continue // no --home
		}
		for _, args := range [][]string{{c.name, "--home", ""}, {c.name, "--home="}, {c.name, "--identity", ""}} {
			if c.name == "relay" && args[1] == "--identity" {
				continue
			}
			code, out, errs := sb(t, args...)
			if code != exitUsage || out != "" || !strings.HasPrefix(errs, "sealbridge: error: ") || !strings.Contains(errs, "empty") {
				t.Errorf("%q: exit %d, stdout %q, stderr %q: want a usage error", args, code, out, errs)
			}
		}
	}
	if code, _, errs := sb(t, "status", ""); code != exitUsage || !strings.Contains(errs, "empty") {
		t.Errorf(`status "": exit %d %q`, code, errs)
	}
}

// $SEALBRIDGE_IDENTITY is the default of --identity.
func TestIdentityFromEnvironment(t *testing.T) {
	home := shortHome(t)
	t.Setenv("SEALBRIDGE_IDENTITY", "carol")
	code, out, errs := sb(t, "init", "--home", home)
	if code != exitOK {
		t.Fatalf("init: %d %s", code, errs)
	}
	if _, err := os.Stat(daemon.IdentityPath(home, "carol")); err != nil {
		t.Fatalf("init with SEALBRIDGE_IDENTITY=carol: %v", err)
	}
	if code, who, _ := sb(t, "whoami", "--home", home); code != exitOK || who != out {
		t.Fatalf("whoami: %d %q, want %q", code, who, out)
	}
	if code, _, errs := sb(t, "whoami", "--home", home, "--identity", "default"); code != exitFailure || !strings.Contains(errs, "--identity default") {
		t.Fatalf("--identity overrides the environment: %d %q", code, errs)
	}
}

// The messages for a missing identity and a bad key file say each thing once.
func TestIdentityErrorsDoNotStutter(t *testing.T) {
	home := shortHome(t)
	path := daemon.IdentityPath(home, "alice")
	code, _, errs := sb(t, "whoami", "--home", home, "--identity", "alice")
	first, _, _ := strings.Cut(errs, "\n")
	if code != exitFailure || strings.Count(first, path) != 1 || strings.Count(first, "identity") != 1 ||
		!strings.Contains(errs, "sealbridge: hint: create it with: sealbridge init --home "+home+" --identity alice\n") {
		t.Errorf("missing identity: exit %d\n%s", code, errs)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("junk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs = sb(t, "whoami", "--home", home, "--identity", "alice")
	if code != exitFailure || strings.Count(errs, path) != 1 || strings.Count(errs, "identity:") != 1 {
		t.Errorf("bad key file: exit %d\n%s", code, errs)
	}
}
