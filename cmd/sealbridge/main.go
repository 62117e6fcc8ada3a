// Command sealbridge is sealbridge's command line: it creates identities, sends
// messages through the local daemon (sealbridged), shows their status, runs a
// reference relay, and runs the end-to-end demo. See usage below.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/sealbridge/sealbridge/internal/buildinfo"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

const usage = `usage: sealbridge COMMAND [flags]
       sealbridge COMMAND --help      (or: sealbridge help COMMAND)

Commands:
  init     [--home DIR] [--identity NAME]       create an identity, print its DID
  whoami   [--home DIR] [--identity NAME] [--socket]
                                                print the identity's DID; --socket:
                                                the path of its daemon's socket
  send     --to DID --relay URL [--deadline 24h|TIME] [--idempotency-key K] [--file F]
                                                send a message (body from --file or
                                                standard input); print its id. The
                                                deadline defaults to 24 h; retries with
                                                one --idempotency-key must send the same
                                                request: use the default or an RFC 3339
                                                TIME, not a duration. send always sends
                                                a key (a random one unless given) and
                                                retries a lost connection or a 5xx with
                                                it (5 attempts, ≤ 10 s); failing that it
                                                prints the key and the command that
                                                finishes the send without a duplicate
  status   ID [--json]                          show one sent message
  ls       [--status S] [--limit N] [--after ID] [--all] [--json]
                                                list sent messages (--all: every page;
                                                --json: one JSON object per line)
  queue    [--json]                             show each relay target's backlog:
                                                pending, held, in flight, state, last
                                                error, and the envelopes by age
  inbox    [--limit N] [--after ID] [--json]    list received messages (the daemon
                                                needs --inbox-relay); --refused: the
                                                envelopes it refused
  watch    [--topics messages,outbox,receipts,observations] [--json]
                                                follow the daemon's change feed, one
                                                line per change: TIME TOPIC ID STATE
  hold     [--reason R] [--json] (MESSAGE… | --target URL)
                                                hold messages: not sent until released
  release  [--reason R] [--json] (MESSAGE… | --target URL)
                                                release held messages
  cancel   [--reason R] [--json] (MESSAGE… | --target URL)
                                                close what is not sent yet (closedBy
                                                cancelled); relayed is not recalled
  retry    [--reason R] [--json] (MESSAGE… | --target URL)
                                                one attempt now, not after the backoff;
                                                exit 1 if any message refused an action
  relay    [--listen 127.0.0.1:8470] [--home DIR]
                                                run a reference relay in the foreground
  demo     [--messages 100] [--keep] [--timeout 2m]
                                                run two daemons and a relay in a temp
                                                home, send messages, check the stores

Common flags:
  --home DIR         the data root (default: $SEALBRIDGE_HOME, else
                     $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge)
  --identity NAME    the identity's name under the data root (default:
                     $SEALBRIDGE_IDENTITY, else "default")
  --version          print the version and exit

send, status, ls and queue talk to the identity's daemon over its unix socket; start it
with: sealbridged --home DIR --identity NAME

Examples:
  sealbridge demo
  sealbridge init --home ~/sb --identity alice
  sealbridged --home ~/sb --identity alice &
  echo hello | sealbridge send --home ~/sb --identity alice --to did:key:z6Mk… --relay http://127.0.0.1:8470
  sealbridge status --home ~/sb --identity alice 0190b6a4-…
  sealbridge ls --home ~/sb --identity alice --status queued
  sealbridge relay --listen 127.0.0.1:8470 --home ~/sb-relay

` + exitStatus

// Exit codes; exitCode maps errors to them.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitNoDaemon = 3
	exitUnknown  = 4
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: it parses args, runs the command and
// returns the exit code. SIGINT and SIGTERM cancel the command's context.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

// command is one verb.
type command struct {
	name string
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"init", cmdInit},
	{"whoami", cmdWhoami},
	{"send", cmdSend},
	{"status", cmdStatus},
	{"ls", cmdLs},
	{"queue", cmdQueue},
	{"inbox", cmdInbox},
	{"relay", cmdRelay},
	{"demo", cmdDemo},
	{"watch", cmdWatch},
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "--version", "-version", "version":
		fmt.Fprintf(stdout, "sealbridge %s\n", version())
		return exitOK
	case "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "help":
		if len(args) == 1 {
			fmt.Fprint(stdout, usage)
			return exitOK
		}
		if u, ok := commandUsage[args[1]]; ok {
			fmt.Fprint(stdout, u+"\n"+exitStatus)
			return exitOK
		}
		return report(stderr, usageErrorf("help: unknown command %q", args[1]))
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, commandUsage[c.name]+"\n"+exitStatus)
				return exitOK
			}
			if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
				err = errors.New("interrupted")
			}
			var ue *cli.UsageError
			if errors.As(err, &ue) && ue.Help == "" {
				ue.Help = "sealbridge " + c.name + " --help"
			}
			return report(stderr, err)
		}
	}
	return report(stderr, usageErrorf("unknown command %q", args[0]))
}

// prog is this binary's conventions (internal/cli).
var prog = cli.Program{Name: "sealbridge", UsageExit: exitUsage}

// usageErrorf is a command-line mistake: exit 2, with the usage hint.
func usageErrorf(format string, a ...any) error { return cli.Usagef(format, a...) }

// noDaemonError: the identity's daemon socket is missing or refuses connections.
type noDaemonError struct {
	did, home, name string
	err             error
}

func (e *noDaemonError) Error() string {
	return fmt.Sprintf("no daemon is running for %s; start one with: sealbridged --home %s --identity %s",
		e.did, shellQuote(e.home), shellQuote(e.name))
}

func (e *noDaemonError) Unwrap() error { return e.err }

// withHint adds a "hint:" line to an error (errcode.WithHint).
func withHint(err error, format string, a ...any) error {
	return errcode.WithHint(err, fmt.Sprintf(format, a...))
}

// exitCode is the one place errors become exit codes. An invalid option the
// daemon package finds (*daemon.OptionError) is a usage error too.
func exitCode(err error) int {
	var nd *noDaemonError
	var is *incompleteSend
	var oe *daemon.OptionError
	switch {
	case err == nil:
		return exitOK
	case cli.IsUsage(err), errors.As(err, &oe):
		return exitUsage
	case errors.As(err, &nd):
		return exitNoDaemon
	case errors.As(err, &is) && is.unknown:
		return exitUnknown
	default:
		return exitFailure
	}
}

// report prints err as "sealbridge: error:" and "sealbridge: hint:" lines and
// returns its exit code.
func report(stderr io.Writer, err error) int {
	var oe *daemon.OptionError
	if errors.As(err, &oe) {
		err = cli.AsUsage(err)
	}
	prog.Report(stderr, err)
	return exitCode(err)
}

// newFlagSet returns a silent flag set: run prints errors its own way.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sealbridge "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags parses args allowing flags after positional arguments
// ("status ID --json"), and returns the positional arguments (cli.ParseFlags).
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	return cli.ParseFlags(fs, args)
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }

// shellQuote quotes s for a POSIX shell when needed.
func shellQuote(s string) string { return cli.ShellQuote(s) }
