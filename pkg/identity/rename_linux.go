package identity

import "golang.org/x/sys/unix"

// renameNoReplace renames oldpath to newpath unless newpath exists (EEXIST).
// It fails with EINVAL on a filesystem without RENAME_NOREPLACE.
func renameNoReplace(oldpath, newpath string) error {
	return unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
}
