package cli

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/errcode"
)

func newFS(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
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

func TestParseFlags(t *testing.T) {
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
		{args: []string{"a", ""}, err: "an argument is empty"},
		{args: []string{""}, err: "an argument is empty"},
		{args: []string{"--nope"}, err: "flag provided but not defined"},
		{args: []string{"--home", ""}, err: `invalid value "" for flag -home`},
		{args: []string{"--identity="}, err: `invalid value "" for flag -identity`},
	} {
		fs := newFS("prog sub")
		asJSON := fs.Bool("json", false, "")
		var home, name string
		HomeFlag(fs, &home)
		IdentityFlag(fs, &name)
		pos, err := ParseFlags(fs, c.args)
		if c.err != "" {
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.err) || ue.Help != "prog sub --help" {
				t.Errorf("%q: err %v, want a usage error with %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(pos, c.pos) || *asJSON != c.json {
			t.Errorf("%q: pos %q json %v err %v, want %q %v", c.args, pos, *asJSON, err, c.pos, c.json)
		}
	}
	if _, err := ParseFlags(newFS("p"), []string{"x", "-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h after an argument: %v, want flag.ErrHelp", err)
	}
}

func TestIdentityDefaultFromEnvironment(t *testing.T) {
	for _, c := range []struct{ env, want string }{{"", DefaultIdentity}, {"alice", "alice"}} {
		t.Setenv(EnvIdentity, c.env)
		fs := newFS("p")
		var name string
		IdentityFlag(fs, &name)
		if _, err := ParseFlags(fs, nil); err != nil || name != c.want {
			t.Errorf("$%s=%q: identity %q (%v), want %q", EnvIdentity, c.env, name, err, c.want)
		}
		if _, err := ParseFlags(fs, []string{"--identity", "bob"}); err != nil || name != "bob" {
			t.Errorf("--identity bob with $%s=%q: %q (%v)", EnvIdentity, c.env, name, err)
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

func TestParseFlagsMessageNamesTheCommandOnce(t *testing.T) {
	for name, want := range map[string]string{"prog sub": "sub: flag provided but not defined: -x", "prog": "flag provided but not defined: -x"} {
		_, err := ParseFlags(newFS(name), []string{"-x"})
		if err == nil || err.Error() != want {
			t.Errorf("flag set %q: %v, want %q", name, err, want)
		}
	}
}
