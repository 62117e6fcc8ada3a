package identity

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The system calls of this file are to move onto internal/fsx.

const (
	// maxKeyFileSize bounds what LoadKeyFile reads; a key file this package
	// writes is 119 bytes.
	maxKeyFileSize = 16 << 10
	pemPrivateKey  = "PRIVATE KEY"
	keyFileMode    = 0o600
)

// WriteKeyFile writes id's private key to path as a PKCS#8 PEM file of mode
// 0600. It never replaces anything at path: if a file, directory or symlink
// (even a dangling one) is there, it returns an error wrapping
// ErrKeyFileExists and leaves it alone. The key is staged in a temporary file
// in path's directory, which must exist, created with O_EXCL|O_NOFOLLOW and
// fsynced; it is then moved into place (renameat2 RENAME_NOREPLACE, or link
// and unlink where the filesystem lacks it) and the directory is fsynced.
// The staged file is removed on failure. An error from the final directory
// fsync is returned although the key is then in place.
func WriteKeyFile(path string, id *Identity) error {
	if id == nil {
		return errors.New("identity: write key file: nil identity")
	}
	path = filepath.Clean(path)
	dir, base := filepath.Split(path)
	if base == "" || base == "." || base == ".." || base == string(filepath.Separator) {
		return fmt.Errorf("identity: write key file %s: not a file name", path)
	}
	if dir == "" {
		dir = "."
	}
	der, err := x509.MarshalPKCS8PrivateKey(id.priv)
	if err != nil {
		return fmt.Errorf("identity: write key file %s: encode key: %w", path, err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der})
	clear(der)
	defer clear(data)

	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(dir, "."+base+"."+hex.EncodeToString(rnd[:])+".tmp")
	if err := writeSynced(tmp, data); err != nil {
		return fmt.Errorf("identity: write key file %s: stage: %w", path, err)
	}
	if err := publish(tmp, path); err != nil {
		unix.Unlink(tmp)
		if errors.Is(err, unix.EEXIST) {
			return atPath(path, ErrKeyFileExists)
		}
		return fmt.Errorf("identity: write key file %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("identity: write key file %s: key in place, but directory not synced: %w", path, err)
	}
	return nil
}

// writeSynced creates tmp exclusively with mode 0600, writes data and fsyncs.
// On failure it removes tmp if it created it.
func writeSynced(tmp string, data []byte) (err error) {
	fd, err := unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, keyFileMode)
	if err != nil {
		return &os.PathError{Op: "open", Path: tmp, Err: err}
	}
	defer func() {
		if err != nil {
			unix.Unlink(tmp)
		}
	}()
	f := os.NewFile(uintptr(fd), tmp)
	// The umask can only clear bits; set the mode anyway so it is exact.
	if err := f.Chmod(keyFileMode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// publish gives tmp the name path unless path exists (EEXIST).
func publish(tmp, path string) error { return publishWith(renameNoReplace, tmp, path) }

// publishWith is publish with the no-replace rename as a parameter, so that
// tests can take the link(2) fallback.
func publishWith(renameNoReplace func(oldpath, newpath string) error, tmp, path string) error {
	err := renameNoReplace(tmp, path)
	if err == nil || !(errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.ENOTSUP)) {
		return wrapPath("rename", path, err)
	}
	// No RENAME_NOREPLACE here; link(2) refuses an existing name too.
	if err := unix.Link(tmp, path); err != nil {
		return wrapPath("link", path, err)
	}
	if err := unix.Unlink(tmp); err != nil {
		return fmt.Errorf("key in place, but staged file %s left behind (the key file has two links until it is removed): %w", tmp, err)
	}
	return nil
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return wrapPath("fsync", dir, unix.Fsync(fd))
}

func wrapPath(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// LoadKeyFile reads the identity in the key file at path. It opens the file
// with O_NOFOLLOW|O_NONBLOCK, so a symlink as the last path element is refused
// (ErrKeyFileType) and a FIFO or device never blocks, and checks with fstat
// that it is a regular file with one link (ErrKeyFileType), owned by the
// effective user (ErrKeyFileOwner), with no permission bits beyond 0600
// (ErrKeyFileMode) and at most 16 KiB (ErrKeyFileSize). The content must be
// exactly one "PRIVATE KEY" PEM block, optionally followed by white space,
// holding an unencrypted PKCS#8 Ed25519 key whose public key is strictly
// valid (ErrKeyFileFormat). Errors never contain key bytes.
func LoadKeyFile(path string) (*Identity, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		perr := &os.PathError{Op: "open", Path: path, Err: err}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EMLINK) {
			return nil, atPath(path, fmt.Errorf("%w: a symbolic link (%w)", ErrKeyFileType, err))
		}
		return nil, fmt.Errorf("identity: key file: %w", perr)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("identity: key file: %w", &os.PathError{Op: "fstat", Path: path, Err: err})
	}
	if err := checkKeyFileStat(&st); err != nil {
		return nil, atPath(path, err)
	}
	buf := make([]byte, maxKeyFileSize+1)
	defer clear(buf)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("identity: key file: %w", &os.PathError{Op: "read", Path: path, Err: err})
		}
		if m == 0 {
			break
		}
		n += m
	}
	if n > maxKeyFileSize { // it grew after fstat
		return nil, atPath(path, ErrKeyFileSize)
	}
	id, err := parseKeyPEM(buf[:n])
	if err != nil {
		return nil, atPath(path, err)
	}
	return id, nil
}

