package fsx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// writeFileKinds is the exact sequence of mutating calls of a successful WriteFile.
var writeFileKinds = []OpKind{OpCreate, OpWrite, OpSync, OpClose, OpRename, OpSyncDir}

func kinds(log []Op) []OpKind {
	out := make([]OpKind, len(log))
	for i, op := range log {
		out[i] = op.Kind
	}
	return out
}

func newFaultyStore(t *testing.T) *Faulty {
	t.Helper()
	fz := NewFaulty(NewOS(t.TempDir()))
	mkdirAll(t, fz, "d")
	return fz
}

func TestFaultyLogsWriteFile(t *testing.T) {
	fz := newFaultyStore(t)
	data := []byte(`{"v":1}` + "\n")
	if err := WriteFile(fz, "d", "x.json", data); err != nil {
		t.Fatal(err)
	}
	log := fz.Log()
	if !slices.Equal(kinds(log), writeFileKinds) {
		t.Fatalf("calls = %v, want %v", kinds(log), writeFileKinds)
	}
	tmp := log[0].Path
	if path.Dir(tmp) != "d" || !IsTempName(path.Base(tmp)) {
		t.Fatalf("temp %q", tmp)
	}
	want := []Op{
		{Seq: 1, Kind: OpCreate, Path: tmp, Flag: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL, Perm: 0o600},
		{Seq: 2, Kind: OpWrite, Path: tmp, Offset: 0, Data: data},
		{Seq: 3, Kind: OpSync, Path: tmp},
		{Seq: 4, Kind: OpClose, Path: tmp},
		{Seq: 5, Kind: OpRename, Path: tmp, Path2: "d/x.json"},
		{Seq: 6, Kind: OpSyncDir, Path: "d"},
	}
	for i := range want {
		if !opEqual(log[i], want[i]) {
			t.Errorf("call %d = %+v, want %+v", i+1, log[i], want[i])
		}
	}
	if fz.Count() != 6 {
		t.Fatalf("Count = %d", fz.Count())
	}
	// The log is a copy.
	log[0].Path = "mutated"
	if fz.Log()[0].Path != tmp {
		t.Fatal("Log returned shared state")
	}
	// Reads are not mutating calls.
	if _, _, err := ReadFile(fz, "d/x.json", 1<<10); err != nil {
		t.Fatal(err)
	}
	if _, err := fz.Lstat("d/x.json"); err != nil {
		t.Fatal(err)
	}
	if _, err := fz.ReadDir("d"); err != nil {
		t.Fatal(err)
	}
	if fz.Count() != 6 || len(fz.Log()) != 6 {
		t.Fatalf("reads were recorded: %v", kinds(fz.Log()))
	}
	// RemoveFile: unlink, syncdir. Reset restarts numbering.
	fz.Reset()
	if fz.Count() != 0 || len(fz.Log()) != 0 {
		t.Fatal("Reset kept state")
	}
	if err := RemoveFile(fz, "d", "x.json"); err != nil {
		t.Fatal(err)
	}
	log = fz.Log()
	if !opEqual(log[0], Op{Seq: 1, Kind: OpRemove, Path: "d/x.json"}) || !opEqual(log[1], Op{Seq: 2, Kind: OpSyncDir, Path: "d"}) || len(log) != 2 {
		t.Fatalf("RemoveFile calls = %+v", log)
	}
}

func opEqual(a, b Op) bool {
	return a.Seq == b.Seq && a.Kind == b.Kind && a.Path == b.Path && a.Path2 == b.Path2 &&
		a.Flag == b.Flag && a.Perm == b.Perm && a.Offset == b.Offset && bytes.Equal(a.Data, b.Data) &&
		errors.Is(a.Err, b.Err) && (a.Err == nil) == (b.Err == nil)
}

func TestFaultyLogsOtherCalls(t *testing.T) {
	fz := newFaultyStore(t)
	if _, err := MkdirPrivate(fz, "d/p"); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, fz, "d/a", []byte("a"), 0o600)
	if err := fz.Link("d/a", "d/b"); err != nil {
		t.Fatal(err)
	}
	if err := fz.RemoveDir("d/p"); err != nil {
		t.Fatal(err)
	}
	err := fz.Remove("d/missing")
	want := []Op{
		{Seq: 1, Kind: OpMkdir, Path: "d/p", Perm: 0o700},
		{Seq: 2, Kind: OpSyncDir, Path: "d"},
		{Seq: 3, Kind: OpLink, Path: "d/a", Path2: "d/b"},
		{Seq: 4, Kind: OpRmdir, Path: "d/p"},
		{Seq: 5, Kind: OpRemove, Path: "d/missing", Err: syscall.ENOENT},
	}
	log := fz.Log()
	if len(log) != len(want) {
		t.Fatalf("calls = %+v", log)
	}
	for i := range want {
		if !opEqual(log[i], want[i]) {
			t.Errorf("call %d = %+v, want %+v", i+1, log[i], want[i])
		}
	}
	if log[4].Err != err {
		t.Fatalf("recorded error %v, returned %v", log[4].Err, err)
	}
}

