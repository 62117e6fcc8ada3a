package fsfixtures

import (
	"bytes"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// ValidRecords returns the bytes of every record file of the store at dir that the
// store accepts by content (record.Parse with the fixtures' owner), by relative
// path. It judges independently of fsck, for tests of fsck.
func ValidRecords(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	owner := OwnerDID()
	key, err := owner.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, k := range record.Kinds {
		ents, err := os.ReadDir(filepath.Join(dir, string(k)))
		if err != nil {
			continue // absent, or not a directory we follow
		}
		if fi, err := os.Lstat(filepath.Join(dir, string(k))); err != nil || !fi.IsDir() {
			continue
		}
		for _, e := range ents {
			id, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok || !e.Type().IsRegular() || !record.ValidID(k, id) {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, string(k), e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := record.Parse(k, id, data, owner, key); err == nil {
				out[record.Path(k, id)] = data
			}
		}
	}
	return out
}

// MovedNote is the part of a lost+found note (pkg/fsck MoveNote) that tests check.
type MovedNote struct {
	From string `json:"from"`
	To   string `json:"to"`
	Code string `json:"code"`
	Why  string `json:"why"`
}

// LostFound returns what the store's lost+found holds: each moved entry's note, by
// the moved entry's path relative to the store directory. It fails the test if an
// entry has no note or a note has no entry.
func LostFound(t testing.TB, dir string) map[string]MovedNote {
	t.Helper()
	out := map[string]MovedNote{}
	ents, err := os.ReadDir(filepath.Join(dir, store.LostAndFound))
	if os.IsNotExist(err) {
		return out
	}
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range ents {
		names[e.Name()] = true
	}
	for _, e := range ents {
		base, isNote := strings.CutSuffix(e.Name(), ".fsck.json")
		if !isNote {
			if !names[e.Name()+".fsck.json"] {
				t.Errorf("lost+found/%s has no note", e.Name())
			}
			continue
		}
		if !names[base] {
			t.Errorf("lost+found/%s is a note without its entry", e.Name())
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, store.LostAndFound, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var n MovedNote
		if err := json.Unmarshal(data, &n); err != nil || n.From == "" || n.Why == "" || n.To != path.Join(store.LostAndFound, base) {
			t.Errorf("lost+found/%s: bad note %q (%v)", e.Name(), data, err)
		}
		out[path.Join(store.LostAndFound, base)] = n
	}
	return out
}

// AssertKept checks that every regular file of before (from Files, taken before a
// repair) is still there after it: in place with the same bytes, or moved into
// lost+found with the same bytes and a note naming its original path, or in place as
// a record the store would write over it (Replaced: a state repair) — unless
// removable says the repair may delete it (stale temps and locks). A file inside a
// moved directory counts as moved with it; the generation file may have grown.
func AssertKept(t testing.TB, dir string, before map[string][]byte, removable func(path string) bool) {
	t.Helper()
	after := Files(t, dir)
	notes := LostFound(t, dir)
	byFrom := map[string]string{} // original path → lost+found path
	for to, n := range notes {
		byFrom[n.From] = to
	}
	for p, data := range before {
		if strings.HasPrefix(p, store.LostAndFound+"/") {
			continue
		}
		if got, ok := after[p]; ok && bytes.Equal(got, data) {
			continue
		}
		if got, ok := after[p]; ok && Replaced(p, data, got) {
			continue
		}
		if got, ok := after[p]; ok && p == store.GenerationFile && bytes.HasPrefix(got, data) {
			continue // the generation only grows
		}
		moved := ""
		for from, to := range byFrom {
			if p == from {
				moved = to
			} else if rest, ok := strings.CutPrefix(p, from+"/"); ok {
				moved = to + "/" + rest
			}
		}
		switch {
		case moved != "" && bytes.Equal(after[moved], data):
		case moved != "":
			t.Errorf("%s was moved to %s but its bytes changed", p, moved)
		case removable(p):
		default:
			t.Errorf("%s is gone (not in place, not in lost+found)", p)
		}
	}
}

// Replaced reports whether next, at record path p, is a valid record of the fixtures'
// owner that the store's write rules (record.CheckReplacement) allow over the valid
// record prev: a record a state repair rewrote, keeping its envelope, digest and
// routing and moving its status only forward.
func Replaced(p string, prev, next []byte) bool {
	kind, file, ok := strings.Cut(p, "/")
	id, isRecord := strings.CutSuffix(file, ".json")
	if !ok || !isRecord || !record.Kind(kind).Valid() {
		return false
	}
	owner := OwnerDID()
	key, err := owner.PublicKey()
	if err != nil {
		return false
	}
	a, err := record.Parse(record.Kind(kind), id, prev, owner, key)
	if err != nil {
		return false
	}
	b, err := record.Parse(record.Kind(kind), id, next, owner, key)
	return err == nil && record.CheckReplacement(a, b) == nil
}
