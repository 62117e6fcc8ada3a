package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sealbridge/sealbridge/internal/dataroot"
)

// TestEveryBinaryHintsAKeyFileFix breaks a key file in each way the key-file rules
// refuse (mode 0644, a symbolic link, two hard links, a FIFO) and runs every binary
// that loads it: the daemon's key (sealbridge whoami, sealbridged, sealbridge-fsck
// --identity NAME) and the relay's (sealbridge-relay, sealbridge relay). Each
// refuses, names the key file and prints a "hint:" line with the fix, as for a
// data-root rule. (Before: the path and the rule only.)
func TestEveryBinaryHintsAKeyFileFix(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bins := buildRulesBinaries(t)
	breaks := []struct {
		name, hint string
		break_     func(t *testing.T, path string)
	}{
		{"mode 0644", "chmod 600 ", func(t *testing.T, path string) {
			if err := os.Chmod(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink", "mv \"$(readlink -f ", func(t *testing.T, path string) {
			if err := os.Rename(path, path+".real"); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Base(path)+".real", path); err != nil {
				t.Fatal(err)
			}
		}},
		{"two hard links", "-samefile ", func(t *testing.T, path string) {
			if err := os.Link(path, path+".second"); err != nil {
				t.Skipf("link: %v", err)
			}
		}},
		{"FIFO", "out of the way", func(t *testing.T, path string) {
			if err := os.Rename(path, path+".real"); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
		}},
	}
	type command struct {
		name, bin, up string
		args          []string
		relay         bool // the relay's key file, not the daemon's
	}
	commands := func(h *rulesHomes) []command {
		return []command{
			{name: "sealbridge whoami", bin: bins.cli, args: []string{"whoami", "--home", h.home}},
			{name: "sealbridged", bin: bins.daemon, up: "daemon: ready", args: []string{"--home", h.home}},
			{name: "sealbridge-fsck", bin: bins.fsck, args: []string{"--home", h.home, "--identity", "default"}},
			{name: "sealbridge-relay", bin: bins.relay, up: "listening ", relay: true,
				args: []string{"--listen", "127.0.0.1:0", "--home", h.relayHome}},
			{name: "sealbridge relay", bin: bins.cli, up: "listening ", relay: true,
				args: []string{"relay", "--listen", "127.0.0.1:0", "--home", h.relayHome}},
		}
	}
	for _, b := range breaks {
		t.Run(b.name, func(t *testing.T) {
			for i := range commands(&rulesHomes{}) {
				h := newRulesHomes(t) // a fresh pair of homes per command
				c := commands(h)[i]
				path := dataroot.KeyFile(h.home, "default")
				if c.relay {
					path = filepath.Join(h.relayHome, "relay-identity.pem")
				}
				b.break_(t, path)
				res := runRules(t, c.up, c.bin, c.args...)
				var hint string
				for _, line := range strings.Split(res.out, "\n") {
					if _, h, ok := strings.Cut(line, ": hint: "); ok && strings.Contains(h, b.hint) {
						hint = h
					}
				}
				switch {
				case res.up:
					t.Errorf("%s started serving with a broken key file:\n%s", c.name, res.out)
				case res.code == 0:
					t.Errorf("%s exited 0 with a broken key file:\n%s", c.name, res.out)
				case !strings.Contains(res.out, path):
					t.Errorf("%s (exit %d) does not name %s:\n%s", c.name, res.code, path, res.out)
				case hint == "" || !strings.Contains(hint, path):
					t.Errorf("%s (exit %d): no hint with %q naming %s:\n%s", c.name, res.code, b.hint, path, res.out)
				}
			}
		})
	}
}
