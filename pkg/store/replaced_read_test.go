package store_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// replaceOnOpen is an FS that, once armed, renames a prepared file over the record it
// is asked to open, right after opening it: the file the reader holds is unlinked
// (0 links) before the reader's fstat, as when another process publishes a newer
// version of the record (or removes it) in the middle of a read.
type replaceOnOpen struct {
	fsx.FS
	dir    string // the store directory, for the os.Rename
	target string // the record's path in the store
	with   atomic.Pointer[string]
}

func (r *replaceOnOpen) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	f, err := r.FS.OpenFile(name, flag, perm)
	if err == nil && name == r.target {
		if src := r.with.Swap(nil); src != nil {
			if *src == "" {
				err = os.Remove(filepath.Join(r.dir, filepath.FromSlash(name)))
			} else {
				err = os.Rename(*src, filepath.Join(r.dir, filepath.FromSlash(name)))
			}
			if err != nil {
				f.Close()
				return nil, err
			}
		}
	}
	return f, err
}

// A record replaced (or removed) by another writer between a read's open and its
// fstat is read again: the reader gets the newer version (or nothing), never
// OUTBOX_STORE_INVALID for a file that merely had its last link taken away.
func TestReadOfRecordReplacedMidReadRetries(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	m, _, _ := oneSecondMessage(t, dir)
	rel := "messages/" + m.MessageID + ".json"
	fs := &replaceOnOpen{dir: dir, target: rel}
	s := openStore(t, store.Options{Dir: dir, CacheEntries: -1, WrapFS: func(inner fsx.FS) fsx.FS {
		fs.FS = inner
		return fs
	}})

	newer := filepath.Join(dir, "messages", ".newer")
	if err := os.WriteFile(newer, signed(t, m, 7), 0o600); err != nil {
		t.Fatal(err)
	}
	fs.with.Store(&newer)
	got, err := getMessage(t, s, m.MessageID)
	if err != nil || got == nil || got.Attempts != 7 {
		t.Fatalf("read across a replacement = %+v, %v; want the newer version (attempts 7)", got, err)
	}

	removed := ""
	fs.with.Store(&removed)
	got, err = getMessage(t, s, m.MessageID)
	if err != nil || got != nil {
		if err != nil && strings.Contains(err.Error(), "links") {
			t.Fatalf("read across a removal: %v (a file that lost its last link taken for a planted one)", err)
		}
		t.Fatalf("read across a removal = %+v, %v; want absent", got, err)
	}
}
