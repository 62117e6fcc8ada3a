package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/store"
)

func TestWriteHeadAfterCommit(t *testing.T) {
	home := t.TempDir()
	s := openStore(t, store.Options{Home: home})
	if h, _ := s.Head(); h != nil {
		t.Fatalf("fresh store has head %+v", h)
	}
	if h, _, err := s.WriteHead(context.Background(), false); err != nil || h != nil {
		t.Fatalf("WriteHead on a clean store: %+v %v", h, err)
	}
	enqueue(t, s, 1)
	h, data, err := s.WriteHead(context.Background(), false)
	if err != nil || h == nil || h.Seq != 1 || h.Format != store.FormatVersion {
		t.Fatalf("WriteHead: %+v %v", h, err)
	}
	h2, _, err := s.WriteHead(context.Background(), false)
	if err != nil || h2.Seq != 1 {
		t.Fatalf("WriteHead, not dirty: %+v %v", h2, err)
	}
	s2 := openStore(t, store.Options{Home: home})
	if got, gotData := s2.Head(); got == nil || got.Seq != 1 || string(gotData) != string(data) {
		t.Fatalf("reopened head %+v", got)
	}
	if err := s2.RolledBack(); err != nil {
		t.Fatal(err)
	}
	_ = dataroot.WitnessFile
	var _ = errors.Is(nil, errcode.StoreRolledBack)
}