// keyFileErrPrefix starts the text of every ErrKeyFile… sentinel.
const keyFileErrPrefix = "identity: key file"

// keyFileError names the key file in an error wrapping an ErrKeyFile… sentinel,
// once: "identity: key file PATH is not …", not "identity: key file PATH:
// identity: key file is not …".
type keyFileError struct {
	path string
	err  error
}

func atPath(path string, err error) error { return &keyFileError{path: path, err: err} }

func (e *keyFileError) Error() string {
	if s := e.err.Error(); strings.HasPrefix(s, keyFileErrPrefix+" ") {
		return keyFileErrPrefix + " " + e.path + s[len(keyFileErrPrefix):]
	}
	return keyFileErrPrefix + " " + e.path + ": " + e.err.Error()
}

func (e *keyFileError) Unwrap() error { return e.err }

// checkKeyFileStat applies LoadKeyFile's rules to an fstat result.
func checkKeyFileStat(st *unix.Stat_t) error {
	mode := uint32(st.Mode)
	if mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: file type %s", ErrKeyFileType, fileTypeName(mode))
	}
	if st.Nlink != 1 {
		return fmt.Errorf("%w: %d hard links", ErrKeyFileType, st.Nlink)
	}
	if euid := os.Geteuid(); int64(st.Uid) != int64(euid) {
		return fmt.Errorf("%w: owner uid %d, running as uid %d", ErrKeyFileOwner, st.Uid, euid)
	}
	if perm := mode &^ unix.S_IFMT; perm&^keyFileMode != 0 {
		return fmt.Errorf("%w: mode %04o", ErrKeyFileMode, perm)
	}
	if st.Size > maxKeyFileSize {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrKeyFileSize, st.Size, maxKeyFileSize)
	}
	return nil
}

func fileTypeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symbolic link"
	}
	return fmt.Sprintf("%#o", mode&unix.S_IFMT)
}

// parseKeyPEM decodes a key file's content. Its errors hold no content.
func parseKeyPEM(data []byte) (*Identity, error) {
	if !bytes.HasPrefix(data, []byte("-----BEGIN "+pemPrivateKey+"-----")) {
		return nil, fmt.Errorf("%w: does not start with a PRIVATE KEY PEM block", ErrKeyFileFormat)
	}
	block, rest := pem.Decode(data)
	if block == nil || block.Type != pemPrivateKey {
		return nil, fmt.Errorf("%w: malformed PEM", ErrKeyFileFormat)
	}
	defer clear(block.Bytes)
	if len(block.Headers) != 0 {
		return nil, fmt.Errorf("%w: PEM headers present", ErrKeyFileFormat)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: data after the PEM block", ErrKeyFileFormat)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		// crypto/x509 and encoding/asn1 errors name tags, lengths and
		// algorithm identifiers, never content bytes.
		return nil, fmt.Errorf("%w: %w", ErrKeyFileFormat, err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: holds a %T, not an Ed25519 key", ErrKeyFileFormat, key)
	}
	defer clear(priv)
	id, err := FromPrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyFileFormat, err)
	}
	return id, nil
}

// LoadOrCreateKeyFile loads the identity in the key file at path, or — only if nothing
// is there — generates one and writes it (WriteKeyFile's rules). created reports which.
func LoadOrCreateKeyFile(path string) (id *Identity, created bool, err error) {
	id, err = LoadKeyFile(path)
	if err == nil {
		return id, false, nil
	}
	if _, serr := os.Lstat(path); !errors.Is(serr, os.ErrNotExist) {
		return nil, false, err
	}
	if id, err = Generate(); err != nil {
		return nil, false, err
	}
	if err := WriteKeyFile(path, id); err != nil {
		return nil, false, err
	}
	return id, true, nil
}
