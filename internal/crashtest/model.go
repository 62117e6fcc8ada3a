// Package crashtest builds the states a crash may leave behind after a sequence of
// file-system calls, in the manner of ALICE (OSDI 2014) and CrashMonkey (OSDI 2018).
//
// A test runs an operation over an fsx.Faulty, which records every mutating call.
// Explore replays that log over a snapshot of the directory as it was before the
// operation and returns, for every prefix of the log (a crash after call k), the trees
// a crash may leave, under this model of persistence:
//
//   - A file's data (writes, truncation by O_TRUNC) is durable once the file was
//     fsynced after it; until then it may be lost entirely, or persist torn (a prefix
//     of the last write).
//   - A directory entry change (create, mkdir, rename, link, unlink, rmdir) is durable
//     once its directory was fsynced after it (for a rename, its destination's
//     directory); until then it may not have happened.
//   - Changes that are not yet durable persist independently of one another: any one
//     of them may survive while the others are lost, and any one may be lost while the
//     others survive (operations on different files with no fsync between them may
//     persist out of order).
//
// For each prefix Explore yields: everything persisted (what a process crash leaves:
// the page cache survives), nothing unsynced persisted (a power cut with no luck),
// each unsynced change alone persisted, each alone lost, and the last unsynced write
// torn. Identical trees are yielded once. A rename is atomic (journaled file systems
// guarantee it); a file's data and its name are not ordered with each other.
package crashtest

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Tree is a directory tree: file contents by inode, names by path.
type Tree struct {
	Dirs   map[string]bool   // relative paths of directories ("." is the root)
	Names  map[string]int    // relative path of a file → inode
	Inodes map[int][]byte    // inode → contents
	Modes  map[string]uint32 // permission bits by path (files and directories)
}

func newTree() *Tree {
	return &Tree{Dirs: map[string]bool{".": true}, Names: map[string]int{}, Inodes: map[int][]byte{}, Modes: map[string]uint32{}}
}

// Snapshot reads the tree under dir (regular files and directories; hard links are
// kept as shared inodes; anything else is an error).
func Snapshot(dir string) (*Tree, error) {
	t := newTree()
	byIno := map[uint64]int{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		t.Modes[rel] = uint32(info.Mode().Perm())
		switch {
		case info.IsDir():
			t.Dirs[rel] = true
		case info.Mode().IsRegular():
			st := info.Sys().(*syscall.Stat_t)
			ino, ok := byIno[st.Ino]
			if !ok {
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				ino = len(t.Inodes) + 1
				byIno[st.Ino] = ino
				t.Inodes[ino] = data
			}
			t.Names[rel] = ino
		default:
			return fmt.Errorf("crashtest: %s is neither a file nor a directory", rel)
		}
		return nil
	})
	return t, err
}

// Clone returns a deep copy.
func (t *Tree) Clone() *Tree {
	c := newTree()
	for k, v := range t.Dirs {
		c.Dirs[k] = v
	}
	for k, v := range t.Names {
		c.Names[k] = v
	}
	for k, v := range t.Inodes {
		c.Inodes[k] = append([]byte(nil), v...)
	}
	for k, v := range t.Modes {
		c.Modes[k] = v
	}
	return c
}

// Materialize writes the tree into dir, which must exist and be empty.
func (t *Tree) Materialize(dir string) error {
	dirs := make([]string, 0, len(t.Dirs))
	for d := range t.Dirs {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs) // parents before children
	for _, d := range dirs {
		if d == "." {
			continue
		}
		if err := os.Mkdir(filepath.Join(dir, d), fs.FileMode(t.mode(d, 0o700))); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(t.Names))
	for n := range t.Names {
		names = append(names, n)
	}
	sort.Strings(names)
	first := map[int]string{}
	for _, n := range names {
		ino := t.Names[n]
		dst := filepath.Join(dir, n)
		if src, ok := first[ino]; ok {
			if err := os.Link(src, dst); err != nil {
				return err
			}
			continue
		}
		if err := os.WriteFile(dst, t.Inodes[ino], fs.FileMode(t.mode(n, 0o600))); err != nil {
			return err
		}
		if err := os.Chmod(dst, fs.FileMode(t.mode(n, 0o600))); err != nil {
			return err
		}
		first[ino] = dst
	}
	for _, d := range dirs {
		if err := os.Chmod(filepath.Join(dir, d), fs.FileMode(t.mode(d, 0o700))); err != nil {
			return err
		}
	}
	return nil
}

func (t *Tree) mode(p string, def uint32) uint32 {
	if m, ok := t.Modes[p]; ok {
		return m
	}
	return def
}

// Key returns a string that identifies the tree's names and contents.
func (t *Tree) Key() string {
	var b strings.Builder
	dirs := make([]string, 0, len(t.Dirs))
	for d := range t.Dirs {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		fmt.Fprintf(&b, "d %s %o\n", d, t.mode(d, 0o700))
	}
	names := make([]string, 0, len(t.Names))
	for n := range t.Names {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "f %s %d %q\n", n, t.Names[n], t.Inodes[t.Names[n]])
	}
	return b.String()
}

// Files returns the file names of the tree, sorted.
func (t *Tree) Files() []string {
	out := make([]string, 0, len(t.Names))
	for n := range t.Names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Has reports whether the tree has a file named p.
func (t *Tree) Has(p string) bool { _, ok := t.Names[p]; return ok }

func parentDir(p string) string { return path.Dir(p) }
