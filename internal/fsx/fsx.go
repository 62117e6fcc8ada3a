// Package fsx owns every system call that sealbridge makes on store files.
//
// All store I/O goes through the FS interface, whose names are relative to one root
// directory (a store directory) and are resolved beneath it without following any
// symbolic link: the real implementation (OS) uses openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS where the kernel has it and an O_NOFOLLOW walk
// otherwise. Faulty wraps any FS, records every mutating call, and can fail or delay a
// chosen call; the crash-state explorer and the fault tests are built on it. Coarse
// wraps any FS and reports its times truncated to a granularity (a 1 s or 2 s file
// system), and ProbeGranularity measures the granularity of a real one.
//
// On top of FS, this package provides the durable primitives of DESIGN §7:
//
//   - Stage writes bytes to a fresh ".<uuid>.tmp" (O_CREAT|O_EXCL|O_NOFOLLOW, 0600) and
//     fsyncs it; Staged.Publish renames it into place; the caller fsyncs the directory.
//     A failed fsync is never retried: the temp is discarded and the error returned.
//   - StageStream is Stage for bytes streamed rather than held (a large body): the
//     same temp, written by StagedWriter.Write, fsynced and closed by Finish, which
//     returns the Staged temp. Stage is StageStream, one Write and Finish.
//   - WriteFile = Stage + Publish + SyncDir: when it returns nil the bytes are durable.
//   - Staged.PublishNoReplace and CreateFile = Stage + PublishNoReplace + SyncDir do the
//     same for a name that must not exist yet (renameat2 RENAME_NOREPLACE, or link and
//     unlink): they never replace anything.
//   - RemoveFile = unlink + SyncDir: when it returns nil the removal is durable.
//   - ReadFile opens with O_NONBLOCK|O_NOFOLLOW (a FIFO never blocks us), checks with
//     fstat that it is a regular file no larger than a bound, then reads it.
//     OpenRegular is its open and checks, returning the open file for a caller that
//     streams it (a large body).
//   - An Appender is a file grown in place (a resumable upload or download):
//     OpenAppend opens or creates it (private, one link, no symlink) at a known
//     offset, Write appends, Checkpoint fsyncs it (and its directory once after
//     creating it); Stage fsyncs and closes it and hands it to Publish when whole,
//     Remove unlinks it durably.
//   - MkdirPrivate creates a 0700 directory (or finds a private one) and fsyncs its
//     parent either way, so the directory it returns is durable; DirsMade pays that
//     fsync once per directory and process.
//
// Info carries the fields of a file's fingerprint (dev, ino, mode, uid, size, mtime,
// ctime in nanoseconds) and of a directory's listing stamp.
//
// Values of FS are safe for concurrent use; a File is not.
package fsx

import (
	"errors"
	"io/fs"
	"path"
	"strings"
	"syscall"
)

// FS is the set of file-system calls the store makes, on names relative to a root.
// Names use forward slashes, are clean and local ("outbox/x.json", "."), and are never
// resolved through a symbolic link. Errors are *fs.PathError carrying a syscall.Errno.
type FS interface {
	// Root returns the absolute path of the root directory (for messages and for
	// handing a path to code that opens it itself, such as flock).
	Root() string
	// OpenFile opens name with the given flags; O_NOFOLLOW and O_CLOEXEC are always
	// added. With O_CREAT the file is created with mode perm (before umask).
	OpenFile(name string, flag int, perm uint32) (File, error)
	// Lstat describes name itself, never the target of a link.
	Lstat(name string) (Info, error)
	// Mkdir creates directory name with mode perm.
	Mkdir(name string, perm uint32) error
	// Rename atomically replaces newname with oldname (renameat).
	Rename(oldname, newname string) error
	// Link makes newname a hard link to oldname; it fails with EEXIST if newname exists.
	Link(oldname, newname string) error
	// Remove unlinks the non-directory name.
	Remove(name string) error
	// RemoveDir removes the empty directory name.
	RemoveDir(name string) error
	// ReadDir lists the names in directory name (without "." and ".."), unsorted.
	ReadDir(name string) ([]DirEntry, error)
	// SyncDir fsyncs directory name, making renames, links and unlinks in it durable.
	SyncDir(name string) error
}

