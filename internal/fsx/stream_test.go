package fsx

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A streamed staged write makes exactly Stage's calls — create the temp O_EXCL 0600,
// its writes in order at growing offsets, one fsync, close — and is published by
// Publish and the caller's SyncDir like any staged write; Stage is one of them.
func TestStageStreamMakesStagesCalls(t *testing.T) {
	fz := newFaultyStore(t)
	w, err := StageStream(fz, "d")
	if err != nil {
		t.Fatal(err)
	}
	parts := [][]byte{[]byte("abc"), []byte("defgh"), []byte("i")}
	for _, p := range parts {
		if n, err := w.Write(p); err != nil || n != len(p) {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if w.Size() != 9 {
		t.Fatalf("Size = %d", w.Size())
	}
	st, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Publish("blob"); err != nil {
		t.Fatal(err)
	}
	if err := fz.SyncDir("d"); err != nil {
		t.Fatal(err)
	}
	log := fz.Log()
	want := []OpKind{OpCreate, OpWrite, OpWrite, OpWrite, OpSync, OpClose, OpRename, OpSyncDir}
	if !slices.Equal(kinds(log), want) {
		t.Fatalf("calls %v, want %v", kinds(log), want)
	}
	tmp := log[0].Path
	if path.Dir(tmp) != "d" || !IsTempName(path.Base(tmp)) || tmp != w.Temp() ||
		log[0].Flag != syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL || log[0].Perm != 0o600 {
		t.Fatalf("create %+v", log[0])
	}
	for i, off := range []int64{0, 3, 8} {
		if op := log[1+i]; op.Path != tmp || op.Offset != off || !bytes.Equal(op.Data, parts[i]) {
			t.Fatalf("write %d = %+v", i, op)
		}
	}
	if got := readRaw(t, fz, "d/blob"); string(got) != "abcdefghi" {
		t.Fatalf("published %q", got)
	}
	if _, err := os.Lstat(abs(fz, tmp)); !os.IsNotExist(err) {
		t.Fatalf("temp left: %v", err)
	}
	// Finished: the writer refuses more.
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("Write after Finish succeeded")
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if got := readRaw(t, fz, "d/blob"); string(got) != "abcdefghi" {
		t.Fatal("Abort after Finish touched the published file")
	}
}

// A failed write makes the temp unusable: later writes and Finish fail with that
// error, nothing is fsynced, and the temp is removed. A failed fsync is not retried
// and removes the temp too. Abort removes a temp in the middle of its writes.
func TestStageStreamFailures(t *testing.T) {
	t.Run("write", func(t *testing.T) {
		fz := newFaultyStore(t)
		w, err := StageStream(fz, "d")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte("ok")); err != nil {
			t.Fatal(err)
		}
		fz.Inject = func(op Op) error {
			if op.Kind == OpWrite {
				return syscall.ENOSPC
			}
			return nil
		}
		if _, err := w.Write([]byte("full")); Errno(err) != syscall.ENOSPC {
			t.Fatalf("Write = %v", err)
		}
		fz.Inject = nil
		if _, err := w.Write([]byte("more")); Errno(err) != syscall.ENOSPC {
			t.Fatalf("Write after a failure = %v, want the first error", err)
		}
		if st, err := w.Finish(); st != nil || Errno(err) != syscall.ENOSPC {
			t.Fatalf("Finish = %v, %v", st, err)
		}
		if slices.Contains(kinds(fz.Log()), OpSync) {
			t.Fatalf("a temp with a failed write was fsynced: %v", kinds(fz.Log()))
		}
		assertEmptyDir(t, fz, "d")
	})
	t.Run("fsync", func(t *testing.T) {
		fz := newFaultyStore(t)
		fz.Inject = func(op Op) error {
			if op.Kind == OpSync {
				return syscall.EIO
			}
			return nil
		}
		w, err := StageStream(fz, "d")
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("data"))
		if st, err := w.Finish(); st != nil || Errno(err) != syscall.EIO {
			t.Fatalf("Finish = %v, %v", st, err)
		}
		n := 0
		for _, op := range fz.Log() {
			if op.Kind == OpSync {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d fsyncs, want exactly one (never retried)", n)
		}
		assertEmptyDir(t, fz, "d")
	})
	t.Run("abort", func(t *testing.T) {
		fz := newFaultyStore(t)
		w, err := StageStream(fz, "d")
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("half"))
		if err := w.Abort(); err != nil {
			t.Fatal(err)
		}
		assertEmptyDir(t, fz, "d")
		if st, err := w.Finish(); st != nil || err == nil {
			t.Fatal("Finish after Abort succeeded")
		}
	})
}

func assertEmptyDir(t *testing.T, fsys FS, dir string) {
	t.Helper()
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("%s holds %v", dir, ents)
	}
}

