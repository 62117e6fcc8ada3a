package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// execIn runs the binary with its working directory set to wd.
func execIn(t *testing.T, wd string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = wd
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return result{ee.ExitCode(), out.String(), errb.String()}
	} else if err != nil {
		t.Fatal(err)
	}
	return result{0, out.String(), errb.String()}
}

// refusal checks an exit 8 with an error line and a hint line containing hint.
func refusal(t *testing.T, r result, hint string) {
	t.Helper()
	if r.code != exitOperational || !strings.Contains(r.stderr, "sealbridge-fsck: error: ") ||
		!strings.Contains(r.stderr, "sealbridge-fsck: hint: ") || !strings.Contains(r.stderr, hint) {
		t.Fatalf("exit %d (want 8 with a hint containing %q)\nstdout: %s\nstderr: %s", r.code, hint, r.stdout, r.stderr)
	}
}

// holdFlock opens (creating) p and holds an exclusive flock on it, as a running
// daemon holds its pid file, until release is called or the test ends.
func holdFlock(t *testing.T, p string) (release func()) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("4242\n"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return func() { f.Close() }
}

// TestRepairRefusesLiveDaemon: --repair of a store whose daemon holds its pid-file
// flock exits 8 and moves nothing, named by STORE-DIR or by --home/--identity, at the
// daemon's pid file and at the one of earlier daemons. Once the daemon is gone the
// same repair runs.
func TestRepairRefusesLiveDaemon(t *testing.T) {
	for _, c := range []struct {
		name string
		pid  func(root, did string) string
	}{
		{"pid file", dataroot.PIDFile},
		{"earlier pid file", func(root, did string) string {
			return filepath.Join(root, "run", filepath.Base(fsfixtures.StoreDirOf(root, identity.DID(did))), "sealbridged.pid")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := fsfixtures.Build(t, "truncated-record")
			root, did := fsfixtures.DataRoot(dir), string(fsfixtures.OwnerDID())
			pid := c.pid(root, did)
			if err := os.MkdirAll(filepath.Dir(pid), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(pid, []byte("4242\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			// An unlocked pid file (a daemon that stopped) does not block a check.
			if r := execIn(t, t.TempDir(), dir); r.code != exitProblems {
				t.Fatalf("check with an idle pid file: exit %d\n%s", r.code, r.stderr)
			}
			release := holdFlock(t, pid)
			hash := fsfixtures.HashTree(t, dir)
			for _, args := range [][]string{
				{"--repair", dir},
				{"--repair", "--json", dir},
				{"--repair", "--home", root, "--identity", did},
			} {
				r := execIn(t, t.TempDir(), args...)
				refusal(t, r, "nothing was changed")
				if !strings.Contains(r.stderr, "a daemon serves the store (pid 4242") {
					t.Fatalf("%v: the daemon is not named:\n%s", args, r.stderr)
				}
				if fsfixtures.HashTree(t, dir) != hash {
					t.Fatalf("%v: --repair under a live daemon changed the store", args)
				}
			}
			// A check (read-only) still runs.
			if r := execIn(t, t.TempDir(), dir); r.code != exitProblems {
				t.Fatalf("check under a live daemon: exit %d\n%s", r.code, r.stderr)
			}
			release()
			if r := execIn(t, t.TempDir(), "--repair", dir); r.code != exitRepaired {
				t.Fatalf("--repair once the daemon is gone: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
		})
	}
}

// dataRoot builds a data root as a user has it: identities/ with key files,
// delivery/ with a store, run/ with the daemon's pid file. It returns the data root,
// the store directory and the key files' paths.
func dataRoot(t *testing.T) (root, dir string, keys []string) {
	t.Helper()
	dir = fsfixtures.Build(t, "combined")
	root = fsfixtures.DataRoot(dir)
	for name, id := range map[string]*identity.Identity{"default": fsfixtures.Owner(), "other": fsfixtures.Foreign()} {
		p := dataroot.KeyFile(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := identity.WriteKeyFile(p, id); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, p)
	}
	pid := dataroot.PIDFile(root, string(fsfixtures.OwnerDID()))
	if err := os.MkdirAll(filepath.Dir(pid), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pid, []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return root, dir, keys
}

// TestDataRootRefused: fsck of a data root (an easy mix-up with --home) exits 8 with
// the right invocation as its hint, with or without --repair, and changes nothing:
// the key files keep their bytes and modes. The hinted invocation then checks the
// store.
func TestDataRootRefused(t *testing.T) {
	root, dir, keys := dataRoot(t)
	hash := fsfixtures.HashTree(t, root)
	type keyState struct {
		data []byte
		mode os.FileMode
	}
	state := map[string]keyState{}
	for _, k := range keys {
		data, err := os.ReadFile(k)
		info, serr := os.Lstat(k)
		if err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		state[k] = keyState{data, info.Mode()}
	}
	for _, args := range [][]string{{root}, {"--repair", root}, {"--repair", "--json", root}, {"--json", root}} {
		r := execIn(t, t.TempDir(), args...)
		refusal(t, r, "--home "+root+" --identity NAME|DID")
		if strings.Contains(r.stdout+r.stderr, "sealbridge-fsck --repair "+root) {
			t.Fatalf("%v: a data root is called repairable:\n%s%s", args, r.stdout, r.stderr)
		}
		if fsfixtures.HashTree(t, root) != hash {
			t.Fatalf("%v changed the data root", args)
		}
		for k, want := range state {
			data, err := os.ReadFile(k)
			info, serr := os.Lstat(k)
			if err != nil || serr != nil || !bytes.Equal(data, want.data) || info.Mode() != want.mode {
				t.Fatalf("%v: key file %s changed (%v %v)", args, k, err, serr)
			}
		}
		if _, err := os.Stat(filepath.Join(root, "lost+found")); !os.IsNotExist(err) {
			t.Fatalf("%v: lost+found made in the data root (%v)", args, err)
		}
	}
	// The hinted invocation, with the identity by name, checks the store.
	r := execIn(t, t.TempDir(), "--home", root, "--identity", "default")
	if r.code != exitProblems || !strings.Contains(r.stdout, dir) {
		t.Fatalf("--home --identity default: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// sourceTree makes a directory that looks like a project checkout: .git/, Go files,
// a subdirectory, mode 0755.
func sourceTree(t *testing.T, dir string) {
	t.Helper()
	for name, data := range map[string]string{
		".git/HEAD":      "ref: refs/heads/main\n",
		".git/config":    "[core]\n",
		"go.mod":         "module example.com/x\n",
		"main.go":        "package main\n\nfunc main() {}\n",
		"pkg/x/x.go":     "package x\n",
		"messages/a.txt": "not a record\n", // a kind's name, by chance
	} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestEmptyArgument: an empty STORE-DIR, --home or --identity (a script's unset
// variable) is a usage error, never ".": run inside a source tree, nothing in it is
// moved and its mode is unchanged.
func TestEmptyArgument(t *testing.T) {
	wd := t.TempDir()
	sourceTree(t, wd)
	hash := fsfixtures.HashTree(t, wd)
	for _, args := range [][]string{
		{"--repair", ""},
		{""},
		{"--repair", "--json", ""},
		{"--repair", "--home", ""},
		{"--repair", "--home=", "--identity", "default"},
		{"--repair", "--identity", ""},
		{"--repair", "--identity=", "."},
	} {
		r := execIn(t, wd, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "empty") || r.stdout != "" {
			t.Fatalf("%q: exit %d (want 16)\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
		}
		if fsfixtures.HashTree(t, wd) != hash {
			t.Fatalf("%q changed the working directory", args)
		}
	}
}

// TestSourceTreeRefused: --repair of a directory holding arbitrary files (a source
// tree) exits 8 and changes nothing, whether it is named like a store or not, given
// by path or as ".".
func TestSourceTreeRefused(t *testing.T) {
	plain := filepath.Join(t.TempDir(), "project")
	named := filepath.Join(t.TempDir(), "delivery", strings.Repeat("0a", 32))
	for _, dir := range []string{plain, named} {
		sourceTree(t, dir)
		hash := fsfixtures.HashTree(t, dir)
		for _, c := range []struct {
			wd   string
			args []string
		}{
			{t.TempDir(), []string{"--repair", dir}},
			{t.TempDir(), []string{dir}},
			{dir, []string{"--repair", "."}},
		} {
			r := execIn(t, c.wd, c.args...)
			refusal(t, r, "<data root>/delivery/<64 hex digits>")
			if fsfixtures.HashTree(t, dir) != hash {
				t.Fatalf("%v (in %s) changed %s", c.args, c.wd, dir)
			}
			info, err := os.Lstat(dir)
			if err != nil || info.Mode().Perm() != 0o755 {
				t.Fatalf("%s: mode %v (%v)", dir, info.Mode(), err)
			}
		}
	}
}

// TestIdentityByName: --identity takes a name, as in sealbridge and sealbridged,
// looked up in the data root (the one of --home, or the one holding STORE-DIR);
// $SEALBRIDGE_IDENTITY names it when --identity is not given.
func TestIdentityByName(t *testing.T) {
	root, dir, _ := dataRoot(t)
	for _, c := range []struct {
		args []string
		env  string
		code int
		want string // in stdout or stderr
	}{
		{args: []string{"--json", "--identity", "default", dir}, code: exitProblems, want: `"ownerSource": "given"`},
		{args: []string{"--identity", "other", dir}, code: exitOperational, want: "store directory of another identity"},
		// An identity whose key file exists and that has stored nothing yet.
		{args: []string{"--json", "--home", root}, env: "other", code: exitClean, want: `"code": "store-absent"`},
		{args: []string{"--json", "--home", root}, env: "default", code: exitProblems, want: `"store": "` + dir + `"`},
		{args: []string{"--home", root, "--identity", "nobody"}, code: exitOperational, want: "no identity nobody at " + root + "/identities/nobody.key"},
	} {
		t.Setenv(identityEnv, c.env)
		r := runArgs(t, c.args...)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("%v ($%s=%q): exit %d (want %d, with %q)\n%s%s", c.args, identityEnv, c.env, r.code, c.code, c.want, r.stdout, r.stderr)
		}
	}
	// The repair command printed for a named identity repeats the name.
	r := runArgs(t, "--json", "--home", root, "--identity", "default")
	if d := doc(t, r); d.RepairCommand != "sealbridge-fsck --repair --home "+root+" --identity default" {
		t.Fatalf("repairCommand %q", d.RepairCommand)
	}
}
