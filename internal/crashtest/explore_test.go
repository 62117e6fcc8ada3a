package crashtest

import (
	"strings"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// The model's persistence rules, on a hand-written log of a durable write: temp
// created, written, fsynced, renamed, directory fsynced.
func TestExploreDurableWrite(t *testing.T) {
	initial := newTree()
	initial.Dirs["d"] = true
	initial.Names["d/x"] = 1
	initial.Inodes[1] = []byte("old")
	log := []fsx.Op{
		{Kind: fsx.OpCreate, Path: "d/.t", Flag: syscall.O_CREAT | syscall.O_EXCL, Perm: 0o600},
		{Kind: fsx.OpWrite, Path: "d/.t", Data: []byte("new!")},
		{Kind: fsx.OpSync, Path: "d/.t"},
		{Kind: fsx.OpClose, Path: "d/.t"},
		{Kind: fsx.OpRename, Path: "d/.t", Path2: "d/x"},
		{Kind: fsx.OpSyncDir, Path: "d"},
	}
	states, err := Explore(initial, log, 1, 2, 3, 4, 5, 6) // every prefix its own epoch
	if err != nil {
		t.Fatal(err)
	}
	contents := map[int]map[string]bool{} // prefix → contents of d/x seen
	for _, s := range states {
		if contents[s.Prefix] == nil {
			contents[s.Prefix] = map[string]bool{}
		}
		if ino, ok := s.Tree.Names["d/x"]; ok {
			contents[s.Prefix][string(s.Tree.Inodes[ino])] = true
		} else {
			contents[s.Prefix]["<absent>"] = true
		}
		for n, ino := range s.Tree.Names {
			if strings.HasSuffix(n, "/.t") && string(s.Tree.Inodes[ino]) == "ne" {
				contents[s.Prefix]["<torn temp>"] = true
			}
		}
	}
	// Before the rename, x is old; after the rename but before the directory fsync,
	// either; after the directory fsync, only new — and never empty or torn, because
	// the data was fsynced before the rename.
	if !contents[2]["<torn temp>"] {
		t.Errorf("a torn unsynced write was not explored: %v", contents[2])
	}
	if got := contents[5]; !got["old"] || !got["new!"] || len(got) != 2 {
		t.Errorf("after the rename: %v, want old and new!", got)
	}
	if got := contents[6]; !got["new!"] || len(got) != 1 {
		t.Errorf("after the directory fsync: %v, want only new!", got)
	}
}

// Without the file fsync, a rename made durable may expose an empty file.
func TestExploreRenameWithoutFsyncExposesEmptyFile(t *testing.T) {
	initial := newTree()
	initial.Dirs["d"] = true
	log := []fsx.Op{
		{Kind: fsx.OpCreate, Path: "d/.t", Flag: syscall.O_CREAT | syscall.O_EXCL, Perm: 0o600},
		{Kind: fsx.OpWrite, Path: "d/.t", Data: []byte("data")},
		{Kind: fsx.OpRename, Path: "d/.t", Path2: "d/x"},
		{Kind: fsx.OpSyncDir, Path: "d"},
	}
	states, err := Explore(initial, log, 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if ino, ok := s.Tree.Names["d/x"]; ok && s.Prefix == 4 && len(s.Tree.Inodes[ino]) == 0 {
			return
		}
	}
	t.Fatal("no state shows the renamed file empty")
}

// A file in a directory whose creation did not persist does not persist either.
func TestExploreMissingParentDir(t *testing.T) {
	log := []fsx.Op{
		{Kind: fsx.OpMkdir, Path: "d", Perm: 0o700},
		{Kind: fsx.OpCreate, Path: "d/f", Flag: syscall.O_CREAT, Perm: 0o600},
		{Kind: fsx.OpSyncDir, Path: "d"},
	}
	states, err := Explore(newTree(), log, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Tree.Has("d/f") && !s.Tree.Dirs["d"] {
			t.Fatalf("%s: a file without its directory", s.Desc)
		}
	}
	found := false
	for _, s := range states {
		if s.Prefix == 3 && !s.Tree.Dirs["d"] {
			found = true // the mkdir was never made durable (its parent was not fsynced)
		}
	}
	if !found {
		t.Fatal("the unsynced mkdir was always persisted")
	}
}

func TestMaterializeRoundTrip(t *testing.T) {
	tr := newTree()
	tr.Dirs["a"] = true
	tr.Modes["a"] = 0o700
	tr.Names["a/x"] = 7
	tr.Names["a/y"] = 7 // a hard link
	tr.Inodes[7] = []byte("hello")
	tr.Modes["a/x"], tr.Modes["a/y"] = 0o600, 0o600
	dir := t.TempDir()
	if err := tr.Materialize(dir); err != nil {
		t.Fatal(err)
	}
	back, err := Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if back.Names["a/x"] != back.Names["a/y"] || string(back.Inodes[back.Names["a/x"]]) != "hello" || back.Modes["a/x"] != 0o600 {
		t.Fatalf("round trip: %+v", back)
	}
}