// TestFaultyFailNth fails each mutating call of WriteFile in turn with each errno.
func TestFaultyFailNth(t *testing.T) {
	errnos := []syscall.Errno{syscall.EIO, syscall.ENOSPC, syscall.EACCES, syscall.EEXIST, syscall.ENOENT}
	for n := 1; n <= len(writeFileKinds); n++ {
		for _, errno := range errnos {
			t.Run(fmt.Sprintf("%d-%s/%s", n, writeFileKinds[n-1], unix.ErrnoName(errno)), func(t *testing.T) {
				fz := newFaultyStore(t)
				writeRaw(t, fz, "d/x.json", []byte("old contents"), 0o600)
				fz.Inject = FailNth(n, errno)
				var err error
				func() {
					defer func() {
						if p := recover(); p != nil {
							t.Fatalf("WriteFile panicked: %v", p)
						}
					}()
					err = WriteFile(fz, "d", "x.json", []byte("new contents"))
				}()
				if err == nil {
					t.Fatal("WriteFile returned nil with a failed call")
				}
				if !errors.Is(err, errno) {
					t.Fatalf("WriteFile = %v, want errors.Is %v", err, errno)
				}
				wantPathError(t, err, "WriteFile")
				log := fz.Log()
				if len(log) < n || log[n-1].Kind != writeFileKinds[n-1] || !errors.Is(log[n-1].Err, errno) {
					t.Fatalf("call %d not failed as injected: %+v", n, log)
				}
				for i, op := range log {
					if i != n-1 && op.Err != nil {
						t.Errorf("call %d (%s) failed too: %v", i+1, op.Kind, op.Err)
					}
				}
				if tmps := temps(t, abs(fz, "d")); len(tmps) != 0 {
					t.Fatalf("temp left behind: %v (calls %v)", tmps, kinds(log))
				}
				got := string(readRaw(t, fz, "d/x.json"))
				renamed := slices.ContainsFunc(log, func(op Op) bool { return op.Kind == OpRename && op.Err == nil })
				if writeFileKinds[n-1] == OpSyncDir {
					// Only the final directory fsync failed: the rename happened, and
					// the caller must treat the write as not acknowledged.
					if got != "new contents" || !renamed {
						t.Fatalf("after a failed syncdir: %q, renamed %v", got, renamed)
					}
					return
				}
				if got != "old contents" || renamed {
					t.Fatalf("destination = %q, renamed %v, want the old contents", got, renamed)
				}
				// Nothing after a failed fsync was retried or published.
				if slices.ContainsFunc(log[n:], func(op Op) bool { return op.Kind == OpSync || op.Kind == OpRename }) {
					t.Fatalf("calls after the failure: %v", kinds(log))
				}
			})
		}
	}
}

// TestFaultyFailNthOther fails each call of RemoveFile and MkdirPrivate in turn.
func TestFaultyFailNthOther(t *testing.T) {
	for n := 1; n <= 2; n++ {
		fz := newFaultyStore(t)
		writeRaw(t, fz, "d/x", nil, 0o600)
		fz.Inject = FailNth(n, syscall.EIO)
		if err := RemoveFile(fz, "d", "x"); !errors.Is(err, syscall.EIO) {
			t.Fatalf("RemoveFile with call %d failing = %v", n, err)
		}
		if exists(t, abs(fz, "d/x")) != (n == 1) {
			t.Fatalf("call %d failing: file exists = %v", n, n != 1)
		}
		fz.Reset()
		created, err := MkdirPrivate(fz, "d/p")
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("MkdirPrivate with call %d failing = %v, %v", n, created, err)
		}
		if created != (n == 2) {
			t.Fatalf("MkdirPrivate with call %d failing: created = %v", n, created)
		}
	}
}

