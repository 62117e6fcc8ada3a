package fsx

import (
	"os"
	"path/filepath"
	"testing"
)

// syncDirsOf returns the directories fsynced in log.
func syncDirsOf(log []Op) []string {
	var out []string
	for _, op := range log {
		if op.Kind == OpSyncDir {
			out = append(out, op.Path)
		}
	}
	return out
}

// A directory MkdirPrivate finds (made by a creator that may have crashed before its
// parent's fsync) is made durable too: the parent is fsynced.
func TestMkdirPrivateFsyncsTheParentOfADirectoryItFinds(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "d"), 0o700); err != nil {
		t.Fatal(err)
	}
	f := NewFaulty(NewOS(root))
	created, err := MkdirPrivate(f, "d")
	if err != nil || created {
		t.Fatalf("MkdirPrivate(existing d) = %v, %v", created, err)
	}
	if got := syncDirsOf(f.Log()); len(got) != 1 || got[0] != "." {
		t.Fatalf("fsynced %q, want the parent \".\" once", got)
	}
	f.Reset()
	if created, err := MkdirPrivate(f, "d/e"); err != nil || !created {
		t.Fatalf("MkdirPrivate(d/e) = %v, %v", created, err)
	}
	if got := syncDirsOf(f.Log()); len(got) != 1 || got[0] != "d" {
		t.Fatalf("fsynced %q, want the parent \"d\" once", got)
	}
}

// DirsMade pays MkdirPrivate's parent fsync once per directory, checks the directory
// at every later call, and makes a directory removed meanwhile again (durably).
func TestDirsMadeEnsuresOnceThenChecks(t *testing.T) {
	root := t.TempDir()
	f := NewFaulty(NewOS(root))
	var d DirsMade
	for range 3 {
		if err := d.Ensure(f, "k"); err != nil {
			t.Fatal(err)
		}
	}
	if got := syncDirsOf(f.Log()); len(got) != 1 {
		t.Fatalf("three Ensures fsynced %q, want one parent fsync", got)
	}
	if err := os.Chmod(filepath.Join(root, "k"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := d.Ensure(f, "k"); err == nil {
		t.Fatal("Ensure accepted a directory loosened to 0755 after it was made")
	}
	if err := os.Chmod(filepath.Join(root, "k"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "k")); err != nil {
		t.Fatal(err)
	}
	f.Reset()
	if err := d.Ensure(f, "k"); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Lstat(filepath.Join(root, "k")); err != nil || !info.IsDir() {
		t.Fatalf("Ensure after removal: %v", err)
	}
	if got := syncDirsOf(f.Log()); len(got) != 1 || got[0] != "." {
		t.Fatalf("re-made directory fsynced %q, want the parent once", got)
	}
}
