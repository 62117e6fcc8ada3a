package crashtest

import (
	"fmt"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// unitKind is what one recorded call does to the persistent state.
type unitKind int

const (
	uNone    unitKind = iota // no persistent effect (close, failed calls)
	uAddName                 // name → inode (create, link, rename's destination)
	uDelName                 // remove a name (unlink, rename's source)
	uRename                  // atomic: dst → inode, src removed
	uMkdir
	uRmdir
	uData     // write data at offset to an inode
	uTruncate // inode contents emptied (O_TRUNC)
	uFsync    // inode's data durable
	uSyncDir  // directory's entries durable
)

// unit is the persistent effect of one call, with the inode resolved by replaying
// the whole log.
type unit struct {
	op     int // index in the log
	kind   unitKind
	path   string
	path2  string
	dir    string // directory whose fsync makes a name change durable
	ino    int
	offset int64
	data   []byte
	perm   uint32
}

// State is one tree a crash may leave.
type State struct {
	Prefix int    // number of calls that had started (and, but for persistence, completed)
	Desc   string // how the tree was made, for failure messages
	Tree   *Tree
}

// resolve replays the log over initial and returns each call's persistent effect.
func resolve(initial *Tree, log []fsx.Op) ([]unit, error) {
	names := map[string]int{}
	for n, ino := range initial.Names {
		names[n] = ino
	}
	next := len(initial.Inodes) + 1000
	var units []unit
	for i, op := range log {
		u := unit{op: i, path: op.Path, path2: op.Path2}
		if op.Err != nil && op.Kind != fsx.OpWrite {
			units = append(units, unit{op: i, kind: uNone})
			continue
		}
		switch op.Kind {
		case fsx.OpCreate:
			ino, exists := names[op.Path]
			if !exists {
				next++
				ino = next
				names[op.Path] = ino
				u.kind, u.ino, u.dir, u.perm = uAddName, ino, parentDir(op.Path), op.Perm&0o777
				units = append(units, u)
			}
			if exists && op.Flag&syscall.O_TRUNC != 0 {
				units = append(units, unit{op: i, kind: uTruncate, ino: ino})
			}
			continue
		case fsx.OpWrite:
			ino, ok := names[op.Path]
			if !ok {
				return nil, fmt.Errorf("crashtest: write to %s, which the log never created", op.Path)
			}
			u.kind, u.ino, u.offset, u.data = uData, ino, op.Offset, op.Data
		case fsx.OpSync:
			u.kind, u.ino = uFsync, names[op.Path]
		case fsx.OpRename:
			ino := names[op.Path]
			delete(names, op.Path)
			names[op.Path2] = ino
			u.kind, u.ino, u.dir = uRename, ino, parentDir(op.Path2)
		case fsx.OpLink:
			ino := names[op.Path]
			names[op.Path2] = ino
			u.kind, u.ino, u.path, u.dir = uAddName, ino, op.Path2, parentDir(op.Path2)
		case fsx.OpRemove:
			delete(names, op.Path)
			u.kind, u.dir = uDelName, parentDir(op.Path)
		case fsx.OpMkdir:
			u.kind, u.dir, u.perm = uMkdir, parentDir(op.Path), op.Perm&0o777
		case fsx.OpRmdir:
			u.kind, u.dir = uRmdir, parentDir(op.Path)
		case fsx.OpSyncDir:
			u.kind, u.dir = uSyncDir, op.Path
		default:
			u.kind = uNone
		}
		units = append(units, u)
	}
	return units, nil
}

// durable reports whether unit j is made durable by a sync among units[j+1:end].
func durable(units []unit, j, end int) bool {
	u := units[j]
	for _, s := range units[j+1 : end] {
		switch {
		case (u.kind == uData || u.kind == uTruncate) && s.kind == uFsync && s.ino == u.ino:
			return true
		case (u.kind == uAddName || u.kind == uDelName || u.kind == uRename || u.kind == uMkdir || u.kind == uRmdir) &&
			s.kind == uSyncDir && s.dir == u.dir:
			return true
		}
	}
	return false
}

func persistent(u unit) bool {
	switch u.kind {
	case uNone, uFsync, uSyncDir:
		return false
	}
	return true
}

// apply applies unit u (torn: only the first half of a write) to t.
func apply(t *Tree, u unit, torn bool) {
	switch u.kind {
	case uAddName:
		if !t.Dirs[parentDir(u.path)] {
			return // its directory did not persist
		}
		t.Names[u.path] = u.ino
		if _, ok := t.Inodes[u.ino]; !ok {
			t.Inodes[u.ino] = nil
		}
		if u.perm != 0 {
			t.Modes[u.path] = u.perm
		}
	case uDelName:
		delete(t.Names, u.path)
		delete(t.Modes, u.path)
	case uRename:
		if !t.Dirs[parentDir(u.path2)] {
			return
		}
		mode, hadMode := t.Modes[u.path]
		delete(t.Names, u.path)
		delete(t.Modes, u.path)
		t.Names[u.path2] = u.ino
		if _, ok := t.Inodes[u.ino]; !ok {
			t.Inodes[u.ino] = nil
		}
		if hadMode {
			t.Modes[u.path2] = mode
		} else {
			t.Modes[u.path2] = 0o600
		}
	case uMkdir:
		if t.Dirs[parentDir(u.path)] {
			t.Dirs[u.path] = true
			t.Modes[u.path] = u.perm
		}
	case uRmdir:
		delete(t.Dirs, u.path)
	case uTruncate:
		t.Inodes[u.ino] = nil
	case uData:
		data := u.data
		if torn {
			data = data[:len(data)/2]
		}
		cur := t.Inodes[u.ino]
		end := u.offset + int64(len(data))
		if int64(len(cur)) < end {
			grown := make([]byte, end)
			copy(grown, cur)
			cur = grown
		}
		copy(cur[u.offset:], data)
		t.Inodes[u.ino] = cur
	}
}

// Explore returns the crash states of log replayed over initial (see the package
// documentation), in prefix order. A tree is yielded once per epoch: epochs are
// separated by the boundaries (log positions at which the operation under test
// acknowledged something), because the same tree may be correct before an
// acknowledgement and wrong after it.
func Explore(initial *Tree, log []fsx.Op, boundaries ...int) ([]State, error) {
	units, err := resolve(initial, log)
	if err != nil {
		return nil, err
	}
	epoch := func(prefix int) int {
		n := 0
		for _, b := range boundaries {
			if b <= prefix {
				n++
			}
		}
		return n
	}
	seen := map[string]bool{}
	var states []State
	add := func(prefix int, desc string, t *Tree) {
		k := fmt.Sprintf("%d\n%s", epoch(prefix), t.Key())
		if seen[k] {
			return
		}
		seen[k] = true
		states = append(states, State{Prefix: prefix, Desc: desc, Tree: t})
	}
	for end := 0; end <= len(units); end++ {
		var unsynced []int
		isDurable := make([]bool, end)
		for j := 0; j < end; j++ {
			if persistent(units[j]) {
				isDurable[j] = durable(units, j, end)
				if !isDurable[j] {
					unsynced = append(unsynced, j)
				}
			}
		}
		build := func(keep func(j int) bool, tornAt int) *Tree {
			t := initial.Clone()
			for j := 0; j < end; j++ {
				if persistent(units[j]) && (isDurable[j] || keep(j)) {
					apply(t, units[j], j == tornAt)
				}
			}
			return t
		}
		prefix := fmt.Sprintf("after %d calls", end)
		add(end, prefix+": every change persisted", build(func(int) bool { return true }, -1))
		add(end, prefix+": no unsynced change persisted", build(func(int) bool { return false }, -1))
		for _, u := range unsynced {
			add(end, fmt.Sprintf("%s: only unsynced call %d (%s) persisted", prefix, u+1, describe(log[units[u].op])),
				build(func(j int) bool { return j == u }, -1))
			add(end, fmt.Sprintf("%s: all but unsynced call %d (%s) persisted", prefix, u+1, describe(log[units[u].op])),
				build(func(j int) bool { return j != u }, -1))
			if units[u].kind == uData && len(units[u].data) > 1 {
				add(end, fmt.Sprintf("%s: unsynced write %d (%s) torn", prefix, u+1, describe(log[units[u].op])),
					build(func(int) bool { return true }, u))
			}
		}
	}
	return states, nil
}

func describe(op fsx.Op) string {
	if op.Path2 != "" {
		return fmt.Sprintf("%s %s → %s", op.Kind, op.Path, op.Path2)
	}
	return fmt.Sprintf("%s %s", op.Kind, op.Path)
}
