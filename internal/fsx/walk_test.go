package fsx

import (
	"os"
	"strings"
	"syscall"
	"testing"
)

// walkFixture builds a tree with every kind of obstacle and returns the calls to try.
func walkFixture(t *testing.T) (FS, []struct {
	what string
	call func() error
}) {
	fsys := newOS(t)
	outside := t.TempDir()
	mkdirAll(t, fsys, "real/sub")
	mkdirAll(t, fsys, "d")
	writeRaw(t, fsys, "real/x", []byte("x"), 0o600)
	writeRaw(t, fsys, "a", []byte("a"), 0o600)
	symlink(t, fsys, "real", "sd")
	symlink(t, fsys, "../real", "d/sd")
	symlink(t, fsys, outside, "out")
	symlink(t, fsys, "a", "ln")
	symlink(t, fsys, "missing", "dangling")
	open := func(name string, flag int) func() error {
		return func() error {
			f, err := fsys.OpenFile(name, flag, 0o600)
			if err == nil {
				f.Close()
			}
			return err
		}
	}
	lstat := func(name string) func() error {
		return func() error { _, err := fsys.Lstat(name); return err }
	}
	readDir := func(name string) func() error {
		return func() error { _, err := fsys.ReadDir(name); return err }
	}
	var calls []struct {
		what string
		call func() error
	}
	add := func(what string, call func() error) {
		calls = append(calls, struct {
			what string
			call func() error
		}{what, call})
	}
	for _, name := range []string{"a", "real/x", "ln", "dangling", "sd/x", "d/sd/x", "out/x", "a/x", "missing/x", "real/sub/x", "sd/sub/x", "real/missing/x"} {
		add("open "+name, open(name, syscall.O_RDONLY))
		add("create "+name, open(name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL))
		add("lstat "+name, lstat(name))
		add("remove "+name+"-no", func() error { return fsys.Remove(name + "-no") })
		add("rename a to "+name+"-no", func() error { return fsys.Rename("missing-src", name+"-no") })
	}
	for _, name := range []string{".", "real", "sd", "d/sd", "out", "a", "ln", "missing", "sd/sub", "real/sub"} {
		add("opendir "+name, open(name, syscall.O_RDONLY|syscall.O_DIRECTORY))
		add("readdir "+name, readDir(name))
		add("syncdir "+name, func() error { return fsys.SyncDir(name) })
		add("mkdir "+name+"/m", func() error { return fsys.Mkdir(name+"/m", 0o700) })
	}
	return fsys, calls
}

// TestWalkMatchesOpenat2 checks that the O_NOFOLLOW walk answers every call with the
// same errno as openat2 does.
func TestWalkMatchesOpenat2(t *testing.T) {
	_, probe := walkFixture(t)
	probe[0].call()
	if noOpenat2.Load() {
		t.Skip("openat2 is not available here")
	}
	// Each mode gets a fresh tree: some calls succeed and change it.
	_, calls := walkFixture(t)
	want := make([]syscall.Errno, len(calls))
	for i, c := range calls {
		want[i] = Errno(c.call())
	}
	withoutOpenat2(t)
	_, calls = walkFixture(t)
	for i, c := range calls {
		got := Errno(c.call())
		if got != want[i] {
			t.Errorf("%s: walk gives %v (%d), openat2 %v (%d)", c.what, got, int(got), want[i], int(want[i]))
		}
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// openFDsUnder counts this process's descriptors open on root or beneath it (other
// tests' OS values may close theirs at any time, when collected).
func openFDsUnder(t *testing.T, root string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && (target == root || strings.HasPrefix(target, root+"/")) {
			n++
		}
	}
	return n
}

// TestNoDescriptorLeak runs every call, failing and succeeding, in both modes and
// checks that no descriptor stays open.
func TestNoDescriptorLeak(t *testing.T) {
	for _, walk := range []bool{false, true} {
		t.Run(map[bool]string{false: "openat2", true: "walk"}[walk], func(t *testing.T) {
			if walk {
				withoutOpenat2(t)
			}
			fsys, calls := walkFixture(t)
			run := func() {
				for _, c := range calls {
					c.call()
				}
				if err := WriteFile(fsys, "real", "w", []byte("w")); err != nil {
					t.Fatal(err)
				}
				if _, _, err := ReadFile(fsys, "real/w", 10); err != nil {
					t.Fatal(err)
				}
				if err := fsys.Link("real/w", "real/w2"); err != nil {
					t.Fatal(err)
				}
				if err := fsys.Rename("real/w2", "d/w3"); err != nil {
					t.Fatal(err)
				}
				if err := RemoveFile(fsys, "d", "w3"); err != nil {
					t.Fatal(err)
				}
				WriteFile(fsys, "sd", "w", nil)
				ReadFile(fsys, "sd/x", 10)
			}
			run()
			before := openFDsUnder(t, fsys.Root())
			for range 20 {
				run()
			}
			if after := openFDsUnder(t, fsys.Root()); after != before {
				t.Fatalf("%d descriptors open before, %d after", before, after)
			}
		})
	}
}
