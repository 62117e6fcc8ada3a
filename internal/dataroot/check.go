package dataroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// RelayDir is the directory under a relay's data root that holds its inboxes.
const RelayDir = "relay"

// The data-root rules. Every directory from the data root down — the data root,
// delivery/, identities/, run/, relay/, witness/, a store directory and its kind directories —
// is a real directory (never a symbolic link: none is followed from the data root
// down), owned by the effective user and not writable by group or others. Store
// directories and their kind directories have no group or other permission bits at
// all (0700). Every binary checks them whenever it opens a data root or a store
// (CheckRoot, CheckStore), and refuses to go on when one is broken.

// Violation is one directory that breaks a data-root rule. It is an error whose
// message is "<path>: <rule>"; the checks return it carrying Fix as its hint
// (errcode.HintOf), so that the commands print what to do.
type Violation struct {
	Path string // absolute path of the directory
	Rule string // the rule it breaks, e.g. "the data root is writable by group or others (mode 0777)"
	Fix  string // the command or step that fixes it, e.g. "chmod 700 /home/u/sb"
}

func (v *Violation) Error() string { return v.Path + ": " + v.Rule }

// err returns v as an error carrying its fix as the hint.
func (v *Violation) err() error { return errcode.WithHint(v, v.Fix) }

// rootDirs are the directories directly under a data root that CheckRoot checks
// when they exist.
var rootDirs = []string{DeliveryDir, IdentitiesDir, RunDir, RelayDir, WitnessDir}

// CheckRoot checks the data root root and those of its delivery/, identities/, run/,
// relay/ and witness/ directories that exist. A data root that does not exist yet is no
// violation (whoever creates it creates it 0700). It returns nil, the first
// violation (a *Violation carrying its fix as hint, see errors.As and
// errcode.HintOf), or the error of an lstat that failed for another reason.
func CheckRoot(root string) error {
	vs, err := RootViolations(root)
	if err != nil {
		return err
	}
	if len(vs) > 0 {
		return vs[0].err()
	}
	return nil
}

// RootViolations returns every violation CheckRoot would refuse, in order: the data
// root, then delivery/, identities/, run/, relay/, witness/.
func RootViolations(root string) ([]*Violation, error) {
	v, exists, err := checkDir(root, "the data root", false)
	if err != nil || !exists {
		return nil, err
	}
	var vs []*Violation
	if v != nil {
		vs = append(vs, v.Violation)
		if v.notDir {
			return vs, nil // nothing beneath a file
		}
	}
	for _, name := range rootDirs {
		v, _, err := checkDir(filepath.Join(root, name), "the "+name+"/ directory", false)
		if err != nil {
			return vs, err
		}
		if v != nil {
			vs = append(vs, v.Violation)
		}
	}
	return vs, nil
}

// CheckDir checks one directory under a data root (what names it in the rule, e.g.
// "the relay's inbox directory"): a real directory owned by the effective user and
// not writable by group or others. A directory that does not exist is no violation.
func CheckDir(path, what string) error {
	v, _, err := checkDir(path, what, false)
	if err != nil {
		return err
	}
	if v != nil {
		return v.err()
	}
	return nil
}

// CheckStore checks the store directory dir and those of its kind directories
// (kinds, names relative to dir) that exist: each a real directory owned by the
// effective user, with no group or other permission bits (0700), that it can open.
// A store directory that does not exist yet is no violation (the store creates it
// at its first write).
func CheckStore(dir string, kinds []string) error {
	v, exists, err := checkDir(dir, "the store directory", true)
	switch {
	case err != nil:
		return err
	case v != nil:
		return v.err()
	case !exists:
		return nil
	}
	for _, k := range kinds {
		v, _, err := checkDir(filepath.Join(dir, k), "the store's "+k+"/ directory", true)
		if err != nil {
			return err
		}
		if v != nil {
			return v.err()
		}
	}
	return nil
}

// violation is a Violation and whether the path is something other than a
// directory or a symbolic link (nothing beneath it can be checked).
type violation struct {
	*Violation
	notDir bool
}

// checkDir judges path by lstat (a symbolic link is never followed). private: the
// store's rule (no group or other bits, and the directory must open). exists is
// false when path does not exist; err is set only when it cannot be judged.
func checkDir(path, what string, private bool) (*violation, bool, error) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	info, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	q := ShellQuote(path)
	mk := func(rule, fix string) *violation {
		return &violation{Violation: &Violation{Path: path, Rule: what + " " + rule, Fix: fix}}
	}
	mode := info.Mode()
	switch {
	case mode&fs.ModeSymlink != 0:
		return mk("is a symbolic link; no symbolic link is followed from the data root down", symlinkFix(path)), true, nil
	case !mode.IsDir():
		v := mk("is "+typeName(mode)+", not a directory", "move "+q+" out of the way: it must be a directory")
		v.notDir = true
		return v, true, nil
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return mk(fmt.Sprintf("is owned by uid %d, not by this user (uid %d)", st.Uid, os.Geteuid()),
			fmt.Sprintf("run as uid %d, or give it to this user: chown %d %s", st.Uid, os.Geteuid(), q)), true, nil
	}
	perm := mode.Perm()
	switch {
	case private && perm&0o077 != 0:
		return mk(fmt.Sprintf("has group or other permissions (mode %04o); store directories are 0700", perm), "chmod 700 "+q), true, nil
	case perm&0o022 != 0:
		return mk(fmt.Sprintf("is writable by group or others (mode %04o)", perm), "chmod 700 "+q), true, nil
	}
	if private {
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				return mk(fmt.Sprintf("cannot be opened by its owner (mode %04o)", perm), "chmod 700 "+q), true, nil
			}
			return nil, true, err
		}
		f.Close()
	}
	return nil, true, nil
}

// symlinkFix is the fix of a symbolic link at path: the commands that put the
// directory it points to in its place.
func symlinkFix(path string) string {
	target, err := os.Readlink(path)
	if err != nil {
		return "replace the symbolic link " + ShellQuote(path) + " with a real directory"
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(path), target)
	}
	return "replace the symbolic link with the directory it points to: rm " + ShellQuote(path) +
		" && mv " + ShellQuote(target) + " " + ShellQuote(path)
}

func typeName(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}

// ShellQuote quotes s for a POSIX shell when it needs it: the paths in the fixes of
// the data-root rules and of the key-file rules (pkg/identity).
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./+:@=,%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
