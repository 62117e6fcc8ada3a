package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// rulesBinaries are the four commands, built once into a temp directory.
type rulesBinaries struct{ cli, daemon, fsck, relay string }

func buildRulesBinaries(t *testing.T) rulesBinaries {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir, "../../cmd/sealbridge", "../../cmd/sealbridged",
		"../../cmd/sealbridge-fsck", "../../cmd/sealbridge-relay").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return rulesBinaries{cli: filepath.Join(dir, "sealbridge"), daemon: filepath.Join(dir, "sealbridged"),
		fsck: filepath.Join(dir, "sealbridge-fsck"), relay: filepath.Join(dir, "sealbridge-relay")}
}

// rulesRun is the outcome of one command: its exit code (-1 if it was stopped
// after it came up), its combined output, and whether it came up (printed marker).
type rulesRun struct {
	code int
	out  string
	up   bool
}

// runRules runs bin with args. A long-running command that prints upMarker has
// started serving: it is stopped (SIGTERM) and reported as up. It must exit or
// come up within a generous bound; the bound is a hang detector, not a timing
// assumption.
func runRules(t *testing.T, upMarker, bin string, args ...string) rulesRun {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "SEALBRIDGE_HOME=", "SEALBRIDGE_IDENTITY=", "XDG_RUNTIME_DIR=")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var mu sync.Mutex
	var buf bytes.Buffer
	up := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(r)
		seen := false
		for sc.Scan() {
			mu.Lock()
			buf.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if !seen && upMarker != "" && strings.Contains(sc.Text(), upMarker) {
				seen = true
				close(up)
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	res := rulesRun{code: -1}
	select {
	case err := <-exited:
		res.code = exitCodeOf(t, err)
	case <-up:
		res.up = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("%s %q neither exited nor came up", filepath.Base(bin), args)
	}
	<-read
	r.Close()
	mu.Lock()
	res.out = buf.String()
	mu.Unlock()
	return res
}

func exitCodeOf(t *testing.T, err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatal(err)
	return -1
}

// rulesHomes is a daemon's data root with its identity, store and run directory,
// and a relay's data root with its key, store and inbox directory: everything each
// rule is broken in.
type rulesHomes struct {
	home, did, storeDir   string
	relayHome, relayStore string
}

func mkdirPrivate(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
}

func newRulesHomes(t *testing.T) *rulesHomes {
	t.Helper()
	// A short base, so that the daemon's socket path fits whatever the test's name.
	base, err := os.MkdirTemp("", "sbrules")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	h := &rulesHomes{home: filepath.Join(base, "home"), relayHome: filepath.Join(base, "relayhome")}
	id, err := daemon.InitIdentity(h.home, "")
	if err != nil {
		t.Fatal(err)
	}
	h.did = string(id.DID())
	h.storeDir = dataroot.StoreDir(h.home, string(id.DID()))
	mkdirPrivate(t, filepath.Join(h.storeDir, string(record.KindOutbox)), filepath.Join(h.home, "run"))

	rid, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	mkdirPrivate(t, h.relayHome)
	if err := identity.WriteKeyFile(filepath.Join(h.relayHome, "relay-identity.pem"), rid); err != nil {
		t.Fatal(err)
	}
	h.relayStore = dataroot.StoreDir(h.relayHome, string(rid.DID()))
	mkdirPrivate(t, filepath.Join(h.relayStore, string(record.KindReceipts)),
		filepath.Join(h.relayHome, "relay", filepath.Base(h.relayStore)))
	return h
}

// toSymlink replaces the directory at path by a symbolic link to it, moved aside.
func toSymlink(t *testing.T, path string) {
	t.Helper()
	if err := os.Rename(path, path+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(path)+".real", path); err != nil {
		t.Fatal(err)
	}
}

func toMode(perm os.FileMode) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		t.Helper()
		if err := os.Chmod(path, perm); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEveryBinaryRefusesABrokenDataRootRule breaks each data-root rule in turn and
// runs every binary the rule concerns: each refuses at start (a non-zero exit,
// never serving) and names the offending path; sealbridge-fsck reports it as a
// finding. init and whoami open the data root, not a store, so the store-level
// rules do not concern them; a relay home has no identities/ or run/ but has a
// relay/ directory. A first run on the unbroken homes shows every binary starts.
func TestEveryBinaryRefusesABrokenDataRootRule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bins := buildRulesBinaries(t)

	type target int
	const (
		daemonHome target = iota
		relayHome
	)
	type rule struct {
		name   string
		where  target
		path   func(h *rulesHomes) string
		break_ func(*testing.T, string)
		// fsckCode and fsckPath: the finding fsck reports ("" code: it refuses to
		// check, exit 8); fsckPath is relative to the store directory, "" for the
		// absolute path of a finding above the store.
		fsckCode, fsckPath string
		store              bool // a store-level rule: init and whoami do not open the store
	}
	home := func(h *rulesHomes) string { return h.home }
	under := func(rel string) func(*rulesHomes) string {
		return func(h *rulesHomes) string { return filepath.Join(h.home, rel) }
	}
	relayUnder := func(rel string) func(*rulesHomes) string {
		return func(h *rulesHomes) string { return filepath.Join(h.relayHome, rel) }
	}
	storeDir := func(h *rulesHomes) string { return h.storeDir }
	kindDir := func(h *rulesHomes) string { return filepath.Join(h.storeDir, string(record.KindOutbox)) }
	relayStore := func(h *rulesHomes) string { return h.relayStore }
	relayInbox := func(h *rulesHomes) string { return filepath.Join(h.relayHome, "relay", filepath.Base(h.relayStore)) }
	relayKind := func(h *rulesHomes) string { return filepath.Join(h.relayStore, string(record.KindReceipts)) }
	rules := []rule{
		{name: "data root symlink", path: home, break_: toSymlink, fsckCode: "data-root-unsafe"},
		{name: "data root 0777", path: home, break_: toMode(0o777), fsckCode: "data-root-unsafe"},
		{name: "delivery 0777", path: under("delivery"), break_: toMode(0o777), fsckCode: "data-root-unsafe"},
		{name: "delivery symlink", path: under("delivery"), break_: toSymlink, fsckCode: "data-root-unsafe"},
		{name: "identities symlink", path: under("identities"), break_: toSymlink, fsckCode: "data-root-unsafe"},
		{name: "run symlink", path: under("run"), break_: toSymlink, fsckCode: "data-root-unsafe"},
		{name: "store dir 0755", path: storeDir, break_: toMode(0o755), fsckCode: "bad-mode", fsckPath: ".", store: true},
		{name: "store dir symlink", path: storeDir, break_: toSymlink, store: true},
		{name: "kind dir 0755", path: kindDir, break_: toMode(0o755), fsckCode: "bad-mode", fsckPath: "outbox", store: true},

		{name: "relay home symlink", where: relayHome, path: relayUnder(""), break_: toSymlink},
		{name: "relay home 0777", where: relayHome, path: relayUnder(""), break_: toMode(0o777)},
		{name: "relay delivery 0777", where: relayHome, path: relayUnder("delivery"), break_: toMode(0o777)},
		{name: "relay delivery symlink", where: relayHome, path: relayUnder("delivery"), break_: toSymlink},
		{name: "relay relay/ symlink", where: relayHome, path: relayUnder("relay"), break_: toSymlink},
		{name: "relay inbox dir 0777", where: relayHome, path: relayInbox, break_: toMode(0o777)},
		{name: "relay store dir 0755", where: relayHome, path: relayStore, break_: toMode(0o755)},
		{name: "relay store dir symlink", where: relayHome, path: relayStore, break_: toSymlink},
		{name: "relay kind dir 0755", where: relayHome, path: relayKind, break_: toMode(0o755)},
	}

	// command is one binary run against a home; up is the line it prints once it
	// serves ("" for a command that just exits).
	type command struct {
		name, bin, up string
		args          []string
	}
	daemonCommands := func(h *rulesHomes, withStore bool) []command {
		cs := []command{}
		if !withStore {
			cs = append(cs,
				command{"sealbridge init", bins.cli, "", []string{"init", "--home", h.home, "--identity", "second"}},
				command{"sealbridge whoami", bins.cli, "", []string{"whoami", "--home", h.home}})
		}
		return append(cs, command{"sealbridged", bins.daemon, "daemon: ready", []string{"--home", h.home, "--log-level", "info"}})
	}
	relayCommands := func(h *rulesHomes) []command {
		return []command{
			{"sealbridge-relay", bins.relay, "listening ", []string{"--listen", "127.0.0.1:0", "--home", h.relayHome}},
			{"sealbridge relay", bins.cli, "listening ", []string{"relay", "--listen", "127.0.0.1:0", "--home", h.relayHome}},
		}
	}
	fsckArgs := func(h *rulesHomes) []string { return []string{"--home", h.home, "--identity", h.did} }

	t.Run("unbroken homes", func(t *testing.T) {
		h := newRulesHomes(t)
		for _, c := range append(daemonCommands(h, false), relayCommands(h)...) {
			if res := runRules(t, c.up, c.bin, c.args...); res.code != 0 && !res.up {
				t.Errorf("%s on a good home: exit %d\n%s", c.name, res.code, res.out)
			}
		}
		if res := runRules(t, "", bins.fsck, fsckArgs(h)...); res.code != 0 {
			t.Errorf("sealbridge-fsck on a good home: exit %d\n%s", res.code, res.out)
		}
	})

	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			h := newRulesHomes(t)
			path := r.path(h)
			r.break_(t, path)
			var cs []command
			if r.where == relayHome {
				cs = relayCommands(h)
			} else {
				cs = daemonCommands(h, r.store)
			}
			for _, c := range cs {
				res := runRules(t, c.up, c.bin, c.args...)
				switch {
				case res.up:
					t.Errorf("%s started serving with %s broken:\n%s", c.name, path, res.out)
				case res.code == 0:
					t.Errorf("%s exited 0 with %s broken:\n%s", c.name, path, res.out)
				case !strings.Contains(res.out, path):
					t.Errorf("%s (exit %d) does not name %s:\n%s", c.name, res.code, path, res.out)
				}
			}
			if r.where != daemonHome {
				return
			}
			// fsck names a finding in the store by its path in the store directory,
			// which it names first.
			named := path
			if r.fsckPath != "" {
				named = h.storeDir
			}
			res := runRules(t, "", bins.fsck, fsckArgs(h)...)
			if res.code == 0 || !strings.Contains(res.out, named) {
				t.Errorf("sealbridge-fsck: exit %d, want non-zero naming %s:\n%s", res.code, named, res.out)
			}
			if r.fsckCode != "" {
				fp := r.fsckPath
				if fp == "" {
					fp = path
				}
				if !strings.Contains(res.out, r.fsckCode+" ") || !strings.Contains(res.out, " "+fp+": ") {
					t.Errorf("sealbridge-fsck: want a %s finding at %s:\n%s", r.fsckCode, fp, res.out)
				}
			}
		})
	}
}
