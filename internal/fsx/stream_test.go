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

// An Appender creates its file 0600 and makes it durable at its first Persist (the
// file's fsync, then its directory's, once); reopened, it continues at the end; Stage
// fsyncs it and hands it to Publish. It never opens a symlink, a second link or a
// file others can read.
func TestAppender(t *testing.T) {
	fz := newFaultyStore(t)
	a, err := OpenAppender(fz, "d", ".x.part")
	if err != nil {
		t.Fatal(err)
	}
	if !a.Created() || a.Size() != 0 || a.Name() != "d/.x.part" {
		t.Fatalf("created %v size %d name %s", a.Created(), a.Size(), a.Name())
	}
	a.Append([]byte("hello "))
	if err := a.Persist(); err != nil {
		t.Fatal(err)
	}
	a.Append([]byte("wor"))
	if err := a.Persist(); err != nil {
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
	a, err = OpenAppender(fz, "d", ".x.part")
	if err != nil {
		t.Fatal(err)
	}
	if a.Created() || a.Size() != 9 {
		t.Fatalf("reopened: created %v size %d", a.Created(), a.Size())
	}
	a.Append([]byte("ld"))
	buf := make([]byte, 11)
	if n, err := a.ReadAt(buf, 0); n != 11 || err != nil || string(buf) != "hello world" {
		t.Fatalf("ReadAt = %d %v %q", n, err, buf)
	}
	st, err := a.Stage()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Publish("done"); err != nil {
		t.Fatal(err)
	}
	// The failed exclusive create is recorded as failed; no directory fsync for a file
	// the Appender did not create.
	want = []OpKind{OpCreate, OpWrite, OpSync, OpClose, OpRename}
	if log := fz.Log(); !slices.Equal(kinds(log), want) || log[0].Err == nil || log[1].Offset != 9 {
		t.Fatalf("calls %v (%+v), want %v", kinds(log), log, want)
	}
	if got := readRaw(t, fz, "d/done"); string(got) != "hello world" {
		t.Fatalf("published %q", got)
	}
	if _, err := a.Append([]byte("x")); err == nil {
		t.Fatal("Append after Stage succeeded")
	}

	writeRaw(t, fz, "d/shared", []byte("x"), 0o644)
	if _, err := OpenAppender(fz, "d", "shared"); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("0644 file: %v", err)
	}
	writeRaw(t, fz, "d/two", []byte("x"), 0o600)
	if err := os.Link(abs(fz, "d/two"), abs(fz, "d/two2")); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenAppender(fz, "d", "two"); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("two links: %v", err)
	}
	if err := os.Symlink(abs(fz, "d/done"), abs(fz, "d/link")); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenAppender(fz, "d", "link"); Errno(err) != syscall.ELOOP {
		t.Fatalf("symlink: %v", err)
	}
	if _, err := OpenAppender(fz, "d", "a/b"); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("name with a slash: %v", err)
	}
}

// A failed fsync of an Appender is never retried: Persist and Stage fail with it from
// then on. Remove unlinks the file durably.
func TestAppenderFailedPersistAndRemove(t *testing.T) {
	fz := newFaultyStore(t)
	a, err := OpenAppender(fz, "d", "p")
	if err != nil {
		t.Fatal(err)
	}
	a.Append([]byte("abc"))
	fz.Inject = func(op Op) error {
		if op.Kind == OpSync {
			return syscall.EIO
		}
		return nil
	}
	if err := a.Persist(); Errno(err) != syscall.EIO {
		t.Fatalf("Persist = %v", err)
	}
	fz.Inject = nil
	if err := a.Persist(); Errno(err) != syscall.EIO {
		t.Fatalf("Persist after a failed fsync = %v, want the first error", err)
	}
	if _, err := a.Append([]byte("d")); Errno(err) != syscall.EIO {
		t.Fatalf("Append after a failed fsync = %v", err)
	}
	if st, err := a.Stage(); st != nil || Errno(err) != syscall.EIO {
		t.Fatalf("Stage = %v, %v", st, err)
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
	fz.Reset()
	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	if log := fz.Log(); !slices.Equal(kinds(log), []OpKind{OpRemove, OpSyncDir}) {
		t.Fatalf("Remove calls %v", kinds(log))
	}
	assertEmptyDir(t, fz, "d")
	if err := a.Remove(); err != nil {
		t.Fatalf("second Remove: %v", err)
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
