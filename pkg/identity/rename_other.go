//go:build unix && !linux

package identity

import "golang.org/x/sys/unix"

// renameNoReplace is unavailable here; WriteKeyFile falls back to link(2).
func renameNoReplace(oldpath, newpath string) error { return unix.ENOSYS }
