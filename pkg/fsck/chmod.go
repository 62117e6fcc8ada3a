package fsck

import (
	"io/fs"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// chmodBeneath sets the permission bits of name, opened beneath the store directory
// without following links through fsys, after checking that it is still the inode
// the check saw (want), and fsyncs it so the new mode is durable.
//
// fsx.FS has no chmod, so this is the one system call fsck makes outside fsx — on a
// descriptor fsx opened, so no path is resolved here. It belongs in fsx (requested);
// until then it stays in this file.
func chmodBeneath(fsys fsx.FS, name string, dir bool, perm uint32, want fsx.Fingerprint) error {
	flag := syscall.O_RDONLY | syscall.O_NONBLOCK | syscall.O_NOCTTY
	if dir {
		flag |= syscall.O_DIRECTORY
	}
	f, err := fsys.OpenFile(name, flag, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if info.Dev != want.Dev || info.Ino != want.Ino {
		return errChanged
	}
	if err := syscall.Fchmod(int(f.Fd()), perm); err != nil {
		return &fs.PathError{Op: "fchmod", Path: name, Err: err}
	}
	return f.Sync()
}
