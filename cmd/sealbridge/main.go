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
	"strings"
	"syscall"
)

const usage = `usage: sealbridge COMMAND [flags]

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
  ls       [--status S] [--limit N] [--after ID] [--json]
                                                list sent messages
  inbox    [--limit N] [--after ID] [--json]    list received messages (the daemon
                                                needs --inbox-relay)
  watch    [--topics messages,outbox,receipts,observations] [--json]
                                                follow the daemon's change feed, one
                                                line per change: TIME TOPIC ID STATE
  relay    [--listen 127.0.0.1:8440] [--home DIR]
                                                run a reference relay in the foreground
  demo     [--messages 100] [--keep] [--timeout 2m]
                                                run two daemons and a relay in a temp
                                                home, send messages, check the stores

Common flags:
  --home DIR         the data root (default: $SEALBRIDGE_HOME, else
                     $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge)
  --identity NAME    the identity's name under the data root (default "default")
  --version          print the version and exit

send, status and ls talk to the identity's daemon over its unix socket; start it
with: sealbridged --home DIR --identity NAME

Examples:
  sealbridge demo
  sealbridge init --home ~/sb --identity alice
  sealbridged --home ~/sb --identity alice &
  echo hello | sealbridge send --home ~/sb --identity alice --to did:key:z6Mk… --relay http://127.0.0.1:8440
  sealbridge status --home ~/sb --identity alice 0190b6a4-…
  sealbridge ls --home ~/sb --identity alice --status queued
  sealbridge relay --listen 127.0.0.1:8440 --home ~/sb-relay

Exit status:
  0   success
  1   failure (a command failed, the demo did not relay everything or fsck found problems)
  2   usage error
  3   no daemon is running for the identity
  4   send: the outcome is unknown (the message may have been accepted); run the
      command printed in the hint to finish it without sending it twice
`

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
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, usage)
				return exitOK
			}
			if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
				err = errors.New("interrupted")
			}
			return report(stderr, err)
		}
	}
	return report(stderr, usageErrorf("unknown command %q", args[0]))
}

// usageError is a command-line mistake: exit 2, with the usage hint.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{fmt.Sprintf(format, a...)}
}

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

// hintError adds a "hint:" line to an error.
type hintError struct {
	err  error
	hint string
}

func (e *hintError) Error() string { return e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }

func withHint(err error, format string, a ...any) error {
	return &hintError{err: err, hint: fmt.Sprintf(format, a...)}
}

// exitCode is the one place errors become exit codes.
func exitCode(err error) int {
	var ue *usageError
	var nd *noDaemonError
	var is *incompleteSend
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
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
	code := exitCode(err)
	if err == nil {
		return code
	}
	fmt.Fprintf(stderr, "sealbridge: error: %v\n", err)
	var he *hintError
	if errors.As(err, &he) {
		fmt.Fprintf(stderr, "sealbridge: hint: %s\n", he.hint)
	}
	if code == exitUsage {
		fmt.Fprintln(stderr, "sealbridge: hint: run 'sealbridge --help' for usage")
	}
	return code
}

// newFlagSet returns a silent flag set: run prints errors its own way.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sealbridge "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags parses args allowing flags after positional arguments
// ("status ID --json"), and returns the positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageErrorf("%s: %v", fs.Name(), err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }

// shellQuote quotes s for a POSIX shell when needed.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=,~", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
