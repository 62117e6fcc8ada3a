package fsx

import (
	"errors"
	"io"
	"io/fs"
	"path"
	"syscall"
)

// StagedWriter is a staged write whose bytes are streamed rather than held: Stage for
// a body too large for memory. StageStream creates the temp; Write appends to it;
// Finish fsyncs and closes it and returns the Staged temp, which is then published
// (Publish or PublishNoReplace) and made durable by the caller's SyncDir, exactly as a
// Stage. Stage itself is StageStream, one Write and Finish, so both go through the
// same calls in the same order. A StagedWriter is not safe for concurrent use.
type StagedWriter struct {
	fsys FS
	dir  string
	temp string
	f    File
	n    int64
	err  error // the first failure: the temp is unusable and Finish refuses it
	done bool  // Finish or Abort ran
}

// errStagedDone is returned by a StagedWriter used after Finish or Abort.
var errStagedDone = errors.New("fsx: staged writer already finished or aborted")

// StageStream creates a fresh ".<uuid>.tmp" in dir (O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW,
// 0600) and returns a writer for it. dir must pass CheckName ("." for the root).
func StageStream(fsys FS, dir string) (*StagedWriter, error) {
	if err := CheckName(dir); err != nil {
		return nil, err
	}
	name := path.Join(dir, TempName())
	f, err := fsys.OpenFile(name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return &StagedWriter{fsys: fsys, dir: dir, temp: name, f: f}, nil
}

// Temp returns the temp's name, relative to the root.
func (w *StagedWriter) Temp() string { return w.temp }

// Size returns the number of bytes written so far.
func (w *StagedWriter) Size() int64 { return w.n }

// Write appends all of p to the temp or returns an error; after an error the temp is
// unusable (every later Write and Finish fail with it) and must be Aborted.
func (w *StagedWriter) Write(p []byte) (int, error) {
	if w.done {
		return 0, errStagedDone
	}
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.f.Write(p)
	w.n += int64(n)
	if err == nil && n != len(p) {
		err = &fs.PathError{Op: "write", Path: w.temp, Err: io.ErrShortWrite}
	}
	if err != nil {
		w.err = err
	}
	return n, err
}

// Finish fsyncs and closes the temp and returns it staged, ready to publish. On any
// error (an earlier Write's included) the temp is closed and removed (best effort)
// and nothing is staged; a failed fsync is reported, never retried.
func (w *StagedWriter) Finish() (*Staged, error) {
	if w.done {
		return nil, errStagedDone
	}
	w.done = true
	err := w.err
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	s := &Staged{fsys: w.fsys, Dir: w.dir, Temp: w.temp}
	if err != nil {
		_ = s.Cleanup()
		return nil, err
	}
	return s, nil
}

// Abort closes and removes the temp. It does nothing after Finish (whose Staged owns
// the temp then) or a first Abort. A missing temp is not an error.
func (w *StagedWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	_ = w.f.Close()
	return (&Staged{fsys: w.fsys, Dir: w.dir, Temp: w.temp}).Cleanup()
}

// OpenRegular opens name for reading as ReadFile does — O_RDONLY|O_NONBLOCK|O_NOCTTY
// and never through a symbolic link (ELOOP) — and checks with fstat that it is a
// regular file (ErrNotRegular) of at most max bytes (ErrTooLarge; max < 0: any size).
// It returns the open file and the fstat Info; the caller closes the file. Checking
// ownership, mode and links (CheckPrivateFile on the Info) is the caller's.
func OpenRegular(fsys FS, name string, max int64) (File, Info, error) {
	f, err := fsys.OpenFile(name, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, Info{}, err
	}
	info, err := f.Stat()
	switch {
	case err != nil:
	case !info.IsRegular():
		err = &fs.PathError{Op: "open", Path: name, Err: ErrNotRegular}
	case max >= 0 && info.Size > max:
		err = &fs.PathError{Op: "open", Path: name, Err: ErrTooLarge}
	}
	if err != nil {
		f.Close()
		return nil, info, err
	}
	return f, info, nil
}

// Appender is a file that is grown in place and published when whole: a resumable
// download. OpenAppender opens it, or creates it 0600 if it is absent; Append writes
// at its end; Persist makes what was appended durable (the file's fsync and, after it
// was created, its directory's fsync once), so a crash after Persist keeps at least
// Size bytes; Stage fsyncs and closes it and returns it as a Staged temp for Publish
// (a rename: its name is its own, not a ".<uuid>.tmp"). Not safe for concurrent use.
type Appender struct {
	fsys    FS
	dir     string
	name    string
	f       File
	size    int64
	created bool // this Appender created the file and its directory is not fsynced yet
	err     error
	done    bool
}

// OpenAppender opens dir/base for reading and writing without following a link, or
// creates it (O_CREAT|O_EXCL, 0600) if absent, and checks that it is a private regular
// file with one link (CheckPrivateFile). Its size is where the next Append writes.
// dir must pass CheckName and base CheckBase.
func OpenAppender(fsys FS, dir, base string) (*Appender, error) {
	if err := CheckName(dir); err != nil {
		return nil, err
	}
	if err := CheckBase(base); err != nil {
		return nil, err
	}
	name := path.Join(dir, base)
	created := true
	f, err := fsys.OpenFile(name, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL, 0o600)
	if IsExist(err) {
		created = false
		f, err = fsys.OpenFile(name, syscall.O_RDWR|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	}
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err == nil {
		err = CheckPrivateFile(name, info)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Appender{fsys: fsys, dir: dir, name: name, f: f, size: info.Size, created: created}, nil
}

// Name returns the file's name, relative to the root.
func (a *Appender) Name() string { return a.name }

// Size returns the file's length: what it held when opened plus what was appended.
func (a *Appender) Size() int64 { return a.size }

// Created reports whether OpenAppender created the file.
func (a *Appender) Created() bool { return a.created }

// Append writes all of p at the end of the file or returns an error; after an error
// the file's end is unknown, and every later call fails with that error (close it and
// open it again, or Remove it).
func (a *Appender) Append(p []byte) (int, error) {
	if a.done {
		return 0, errStagedDone
	}
	if a.err != nil {
		return 0, a.err
	}
	n, err := a.f.WriteAt(p, a.size)
	a.size += int64(n)
	if err == nil && n != len(p) {
		err = &fs.PathError{Op: "pwrite", Path: a.name, Err: io.ErrShortWrite}
	}
	if err != nil {
		a.err = err
	}
	return n, err
}

// ReadAt reads from the file (pread), for verifying what it holds.
func (a *Appender) ReadAt(p []byte, off int64) (int, error) {
	if a.done {
		return 0, errStagedDone
	}
	return a.f.ReadAt(p, off)
}

// Persist fsyncs the file and, the first time after OpenAppender created it, its
// directory: when it returns nil, Size bytes survive a crash under the file's name. A
// failed fsync is never retried: the file is unusable afterwards (every later call
// fails with the error), since Linux reports a write-back error once.
func (a *Appender) Persist() error {
	if a.done {
		return errStagedDone
	}
	if a.err != nil {
		return a.err
	}
	if err := a.f.Sync(); err != nil {
		a.err = err
		return err
	}
	if a.created {
		if err := a.fsys.SyncDir(a.dir); err != nil {
			a.err = err
			return err
		}
		a.created = false
	}
	return nil
}

// Stage fsyncs and closes the file and returns it as a Staged temp (its Temp is the
// file's own name) for Publish or PublishNoReplace and the caller's SyncDir. On error
// the file is closed and left in place. The Appender is done afterwards.
func (a *Appender) Stage() (*Staged, error) {
	if a.done {
		return nil, errStagedDone
	}
	a.done = true
	err := a.err
	if err == nil {
		err = a.f.Sync()
	}
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return &Staged{fsys: a.fsys, Dir: a.dir, Temp: a.name}, nil
}

// Close closes the file, keeping it (and what was appended, durable or not).
func (a *Appender) Close() error {
	if a.done {
		return nil
	}
	a.done = true
	return a.f.Close()
}

// Remove closes the file and durably removes it (RemoveFile: unlink, fsync the
// directory). A missing file is not an error.
func (a *Appender) Remove() error {
	if !a.done {
		a.done = true
		_ = a.f.Close()
	}
	err := RemoveFile(a.fsys, a.dir, path.Base(a.name))
	if IsNotExist(err) {
		return a.fsys.SyncDir(a.dir)
	}
	return err
}
