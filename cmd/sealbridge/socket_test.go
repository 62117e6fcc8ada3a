package main

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/daemon"
)

// dialLivez connects to path with a plain net.Dial, as curl --unix-socket and
// Python do, and asks GET /livez.
func dialLivez(t *testing.T, path string) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("net.Dial(unix, %s): %v", path, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /livez at %s: %s", path, resp.Status)
	}
}

// A user with a real-length $HOME and the default data root: with
// $XDG_RUNTIME_DIR the daemon starts, the CLI reaches it, and the path
// `whoami --socket` prints is dialled plainly; without one, the daemon itself
// refuses to start, naming the socket path.
func TestDefaultDataRootLongHome(t *testing.T) {
	base := shortHome(t)
	home := filepath.Join(base, strings.Repeat("h", max(1, 64-len(base))))
	rt := shortHome(t)
	if len(filepath.Join(rt, dataroot.RuntimeSubdir, dataroot.ShortID("x")+".sock")) > dataroot.MaxSocketPath {
		t.Skipf("the temp dir %s is too long to hold a runtime directory", os.TempDir())
	}
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", home)
	t.Setenv("SEALBRIDGE_HOME", "")
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("XDG_RUNTIME_DIR", "")
	code, out, errs := sb(t, "init")
	if code != 0 {
		t.Fatalf("init: %d %s", code, errs)
	}
	did := strings.TrimSpace(out)
	root := filepath.Join(home, ".local", "state", "sealbridge")
	sock := filepath.Join(root, dataroot.RunDir, dataroot.ShortID(did)+".sock")
	if len(sock) <= dataroot.MaxSocketPath {
		t.Fatalf("HOME %s is too short for the test: %s fits", home, sock)
	}

	// No runtime directory: the daemon refuses, before any client fails.
	if d, err := daemon.New(daemon.Options{}); err == nil {
		d.Close()
		t.Fatalf("daemon started with socket path %s (%d bytes)", sock, len(sock))
	} else if !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), strconv.Itoa(len(sock))) {
		t.Fatalf("daemon refused with %q; want the path %s and its length", err, sock)
	}

	t.Setenv("XDG_RUNTIME_DIR", rt)
	d := startDaemon(t, "", "")
	code, out, errs = sb(t, "whoami", "--socket")
	if code != 0 {
		t.Fatalf("whoami --socket: %d %s", code, errs)
	}
	path := strings.TrimSuffix(out, "\n")
	if want := filepath.Join(rt, dataroot.RuntimeSubdir, dataroot.ShortID(did)+".sock"); path != want || d.SocketPath() != want {
		t.Fatalf("whoami --socket printed %q, the daemon listens on %s; want %s", path, d.SocketPath(), want)
	}
	dialLivez(t, path)
	if code, out, errs = sb(t, "whoami"); code != 0 || out != did+"\n" {
		t.Fatalf("whoami: %d %q %s", code, out, errs)
	}
	if code, _, errs = sb(t, "ls"); code != 0 {
		t.Fatalf("ls: %d %s", code, errs)
	}
}

// A daemon started without $XDG_RUNTIME_DIR is found from a shell that has one.
func TestDaemonFoundAtTheDataRootSocket(t *testing.T) {
	home := shortHome(t)
	t.Setenv("XDG_RUNTIME_DIR", "")
	code, out, errs := sb(t, "init", "--home", home)
	if code != 0 {
		t.Fatalf("init: %d %s", code, errs)
	}
	did := strings.TrimSpace(out)
	d := startDaemon(t, home, "")
	t.Setenv("XDG_RUNTIME_DIR", shortHome(t))
	code, out, errs = sb(t, "whoami", "--socket", "--home", home)
	if want := filepath.Join(home, dataroot.RunDir, dataroot.ShortID(did)+".sock"); code != 0 || out != want+"\n" || d.SocketPath() != want {
		t.Fatalf("whoami --socket: %d %q %s; daemon at %s, want %s", code, out, errs, d.SocketPath(), want)
	}
	dialLivez(t, strings.TrimSpace(out))
	if code, _, errs = sb(t, "ls", "--home", home); code != 0 {
		t.Fatalf("ls: %d %s", code, errs)
	}
}
