package fsx

import (
	"fmt"
	"io/fs"
	"path"
	"syscall"
)

// Appender writes a file that grows by appends made durable as they go: the
// partial body of a resumable upload. It writes at its offset (pwrite), never
// truncates, and Checkpoint fsyncs the file — and its directory after the
// write that created it — so that the bytes before Durable() survive a crash.
// An Appender is not safe for concurrent use; its caller serializes the
// appends of one file.
type Appender struct {
	f       File
	fsys    FS
	dir     string
	off     int64 // where the next Write goes
	durable int64 // bytes made durable by the last Checkpoint
	newFile bool  // created by OpenAppend: the directory needs an fsync
	failed  bool  // a Checkpoint failed: the file's state is unknown
}

// OpenAppend opens dir/base (creating it, mode 0600, when create is set) to
// write at offset off. The file must be a private regular file (CheckPrivateFile)
// holding at least off bytes; what it holds past off is overwritten by the
// writes. Bytes before off count as durable: the caller knows they are (a
// Checkpoint made them so, or they were found after a restart).
func OpenAppend(fsys FS, dir, base string, off int64, create bool) (*Appender, error) {
	if err := CheckName(dir); err != nil {
		return nil, err
	}
	if err := CheckBase(base); err != nil {
		return nil, err
	}
	name := path.Join(dir, base)
	flag := syscall.O_WRONLY
	if create {
		flag |= syscall.O_CREAT
	}
	_, lerr := fsys.Lstat(name)
	f, err := fsys.OpenFile(name, flag, 0o600)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err == nil {
		err = CheckPrivateFile(name, info)
	}
	if err == nil && info.Size < off {
		err = &fs.PathError{Op: "append", Path: name, Err: fmt.Errorf("holds %d bytes, not the %d to append after", info.Size, off)}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Appender{f: f, fsys: fsys, dir: dir, off: off, durable: off, newFile: IsNotExist(lerr)}, nil
}

// Write writes all of p at the Appender's offset and advances it.
func (a *Appender) Write(p []byte) (int, error) {
	n, err := a.f.WriteAt(p, a.off)
	a.off += int64(n)
	return n, err
}

// Offset is where the next Write goes: the bytes written so far.
func (a *Appender) Offset() int64 { return a.off }

// Durable is the bytes the last successful Checkpoint made durable.
func (a *Appender) Durable() int64 { return a.durable }

// Checkpoint fsyncs the file (and, the first time after OpenAppend created it,
// its directory), making every byte written so far durable. A failed fsync is
// never retried: after it the file's contents are unknown (Linux reports a
// write-back error once), every later Checkpoint fails, and the caller must
// discard the file.
func (a *Appender) Checkpoint() error {
	if a.failed {
		return &fs.PathError{Op: "fsync", Path: a.f.Name(), Err: syscall.EIO}
	}
	if err := a.f.Sync(); err != nil {
		a.failed = true
		return err
	}
	if a.newFile {
		if err := a.fsys.SyncDir(a.dir); err != nil {
			a.failed = true
			return err
		}
		a.newFile = false
	}
	a.durable = a.off
	return nil
}

// Close closes the file; bytes written since the last Checkpoint are not
// known to be durable.
func (a *Appender) Close() error { return a.f.Close() }