func TestFaultyShortWrite(t *testing.T) {
	fz := newFaultyStore(t)
	writeRaw(t, fz, "d/x.json", []byte("old"), 0o600)
	fz.Inject = func(op Op) error {
		if op.Kind == OpWrite {
			return ErrShortWrite
		}
		return nil
	}
	data := []byte("0123456789")
	err := WriteFile(fz, "d", "x.json", data)
	if err == nil || !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("WriteFile = %v, want io.ErrShortWrite", err)
	}
	log := fz.Log()
	i := slices.IndexFunc(log, func(op Op) bool { return op.Kind == OpWrite })
	if i < 0 || string(log[i].Data) != "01234" || log[i].Err == nil {
		t.Fatalf("write call = %+v", log[i])
	}
	if slices.ContainsFunc(log, func(op Op) bool { return op.Kind == OpRename || op.Kind == OpSync }) {
		t.Fatalf("a short-written temp was fsynced or renamed: %v", kinds(log))
	}
	if got := readRaw(t, fz, "d/x.json"); string(got) != "old" {
		t.Fatalf("destination = %q", got)
	}
	if tmps := temps(t, abs(fz, "d")); len(tmps) != 0 {
		t.Fatalf("temp left: %v", tmps)
	}

	// Directly on a file: half the bytes reach the disk.
	f, err := fz.OpenFile("d/direct", oCreateExcl, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Write(data)
	if n != 5 || !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("Write = %d, %v", n, err)
	}
	f.Close()
	if got := readRaw(t, fz, "d/direct"); string(got) != "01234" {
		t.Fatalf("file holds %q", got)
	}
	// ErrShortWrite for a call that is not a write is a plain failure.
	fz.Inject = func(op Op) error {
		if op.Kind == OpRename {
			return ErrShortWrite
		}
		return nil
	}
	if err := WriteFile(fz, "d", "y", data); !errors.Is(err, ErrShortWrite) || exists(t, abs(fz, "d/y")) {
		t.Fatalf("WriteFile with a failed rename = %v", err)
	}
}

func TestFaultyDropSync(t *testing.T) {
	for _, tc := range []struct {
		sync, syncDir bool
		want          []OpKind
	}{
		{true, false, []OpKind{OpCreate, OpWrite, OpClose, OpRename, OpSyncDir}},
		{false, true, []OpKind{OpCreate, OpWrite, OpSync, OpClose, OpRename}},
		{true, true, []OpKind{OpCreate, OpWrite, OpClose, OpRename}},
	} {
		fz := newFaultyStore(t)
		fz.DropSync, fz.DropSyncDir = tc.sync, tc.syncDir
		// A dropped call is never offered to Inject either.
		fz.Inject = func(op Op) error {
			if (tc.sync && op.Kind == OpSync) || (tc.syncDir && op.Kind == OpSyncDir) {
				return syscall.EIO
			}
			return nil
		}
		if err := WriteFile(fz, "d", "x", []byte("x")); err != nil {
			t.Fatal(err)
		}
		log := fz.Log()
		if !slices.Equal(kinds(log), tc.want) {
			t.Fatalf("DropSync %v, DropSyncDir %v: calls %v, want %v", tc.sync, tc.syncDir, kinds(log), tc.want)
		}
		for i, op := range log {
			if op.Seq != i+1 {
				t.Fatalf("call %d has Seq %d", i+1, op.Seq)
			}
		}
		if fz.Count() != len(tc.want) {
			t.Fatalf("Count = %d", fz.Count())
		}
		if got := readRaw(t, fz, "d/x"); string(got) != "x" {
			t.Fatalf("x = %q", got)
		}
	}
}

func TestFaultyInjectSeesCall(t *testing.T) {
	fz := newFaultyStore(t)
	var seen []Op
	custom := &fs.PathError{Op: "custom", Path: "p", Err: syscall.EROFS}
	fz.Inject = func(op Op) error {
		if op.Err != nil {
			t.Errorf("Inject saw Err %v", op.Err)
		}
		seen = append(seen, op)
		if op.Kind == OpRename {
			return custom
		}
		return nil
	}
	err := WriteFile(fz, "d", "x", []byte("x"))
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe != custom {
		t.Fatalf("an injected *fs.PathError was not returned as is: %v", err)
	}
	want := []OpKind{OpCreate, OpWrite, OpSync, OpClose, OpRename, OpRemove}
	if !slices.Equal(kinds(seen), want) {
		t.Fatalf("Inject saw %v, want %v", kinds(seen), want)
	}
	for i, op := range seen {
		if op.Seq != i+1 {
			t.Fatalf("Inject call %d had Seq %d", i+1, op.Seq)
		}
	}
	if string(seen[1].Data) != "x" || seen[4].Path2 != "d/x" {
		t.Fatalf("Inject saw %+v", seen)
	}
	// A plain error is wrapped in an *fs.PathError naming the call.
	fz.Inject = FailNth(fz.Count()+1, errors.New("boom"))
	err = fz.Mkdir("d/m", 0o700)
	if !errors.As(err, &pe) || pe.Op != string(OpMkdir) || pe.Path != "d/m" || pe.Err.Error() != "boom" {
		t.Fatalf("injected plain error = %#v", err)
	}
	if exists(t, abs(fz, "d/m")) {
		t.Fatal("a failed call was performed")
	}
}

