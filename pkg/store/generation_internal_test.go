package store

import (
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// An inode number can come back: after two compactions the file may sit on the inode
// of one a reader remembers, with the same length. The epoch in the header still tells
// them apart. Here the file is rewritten in place (same inode, same length, another
// epoch): the state differs, the tail between them is unknown (every kind), and a plan
// made on the old state is stale.
func TestGenerationEpochTellsReusedInode(t *testing.T) {
	s, err := Open(ed25519.NewKeyFromSeed(make([]byte, 32)), Options{Home: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ensureStoreDir(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(s.Dir(), generationName)
	var e1, e2 [16]byte
	e1[0], e2[0] = 1, 2
	if err := os.WriteFile(p, append(generationHeader(e1), 'm'), 0o600); err != nil {
		t.Fatal(err)
	}
	g1, err := s.generation()
	if err != nil || g1.epoch != e1 || g1.size != int64(generationHeaderLen)+1 {
		t.Fatalf("state %+v, %v", g1, err)
	}
	if err := os.WriteFile(p, append(generationHeader(e2), 'x'), 0o600); err != nil { // O_TRUNC: same inode
		t.Fatal(err)
	}
	g2, err := s.generation()
	if err != nil || g2.ino != g1.ino || g2.size != g1.size {
		t.Fatalf("the rewrite should keep inode and length: %+v %+v %v", g1, g2, err)
	}
	if g1 == g2 || g1.sameFile(g2) {
		t.Fatalf("states of two epochs compare as one file: %+v", g2)
	}
	if got := s.changedKinds(g1, g2); len(got) != len(record.Kinds) {
		t.Errorf("changedKinds across epochs = %v, want every kind", got)
	}
	held := func() *marks {
		m := &marks{s: s}
		if err := m.open(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.close)
		return m
	}
	if err := s.validate(&Tx{s: s, gen0: g1}, &groupWrites{}, held()); err != errStalePlan {
		t.Errorf("a plan made in the old epoch validated with %v, want it stale", err)
	}
	// Within one epoch the marks tell: an outbox publication since g2.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{'x'})
	f.Close()
	g3, _ := s.generation()
	if got := s.changedKinds(g2, g3); len(got) != 1 || !got[record.KindOutbox] {
		t.Errorf("changedKinds within the epoch = %v, want outbox only", got)
	}
	if err := s.validate(&Tx{s: s, gen0: g2, listed: map[record.Kind]bool{record.KindMessages: true}}, &groupWrites{}, held()); err != nil {
		t.Errorf("a plan listing only messages was invalidated by an outbox mark: %v", err)
	}
}

// When the generation file can be neither marked, replaced nor removed, the kind
// stays unmarked in the failing process, which reconciles it in full (and so reads it
// right) until its next publication replaces the file; from then on it trusts stamps
// again.
func TestUnmarkedKindHealsAtTheNextPublication(t *testing.T) {
	failing := new(atomic.Bool)
	s, err := Open(ed25519.NewKeyFromSeed(make([]byte, 32)), Options{Home: t.TempDir(), WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		f.Inject = func(op fsx.Op) error {
			gen := op.Path == generationName && (op.Kind == fsx.OpWrite || op.Kind == fsx.OpRemove)
			rootTemp := op.Kind == fsx.OpWrite && !strings.Contains(op.Path, "/") && fsx.IsTempName(op.Path)
			if failing.Load() && (gen || rootTemp) {
				return syscall.ENOSPC
			}
			return nil
		}
		return f
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.BeginOperation(ctx, "first", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	if _, err := s.BeginOperation(ctx, "second", []byte(`{}`)); err == nil {
		t.Fatal("BeginOperation with its marks failing reported success")
	}
	unmarked := func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.unmarkedKinds) > 0 }
	if !unmarked() {
		t.Fatal("no kind is unmarked although its mark, replacement and removal all failed")
	}
	ix, err := s.prepareIndex(ctx, record.KindOperations)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ix.ops); n != 2 {
		t.Fatalf("the failing process's operations index holds %d, want the 2 on disk", n)
	}
	failing.Store(false)
	if _, err := s.BeginOperation(ctx, "third", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if unmarked() {
		t.Fatal("still unmarked after a publication replaced the generation file")
	}
	ix, err = s.prepareIndex(ctx, record.KindOperations)
	if err != nil || len(ix.ops) != 3 {
		t.Fatalf("operations index after healing: %v entries, %v", len(ix.ops), err)
	}
}
