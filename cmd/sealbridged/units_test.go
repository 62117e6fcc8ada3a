package main

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/daemon"
)

// The shipped systemd units: a system unit and a user unit, both templates
// (sealbridged@NAME), with the binary where each is documented to be installed.
var units = []struct {
	path     string // from this package's directory
	user     bool   // for a per-user manager (systemctl --user)
	bin      string // ExecStart's binary
	wantedBy string
}{
	{"../../docs/systemd/system/sealbridged@.service", false, "/usr/local/bin/sealbridged", "multi-user.target"},
	{"../../docs/systemd/user/sealbridged@.service", true, "%h/go/bin/sealbridged", "default.target"},
}

// unitFile is a unit's settings: "Section.Key" → its values in order.
type unitFile map[string][]string

func readUnit(t *testing.T, path string) (string, unitFile) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u, section := unitFile{}, ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: cannot parse %q", path, line)
			}
			u[section+"."+k] = append(u[section+"."+k], v)
		}
	}
	return string(data), u
}

func (u unitFile) one(t *testing.T, key string) string {
	t.Helper()
	if v := u[key]; len(v) == 1 {
		return v[0]
	}
	t.Fatalf("%s: %q, want one value", key, u[key])
	return ""
}

// The units keep what the daemon and the docs rely on: Type=notify, the socket in
// the runtime directory systemd creates, the data root in the state directory,
// real Documentation URLs, and an install target the manager has.
func TestSystemdUnitsSettings(t *testing.T) {
	for _, c := range units {
		t.Run(filepath.Base(filepath.Dir(c.path)), func(t *testing.T) {
			_, u := readUnit(t, c.path)
			for key, want := range map[string]string{
				"Service.Type":                     "notify",
				"Service.RuntimeDirectory":         "sealbridge",
				"Service.RuntimeDirectoryMode":     "0700",
				"Service.StateDirectory":           "sealbridge",
				"Service.StateDirectoryMode":       "0700",
				"Service.NoNewPrivileges":          "yes",
				"Service.ProtectSystem":            "strict",
				"Install.WantedBy":                 c.wantedBy,
				"Service.RuntimeDirectoryPreserve": "yes",
			} {
				if got := u.one(t, key); got != want {
					t.Errorf("%s=%s, want %s", key, got, want)
				}
			}
			env := strings.Join(u["Service.Environment"], " ")
			for _, want := range []string{"XDG_RUNTIME_DIR=%t", "SEALBRIDGE_HOME=%S/sealbridge"} {
				if !strings.Contains(" "+env+" ", " "+want+" ") {
					t.Errorf("Environment %q lacks %s", env, want)
				}
			}
			if bin, _, _ := strings.Cut(u.one(t, "Service.ExecStart"), " "); bin != c.bin {
				t.Errorf("ExecStart runs %s, want %s", bin, c.bin)
			}
			for _, doc := range strings.Fields(strings.Join(u["Unit.Documentation"], " ")) {
				if !strings.HasPrefix(doc, "https://") && !strings.HasPrefix(doc, "man:") {
					t.Errorf("Documentation=%s is neither an https: URL nor a man: page", doc)
				}
			}
			switch _, ok := u["Service.User"]; {
			case ok && c.user:
				t.Error("User= in the user unit (a user manager runs units as its user)")
			case !ok && !c.user:
				t.Error("the system unit names no User=: the daemon would run as root")
			}
		})
	}
}

