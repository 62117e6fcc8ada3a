package relay

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// The relay's inbox directory lives next to its store, not inside it (the store
// refuses unknown files). This small helper gives it the store's durability
// rules without importing internal/fsx: a temp created with O_EXCL|O_NOFOLLOW,
// written and fsynced, renamed into place, and the directory fsynced before the
// write counts.

// ensureDir creates dir (mode 0700) and its missing parents, fsyncing each
// parent of a directory it created, and refuses a symlink at dir.
func ensureDir(dir string) error {
	st, err := os.Lstat(dir)
	switch {
	case err == nil && st.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("relay: %s is not a directory", dir)
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := ensureDir(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return syncDir(parent)
}

// syncDir fsyncs a directory so that the names in it are durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeFileDurable writes data to dir/name (which must not exist) durably:
// when it returns nil, the file and its name survive a crash.
func writeFileDurable(dir, name string, data []byte) (err error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, "."+hex.EncodeToString(rnd[:])+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

// readFileBounded reads a regular file of at most max bytes without following
// a symlink.
func readFileBounded(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > max {
		return nil, fmt.Errorf("relay: %s is not a regular file of at most %d bytes", filepath.Base(path), max)
	}
	buf := make([]byte, st.Size())
	n, err := f.ReadAt(buf, 0)
	if err != nil && n != len(buf) {
		return nil, err
	}
	return buf, nil
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
