package fsx

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/uuid"
)

// TempPrefix and TempSuffix frame the name of a staged, unpublished write.
const (
	TempPrefix = "."
	TempSuffix = ".tmp"
)

// TempName returns a fresh ".<uuid>.tmp" name (a random version-4 UUID).
func TempName() string { return TempPrefix + uuid.NewString() + TempSuffix }

// IsTempName reports whether base has the shape of a staged write's name.
func IsTempName(base string) bool {
	// The length check comes first: in ".tmp" the prefix and the suffix overlap.
	if len(base) < len(TempPrefix)+len(TempSuffix) || !strings.HasPrefix(base, TempPrefix) || !strings.HasSuffix(base, TempSuffix) {
		return false
	}
	return uuid.Valid(base[len(TempPrefix) : len(base)-len(TempSuffix)])
}

// Staged is a written and fsynced temp file that is not yet published. Cleanup is
// always safe to defer: after Publish it does nothing, so a newer file is never removed.
type Staged struct {
	fsys      FS
	Dir       string // directory of the temp and of its destination
	Temp      string // full name of the temp, relative to the root
	published bool
	removed   bool
}

// Stage creates a fresh temp in dir with mode 0600, writes data, fsyncs and closes it.
// On any error the temp is removed (best effort) and nothing is staged. A failed fsync
// is reported, never retried. dir must pass CheckName ("." for the root). It is
// StageStream, one Write and Finish.
func Stage(fsys FS, dir string, data []byte) (*Staged, error) {
	w, err := StageStream(fsys, dir)
	if err != nil {
		return nil, err
	}
	_, _ = w.Write(data) // an error is kept by w and returned by Finish
	return w.Finish()
}

// Publish renames the temp over dir/base. The rename is atomic but not yet durable:
// the caller must SyncDir(Dir) before acknowledging. base is a single name (CheckBase).
func (s *Staged) Publish(base string) error {
	if s.published || s.removed {
		return errors.New("fsx: staged file already published or cleaned up")
	}
	if err := CheckBase(base); err != nil {
		return err
	}
	if err := s.fsys.Rename(s.Temp, path.Join(s.Dir, base)); err != nil {
		return err
	}
	s.published = true
	return nil
}

// noReplaceRenamer is an FS that can rename without replacing (renameat2
// RENAME_NOREPLACE). OS is one; Faulty is not, so under Faulty PublishNoReplace takes
// the link path, whose two calls the crash explorer models.
type noReplaceRenamer interface {
	RenameNoReplace(oldname, newname string) error
}

// PublishNoReplace gives the temp the name dir/base unless something is there — a
// file, a directory, a symlink (even a dangling one): then it fails with EEXIST,
// changes nothing, and the temp is left for Cleanup. It renames with
// RENAME_NOREPLACE where the FS and the file system have it, and otherwise links the
// temp to base (link refuses an existing name too) and unlinks the temp; if only that
// unlink fails, the file is published (with a second link, the temp) and the error
// says so. Like Publish, the new name is atomic but not yet durable: the caller must
// SyncDir(Dir) before acknowledging. base is a single name (CheckBase).
func (s *Staged) PublishNoReplace(base string) error {
	if s.published || s.removed {
		return errors.New("fsx: staged file already published or cleaned up")
	}
	if err := CheckBase(base); err != nil {
		return err
	}
	dst := path.Join(s.Dir, base)
	if r, ok := s.fsys.(noReplaceRenamer); ok {
		err := r.RenameNoReplace(s.Temp, dst)
		if err == nil {
			s.published = true
			return nil
		}
		// EINVAL and EOPNOTSUPP: a file system without the flag; ENOSYS: a kernel.
		if e := Errno(err); e != syscall.EINVAL && e != syscall.EOPNOTSUPP && e != syscall.ENOSYS {
			return err
		}
	}
	if err := s.fsys.Link(s.Temp, dst); err != nil {
		return err
	}
	s.published = true
	if err := s.fsys.Remove(s.Temp); err != nil {
		return fmt.Errorf("fsx: %s published, but its temp is left as a second link: %w", dst, err)
	}
	return nil
}

// Published reports whether Publish succeeded.
func (s *Staged) Published() bool { return s.published }

// Cleanup removes the temp unless it was published or already removed. A missing temp
// is not an error.
func (s *Staged) Cleanup() error {
	if s == nil || s.published || s.removed {
		return nil
	}
	err := s.fsys.Remove(s.Temp)
	if err != nil && !IsNotExist(err) {
		return err
	}
	s.removed = true
	return nil
}

// WriteFile durably replaces dir/base with data: stage, rename, fsync dir. When it
// returns nil the new contents survive a power cut; on error the old file is intact
// unless the error came from the final directory fsync (then either version may
// survive, and the write must be treated as not acknowledged). dir must pass CheckName
// and base CheckBase (else ErrNotLocal, and nothing is written).
func WriteFile(fsys FS, dir, base string, data []byte) error {
	return stagePublishSync(fsys, dir, base, data, (*Staged).Publish)
}

// CreateFile durably creates dir/base with data and never replaces anything there:
// stage, PublishNoReplace, fsync dir. If base exists (whatever it is) it fails with
// EEXIST (IsExist) and changes nothing. When it returns nil the new file survives a
// power cut; an error from the final directory fsync means the file is in place but
// may not survive one. dir must pass CheckName and base CheckBase.
func CreateFile(fsys FS, dir, base string, data []byte) error {
	return stagePublishSync(fsys, dir, base, data, (*Staged).PublishNoReplace)
}