// OpenRegular opens a regular file within its bound and refuses, without blocking or
// following anything, a symlink, a FIFO, a directory and a file over the bound.
func TestOpenRegular(t *testing.T) {
	fsys := NewOS(t.TempDir())
	writeRaw(t, fsys, "f", []byte("12345"), 0o600)
	f, info, err := OpenRegular(fsys, "f", 5)
	if err != nil || info.Size != 5 {
		t.Fatalf("OpenRegular = %v, %+v", err, info)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != "12345" {
		t.Fatalf("read %q", got)
	}
	if f, _, err := OpenRegular(fsys, "f", -1); err != nil {
		t.Fatalf("no bound: %v", err)
	} else {
		f.Close()
	}
	if _, _, err := OpenRegular(fsys, "f", 4); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the bound: %v", err)
	}
	if err := os.Symlink(abs(fsys, "f"), abs(fsys, "l")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenRegular(fsys, "l", -1); Errno(err) != syscall.ELOOP {
		t.Fatalf("symlink: %v", err)
	}
	if err := unix.Mkfifo(abs(fsys, "p"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenRegular(fsys, "p", -1); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("fifo: %v", err)
	}
	mkdirAll(t, fsys, "dir")
	if _, _, err := OpenRegular(fsys, "dir", -1); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("directory: %v", err)
	}
}

// An Appender created makes its directory durable at its first Checkpoint (the
// file's fsync, then its directory's, once); reopened at its end it continues there;
// Stage fsyncs and closes it and hands it to Publish; Remove unlinks it durably.
func TestAppenderStageAndRemove(t *testing.T) {
	fz := newFaultyStore(t)
	a, err := OpenAppend(fz, "d", ".x.part", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name() != "d/.x.part" {
		t.Fatalf("Name = %s", a.Name())
	}
	a.Write([]byte("hello "))
	if err := a.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	a.Write([]byte("wor"))
	if err := a.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	want := []OpKind{OpCreate, OpWrite, OpSync, OpSyncDir, OpWrite, OpSync, OpClose}
	if log := fz.Log(); !slices.Equal(kinds(log), want) || log[0].Perm != 0o600 || log[4].Offset != 6 {
		t.Fatalf("calls %v (%+v), want %v", kinds(log), log, want)
	}
	fz.Reset()
	a, err = OpenAppend(fz, "d", ".x.part", 9, false)
	if err != nil {
		t.Fatal(err)
	}
	a.Write([]byte("ld"))
	st, err := a.Stage()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Publish("done"); err != nil {
		t.Fatal(err)
	}
	want = []OpKind{OpWrite, OpSync, OpClose, OpRename}
	if log := fz.Log(); !slices.Equal(kinds(log), want) || log[0].Offset != 9 {
		t.Fatalf("calls %v (%+v), want %v", kinds(log), log, want)
	}
	if got := readRaw(t, fz, "d/done"); string(got) != "hello world" {
		t.Fatalf("published %q", got)
	}

	fz.Reset()
	a, err = OpenAppend(fz, "d", "p", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	a.Write([]byte("abc"))
	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	if log := fz.Log(); !slices.Equal(kinds(log), []OpKind{OpCreate, OpWrite, OpClose, OpRemove, OpSyncDir}) {
		t.Fatalf("Remove calls %v", kinds(log))
	}
	if _, err := os.Lstat(abs(fz, "d/p")); !os.IsNotExist(err) {
		t.Fatalf("removed file still there: %v", err)
	}

	writeRaw(t, fz, "d/shared", []byte("x"), 0o644)
	if _, err := OpenAppend(fz, "d", "shared", 1, false); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("0644 file: %v", err)
	}
	if err := os.Symlink(abs(fz, "d/done"), abs(fz, "d/link")); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenAppend(fz, "d", "link", 0, false); Errno(err) != syscall.ELOOP {
		t.Fatalf("symlink: %v", err)
	}
}

// After a failed Checkpoint, Stage fails too (never a retried fsync), and the file is
// left in place.
func TestAppenderStageAfterAFailedCheckpoint(t *testing.T) {
	fz := newFaultyStore(t)
	a, err := OpenAppend(fz, "d", "p", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	a.Write([]byte("abc"))
	fz.Inject = func(op Op) error {
		if op.Kind == OpSync {
			return syscall.EIO
		}
		return nil
	}
	if err := a.Checkpoint(); Errno(err) != syscall.EIO {
		t.Fatalf("Checkpoint = %v", err)
	}
	fz.Inject = nil
	if st, err := a.Stage(); st != nil || Errno(err) != syscall.EIO {
		t.Fatalf("Stage after a failed fsync = %v, %v", st, err)
	}
	syncs := 0
	for _, op := range fz.Log() {
		if op.Kind == OpSync {
			syncs++
		}
	}
	if syncs != 1 {
		t.Fatalf("%d fsyncs, want one", syncs)
	}
	if got := readRaw(t, fz, "d/p"); string(got) != "abc" {
		t.Fatalf("file %q", got)
	}
}

// DropIf drops only the fsyncs it chooses: here those of directory "d" and of files
// in it, while another directory's are made and recorded.
func TestFaultyDropIf(t *testing.T) {
	fz := newFaultyStore(t)
	mkdirAll(t, fz, "e")
	fz.DropIf = func(op Op) bool { return op.Path == "d" || path.Dir(op.Path) == "d" }
	for _, dir := range []string{"d", "e"} {
		if err := WriteFile(fz, dir, "x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, op := range fz.Log() {
		switch op.Kind {
		case OpSync:
			got = append(got, "fsync "+path.Dir(op.Path))
		case OpSyncDir:
			got = append(got, "syncdir "+op.Path)
		}
	}
	if !slices.Equal(got, []string{"fsync e", "syncdir e"}) {
		t.Fatalf("recorded syncs %v, want only e's", got)
	}
}
