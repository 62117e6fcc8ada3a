package identity

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPublishLinkFallback takes the link(2) path used where the filesystem
// lacks RENAME_NOREPLACE: it publishes, leaves one link, and never replaces.
func TestPublishLinkFallback(t *testing.T) {
	noRenameat2 := func(string, string) error { return unix.EINVAL }
	dir := t.TempDir()
	tmp, path := filepath.Join(dir, ".k.tmp"), filepath.Join(dir, "k")
	if err := os.WriteFile(tmp, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := publishWith(noRenameat2, tmp, path); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Nlink != 1 {
		t.Fatalf("published file: nlink %d, %v", st.Nlink, err)
	}
	if _, err := os.Lstat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("staged name still present: %v", err)
	}

	os.WriteFile(tmp, []byte("two"), 0o600)
	if err := publishWith(noRenameat2, tmp, path); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("fallback over an existing file: %v, want EEXIST", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "one" {
		t.Fatalf("existing file replaced: %q", got)
	}
	// Other errors of the rename are returned as they are, without fallback.
	os.Remove(path)
	if err := publishWith(func(string, string) error { return unix.EACCES }, tmp, path); !errors.Is(err, unix.EACCES) {
		t.Fatalf("EACCES: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("fell back to link after EACCES")
	}
}
