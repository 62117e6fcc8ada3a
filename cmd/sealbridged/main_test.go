package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// sbd runs the daemon's command line with a cancelled context (were it to start,
// it stops at once) and returns its exit code and output.
func sbd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	code := run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersionAndUsage(t *testing.T) {
	if code, out, _ := sbd(t, "--version"); code != 0 || !strings.HasPrefix(out, "sealbridged ") {
		t.Fatalf("--version: %d %q", code, out)
	}
	for _, h := range []string{"--help", "-h"} {
		code, out, errs := sbd(t, h)
		if code != 0 || errs != "" || !strings.HasPrefix(out, "usage: sealbridged") {
			t.Fatalf("%s: %d %q %q", h, code, out, errs)
		}
		for _, want := range []string{"Exit status:", "  0 ", "  1 ", "  2 ", "$SEALBRIDGE_IDENTITY"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s does not say %q", h, want)
			}
		}
	}
}

// Usage errors, found by the flag parser or by the daemon package (an
// OptionError), exit 2 with "sealbridged: error:" and a hint; other failures exit 1.
func TestErrorsAndExitCodes(t *testing.T) {
	t.Setenv("SEALBRIDGE_HOME", t.TempDir()) // nothing may touch the real default
	home := t.TempDir()
	for _, c := range []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"unknown flag", []string{"--nope"}, 2, "unknown flag: --nope"},
		{"argument", []string{"--home", home, "extra"}, 2, `unexpected argument "extra"`},
		{"bad log format", []string{"--log-format", "xml"}, 2, "--log-format"},
		{"bad log level", []string{"--log-level", "loud"}, 2, "--log-level"},
		{"empty home", []string{"--home", ""}, 2, "empty"},
		{"empty identity", []string{"--home", home, "--identity="}, 2, "empty"},
		{"option error", []string{"--home", home, "--identity", "../x"}, 2, "--identity: "},
		{"negative retention", []string{"--home", home, "--closed-retention", "-1h"}, 2, "--closed-retention: -1h0m0s is out of range"},
		{"short retention", []string{"--home", home, "--delivered-retention", "1s"}, 2, "--delivered-retention: 1s is out of range"},
		{"no identity", []string{"--home", home}, 1, "no identity default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := sbd(t, c.args...)
			if code != c.code || out != "" || !strings.HasPrefix(errs, "sealbridged: error: ") || !strings.Contains(errs, c.want) {
				t.Fatalf("exit %d (want %d)\nstdout %q\nstderr %q", code, c.code, out, errs)
			}
			if c.code == 2 && !strings.Contains(errs, "sealbridged: hint: run 'sealbridged --help' for usage\n") {
				t.Fatalf("usage error without the usage hint: %q", errs)
			}
		})
	}
}

// A missing identity names its path once and says how to create it; the default
// identity is $SEALBRIDGE_IDENTITY.
func TestMissingIdentity(t *testing.T) {
	home := t.TempDir()
	t.Setenv("SEALBRIDGE_IDENTITY", "carol")
	path := daemon.IdentityPath(home, "carol")
	code, _, errs := sbd(t, "--home", home)
	want := "sealbridged: hint: create it with: sealbridge init --home " + home + " --identity carol\n"
	first, _, _ := strings.Cut(errs, "\n")
	if code != 1 || strings.Count(first, path) != 1 || strings.Count(first, "identity") != 1 || !strings.Contains(errs, want) {
		t.Fatalf("exit %d\n%s\nwant the path once and %q", code, errs, want)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("junk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs = sbd(t, "--home", home)
	if code != 1 || strings.Count(errs, path) != 1 || strings.Count(errs, "identity:") != 1 || !strings.HasPrefix(errs, "sealbridged: error: ") {
		t.Fatalf("bad key file: exit %d\n%s", code, errs)
	}
}

// A store behind its witness (an older .head put back) stops the daemon with exit
// 3 and a hint naming the exact reconcile command: this data root, this identity.
func TestRolledBackStoreExitsThreeWithTheReconcileCommand(t *testing.T) {
	home := t.TempDir()
	id, err := daemon.InitIdentity(home, "alice")
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(id.Signer(), store.Options{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.WriteHead(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	headPath := filepath.Join(s.Dir(), store.HeadFile)
	older, err := os.ReadFile(headPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.WriteHead(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(headPath, older, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := sbd(t, "--home", home, "--identity", "alice")
	want := "sealbridged: hint: the store was restored from an older copy: bring it forward with: sealbridge-fsck --reconcile --home " +
		home + " --identity alice"
	if code != 3 || out != "" || !strings.Contains(errs, "STORE_ROLLED_BACK") || !strings.Contains(errs, want) {
		t.Fatalf("exit %d (want 3)\nstdout %q\nstderr %q\nwant %q", code, out, errs, want)
	}
}
