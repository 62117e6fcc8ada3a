package identity_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// runFix runs the shell command at the end of a hint (after its last ": ") and
// reports whether it succeeded.
func runFix(t *testing.T, hint string) {
	t.Helper()
	cmd := hint
	if i := strings.LastIndex(hint, ": "); i >= 0 {
		cmd = hint[i+2:]
	}
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatalf("the hint's command %q: %v\n%s", cmd, err, out)
	}
}

// Every refusal of a key-file rule carries its fix as the hint (as the data-root
// refusals do), naming the path; where the fix is a command, running it makes the
// key load. (Before: the path and the rule only, no hint.)
func TestLoadKeyFileRefusalsCarryTheFix(t *testing.T) {
	// A path that needs quoting, so that the hints' commands must quote it.
	dir := filepath.Join(t.TempDir(), "my keys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	refused := func(path string) string {
		t.Helper()
		_, err := identity.LoadKeyFile(path)
		if err == nil {
			t.Fatalf("%s loaded", path)
		}
		hint := errcode.HintOf(err)
		if hint == "" || (!strings.Contains(hint, path) && !strings.Contains(hint, "backup")) {
			t.Fatalf("%s: %v: hint %q, want one naming the path", path, err, hint)
		}
		return hint
	}
	loads := func(path string) {
		t.Helper()
		if _, err := identity.LoadKeyFile(path); err != nil {
			t.Fatalf("after the fix: %v", err)
		}
	}

	t.Run("mode 0644", func(t *testing.T) {
		_, path := writeKey(t, dir, "mode.key")
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		hint := refused(path)
		if !strings.HasPrefix(hint, "chmod 600 ") {
			t.Fatalf("hint %q, want chmod 600", hint)
		}
		runFix(t, hint)
		loads(path)
	})
	t.Run("symlink", func(t *testing.T) {
		_, target := writeKey(t, dir, "target.key")
		link := filepath.Join(dir, "link.key")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		hint := refused(link)
		if !strings.Contains(hint, "mv ") {
			t.Fatalf("hint %q, want the mv that replaces the link", hint)
		}
		runFix(t, hint)
		loads(link)
	})
	t.Run("two hard links", func(t *testing.T) {
		_, path := writeKey(t, dir, "linked.key")
		other := filepath.Join(dir, "other name")
		if err := os.Link(path, other); err != nil {
			t.Skipf("link: %v", err)
		}
		hint := refused(path)
		if !strings.Contains(hint, "2 names") || !strings.Contains(hint, "-samefile") {
			t.Fatalf("hint %q, want the other names' removal", hint)
		}
		if err := os.Remove(other); err != nil {
			t.Fatal(err)
		}
		loads(path)
	})
	t.Run("FIFO", func(t *testing.T) {
		path := filepath.Join(dir, "fifo.key")
		if err := unix.Mkfifo(path, 0o600); err != nil {
			t.Skipf("mkfifo: %v", err)
		}
		if hint := refused(path); !strings.Contains(hint, "out of the way") || !strings.Contains(hint, "regular file") {
			t.Fatalf("hint %q", hint)
		}
	})
	t.Run("not a key", func(t *testing.T) {
		path := filepath.Join(dir, "junk.key")
		if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if hint := refused(path); !strings.Contains(hint, "backup") {
			t.Fatalf("hint %q", hint)
		}
	})
}
