package fsx

import (
	"errors"
	"io"
	"io/fs"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// OpKind names a mutating call recorded by Faulty.
type OpKind string

// The mutating calls. Open without O_CREAT is not mutating and is not recorded, nor is
// anything done to an unnamed O_TMPFILE file (it changes no directory and is gone when
// closed, so no crash state holds it) or File.SetTimes (no crash state holds times).
const (
	OpCreate  OpKind = "create"  // OpenFile with O_CREAT (Flag says whether O_EXCL/O_TRUNC/O_APPEND)
	OpWrite   OpKind = "write"   // File.Write: Data at Offset
	OpSync    OpKind = "fsync"   // File.Sync
	OpClose   OpKind = "close"   // File.Close of a file opened for writing
	OpRename  OpKind = "rename"  // Path → Path2
	OpLink    OpKind = "link"    // Path → Path2
	OpRemove  OpKind = "unlink"  // Path
	OpRmdir   OpKind = "rmdir"   // Path
	OpMkdir   OpKind = "mkdir"   // Path
	OpSyncDir OpKind = "syncdir" // Path
)

// Op is one recorded mutating call.
type Op struct {
	Seq    int // 1-based position among the mutating calls of this Faulty
	Kind   OpKind
	Path   string
	Path2  string
	Flag   int
	Perm   uint32
	Offset int64
	Data   []byte
	Err    error // the error the call returned (nil on success)
}

// ErrShortWrite, returned by an Inject function for an OpWrite, makes the call write
// only the first half of its bytes and then fail with io.ErrShortWrite.
var ErrShortWrite = errors.New("fsx: injected short write")

// Faulty wraps an FS, records every mutating call, and lets a test fail or delay any
// of them. It is safe for concurrent use.
type Faulty struct {
	Inner FS

	// Inject, if set, is called before every mutating call with the call's
	// description (Seq set, Err nil). A non-nil result fails the call with that error
	// without performing it (ErrShortWrite is special, see above). It may block to
	// simulate a slow call. It is called without Faulty's lock held.
	Inject func(op Op) error
	// DropSync and DropSyncDir turn File.Sync and SyncDir into unrecorded no-ops: test
	// switches that weaken the write protocol, for proving the crash tests catch it.
	DropSync, DropSyncDir bool
	// DropIf, if set, is asked about every File.Sync and SyncDir (with the call's Kind
	// and Path): true turns that one call into an unrecorded no-op, as DropSync and
	// DropSyncDir do for all of them — to weaken the protocol of one directory only.
	// It is called without Faulty's lock held.
	DropIf func(op Op) bool

	mu  sync.Mutex
	seq int
	log []Op
}

var _ FS = (*Faulty)(nil)

// NewFaulty wraps inner.
func NewFaulty(inner FS) *Faulty { return &Faulty{Inner: inner} }

// FailNth returns an Inject function that fails the n-th mutating call (1-based) with err.
func FailNth(n int, err error) func(Op) error {
	return func(op Op) error {
		if op.Seq == n {
			return err
		}
		return nil
	}
}

// Log returns a copy of the recorded calls.
func (f *Faulty) Log() []Op {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Op(nil), f.log...)
}

// Count returns the number of mutating calls so far.
func (f *Faulty) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

// Reset forgets the log and restarts numbering.
func (f *Faulty) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq, f.log = 0, nil
}

// do runs one mutating call: number it, let Inject decide, run it, record the outcome.
func (f *Faulty) do(op Op, run func() error) error {
	return f.doWrite(&op, func(error) error { return run() })
}

// doWrite is do for a call that can honour an injected ErrShortWrite: run is called
// with nil or ErrShortWrite and may update op.Data to what it really wrote.
func (f *Faulty) doWrite(op *Op, run func(injected error) error) error {
	f.mu.Lock()
	f.seq++
	op.Seq = f.seq
	f.mu.Unlock()
	var err error
	if f.Inject != nil {
		err = f.Inject(*op)
	}
	switch {
	case err == nil:
		err = run(nil)
	case errors.Is(err, ErrShortWrite) && op.Kind == OpWrite:
		err = run(err)
	default:
		if _, isPath := err.(*fs.PathError); !isPath {
			err = &fs.PathError{Op: string(op.Kind), Path: op.Path, Err: err}
		}
	}
	op.Err = err
	f.mu.Lock()
	f.log = append(f.log, *op)
	f.mu.Unlock()
	return err
}

// Root implements FS.
func (f *Faulty) Root() string { return f.Inner.Root() }