// stagePublishSync is WriteFile and CreateFile, with their publish step.
func stagePublishSync(fsys FS, dir, base string, data []byte, publish func(*Staged, string) error) error {
	if err := CheckBase(base); err != nil {
		return err
	}
	s, err := Stage(fsys, dir, data)
	if err != nil {
		return err
	}
	if err := publish(s, base); err != nil {
		_ = s.Cleanup()
		return err
	}
	return fsys.SyncDir(dir)
}

// RemoveFile durably unlinks dir/base: unlink, fsync dir. dir must pass CheckName and
// base CheckBase.
func RemoveFile(fsys FS, dir, base string) error {
	if err := CheckName(dir); err != nil {
		return err
	}
	if err := CheckBase(base); err != nil {
		return err
	}
	if err := fsys.Remove(path.Join(dir, base)); err != nil {
		return err
	}
	return fsys.SyncDir(dir)
}

// ErrTooLarge is returned by ReadFile for a file larger than its bound; the file was
// not read.
var ErrTooLarge = errors.New("fsx: file exceeds its size limit")

// ErrNotRegular is returned for a file that is not a regular file.
var ErrNotRegular = errors.New("fsx: not a regular file")

// ReadFile reads a regular file of at most max bytes. It opens with
// O_RDONLY|O_NONBLOCK|O_NOCTTY|O_NOFOLLOW, so a FIFO or device never blocks, a planted
// terminal never becomes our controlling terminal, and a symlink is refused (ELOOP),
// checks the type and size with fstat before reading, and returns the fstat Info taken
// before reading.
func ReadFile(fsys FS, name string, max int64) ([]byte, Info, error) {
	f, info, err := OpenRegular(fsys, name, max)
	if err != nil {
		return nil, info, err
	}
	defer f.Close()
	buf := make([]byte, info.Size+1)
	n, err := io.ReadFull(f, buf)
	switch {
	case err == io.ErrUnexpectedEOF || err == io.EOF:
		return buf[:n], info, nil
	case err != nil:
		return nil, info, err
	default:
		// The file grew past its stat size while we read: refuse rather than guess.
		return nil, info, &fs.PathError{Op: "read", Path: name, Err: fmt.Errorf("file changed while reading")}
	}
}

// ErrNotPrivate is returned for a file or directory with a wrong owner, a
// group/other permission bit, extra links, or the wrong type.
var ErrNotPrivate = errors.New("fsx: not private to this user")

// CheckPrivateFile checks that info describes a regular file with exactly one link,
// owned by the effective user, with no group or other permission bits.
func CheckPrivateFile(name string, info Info) error {
	switch {
	case info.IsSymlink():
		return &fs.PathError{Op: "check", Path: name, Err: syscall.ELOOP}
	case !info.IsRegular():
		return &fs.PathError{Op: "check", Path: name, Err: ErrNotRegular}
	case info.Nlink != 1:
		return &fs.PathError{Op: "check", Path: name, Err: fmt.Errorf("%w: %d links", ErrNotPrivate, info.Nlink)}
	}
	return checkOwnerMode(name, info)
}

// CheckPrivateDir checks that info describes a directory (not a symlink) owned by the
// effective user with no group or other permission bits.
func CheckPrivateDir(name string, info Info) error {
	switch {
	case info.IsSymlink():
		return &fs.PathError{Op: "check", Path: name, Err: syscall.ELOOP}
	case !info.IsDir():
		return &fs.PathError{Op: "check", Path: name, Err: syscall.ENOTDIR}
	}
	return checkOwnerMode(name, info)
}

// euid is the effective user id, read once (it is a system call).
var euid = os.Geteuid()

func checkOwnerMode(name string, info Info) error {
	if int(info.Uid) != euid {
		return &fs.PathError{Op: "check", Path: name, Err: fmt.Errorf("%w: owned by uid %d", ErrNotPrivate, info.Uid)}
	}
	if info.Perm()&0o077 != 0 {
		return &fs.PathError{Op: "check", Path: name, Err: fmt.Errorf("%w: mode %04o", ErrNotPrivate, info.Perm())}
	}
	return nil
}

// MkdirPrivate makes sure directory name exists, is private (CheckPrivateDir), and that
// its entry is durable: it fsyncs the parent whether this call created the directory
// or found it, because a directory found may be one whose creator crashed, or failed,
// before its parent's fsync (a crash could then still lose it). It reports whether it
// created the directory. A concurrent creator is tolerated. Callers that ensure one
// directory many times pay the fsync once through DirsMade.
func MkdirPrivate(fsys FS, name string) (created bool, err error) {
	info, err := fsys.Lstat(name)
	if IsNotExist(err) {
		err = fsys.Mkdir(name, 0o700)
		switch {
		case err == nil:
			created = true
		case IsExist(err):
		default:
			return false, err
		}
		info, err = fsys.Lstat(name)
	}
	if err != nil {
		return created, err
	}
	if err := CheckPrivateDir(name, info); err != nil {
		return created, err
	}
	return created, fsys.SyncDir(path.Dir(name))
}

// DirsMade remembers the directories that MkdirPrivate made durable through it, so
// that ensuring one again costs an lstat (the directory must still be there and
// private), not a parent fsync. The zero value is ready; it is safe for concurrent
// use. One DirsMade serves one FS.
type DirsMade struct {
	made sync.Map // name → struct{}
}

// Ensure makes sure directory name exists, is private, and is durable: the first time
// (and again whenever it is found missing) by MkdirPrivate, afterwards by one lstat
// and the privacy check.
func (d *DirsMade) Ensure(fsys FS, name string) error {
	if _, ok := d.made.Load(name); ok {
		info, err := fsys.Lstat(name)
		if err == nil {
			return CheckPrivateDir(name, info)
		}
		if !IsNotExist(err) {
			return err
		}
		d.made.Delete(name)
	}
	if _, err := MkdirPrivate(fsys, name); err != nil {
		return err
	}
	d.made.Store(name, struct{}{})
	return nil
}
