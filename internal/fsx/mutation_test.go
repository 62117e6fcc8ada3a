package fsx

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCleanupReportsAFailedRemove: Cleanup returns a failed unlink (other than a
// missing temp) and leaves the temp staged, so a later Cleanup removes it; after
// that, Cleanup makes no call at all.
func TestCleanupReportsAFailedRemove(t *testing.T) {
	f := NewFaulty(NewOS(t.TempDir()))
	s, err := Stage(f, ".", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	f.Inject = func(op Op) error {
		if op.Kind == OpRemove {
			return syscall.EIO
		}
		return nil
	}
	if err := s.Cleanup(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Cleanup with a failing unlink = %v, want EIO", err)
	}
	if got := temps(t, f.Root()); len(got) != 1 {
		t.Fatalf("temps after the failed Cleanup: %v, want the one staged", got)
	}
	f.Inject = nil
	if err := s.Cleanup(); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	if got := temps(t, f.Root()); len(got) != 0 {
		t.Fatalf("temps after Cleanup: %v", got)
	}
	n := f.Count()
	if err := s.Cleanup(); err != nil || f.Count() != n {
		t.Fatalf("Cleanup after Cleanup: %v, %d calls, want nil and none", err, f.Count()-n)
	}
	if err := s.Publish("k"); err == nil || f.Count() != n {
		t.Fatalf("Publish after Cleanup: %v, %d calls, want an error and none", err, f.Count()-n)
	}
}

// TestFaultyRecordsAppendOffsets: a write through a file opened without O_CREAT is
// recorded at the offset it really lands at: the end of the file with O_APPEND,
// the file offset (0 at open) without it.
func TestFaultyRecordsAppendOffsets(t *testing.T) {
	f := NewFaulty(NewOS(t.TempDir()))
	writeRaw(t, f, "a", []byte("0123"), 0o600)
	for _, c := range []struct {
		flag int
		want int64
	}{{syscall.O_WRONLY | syscall.O_APPEND, 4}, {syscall.O_WRONLY, 0}} {
		file, err := f.OpenFile("a", c.flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Reset()
		if _, err := file.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		file.Close()
		if log := f.Log(); len(log) == 0 || log[0].Kind != OpWrite || log[0].Offset != c.want {
			t.Errorf("flag %#x: recorded %+v, want a write at offset %d", c.flag, log, c.want)
		}
	}
}

// halfWriteFS is an FS whose files write half of what they are given and then
// fail, as a full disk does.
type halfWriteFS struct{ *OS }

func (h halfWriteFS) OpenFile(name string, flag int, perm uint32) (File, error) {
	file, err := h.OS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return halfWriteFile{file}, nil
}

type halfWriteFile struct{ File }

func (w halfWriteFile) Write(p []byte) (int, error) {
	n, _ := w.File.Write(p[:len(p)/2])
	return n, syscall.ENOSPC
}

// TestFaultyRecordsWhatAFailedWriteWrote: when the inner file's write fails part
// way, Faulty records the bytes that reached the file, not all that were given.
func TestFaultyRecordsWhatAFailedWriteWrote(t *testing.T) {
	f := NewFaulty(halfWriteFS{NewOS(t.TempDir())})
	file, err := f.OpenFile("a", syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if n, err := file.Write([]byte("abcd")); !errors.Is(err, syscall.ENOSPC) || n != 2 {
		t.Fatalf("Write = %d, %v, want 2, ENOSPC", n, err)
	}
	var w *Op
	for _, op := range f.Log() {
		if op.Kind == OpWrite {
			w = &op
		}
	}
	if w == nil || string(w.Data) != "ab" || !errors.Is(w.Err, syscall.ENOSPC) {
		t.Fatalf("recorded write %+v, want data %q and ENOSPC", w, "ab")
	}
}

// TestFloorTo: times are floored to the granularity, exactly on a boundary as
// well as before the epoch.
func TestFloorTo(t *testing.T) {
	const g = int64(time.Second)
	for _, c := range []struct{ ns, want int64 }{
		{2 * g, 2 * g}, {2*g + 1, 2 * g}, {3*g - 1, 2 * g}, {0, 0}, {-1, -g}, {-g, -g},
	} {
		if got := floorTo(c.ns, g); got != c.want {
			t.Errorf("floorTo(%d, %d) = %d, want %d", c.ns, g, got, c.want)
		}
	}
}

// TestNewOSMakesTheRootAbsolute: a relative directory is resolved against the
// working directory once, at NewOS.
func TestNewOSMakesTheRootAbsolute(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := NewOS("some/dir").Root(), filepath.Join(wd, "some/dir"); got != want {
		t.Errorf("NewOS(relative).Root() = %q, want %q", got, want)
	}
	if got := NewOS("/a//b/").Root(); got != "/a/b" {
		t.Errorf("NewOS(unclean).Root() = %q, want /a/b", got)
	}
}

// TestOpenat2ProbeFindsIt: where this kernel has openat2, the start-up probe
// found it, so names are resolved by openat2 and not by the fallback walk.
func TestOpenat2ProbeFindsIt(t *testing.T) {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err != nil {
		t.Skipf("no openat2 here: %v", err)
	}
	unix.Close(fd)
	if noOpenat2.Load() {
		t.Error("openat2 works, but the probe decided it is missing")
	}
}

// TestOSFileReadEdges: Read of an empty buffer is (0, nil) even at the end of the
// file, where a non-empty one gets io.EOF; ReadAt across the end returns the bytes
// that are there, from the offset asked for, and io.EOF.
func TestOSFileReadEdges(t *testing.T) {
	fsys := NewOS(t.TempDir())
	writeRaw(t, fsys, "a", []byte("01234"), 0o600)
	f, err := fsys.OpenFile("a", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 10)
	if n, err := f.Read(buf); n != 5 || err != nil {
		t.Fatalf("Read = %d, %v, want 5, nil", n, err)
	}
	if n, err := f.Read(buf[:0]); n != 0 || err != nil {
		t.Errorf("Read of an empty buffer at the end = %d, %v, want 0, nil", n, err)
	}
	if n, err := f.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("Read at the end = %d, %v, want 0, io.EOF", n, err)
	}
	clear(buf)
	if n, err := f.ReadAt(buf, 2); n != 3 || err != io.EOF || string(buf[:n]) != "234" {
		t.Errorf("ReadAt(10 bytes, 2) = %d %q, %v, want 3 \"234\", io.EOF", n, buf[:n], err)
	}
	if n, err := f.ReadAt(buf[:3], 1); n != 3 || err != nil || string(buf[:3]) != "123" {
		t.Errorf("ReadAt(3 bytes, 1) = %d %q, %v, want 3 \"123\", nil", n, buf[:3], err)
	}
}
