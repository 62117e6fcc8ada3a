package relay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// The relay's inbox directory lives next to its store, not inside it (the store
// refuses unknown files). Every file call on it goes through internal/fsx, rooted at
// the inbox directory (r.fs), so it has the store's rules: names resolved beneath
// the root without following a symlink, durable writes (a temp created with
// O_EXCL|O_NOFOLLOW, written and fsynced, published, the directory fsynced before the
// write counts), and reads that a FIFO or device cannot block (O_NONBLOCK, fstat
// for a regular file within a size bound before reading).
//
// Envelope files are created with fsx.CreateFile, which never replaces: an
// envelope's name holds a sequence number allocated once (allocSeq), so a file
// already there was not written by this accept — it is left alone and the accept
// fails rather than overwrite what may be another envelope.

// ensureInboxDir creates the inbox directory dir (mode 0700) and its missing parents
// with fsx.MkdirPrivate, which fsyncs the parent of each directory it creates. An
// existing dir is left to dataroot.CheckDir, which New runs first.
func ensureInboxDir(dir string) error {
	base, missing := dir, []string(nil)
	for {
		_, err := os.Lstat(base)
		if err == nil {
			break
		}
		parent := filepath.Dir(base)
		if !errors.Is(err, os.ErrNotExist) || parent == base {
			return err
		}
		missing = append([]string{filepath.Base(base)}, missing...)
		base = parent
	}
	fsys := fsx.NewOS(base)
	for i := range missing {
		if _, err := fsx.MkdirPrivate(fsys, strings.Join(missing[:i+1], "/")); err != nil {
			return err
		}
	}
	return nil
}

const noFollow = syscall.O_NOFOLLOW | syscall.O_CLOEXEC

// lockDir takes an exclusive, non-blocking flock on dir/.relay.lock so that two
// relay processes never share one inbox. The lock is released when the returned
// file is closed (or the process dies).
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ".relay.lock"), os.O_RDWR|os.O_CREATE|noFollow, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("relay: %s is in use by another relay process: %w", dir, err)
	}
	return f, nil
}
