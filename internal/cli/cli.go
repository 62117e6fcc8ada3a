// Package cli holds the conventions the four binaries share: the "PROG: error:" and
// "PROG: hint:" lines, usage errors and their exit status, the --home and
// --identity flags, the logger flags, and the command tree (spf13/cobra) from which
// each binary's help, shell completions and man pages are all made, so that they
// cannot drift: flags may follow positional arguments, each command's help ends
// with its own exit statuses. Each binary keeps its own exit codes, texts and
// commands; this package only makes the common parts behave the same everywhere.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// DefaultIdentity is the identity name used when neither --identity nor
// $SEALBRIDGE_IDENTITY gives one.
const DefaultIdentity = "default"

// Environment variables that give the defaults of --home and --identity.
const (
	EnvHome     = "SEALBRIDGE_HOME"
	EnvIdentity = "SEALBRIDGE_IDENTITY"
)

// Program is one binary's conventions: the name that prefixes its error lines and
// the exit status it gives a usage error.
type Program struct {
	Name       string // e.g. "sealbridged"
	UsageExit  int    // 2, or 16 for sealbridge-fsck
	ManSection string // the section of its man pages: "1" (the default) or "8"
	Version    string // printed in its man pages' footer
}

// UsageError is a mistake on the command line (or in an option the program found
// invalid later). Help names the command that prints the relevant usage; empty
// means "PROG --help".
type UsageError struct {
	Err  error
	Help string
}

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a usage error with a formatted message.
func Usagef(format string, a ...any) error {
	return &UsageError{Err: fmt.Errorf(format, a...)}
}

// AsUsage marks err (kept in the chain, with its hint) as a usage error; nil stays
// nil and an error that already is one is returned unchanged.
func AsUsage(err error) error {
	if err == nil || IsUsage(err) {
		return err
	}
	return &UsageError{Err: err}
}

// IsUsage reports whether err's chain holds a *UsageError.
func IsUsage(err error) bool {
	var ue *UsageError
	return errors.As(err, &ue)
}

// Exit returns the exit status of err: 0 for nil, p.UsageExit for a usage error
// and failure for anything else.
func (p Program) Exit(err error, failure int) int {
	switch {
	case err == nil:
		return 0
	case IsUsage(err):
		return p.UsageExit
	default:
		return failure
	}
}

// Report writes err to w as a "NAME: error: MSG" line, then a "NAME: hint: HINT"
// line when err carries a hint (errcode.WithHint), then, for a usage error, a hint
// naming the --help command. It writes nothing for a nil err.
func (p Program) Report(w io.Writer, err error) {
	if err == nil {
		return
	}
	fmt.Fprintf(w, "%s: error: %v\n", p.Name, err)
	if h := errcode.HintOf(err); h != "" {
		fmt.Fprintf(w, "%s: hint: %s\n", p.Name, h)
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		help := ue.Help
		if help == "" {
			help = p.Name + " --help"
		}
		fmt.Fprintf(w, "%s: hint: run '%s' for usage\n", p.Name, help)
	}
}

// nonEmpty is a string flag that refuses an empty value, so that --home "" (an
// unset variable in a script) is a usage error instead of silently meaning the
// default or ".".
type nonEmpty struct{ p *string }

func (v nonEmpty) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v nonEmpty) Set(s string) error {
	if s == "" {
		return errors.New("empty value (omit the flag to get its default)")
	}
	*v.p = s
	return nil
}

// Type is what pflag calls the value's type: not "string", so that a default is
// printed as given, without quotes.
func (v nonEmpty) Type() string { return "text" }

// NonEmptyVar defines a string flag name on fs, stored in *p with default def,
// whose value may not be given as "": --name "" fails to parse (a usage error).
// usage is the flag's one description (help, man page and completions); a
// back-quoted word in it names the value (pflag's convention).
func NonEmptyVar(fs *pflag.FlagSet, p *string, name, def, usage string) {
	*p = def
	fs.Var(nonEmpty{p}, name, usage)
}

// HomeUsage describes --home.
const HomeUsage = "the data root `DIR` (default: $SEALBRIDGE_HOME, else $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge)"

// IdentityUsage describes --identity.
const IdentityUsage = "the identity's `NAME` under the data root (default: $SEALBRIDGE_IDENTITY, else \"default\")"

// HomeFlag defines --home DIR on fs, stored in *p. Its default is "", which each
// program resolves to the default data root ($SEALBRIDGE_HOME, else
// $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge); an explicitly empty
// --home is refused.
func HomeFlag(fs *pflag.FlagSet, p *string) { NonEmptyVar(fs, p, "home", "", HomeUsage) }

// IdentityFlag defines --identity on fs, stored in *p. Its default is
// $SEALBRIDGE_IDENTITY when set and non-empty, else DefaultIdentity; an explicitly
// empty --identity is refused. The help states the default in words, not the
// environment's value of the moment (the man pages do not depend on it).
func IdentityFlag(fs *pflag.FlagSet, p *string) {
	def := os.Getenv(EnvIdentity)
	if def == "" {
		def = DefaultIdentity
	}
	NonEmptyVar(fs, p, "identity", def, IdentityUsage)
	fs.Lookup("identity").DefValue = ""
}

// LogFlags are the values of --log-format and --log-level.
type LogFlags struct{ Format, Level string }

// AddLogFlags defines --log-format text|json (default text) and --log-level
// debug|info|warn|error (default info) on fs.
func AddLogFlags(fs *pflag.FlagSet) *LogFlags {
	l := &LogFlags{}
	fs.StringVar(&l.Format, "log-format", "text", "the log's `FORMAT`: text or json")
	fs.StringVar(&l.Level, "log-level", "info", "the least `LEVEL` logged: debug, info, warn or error")
	return l
}

// Logger returns a logger writing to w in l.Format at l.Level, or a usage error
// naming the flag whose value is invalid.
func (l *LogFlags) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		return nil, Usagef("--log-level %q: use debug, info, warn or error", l.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.Format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, Usagef("--log-format %q: use text or json", l.Format)
}

// ShellQuote quotes s for a POSIX shell when it needs it, so that hints print
// commands that can be pasted.
func ShellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=,~", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