// The unit's ExecStart, run in process with its Environment= expanded as systemd
// expands it (%t the runtime directory, %S the state directory), starts a daemon
// that reports READY=1 to $NOTIFY_SOCKET and listens in %t/sealbridge, where a
// plain net.Dial reaches it.
func TestSystemdUnitsExecStartRuns(t *testing.T) {
	for _, c := range units {
		t.Run(filepath.Base(filepath.Dir(c.path)), func(t *testing.T) {
			_, u := readUnit(t, c.path)
			tmp, err := os.MkdirTemp("", "sb")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(tmp) })
			runtimeDir, stateDir := filepath.Join(tmp, "r"), filepath.Join(tmp, "s")
			for _, d := range []string{runtimeDir, filepath.Join(runtimeDir, "sealbridge"), stateDir, filepath.Join(stateDir, "sealbridge")} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			spec := strings.NewReplacer("%t", runtimeDir, "%S", stateDir, "%h", tmp, "%i", "test")
			t.Setenv("SEALBRIDGE_HOME", "")
			for _, assign := range strings.Fields(strings.Join(u["Service.Environment"], " ")) {
				k, v, _ := strings.Cut(spec.Replace(assign), "=")
				t.Setenv(k, v)
			}
			notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(tmp, "notify"), Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer notify.Close()
			t.Setenv("NOTIFY_SOCKET", notify.LocalAddr().String())
			id, err := daemon.InitIdentity(os.Getenv("SEALBRIDGE_HOME"), "test")
			if err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(runtimeDir, "sealbridge", dataroot.ShortID(string(id.DID()))+".sock")
			if len(sock) > dataroot.MaxSocketPath {
				t.Skipf("the temp dir %s is too long for a runtime directory", os.TempDir())
			}

			args := strings.Fields(os.Expand(spec.Replace(u.one(t, "Service.ExecStart")), os.Getenv))[1:]
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var errb bytes.Buffer
			code := make(chan int, 1)
			go func() { code <- run(ctx, args, &bytes.Buffer{}, &errb) }()
			ready := make(chan string, 1)
			go func() {
				buf := make([]byte, 256)
				n, _ := notify.Read(buf)
				ready <- string(buf[:n])
			}()
			select {
			case msg := <-ready:
				if msg != "READY=1" {
					t.Fatalf("notified %q", msg)
				}
			case c := <-code:
				t.Fatalf("sealbridged %q exited %d: %s", args, c, errb.String())
			case <-time.After(60 * time.Second):
				t.Fatal("no READY=1")
			}
			conn, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatalf("daemon of the unit not at %s: %v", sock, err)
			}
			conn.Close()
			cancel()
			select {
			case c := <-code:
				if c != 0 {
					t.Fatalf("exit %d: %s", c, errb.String())
				}
			case <-time.After(60 * time.Second):
				t.Fatal("sealbridged did not stop")
			}
		})
	}
}

// systemd-analyze verify accepts the units. verify checks that ExecStart names an
// executable, so it runs on a copy of each unit whose ExecStart binary is this
// test's own executable (the shipped paths are checked above, and the arguments
// are run by TestSystemdUnitsExecStartRuns); a template is verified as the
// instance sealbridged@test. The user unit is verified by a user manager
// (--user). Warnings count as failures: verify prints them and still exits 0.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed; the unit files are not verified")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range units {
		t.Run(filepath.Base(filepath.Dir(c.path)), func(t *testing.T) {
			text, _ := readUnit(t, c.path)
			if !strings.Contains(text, "ExecStart="+c.bin+" ") {
				t.Fatalf("ExecStart does not run %s", c.bin)
			}
			dir := t.TempDir()
			copyPath := filepath.Join(dir, "sealbridged@test.service")
			if err := os.WriteFile(copyPath, []byte(strings.ReplaceAll(text, "ExecStart="+c.bin+" ", "ExecStart="+exe+" ")), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"verify", copyPath}
			cmd := exec.Command(analyze)
			if c.user {
				args = append([]string{"--user"}, args...)
				runtimeDir := filepath.Join(dir, "run")
				if err := os.Mkdir(runtimeDir, 0o700); err != nil {
					t.Fatal(err)
				}
				cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+runtimeDir)
			}
			cmd.Args = append(cmd.Args, args...)
			out, err := cmd.CombinedOutput()
			var ours []string
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				// verify may also warn about unrelated units installed on this machine.
				if strings.Contains(line, "sealbridged@") {
					ours = append(ours, line)
				} else if line != "" {
					t.Logf("systemd-analyze (other units): %s", line)
				}
			}
			if err != nil || len(ours) > 0 {
				t.Fatalf("systemd-analyze %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
}
