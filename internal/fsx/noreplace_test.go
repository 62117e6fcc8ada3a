package fsx

import (
	"errors"
	"os"
	"slices"
	"syscall"
	"testing"
)

// renamerFS gives an FS a RenameNoReplace that fails with err (a file system without
// RENAME_NOREPLACE, or some other refusal).
type renamerFS struct {
	FS
	err   error
	calls int
}

func (r *renamerFS) RenameNoReplace(oldname, newname string) error {
	r.calls++
	return r.err
}

// TestCreateFileNeverReplaces runs CreateFile on the real FS (renameat2), on Faulty
// (no RenameNoReplace: link and unlink) and on an FS whose renameat2 says EINVAL (the
// link fallback). Each creates a private file with one link and no temp left, and
// refuses every kind of occupant — file, directory, symlink, dangling symlink —
// with EEXIST, leaving it as it was.
func TestCreateFileNeverReplaces(t *testing.T) {
	for _, c := range []struct {
		name  string
		newFS func(t *testing.T) FS
	}{
		{"OS", newOS},
		{"Faulty", newFaultyOS},
		{"EINVAL", func(t *testing.T) FS { return &renamerFS{FS: NewOS(t.TempDir()), err: syscall.EINVAL} }},
		{"ENOSYS", func(t *testing.T) FS { return &renamerFS{FS: NewOS(t.TempDir()), err: syscall.ENOSYS} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			withUmask(t, 0)
			fsys := c.newFS(t)
			mkdirAll(t, fsys, "d")
			if err := CreateFile(fsys, "d", "k", []byte("one")); err != nil {
				t.Fatal(err)
			}
			if got := readRaw(t, fsys, "d/k"); string(got) != "one" {
				t.Fatalf("d/k = %q", got)
			}
			info := mustLstat(t, fsys, "d/k")
			if info.Nlink != 1 || info.Perm() != 0o600 || !info.IsRegular() {
				t.Fatalf("created file: nlink %d, mode %o", info.Nlink, info.Mode)
			}
			if err := CreateFile(fsys, "d", "k", []byte("two")); !IsExist(err) {
				t.Fatalf("CreateFile over a file: %v, want EEXIST", err)
			}
			if got := readRaw(t, fsys, "d/k"); string(got) != "one" {
				t.Fatalf("existing file replaced: %q", got)
			}
			symlink(t, fsys, "k", "d/link")
			symlink(t, fsys, "absent", "d/dangling")
			mkdirAll(t, fsys, "d/sub")
			for _, occupant := range []string{"link", "dangling", "sub"} {
				if err := CreateFile(fsys, "d", occupant, []byte("x")); !IsExist(err) {
					t.Errorf("CreateFile over %s: %v, want EEXIST", occupant, err)
				}
			}
			if exists(t, abs(fsys, "d/absent")) {
				t.Fatal("CreateFile wrote through a dangling symlink")
			}
			if got := readRaw(t, fsys, "d/k"); string(got) != "one" {
				t.Fatalf("file behind the symlink changed: %q", got)
			}
			if tmps := temps(t, abs(fsys, "d")); len(tmps) != 0 {
				t.Fatalf("temps left: %v", tmps)
			}
			if err := CreateFile(fsys, "d", "a/b", nil); !errors.Is(err, ErrNotLocal) {
				t.Fatalf("CreateFile with a path as base: %v", err)
			}
		})
	}
}

// TestPublishNoReplaceFallsBackOnlyForMissingSupport: any other error of
// RenameNoReplace is returned as it is, without trying link.
func TestPublishNoReplaceFallsBackOnlyForMissingSupport(t *testing.T) {
	r := &renamerFS{FS: NewOS(t.TempDir()), err: &os.PathError{Op: "rename", Path: "k", Err: syscall.EACCES}}
	s, err := Stage(r, ".", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Cleanup()
	if err := s.PublishNoReplace("k"); !errors.Is(err, syscall.EACCES) || r.calls != 1 {
		t.Fatalf("PublishNoReplace = %v after %d calls, want EACCES after 1", err, r.calls)
	}
	if s.Published() || exists(t, abs(r, "k")) {
		t.Fatal("fell back to link after EACCES")
	}
	if err := s.Cleanup(); err != nil || exists(t, abs(r, s.Temp)) {
		t.Fatalf("Cleanup after a refused publish: %v", err)
	}
	if err := s.PublishNoReplace("k"); err == nil {
		t.Fatal("PublishNoReplace after Cleanup succeeded")
	}
}

// TestCreateFileIsDurable checks the calls CreateFile makes (under Faulty, the link
// path): the temp is written and fsynced before it gets its name, and the directory is
// fsynced after the name changes — the order the crash explorer relies on.
func TestCreateFileIsDurable(t *testing.T) {
	f := NewFaulty(NewOS(t.TempDir()))
	mkdirAll(t, f, "d")
	if err := CreateFile(f, "d", "k", []byte("x")); err != nil {
		t.Fatal(err)
	}
	var kinds []OpKind
	for _, op := range f.Log() {
		kinds = append(kinds, op.Kind)
	}
	want := []OpKind{OpCreate, OpWrite, OpSync, OpClose, OpLink, OpRemove, OpSyncDir}
	if !slices.Equal(kinds, want) {
		t.Fatalf("calls %v, want %v", kinds, want)
	}
	if log := f.Log(); log[4].Path2 != "d/k" || log[5].Path != log[0].Path || log[6].Path != "d" {
		t.Fatalf("link/unlink/syncdir on the wrong names: %+v", log[4:])
	}
	// A failed temp fsync stops it before any name is given.
	f2 := NewFaulty(NewOS(t.TempDir()))
	f2.Inject = func(op Op) error {
		if op.Kind == OpSync {
			return syscall.EIO
		}
		return nil
	}
	if err := CreateFile(f2, ".", "k", []byte("x")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("CreateFile with a failing fsync: %v", err)
	}
	if exists(t, abs(f2, "k")) || len(temps(t, f2.Root())) != 0 {
		t.Fatal("a failed fsync left a file or a temp")
	}
}
