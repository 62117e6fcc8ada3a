// Command sealbridge is sealbridge's command line: it creates identities, sends
// messages through the local daemon (sealbridged), shows their status, runs a
// reference relay, and runs the end-to-end demo. newRoot defines every command;
// `sealbridge --help`, `sealbridge completion SHELL` and the man pages are made
// from it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/buildinfo"
	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// Exit codes; exitCode maps errors to them.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitNoDaemon = 3
	exitUnknown  = 4
)

// The lines of the exit status tables, which each command's help puts together
// from the statuses it can give.
const (
	exitLineOK       = "  0   success\n"
	exitLineFailure  = "  1   failure\n"
	exitLineUsage    = "  2   usage error\n"
	exitLineNoDaemon = "  3   no daemon is running for the identity (start one with sealbridged)\n"
	exitLineUnknown  = "  4   the outcome is unknown (the message may have been accepted); run the\n" +
		"      command printed in the hint to finish it without sending it twice\n"
)

// annotDaemon marks a command that talks to the identity's daemon (and exits 3
// when none runs); the main help lists them.
const annotDaemon = "sealbridge.daemon"

// daemonExit is the exit table of a command that talks to the daemon; failure
// says what exit 1 means for it.
func daemonExit(failure string) string {
	return exitLineOK + "  1   " + failure + "\n" + exitLineUsage + exitLineNoDaemon
}

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

// newRoot is the command tree: every command with its flags, help and exit
// statuses — the one definition the help, the completions and the man pages are
// made from.
func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "sealbridge COMMAND [flags]",
		Short: "send signed messages through a local daemon and a relay",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if v, _ := c.Flags().GetBool("version"); v {
				fmt.Fprintf(c.OutOrStdout(), "sealbridge %s\n", version())
				return nil
			}
			if len(args) == 0 {
				return usageErrorf("give a command")
			}
			return usageErrorf("unknown command %q", args[0])
		},
		Example: `  sealbridge demo
  sealbridge init --home ~/sb --identity alice
  sealbridged --home ~/sb --identity alice &
  echo hello | sealbridge send --home ~/sb --identity alice --to did:key:z6Mk… --relay http://127.0.0.1:8470
  sealbridge status --home ~/sb --identity alice 0190b6a4-…
  sealbridge ls --home ~/sb --identity alice --status queued
  sealbridge get --home ~/sb --identity bob 0190b6a4-… --out report.pdf
  sealbridge queue --json | jq -r 'select(.state == "unreachable") | .relayUrl' | sealbridge retry --target -
  sealbridge backup --home ~/sb --identity alice ~/backups/alice-2026-12-02
  sealbridge relay --listen 127.0.0.1:8470 --home ~/sb-relay`,
	}
	cli.Annotate(root, cli.AnnotSynopsis, "COMMAND --help      (or: sealbridge help COMMAND)\ncompletion bash|zsh|fish")
	cli.Annotate(root, cli.AnnotExit, `  0   success
  1   failure (a command failed, the demo did not relay everything or fsck found problems)
  2   usage error
  3   no daemon is running for the identity
  4   send: the outcome is unknown (the message may have been accepted); run the
      command printed in the hint to finish it without sending it twice
`)
	root.Flags().Bool("version", false, "print the version and exit")
	root.AddCommand(initCommand(), whoamiCommand(), sendCommand(), statusCommand(), lsCommand(), queueCommand(),
		inboxCommand(), getCommand(), watchCommand(), backupCommand())
	for _, op := range actionOps {
		root.AddCommand(op.command())
	}
	root.AddCommand(relayCommand(), demoCommand())
	root.SetHelpCommand(helpCommand(root))
	var daemonCmds []string
	for _, c := range root.Commands() {
		if c.Annotations[annotDaemon] != "" {
			daemonCmds = append(daemonCmds, c.Name())
		}
	}
	root.Long = `Creates identities, sends messages through the identity's daemon (sealbridged),
shows and acts on what it queued, runs a reference relay and the end-to-end demo.
"sealbridge COMMAND --help" describes each command, its flags and its exit statuses.

` + cli.Wrap("The commands that talk to the identity's daemon over its unix socket (and exit 3 when none runs): "+
		strings.Join(daemonCmds, ", ")+". Start it with: sealbridged --home DIR --identity NAME", 84) + `

Most commands take:
  --home DIR         the data root (default: $SEALBRIDGE_HOME, else
                     $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge)
  --identity NAME    the identity's name under the data root (default:
                     $SEALBRIDGE_IDENTITY, else "default")

` + jsonConvention
	return root
}

