package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// testProgram is a program "prog" with a subcommand "sub" taking --json, --home,
// --identity and positional arguments, which it records.
func testProgram(got *[]string, asJSON *bool) *cobra.Command {
	root := &cobra.Command{Use: "prog", Args: NoArgs, RunE: func(*cobra.Command, []string) error { return nil }}
	sub := &cobra.Command{Use: "sub [ARG…]", RunE: func(_ *cobra.Command, args []string) error {
		*got = args
		return nil
	}}
	sub.Flags().BoolVar(asJSON, "json", false, "JSON")
	var home, name string
	HomeFlag(sub.Flags(), &home)
	IdentityFlag(sub.Flags(), &name)
	root.AddCommand(sub)
	return root
}

func TestReportLines(t *testing.T) {
	p := Program{Name: "prog", UsageExit: 16}
	for _, c := range []struct {
		err  error
		want string
		code int
	}{
		{nil, "", 0},
		{errors.New("boom"), "prog: error: boom\n", 1},
		{errcode.WithHint(errors.New("boom"), "do this"), "prog: error: boom\nprog: hint: do this\n", 1},
		{Usagef("bad %d", 1), "prog: error: bad 1\nprog: hint: run 'prog --help' for usage\n", 16},
		{&UsageError{Err: errors.New("bad"), Help: "prog sub --help"}, "prog: error: bad\nprog: hint: run 'prog sub --help' for usage\n", 16},
		{AsUsage(errcode.WithHint(errors.New("bad"), "fix it")), "prog: error: bad\nprog: hint: fix it\nprog: hint: run 'prog --help' for usage\n", 16},
	} {
		var b bytes.Buffer
		p.Report(&b, c.err)
		if b.String() != c.want {
			t.Errorf("Report(%v) = %q, want %q", c.err, b.String(), c.want)
		}
		if got := p.Exit(c.err, 1); got != c.code {
			t.Errorf("Exit(%v) = %d, want %d", c.err, got, c.code)
		}
	}
	if AsUsage(nil) != nil {
		t.Error("AsUsage(nil) is not nil")
	}
}

