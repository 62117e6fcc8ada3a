package fsck

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// dataRootNames are the directories of a data root. A store never has them, so a
// directory that holds one (as a directory or a symbolic link) is taken for a data
// root and never checked or repaired as a store.
var dataRootNames = []string{"delivery", "identities", "run"}

// deliveryDir is the name of the data root's directory that holds the stores.
const deliveryDir = "delivery"

// checkLayout decides whether the directory (already known to be a real directory
// of ours, checkRoot) is laid out like a store directory:
//
//   - it holds no "delivery", "identities" or "run" directory (or link): else it
//     looks like a data root (ErrDataRoot);
//   - its name is 64 lower-case hex digits (the SHA-256 of its owner's DID, which
//     establishOwner confirms) and its parent directory is named "delivery".
//
// The check then applies one more rule (checkForeign), once the records are
// verified: a directory that holds names the store never makes at its top is a
// store only if at least one record in it verifies as its owner's.
func (c *checker) checkLayout() error {
	for _, name := range dataRootNames {
		if info, err := c.fs.Lstat(name); err == nil && (info.IsDir() || info.IsSymlink()) {
			return fmt.Errorf("%w: %s holds %s/, as a data root does; a store directory is <data root>/delivery/<64 hex digits>", ErrDataRoot, c.dir, name)
		}
	}
	base, parent := filepath.Base(c.dir), filepath.Base(filepath.Dir(c.dir))
	if !record.ValidID(record.KindIdempotency, base) { // 64 lower-case hex digits
		return fmt.Errorf("%w: %s: the name of a store directory is the 64 hex digits of the SHA-256 of its owner's DID", ErrNotStoreLayout, c.dir)
	}
	if parent != deliveryDir {
		return fmt.Errorf("%w: %s: a store directory is in the data root's delivery/ directory, not in %s/", ErrNotStoreLayout, c.dir, parent)
	}
	return nil
}

// checkForeign refuses a directory that holds, at its top, names the store never
// makes (unknownTop) unless at least one of its records verifies as signed by the
// owner the directory is named for. Unknown names alone do not decide — a damaged
// store with planted files is still a store — but a directory with no evidence of
// being one (a source tree, say, even one with a kind's name inside) is never
// repaired.
func (c *checker) checkForeign() error {
	if len(c.foreign) == 0 || c.rep.Valid > 0 {
		return nil
	}
	names := c.foreign
	more := ""
	if len(names) > 3 {
		names, more = names[:3], fmt.Sprintf(" and %d more", len(c.foreign)-3)
	}
	return fmt.Errorf("%w: %s holds names a store never has (%s%s) and no record of its owner; if it is a store, move those names out of it and run again",
		ErrNotStoreLayout, c.dir, strings.Join(names, ", "), more)
}

// layoutTopName reports whether name, directly in the store directory, is a name the
// store itself makes.
func layoutTopName(name string) bool {
	return record.Kind(name).Valid() || name == lockfile.LockName || lockfile.IsTempName(name) ||
		name == store.GenerationFile || name == store.HeadFile || name == store.LostAndFound || name == blobsDir || fsx.IsTempName(name)
}

// movable reports whether Repair may move p: a name inside a kind directory (or a
// temp name inside lost+found), or a top-level name of the store's layout other than
// lost+found and .head (fsck never changes the head). Nothing the store did not make at the top of the store directory, and
// nothing outside it, is ever moved.
func movable(p string) bool {
	first, rest, nested := strings.Cut(p, "/")
	if p != path.Clean(p) || path.IsAbs(p) || first == ".." || first == "." {
		return false
	}
	if nested {
		return (record.Kind(first).Valid() || first == blobsDir || first == store.LostAndFound && fsx.IsTempName(rest)) && rest != ""
	}
	return first != store.LostAndFound && first != store.HeadFile && layoutTopName(first)
}

// recheck confirms, just before a change, that the directory is still the store the
// check saw: the same directory (device, inode, owner; not a symbolic link, which
// every call refuses), still without a data root's directories, and with no daemon
// serving it.
func (r *repairer) recheck() error {
	info, err := r.fs.Lstat(".")
	switch {
	case err != nil:
		return fmt.Errorf("%w: %s: %s", ErrNotStore, r.dir, errnoText(err))
	case !info.IsDir() || info.Dev != r.root.Dev || info.Ino != r.root.Ino || info.Uid != r.root.Uid || int(info.Uid) != os.Geteuid():
		return fmt.Errorf("%w: %s was replaced since the check; run fsck again", ErrNotStore, r.dir)
	}
	for _, name := range dataRootNames {
		if info, err := r.fs.Lstat(name); err == nil && (info.IsDir() || info.IsSymlink()) {
			return fmt.Errorf("%w: %s/ appeared in %s since the check", ErrDataRoot, name, r.dir)
		}
	}
	return daemonLive(r.opts, r.dir)
}