// jsonConvention is the one rule of --json, stated in the main help.
const jsonConvention = `--json prints JSON on standard output: a list (ls, inbox, inbox --refused, queue,
watch, and the actions' results) as JSON lines, one object per line; one item
(status) as one object. Commands that act on messages (hold, release, cancel,
retry) read the ids, or with --target the relay URLs, from standard input when
given "-", one per line (as postsuper - does): sealbridge ls --json | jq -r
'select(.status == "queued") | .messageId' | sealbridge retry -`

// helpCommand is "sealbridge help [COMMAND]": the command's help, as COMMAND --help.
func helpCommand(root *cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "print a command's help (as COMMAND --help)",
		Long:  "Prints the help of COMMAND (of sealbridge itself without one) on standard output.",
		Args:  cobra.MaximumNArgs(2),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			var names []string
			for _, s := range root.Commands() {
				if s.IsAvailableCommand() {
					names = append(names, s.Name()+"\t"+s.Short)
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		Example: "  sealbridge help send\n  sealbridge help completion bash",
		RunE: func(c *cobra.Command, args []string) error {
			target := root
			if len(args) > 0 {
				t, rest, err := root.Find(args)
				if err != nil || t == root || len(rest) > 0 {
					return usageErrorf("help: unknown command %q", strings.Join(args, " "))
				}
				target = t
			}
			target.HelpFunc()(target, args)
			return nil
		},
	}
	return cli.Annotate(c, cli.AnnotExit, exitLineOK+exitLineUsage)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		_ = prog.Execute(ctx, newRoot(), []string{"--help"}, stderr, stderr)
		return exitUsage
	}
	switch args[0] {
	case "-version", "version":
		fmt.Fprintf(stdout, "sealbridge %s\n", version())
		return exitOK
	case "-help":
		args[0] = "--help"
	}
	err := prog.Execute(ctx, newRoot(), args, stdout, stderr)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = errors.New("interrupted")
	}
	return report(stderr, err)
}

// prog is this binary's conventions (internal/cli).
var prog = cli.Program{Name: "sealbridge", UsageExit: exitUsage, Version: version()}

// usageErrorf is a command-line mistake: exit 2, with the usage hint.
func usageErrorf(format string, a ...any) error { return cli.Usagef(format, a...) }

// noDaemonError: the identity's daemon socket is missing or refuses connections.
type noDaemonError struct {
	did, home, name string
	err             error
}

func (e *noDaemonError) Error() string { return "no daemon is running for " + e.did }

// hint is the command that starts the daemon.
func (e *noDaemonError) hint() string {
	return "start one with: sealbridged --home " + shellQuote(e.home) + " --identity " + shellQuote(e.name)
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

// plural is n with the noun for n: "1 message", "2 messages".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// checkMessageID refuses what is not a message id, as a usage error of cmd.
func checkMessageID(cmd, id string) error {
	if !uuid.Valid(id) {
		return usageErrorf("%s: %q is not a message id (a lower-case UUID, as sealbridge send printed)", cmd, id)
	}
	return nil
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }

// shellQuote quotes s for a POSIX shell when needed.
func shellQuote(s string) string { return cli.ShellQuote(s) }