// OpenFile implements FS.
func (f *Faulty) OpenFile(name string, flag int, perm uint32) (File, error) {
	if flag&unix.O_TMPFILE == unix.O_TMPFILE {
		return f.Inner.OpenFile(name, flag, perm)
	}
	writable := flag&(syscall.O_WRONLY|syscall.O_RDWR) != 0
	if flag&syscall.O_CREAT == 0 {
		inner, err := f.Inner.OpenFile(name, flag, perm)
		if err != nil {
			return nil, err
		}
		return &faultyFile{File: inner, fs: f, name: name, writable: writable, appendMode: flag&syscall.O_APPEND != 0}, nil
	}
	var inner File
	err := f.do(Op{Kind: OpCreate, Path: name, Flag: flag, Perm: perm}, func() (err error) {
		inner, err = f.Inner.OpenFile(name, flag, perm)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &faultyFile{File: inner, fs: f, name: name, writable: writable, appendMode: flag&syscall.O_APPEND != 0}, nil
}

// Lstat implements FS.
func (f *Faulty) Lstat(name string) (Info, error) { return f.Inner.Lstat(name) }

// ReadDir implements FS.
func (f *Faulty) ReadDir(name string) ([]DirEntry, error) { return f.Inner.ReadDir(name) }

// Mkdir implements FS.
func (f *Faulty) Mkdir(name string, perm uint32) error {
	return f.do(Op{Kind: OpMkdir, Path: name, Perm: perm}, func() error { return f.Inner.Mkdir(name, perm) })
}

// Rename implements FS.
func (f *Faulty) Rename(oldname, newname string) error {
	return f.do(Op{Kind: OpRename, Path: oldname, Path2: newname}, func() error { return f.Inner.Rename(oldname, newname) })
}

// Link implements FS.
func (f *Faulty) Link(oldname, newname string) error {
	return f.do(Op{Kind: OpLink, Path: oldname, Path2: newname}, func() error { return f.Inner.Link(oldname, newname) })
}

// Remove implements FS.
func (f *Faulty) Remove(name string) error {
	return f.do(Op{Kind: OpRemove, Path: name}, func() error { return f.Inner.Remove(name) })
}

// RemoveDir implements FS.
func (f *Faulty) RemoveDir(name string) error {
	return f.do(Op{Kind: OpRmdir, Path: name}, func() error { return f.Inner.RemoveDir(name) })
}

// SyncDir implements FS.
func (f *Faulty) SyncDir(name string) error {
	if f.DropSyncDir || (f.DropIf != nil && f.DropIf(Op{Kind: OpSyncDir, Path: name})) {
		return nil
	}
	return f.do(Op{Kind: OpSyncDir, Path: name}, func() error { return f.Inner.SyncDir(name) })
}

type faultyFile struct {
	File
	fs         *Faulty
	name       string
	writable   bool
	appendMode bool
	offset     int64
}

// Read passes through, keeping the offset that the next write is recorded at.
func (ff *faultyFile) Read(p []byte) (int, error) {
	n, err := ff.File.Read(p)
	ff.offset += int64(n)
	return n, err
}

func (ff *faultyFile) Write(p []byte) (int, error) {
	off := ff.offset
	if ff.appendMode {
		if info, err := ff.File.Stat(); err == nil {
			off = info.Size
		}
	}
	op := Op{Kind: OpWrite, Path: ff.name, Offset: off, Data: append([]byte(nil), p...)}
	var n int
	err := ff.fs.doWrite(&op, func(injected error) (err error) {
		if injected == nil {
			n, err = ff.File.Write(p)
			if err != nil {
				op.Data = op.Data[:n] // record what really reached the file
			}
			return err
		}
		n, _ = ff.File.Write(p[:len(p)/2])
		op.Data = op.Data[:n]
		return &fs.PathError{Op: "write", Path: ff.name, Err: io.ErrShortWrite}
	})
	ff.offset = off + int64(n)
	return n, err
}

// WriteAt is recorded as an OpWrite at off; the offset of the next Write is unchanged.
func (ff *faultyFile) WriteAt(p []byte, off int64) (int, error) {
	op := Op{Kind: OpWrite, Path: ff.name, Offset: off, Data: append([]byte(nil), p...)}
	var n int
	err := ff.fs.doWrite(&op, func(injected error) (err error) {
		if injected == nil {
			n, err = ff.File.WriteAt(p, off)
			if err != nil {
				op.Data = op.Data[:n]
			}
			return err
		}
		n, _ = ff.File.WriteAt(p[:len(p)/2], off)
		op.Data = op.Data[:n]
		return &fs.PathError{Op: "pwrite", Path: ff.name, Err: io.ErrShortWrite}
	})
	return n, err
}

func (ff *faultyFile) Sync() error {
	if ff.fs.DropSync || (ff.fs.DropIf != nil && ff.fs.DropIf(Op{Kind: OpSync, Path: ff.name})) {
		return nil
	}
	return ff.fs.do(Op{Kind: OpSync, Path: ff.name}, ff.File.Sync)
}

func (ff *faultyFile) Close() error {
	if !ff.writable {
		return ff.File.Close()
	}
	var closeErr error
	err := ff.fs.do(Op{Kind: OpClose, Path: ff.name}, func() error {
		closeErr = ff.File.Close()
		return closeErr
	})
	if err != nil && closeErr == nil {
		// An injected close failure still releases the descriptor.
		_ = ff.File.Close()
	}
	return err
}
