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

// Name returns the file's name, relative to the root.
func (a *Appender) Name() string { return a.f.Name() }

// Stage fsyncs and closes the file and returns it as a Staged temp (its Temp is the
// file's own name) for Publish or PublishNoReplace and the caller's SyncDir: a file
// grown in place published once whole (a downloaded body). After a failed Checkpoint
// it fails (the file's contents are unknown), closing the file. Either way the
// Appender is closed afterwards; on error the file is left in place.
func (a *Appender) Stage() (*Staged, error) {
	var err error
	if a.failed {
		err = &fs.PathError{Op: "fsync", Path: a.f.Name(), Err: syscall.EIO}
	} else {
		err = a.f.Sync()
	}
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	name := a.f.Name()
	return &Staged{fsys: a.fsys, Dir: a.dir, Temp: name}, nil
}

// Remove closes the file (if still open) and durably removes it: unlink, fsync the
// directory (a missing file is not an error).
func (a *Appender) Remove() error {
	_ = a.f.Close() // an error here (already closed) changes nothing
	name := a.f.Name()
	err := a.fsys.Remove(name)
	if err != nil && !IsNotExist(err) {
		return err
	}
	return a.fsys.SyncDir(a.dir)
}
