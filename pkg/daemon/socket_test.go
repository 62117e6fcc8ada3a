package daemon

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
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

// tree lists every path under root with its mode.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		out = append(out, p+" "+fi.Mode().String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A socket path longer than a unix socket address holds stops the daemon in New,
// with the path, its length and a hint, before it writes anything.
func TestSocketPathTooLongRefusedBeforeAnythingIsWritten(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "")
	base := shortDir(t)
	home := filepath.Join(base, strings.Repeat("h", 100))
	id, err := InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	sock := dataroot.SocketPaths(home, string(id.DID()))[0]
	if len(sock) <= dataroot.MaxSocketPath {
		t.Fatalf("socket path %s is short enough; the test needs a longer one", sock)
	}
	before := tree(t, base)
	d, err := New(Options{Home: home, Logger: quiet})
	if err == nil {
		d.Close()
		t.Fatal("daemon started on a socket path too long to bind")
	}
	if msg := err.Error(); !strings.Contains(msg, sock) || !strings.Contains(msg, strconv.Itoa(len(sock))) {
		t.Fatalf("error %q lacks the path %s or its length %d", msg, sock, len(sock))
	}
	if h := errcode.HintOf(err); !strings.Contains(h, "XDG_RUNTIME_DIR") || !strings.Contains(h, "--home") {
		t.Fatalf("hint %q", h)
	}
	if after := tree(t, base); !slices.Equal(before, after) {
		t.Fatalf("New wrote to the data root:\nbefore %q\nafter  %q", before, after)
	}
}

// With $XDG_RUNTIME_DIR the socket is $XDG_RUNTIME_DIR/sealbridge/<short id>.sock
// in a 0700 directory the daemon creates, whatever the length of the data root.
func TestSocketInRuntimeDir(t *testing.T) {
	rt := shortDir(t)
	t.Setenv("XDG_RUNTIME_DIR", rt)
	home := filepath.Join(t.TempDir(), strings.Repeat("h", 100))
	id, err := InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(rt, "sealbridge", dataroot.ShortID(string(id.DID()))+".sock")
	if len(want) > dataroot.MaxSocketPath {
		t.Skipf("the temp dir %s is too long for a runtime directory", os.TempDir())
	}
	d, err := New(Options{Home: home, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, d)
	if d.SocketPath() != want {
		t.Fatalf("socket %s, want %s", d.SocketPath(), want)
	}
	fi, err := os.Lstat(filepath.Dir(want))
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("runtime directory: %v %v", fi, err)
	}
	if fi, err := os.Lstat(want); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi, err)
	}
}

// A runtime or run directory that is open to others, or a symlink, is refused.
func TestSocketDirectoryRulesRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		bad  func(t *testing.T, dir string)
		want string
	}{
		{"mode 0755", func(t *testing.T, dir string) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "chmod 700 "},
		{"symlink", func(t *testing.T, dir string) {
			if err := os.Symlink(t.TempDir(), dir); err != nil {
				t.Fatal(err)
			}
		}, "remove it"},
	} {
		for _, which := range []string{"runtime", "run"} {
			t.Run(which+" "+c.name, func(t *testing.T) {
				rt := shortDir(t)
				t.Setenv("XDG_RUNTIME_DIR", rt)
				home := shortDir(t)
				if _, err := InitIdentity(home, ""); err != nil {
					t.Fatal(err)
				}
				dir := filepath.Join(rt, dataroot.RuntimeSubdir)
				if which == "run" {
					dir = filepath.Join(home, dataroot.RunDir)
				}
				c.bad(t, dir)
				d, err := New(Options{Home: home, Logger: quiet})
				if err == nil {
					d.Close()
					t.Fatalf("daemon started with %s %s", dir, c.name)
				}
				want := c.want
				if which == "run" && c.name == "symlink" {
					want = "replace the symbolic link" // the data-root rules refuse it first
				}
				if !strings.Contains(err.Error(), dir) || !strings.Contains(errcode.HintOf(err), want) {
					t.Fatalf("error %q, hint %q", err, errcode.HintOf(err))
				}
			})
		}
	}
}

// The pid file is a lock that stays: a daemon that opened it while another held it
// holds the lock on that same file afterwards, and a third daemon is refused. (If
// Close unlinked it, the third would lock a new file and run beside the second.)
func TestPIDFileStaysAndKeepsExcluding(t *testing.T) {
	home := shortDir(t)
	id, err := InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Home: home, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	path := dataroot.PIDFile(home, string(id.DID()))
	data, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(data)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("pid file %s: %q %v", path, data, err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pid file mode: %v %v", fi, err)
	}
	// A second daemon has opened the pid file and waits for the lock.
	second, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if err := syscall.Flock(int(second.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("flock while the daemon holds it: %v", err)
	}
	d.Close()
	if err := syscall.Flock(int(second.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("flock after Close: %v", err)
	}
	third, err := New(Options{Home: home, Logger: quiet})
	if err == nil {
		third.Close()
		t.Fatal("a third daemon started while the second holds the pid-file lock")
	}
	if !strings.Contains(err.Error(), "already running") {
		t.Fatalf("third daemon: %v", err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("pid file after Close: %v", err)
	}
}