// TestFaultyInjectMayBlock checks that Inject runs without Faulty's lock: a slow call
// does not stop others from reading the log or making calls.
func TestFaultyInjectMayBlock(t *testing.T) {
	fz := newFaultyStore(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	fz.Inject = func(op Op) error {
		if op.Kind == OpRename && op.Path2 == "d/slow" {
			close(entered)
			<-release
		}
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- WriteFile(fz, "d", "slow", []byte("s")) }()
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("the slow call never started")
	}
	// While the rename is held: the log is readable and other calls proceed.
	other := make(chan error, 1)
	go func() {
		_ = fz.Log()
		_ = fz.Count()
		other <- WriteFile(fz, "d", "fast", []byte("f"))
	}()
	select {
	case err := <-other:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		close(release)
		t.Fatal("a blocked Inject blocked other calls")
	}
	if exists(t, abs(fz, "d/slow")) {
		t.Fatal("the held rename happened")
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the slow call never finished")
	}
	if !exists(t, abs(fz, "d/slow")) {
		t.Fatal("the slow rename did not happen")
	}
}

func TestFaultyInjectedCloseReleasesDescriptor(t *testing.T) {
	fz := newFaultyStore(t)
	f, err := fz.OpenFile("d/x", oCreateExcl, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	fz.Inject = FailNth(fz.Count()+1, syscall.EIO)
	if err := f.Close(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Close = %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Fatalf("descriptor %d still open after an injected close failure (fcntl: %v)", fd, err)
	}
}

func TestFaultyWriteOffsets(t *testing.T) {
	fz := newFaultyStore(t)
	writeRaw(t, fz, "d/f", []byte("abcdef"), 0o600)
	// O_RDWR: a read moves the offset the next write lands at.
	f, err := fz.OpenFile("d/f", syscall.O_RDWR|syscall.O_CREAT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(f, buf); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("XY")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("Z")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := readRaw(t, fz, "d/f"); string(got) != "abcXYZ" {
		t.Fatalf("file = %q", got)
	}
	// O_APPEND: writes land at the end.
	a, err := fz.OpenFile("d/f", syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	a.Close()
	var offsets []int64
	for _, op := range fz.Log() {
		if op.Kind == OpWrite {
			offsets = append(offsets, op.Offset)
		}
	}
	if !slices.Equal(offsets, []int64{3, 5, 6}) {
		t.Fatalf("recorded write offsets %v, want [3 5 6]", offsets)
	}
	// Replaying the log's writes over the original bytes gives the file.
	img := []byte("abcdef")
	for _, op := range fz.Log() {
		if op.Kind == OpWrite {
			end := op.Offset + int64(len(op.Data))
			for int64(len(img)) < end {
				img = append(img, 0)
			}
			copy(img[op.Offset:], op.Data)
		}
	}
	if got := readRaw(t, fz, "d/f"); !bytes.Equal(img, got) {
		t.Fatalf("replayed %q, file %q", img, got)
	}
}

func TestFaultyConcurrent(t *testing.T) {
	fz := newFaultyStore(t)
	const writers, each = 8, 10
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if err := WriteFile(fz, "d", fmt.Sprintf("w%d-%d", w, i), []byte("x")); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	log := fz.Log()
	total := writers * each * len(writeFileKinds)
	if len(log) != total || fz.Count() != total {
		t.Fatalf("%d calls logged, Count %d, want %d", len(log), fz.Count(), total)
	}
	seqs := make([]int, len(log))
	for i, op := range log {
		seqs[i] = op.Seq
	}
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != i+1 {
			t.Fatalf("Seq values are not 1..%d: %v", total, seqs)
		}
	}
}
