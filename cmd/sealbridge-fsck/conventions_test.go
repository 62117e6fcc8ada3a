package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/fsfixtures"
)

// An empty argument or flag value (a script's unset variable) is a usage error
// (16), never "." or the default: nothing in the working directory is touched.
func TestEmptyArgumentsAreUsageErrors(t *testing.T) {
	t.Setenv("SEALBRIDGE_HOME", t.TempDir()) // were "" the default, not the real one
	cwd := t.TempDir()
	t.Chdir(cwd)
	file := filepath.Join(cwd, "main.go")
	if err := os.WriteFile(file, []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(cwd)
	if err != nil {
		t.Fatal(err)
	}
	owner := string(fsfixtures.OwnerDID())
	for _, args := range [][]string{
		{""}, {"--repair", ""}, {"--repair", "--json", ""},
		{"--home", "", "--identity", owner}, {"--repair", "--home=", "--identity", owner},
		{"--identity", "", fsfixtures.Build(t, "valid")},
	} {
		r := runArgs(t, args...)
		if r.code != exitUsage || r.stdout != "" || !strings.HasPrefix(r.stderr, "sealbridge-fsck: error: ") ||
			!strings.Contains(r.stderr, "empty") ||
			!strings.HasSuffix(r.stderr, "sealbridge-fsck: hint: run 'sealbridge-fsck --help' for usage\n") {
			t.Errorf("%q: exit %d\nstdout %q\nstderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	ents, err := os.ReadDir(cwd)
	if err != nil || len(ents) != 1 || ents[0].Name() != "main.go" {
		t.Fatalf("working directory changed: %v %v", ents, err)
	}
	if fi, err := os.Stat(cwd); err != nil || fi.Mode().Perm() != before.Mode().Perm() {
		t.Fatalf("working directory's mode changed: %v %v", fi, err)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("main.go: %v %v", fi, err)
	}
}
