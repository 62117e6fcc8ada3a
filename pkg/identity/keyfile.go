package identity

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

const (
	// maxKeyFileSize bounds what LoadKeyFile reads; a key file this package
	// writes is 119 bytes.
	maxKeyFileSize = 16 << 10
	pemPrivateKey  = "PRIVATE KEY"
	keyFileMode    = 0o600
)

// keyFileDir returns an fsx.FS rooted at path's directory and path's last element.
// Every system call on a key file goes through it (internal/fsx).
func keyFileDir(path string) (fsx.FS, string, error) {
	dir, base := filepath.Split(filepath.Clean(path))
	if fsx.CheckBase(base) != nil || base == string(filepath.Separator) {
		return nil, "", fmt.Errorf("identity: key file %s: not a file name", path)
	}
	if dir == "" {
		dir = "."
	}
	return fsx.NewOS(dir), base, nil
}

// WriteKeyFile writes id's private key to path as a PKCS#8 PEM file of mode
// 0600. It never replaces anything at path: if a file, directory or symlink
// (even a dangling one) is there, it returns an error wrapping
// ErrKeyFileExists and leaves it alone. path's directory must exist. The write
// is fsx.CreateFile's: the key is staged in a temporary file in that directory
// (O_EXCL|O_NOFOLLOW, 0600) and fsynced, moved into place without replacing
// (renameat2 RENAME_NOREPLACE, or link and unlink where the file system lacks
// it), and the directory is fsynced; the staged file is removed on failure. An
// error from the final directory fsync is returned although the key is then in
// place.
func WriteKeyFile(path string, id *Identity) error {
	if id == nil {
		return errors.New("identity: write key file: nil identity")
	}
	fsys, base, err := keyFileDir(path)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(id.priv)
	if err != nil {
		return fmt.Errorf("identity: write key file %s: encode key: %w", path, err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der})
	clear(der)
	defer clear(data)
	if err := fsx.CreateFile(fsys, ".", base, data); err != nil {
		if fsx.IsExist(err) {
			return atPath(path, ErrKeyFileExists)
		}
		return fmt.Errorf("identity: write key file %s: %w", path, unwrapPath(err))
	}
	return nil
}

// unwrapPath drops the *fs.PathError around an fsx error when its name is the one
// relative to the key file's directory (the caller names the key file itself); one
// naming the directory (absolute) is kept.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && !filepath.IsAbs(pe.Path) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// LoadKeyFile reads the identity in the key file at path. It reads with
// fsx.ReadFile, which opens with O_NOFOLLOW|O_NONBLOCK, so a symlink as the last
// path element is refused (ErrKeyFileType) and a FIFO or device never blocks,
// and checks with fstat that it is a regular file with one link
// (ErrKeyFileType), owned by the effective user (ErrKeyFileOwner), with no
// permission bits beyond 0600 (ErrKeyFileMode) and at most 16 KiB
// (ErrKeyFileSize). The content must be exactly one "PRIVATE KEY" PEM block,
// optionally followed by white space, holding an unencrypted PKCS#8 Ed25519 key
// whose public key is strictly valid (ErrKeyFileFormat). Errors never contain
// key bytes. Each refusal of a rule carries its fix as its hint (errcode.HintOf):
// chmod 600 for a mode, chown for an owner, the commands that replace a symbolic
// link or remove other links, moving a file of another type out of the way.
func LoadKeyFile(path string) (*Identity, error) {
	fsys, base, err := keyFileDir(path)
	if err != nil {
		return nil, err
	}
	data, info, err := fsx.ReadFile(fsys, base, maxKeyFileSize)
	defer clear(data)
	if info.Mode != 0 { // fstat succeeded: the key file's own rules come first
		if cerr := checkKeyFileStat(info); cerr != nil {
			return nil, refusal(path, cerr, info)
		}
	}
	switch {
	case errors.Is(err, syscall.ELOOP):
		return nil, refusal(path, fmt.Errorf("%w: a symbolic link (%w)", ErrKeyFileType, syscall.ELOOP), info)
	case errors.Is(err, fsx.ErrTooLarge):
		return nil, refusal(path, ErrKeyFileSize, info) // it grew after fstat
	case err != nil:
		return nil, fmt.Errorf("identity: key file %s: %w", path, unwrapPath(err))
	}
	id, err := parseKeyPEM(data)
	if err != nil {
		return nil, refusal(path, err, info)
	}
	return id, nil
}

// refusal is LoadKeyFile's refusal of the key file at path for breaking a key-file
// rule (err wraps an ErrKeyFile… sentinel; info is its fstat, zero if there was
// none): it names the path once and carries the fix as its hint (errcode.HintOf),
// as the data-root refusals do, so that every binary prints what to do.
func refusal(path string, err error, info fsx.Info) error {
	return errcode.WithHint(atPath(path, err), keyFileFix(path, err, info))
}

// keyFileFix is the command or step that fixes the key-file rule err breaks.
func keyFileFix(path string, err error, info fsx.Info) string {
	q := dataroot.ShellQuote(path)
	switch {
	case errors.Is(err, syscall.ELOOP):
		return "a key file is never a symbolic link: replace the link with the file it points to: mv \"$(readlink -f " + q + ")\" " + q
	case errors.Is(err, ErrKeyFileType) && info.IsRegular():
		return fmt.Sprintf("the key file has %d names (hard links): remove the others, so that no other name reads the key (find them with: find / -xdev -samefile %s)", info.Nlink, q)
	case errors.Is(err, ErrKeyFileType):
		return "move " + q + " out of the way and put the key file there: a key file is a regular file of mode 0600"
	case errors.Is(err, ErrKeyFileOwner):
		return fmt.Sprintf("run as uid %d, or give it to this user: chown %d %s", info.Uid, os.Geteuid(), q)
	case errors.Is(err, ErrKeyFileMode):
		return "chmod 600 " + q
	}
	// ErrKeyFileSize, ErrKeyFileFormat: not a key file this package wrote.
	return "restore the key file from a backup: a key file is one PKCS#8 Ed25519 PRIVATE KEY PEM block, mode 0600"
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
func checkKeyFileStat(info fsx.Info) error {
	if !info.IsRegular() {
		return fmt.Errorf("%w: file type %s", ErrKeyFileType, fileTypeName(info.Mode))
	}
	if info.Nlink != 1 {
		return fmt.Errorf("%w: %d hard links", ErrKeyFileType, info.Nlink)
	}
	if euid := os.Geteuid(); int64(info.Uid) != int64(euid) {
		return fmt.Errorf("%w: owner uid %d, running as uid %d", ErrKeyFileOwner, info.Uid, euid)
	}
	if perm := info.Perm(); perm&^keyFileMode != 0 {
		return fmt.Errorf("%w: mode %04o", ErrKeyFileMode, perm)
	}
	if info.Size > maxKeyFileSize {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrKeyFileSize, info.Size, maxKeyFileSize)
	}
	return nil
}

func fileTypeName(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return "directory"
	case syscall.S_IFIFO:
		return "FIFO"
	case syscall.S_IFCHR:
		return "character device"
	case syscall.S_IFBLK:
		return "block device"
	case syscall.S_IFSOCK:
		return "socket"
	case syscall.S_IFLNK:
		return "symbolic link"
	}
	return fmt.Sprintf("%#o", mode&syscall.S_IFMT)
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