func TestExecuteParsesFlagsAnywhere(t *testing.T) {
	p := Program{Name: "prog", UsageExit: 2}
	for _, c := range []struct {
		args []string
		pos  []string
		json bool
		err  string
	}{
		{args: []string{"id", "--json"}, pos: []string{"id"}, json: true},
		{args: []string{"--json", "a", "b"}, pos: []string{"a", "b"}, json: true},
		{args: []string{"a", "--", "--json", "-x"}, pos: []string{"a", "--json", "-x"}},
		{args: []string{"--", "-x"}, pos: []string{"-x"}},
		{args: []string{"a", ""}, err: "sub: an argument is empty"},
		{args: []string{""}, err: "sub: an argument is empty"},
		{args: []string{"--nope"}, err: "sub: unknown flag: --nope"},
		{args: []string{"--home", ""}, err: `invalid argument "" for "--home" flag: empty value`},
		{args: []string{"--identity="}, err: `invalid argument "" for "--identity" flag: empty value`},
	} {
		var pos []string
		var asJSON bool
		err := p.Execute(context.Background(), testProgram(&pos, &asJSON), append([]string{"sub"}, c.args...), io.Discard, io.Discard)
		if c.err != "" {
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.err) || ue.Help != "prog sub --help" {
				t.Errorf("%q: err %v, want a usage error with %q naming prog sub --help", c.args, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(pos, c.pos) || asJSON != c.json {
			t.Errorf("%q: pos %q json %v err %v, want %q %v", c.args, pos, asJSON, err, c.pos, c.json)
		}
	}
	var pos []string
	var asJSON bool
	var out bytes.Buffer
	if err := p.Execute(context.Background(), testProgram(&pos, &asJSON), []string{"sub", "x", "-h"}, &out, io.Discard); err != nil ||
		pos != nil || !strings.HasPrefix(out.String(), "usage: prog sub [ARG…]\n") || !strings.Contains(out.String(), "Exit status:\n  0   success\n  2   usage error\n") {
		t.Errorf("-h after an argument: %v, ran with %q, printed %q; want the help, not a run", err, pos, out.String())
	}
	if err := p.Execute(context.Background(), testProgram(&pos, &asJSON), []string{"extra"}, io.Discard, io.Discard); !IsUsage(err) ||
		err.Error() != `unexpected argument "extra": prog takes flags only` {
		t.Errorf("prog extra: %v", err)
	}
}

func TestIdentityDefaultFromEnvironment(t *testing.T) {
	for _, c := range []struct{ env, want string }{{"", DefaultIdentity}, {"alice", "alice"}} {
		t.Setenv(EnvIdentity, c.env)
		fs := pflag.NewFlagSet("p", pflag.ContinueOnError)
		var name string
		IdentityFlag(fs, &name)
		if err := fs.Parse(nil); err != nil || name != c.want {
			t.Errorf("$%s=%q: identity %q (%v), want %q", EnvIdentity, c.env, name, err, c.want)
		}
		if err := fs.Parse([]string{"--identity", "bob"}); err != nil || name != "bob" {
			t.Errorf("--identity bob with $%s=%q: %q (%v)", EnvIdentity, c.env, name, err)
		}
		// The help and the man pages state the default in words, whatever the environment.
		if d := fs.Lookup("identity").DefValue; d != "" {
			t.Errorf("$%s=%q: --identity's printed default is %q", EnvIdentity, c.env, d)
		}
	}
}

func TestLogger(t *testing.T) {
	var b bytes.Buffer
	l := &LogFlags{Format: "json", Level: "warn"}
	log, err := l.Logger(&b)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("quiet")
	log.Warn("loud", "k", "v")
	if s := b.String(); strings.Contains(s, "quiet") || !strings.HasPrefix(s, "{") || !strings.Contains(s, `"k":"v"`) {
		t.Fatalf("json at warn wrote %q", s)
	}
	for _, bad := range []LogFlags{{"xml", "info"}, {"text", "loud"}} {
		if _, err := bad.Logger(io.Discard); !IsUsage(err) {
			t.Errorf("%+v: %v, want a usage error", bad, err)
		}
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{"/a/b": "/a/b", "": "''", "a b": "'a b'", "it's": `'it'\''s'`} {
		if got := ShellQuote(in); got != want {
			t.Errorf("ShellQuote(%q) = %q, want %q", in, got, want)
		}
	}
}

// The flags a package defines on a standard-library flag set parse through the
// same values, are described by its usage text, in its order, and a flag the text
// does not describe (or a description of no flag) is reported.
func TestAddGoFlags(t *testing.T) {
	const doc = `  --rate R      envelopes per second
                (default 0: no bound)
  --allow-list  accept only registered recipients
  --backend B   file or jetstream
`
	gfs := flag.NewFlagSet("g", flag.ContinueOnError)
	backend := "file"
	gfs.Func("backend", "", func(s string) error {
		if s != "file" && s != "jetstream" {
			return errors.New("want file or jetstream")
		}
		backend = s
		return nil
	})
	allow := gfs.Bool("allow-list", false, "")
	rate := gfs.Float64("rate", 0, "")
	fs := pflag.NewFlagSet("p", pflag.ContinueOnError)
	fs.SortFlags = false
	if undescribed, unknown := AddGoFlags(fs, gfs, doc); undescribed != nil || unknown != nil {
		t.Fatalf("undescribed %q, unknown %q", undescribed, unknown)
	}
	if err := fs.Parse([]string{"--backend", "jetstream", "--allow-list", "--rate=2.5"}); err != nil || backend != "jetstream" || !*allow || *rate != 2.5 {
		t.Fatalf("parse: %v backend %q allow %v rate %v", err, backend, *allow, *rate)
	}
	if err := fs.Parse([]string{"--backend", "nfs"}); err == nil || !strings.Contains(err.Error(), "want file or jetstream") {
		t.Errorf("--backend nfs: %v", err)
	}
	u := fs.FlagUsages()
	if !strings.Contains(u, "--rate R") || !strings.Contains(u, "envelopes per second (default 0: no bound)") ||
		!strings.Contains(u, "--backend B") || strings.Contains(u, "--allow-list bool") ||
		strings.Index(u, "--rate") > strings.Index(u, "--allow-list") || strings.Index(u, "--allow-list") > strings.Index(u, "--backend") {
		t.Errorf("usages:\n%s", u)
	}
	fs = pflag.NewFlagSet("p", pflag.ContinueOnError)
	if undescribed, unknown := AddGoFlags(fs, gfs, "  --rate R  r\n  --allow-list  a\n  --nope N  n\n"); !slices.Equal(undescribed, []string{"backend"}) ||
		!slices.Equal(unknown, []string{"nope"}) || fs.Lookup("backend") == nil {
		t.Errorf("undescribed %q, unknown %q; --backend defined: %v", undescribed, unknown, fs.Lookup("backend") != nil)
	}
}

func TestWrap(t *testing.T) {
	if got := Wrap("aa bb cc  dd\nee", 5); got != "aa bb\ncc dd\nee" {
		t.Errorf("Wrap = %q", got)
	}
}

// The man pages are one per command, with the exit statuses, from the same
// definitions as the help.
func TestWriteMan(t *testing.T) {
	var pos []string
	var asJSON bool
	dir := t.TempDir()
	p := Program{Name: "prog", UsageExit: 2, ManSection: "8", Version: "v1"}
	if err := p.Execute(context.Background(), testProgram(&pos, &asJSON), []string{ManCommand, dir}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "prog-sub.8"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"EXIT STATUS", "2   usage error", `\fB--json\fP`, `\fB--home\fP`, `\fB--identity\fP`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("prog-sub.8 lacks %q:\n%s", want, b)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "prog.8")); err != nil {
		t.Error(err)
	}
}