// File is an open file. Write writes all of p or returns an error.
type File interface {
	Name() string
	Read(p []byte) (int, error)
	// ReadAt reads len(p) bytes at offset off (pread); it returns io.EOF at the end.
	ReadAt(p []byte, off int64) (int, error)
	Write(p []byte) (int, error)
	// WriteAt writes all of p at offset off (pwrite), leaving the file offset alone,
	// or returns an error.
	WriteAt(p []byte, off int64) (int, error)
	// Sync fsyncs the file. After an error the file's state on disk is unknown and
	// the caller must not rely on any earlier write (Linux reports a write-back error
	// once).
	Sync() error
	Stat() (Info, error)
	// SetTimes sets the file's access and modification times, in nanoseconds since
	// the epoch (futimens); the file system keeps what its timestamp granularity
	// allows. Only ProbeGranularity uses it, on an unnamed file.
	SetTimes(atimeNs, mtimeNs int64) error
	Close() error
	// Fd returns the descriptor, for flock.
	Fd() uintptr
}

// DirEntry is one name in a directory listing, with its type bits as reported by the
// directory (fs.ModeDir, fs.ModeSymlink, …; 0 for a regular file).
type DirEntry struct {
	Name string
	Type fs.FileMode
}

// Info is what lstat or fstat reports of a file.
type Info struct {
	Dev, Ino uint64
	Mode     uint32 // st_mode: type and permission bits
	Uid, Gid uint32
	Nlink    uint64
	Size     int64
	MtimeNs  int64
	CtimeNs  int64
}

// IsRegular reports whether the file is a regular file.
func (i Info) IsRegular() bool { return i.Mode&syscall.S_IFMT == syscall.S_IFREG }

// IsDir reports whether the file is a directory.
func (i Info) IsDir() bool { return i.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// IsSymlink reports whether the file is a symbolic link.
func (i Info) IsSymlink() bool { return i.Mode&syscall.S_IFMT == syscall.S_IFLNK }

// Perm returns the permission bits.
func (i Info) Perm() uint32 { return i.Mode & 0o7777 }

// Fingerprint identifies one version of a file: an atomic replacement, an in-place
// rewrite or a permission change changes at least one of its fields.
type Fingerprint struct {
	Dev, Ino uint64
	Mode     uint32
	Uid      uint32
	Size     int64
	MtimeNs  int64
	CtimeNs  int64
}

// Fingerprint returns the file fingerprint of DESIGN §8.
func (i Info) Fingerprint() Fingerprint {
	return Fingerprint{Dev: i.Dev, Ino: i.Ino, Mode: i.Mode, Uid: i.Uid, Size: i.Size, MtimeNs: i.MtimeNs, CtimeNs: i.CtimeNs}
}

// DirStamp is the directory part of a listing stamp (DESIGN §8). The store adds the
// generation file's state.
type DirStamp struct {
	Dev, Ino uint64
	MtimeNs  int64
	CtimeNs  int64
}

// DirStamp returns the directory fields of a listing stamp.
func (i Info) DirStamp() DirStamp {
	return DirStamp{Dev: i.Dev, Ino: i.Ino, MtimeNs: i.MtimeNs, CtimeNs: i.CtimeNs}
}

// ErrNotLocal is returned for a name that is absolute, unclean or leaves the root.
var ErrNotLocal = errors.New("fsx: name is not a clean local path")

// CheckName reports whether name is acceptable to an FS.
func CheckName(name string) error {
	if name == "." {
		return nil
	}
	if name == "" || strings.HasPrefix(name, "/") || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") || strings.ContainsRune(name, 0) {
		return &fs.PathError{Op: "check", Path: name, Err: ErrNotLocal}
	}
	return nil
}

// CheckBase reports whether base is a single name within a directory: not empty, not
// "." or "..", without a slash or NUL. WriteFile, RemoveFile and Publish require it, so
// the entry they change is always in the directory they fsync.
func CheckBase(base string) error {
	if base == "" || base == "." || base == ".." || strings.ContainsAny(base, "/\x00") {
		return &fs.PathError{Op: "check", Path: base, Err: ErrNotLocal}
	}
	return nil
}

// Errno returns the syscall.Errno inside err, or 0.
func Errno(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

// IsNotExist reports whether err means the file does not exist.
func IsNotExist(err error) bool { return Errno(err) == syscall.ENOENT }

// IsExist reports whether err means the file already exists.
func IsExist(err error) bool { return Errno(err) == syscall.EEXIST }
