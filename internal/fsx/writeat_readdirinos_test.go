package fsx

import (
	"errors"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// WriteAt writes at the offset asked for and leaves the file offset alone: the next
// Write lands where it would have without it.
func TestWriteAtLeavesTheOffset(t *testing.T) {
	for name, fsys := range map[string]FS{"OS": NewOS(t.TempDir()), "Faulty": NewFaulty(NewOS(t.TempDir()))} {
		writeRaw(t, fsys, "f", []byte("0123456789"), 0o600)
		f, err := fsys.OpenFile("f", syscall.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("ab")); err != nil {
			t.Fatal(err)
		}
		if n, err := f.WriteAt([]byte("XYZ"), 5); n != 3 || err != nil {
			t.Fatalf("%s: WriteAt = %d, %v", name, n, err)
		}
		if _, err := f.Write([]byte("c")); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if got := readRaw(t, fsys, "f"); string(got) != "abc34XYZ89" {
			t.Errorf("%s: file holds %q, want %q", name, got, "abc34XYZ89")
		}
	}
}

// Faulty records a WriteAt as an OpWrite at its offset; an injected ErrShortWrite
// writes the first half there and fails; an inner WriteAt that fails part way is
// recorded with the bytes that reached the file.
func TestFaultyWriteAt(t *testing.T) {
	fz := NewFaulty(NewOS(t.TempDir()))
	writeRaw(t, fz, "f", []byte("........"), 0o600)
	f, err := fz.OpenFile("f", syscall.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("ab"), 2); err != nil {
		t.Fatal(err)
	}
	fz.Inject = func(op Op) error {
		if op.Kind == OpWrite {
			return ErrShortWrite
		}
		return nil
	}
	if n, err := f.WriteAt([]byte("wxyz"), 4); n != 2 || !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short WriteAt = %d, %v, want 2, io.ErrShortWrite", n, err)
	}
	fz.Inject = FailNth(fz.Count()+1, syscall.EIO)
	if n, err := f.WriteAt([]byte("!!"), 0); n != 0 || !errors.Is(err, syscall.EIO) {
		t.Fatalf("failed WriteAt = %d, %v, want 0, EIO", n, err)
	}
	if got := readRaw(t, fz, "f"); string(got) != "..abwx.." {
		t.Fatalf("file holds %q, want %q", got, "..abwx..")
	}
	log := fz.Log()
	want := []Op{{Kind: OpWrite, Path: "f", Offset: 2, Data: []byte("ab")},
		{Kind: OpWrite, Path: "f", Offset: 4, Data: []byte("wx")},
		{Kind: OpWrite, Path: "f", Offset: 0, Data: []byte("!!")}}
	if len(log) != len(want) {
		t.Fatalf("log %+v", log)
	}
	for i, w := range want {
		if log[i].Kind != w.Kind || log[i].Path != w.Path || log[i].Offset != w.Offset || string(log[i].Data) != string(w.Data) {
			t.Errorf("call %d recorded %+v, want %+v", i, log[i], w)
		}
		if (log[i].Err == nil) != (i == 0) {
			t.Errorf("call %d recorded error %v", i, log[i].Err)
		}
	}

	hf := NewFaulty(halfWriteFS{NewOS(t.TempDir())})
	g, err := hf.OpenFile("g", syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if n, err := g.WriteAt([]byte("abcd"), 1); n != 2 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("WriteAt on a full disk = %d, %v, want 2, ENOSPC", n, err)
	}
	i := slices.IndexFunc(hf.Log(), func(op Op) bool { return op.Kind == OpWrite })
	if op := hf.Log()[i]; string(op.Data) != "ab" || op.Offset != 1 || !errors.Is(op.Err, syscall.ENOSPC) {
		t.Fatalf("recorded %+v, want %q at 1 and ENOSPC", op, "ab")
	}
}

// WriteAt on a full disk writes half and fails, as halfWriteFile.Write does.
func (w halfWriteFile) WriteAt(p []byte, off int64) (int, error) {
	n, _ := w.File.WriteAt(p[:len(p)/2], off)
	return n, syscall.ENOSPC
}

// ReadDirInos lists every name but "." and ".." with the inode number lstat reports,
// across as many getdents buffers as the directory needs.
func TestReadDirInos(t *testing.T) {
	fsys := NewOS(t.TempDir())
	mkdirAll(t, fsys, "empty")
	if got, err := fsys.ReadDirInos("empty"); err != nil || len(got) != 0 {
		t.Fatalf("ReadDirInos(empty) = %v, %v", got, err)
	}
	if _, err := fsys.ReadDirInos("missing"); !IsNotExist(err) {
		t.Fatalf("ReadDirInos(missing): %v, want ENOENT", err)
	}
	// Names of 200 bytes take 224 bytes of getdents buffer each: 600 of them need
	// three 64 KiB buffers.
	mkdirAll(t, fsys, "d")
	want := map[string]uint64{}
	for i := range 600 {
		name := strconv.Itoa(i) + strings.Repeat("n", 200-len(strconv.Itoa(i)))
		if i%100 == 0 {
			name = strconv.Itoa(i) // and a few short ones
		}
		if err := os.WriteFile(abs(fsys, "d/"+name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		info, err := fsys.Lstat("d/" + name)
		if err != nil {
			t.Fatal(err)
		}
		want[name] = info.Ino
	}
	mkdirAll(t, fsys, "d/sub")
	info, err := fsys.Lstat("d/sub")
	if err != nil {
		t.Fatal(err)
	}
	want["sub"] = info.Ino
	got, err := fsys.ReadDirInos("d")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d entries listed, want %d", len(got), len(want))
	}
	for _, e := range got {
		if ino, ok := want[e.Name]; !ok || ino != e.Ino {
			t.Fatalf("listed %q ino %d; lstat says %d (known: %v)", e.Name, e.Ino, ino, ok)
		}
		delete(want, e.Name)
	}
	if len(want) != 0 {
		t.Fatalf("not listed: %d names", len(want))
	}
	// The root too, by ".".
	if got, err := fsys.ReadDirInos("."); err != nil || len(got) != 2 {
		t.Fatalf("ReadDirInos(.) = %v, %v, want d and empty", got, err)
	}
}

// An entry cached as O_PATH (a directory we may search but not read: opened so on
// EACCES) is fsynced through a readable descriptor opened from it, which is closed
// after.
func TestSyncDirOfAnUnreadableEntry(t *testing.T) {
	fsys := NewOS(t.TempDir())
	mkdirAll(t, fsys, "d")
	fd, err := unix.Open(abs(fsys, "d"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(fsys, ".", "x", nil); err != nil { // opens and caches the root
		t.Fatal(err)
	}
	e := &dirEnt{fd: fd, dev: st.Dev, ino: st.Ino}
	fsys.c.mu.Lock()
	fsys.c.dirs["d"] = e
	fsys.c.mu.Unlock()
	before := openFDsUnder(t, fsys.Root())
	if err := fsys.SyncDir("d"); err != nil {
		t.Fatalf("SyncDir through an O_PATH entry: %v", err)
	}
	if after := openFDsUnder(t, fsys.Root()); after != before {
		t.Fatalf("%d descriptors open under the root after SyncDir, %d before", after, before)
	}
	if cached(fsys, "d") != e || e.refs != 0 {
		t.Fatalf("the entry was not given back: cached %v, refs %d", cached(fsys, "d") == e, e.refs)
	}
	fsys.Close()
}
