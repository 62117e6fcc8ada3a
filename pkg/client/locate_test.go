package client_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
)

// shortDir returns a new directory directly under the system temp dir (t.TempDir
// carries the test's name and may be long), removed when the test ends.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A daemon started without $XDG_RUNTIME_DIR listens on <root>/run/…; a client
// whose environment has one still finds it there, passing over a stale socket at
// the runtime-directory path, and dials it by its plain path.
func TestForIdentityFindsTheSecondCandidate(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "")
	home := shortDir(t)
	id, err := daemon.InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	did := string(id.DID())
	d, cancel, done := start(t, home)
	t.Cleanup(func() { stop(t, cancel, done) })
	second := filepath.Join(home, dataroot.RunDir, dataroot.ShortID(did)+".sock")
	if d.SocketPath() != second {
		t.Fatalf("daemon socket %s, want %s", d.SocketPath(), second)
	}

	rt := shortDir(t)
	t.Setenv("XDG_RUNTIME_DIR", rt)
	first := filepath.Join(rt, dataroot.RuntimeSubdir, dataroot.ShortID(did)+".sock")
	if got := client.SocketPath(home, did); got != first {
		t.Fatalf("SocketPath %s, want %s", got, first)
	}
	if got := client.Locate(home, did); got != second {
		t.Fatalf("Locate %s, want %s", got, second)
	}
	c := client.ForIdentity(home, did)
	if err := c.Live(context.Background()); err != nil {
		t.Fatal(err)
	}

	// A socket left at the first candidate by a daemon that died is passed over.
	if err := os.Mkdir(filepath.Dir(first), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: first, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	c = client.ForIdentity(home, did)
	if err := c.Ready(context.Background()); err != nil {
		t.Fatalf("with a stale socket at %s: %v", first, err)
	}
}

// With no socket at any candidate the error is "not running" and names the path
// the daemon would bind.
func TestForIdentityNotRunningNamesThePreferredPath(t *testing.T) {
	rt := shortDir(t)
	t.Setenv("XDG_RUNTIME_DIR", rt)
	home := shortDir(t)
	did := "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"
	err := client.ForIdentity(home, did).Live(context.Background())
	if err == nil || !client.IsNotRunning(err) {
		t.Fatalf("no daemon: %v", err)
	}
	if want := client.SocketPath(home, did); !strings.HasPrefix(want, rt) || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
}
