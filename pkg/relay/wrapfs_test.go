package relay_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Options.WrapFS wraps both file systems the relay writes: a failure injected into
// the inbox's refuses the accept before any receipt record is written, and the
// accept after it writes its record through the store's wrapper.
func TestWrapFSWrapsStoreAndInbox(t *testing.T) {
	home, relID := t.TempDir(), ident(t, 9)
	wrapped := map[string]*fsx.Faulty{} // root → its wrapper
	r, err := relay.New(relay.Options{Identity: relID, Home: home, Logger: quiet, WrapFS: func(inner fsx.FS) fsx.FS {
		f := fsx.NewFaulty(inner)
		wrapped[inner.Root()] = f
		return f
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sum := sha256.Sum256([]byte(relID.DID()))
	inbox := wrapped[filepath.Join(home, dataroot.RelayDir, hex.EncodeToString(sum[:]))]
	st := wrapped[dataroot.StoreDir(home, string(relID.DID()))]
	if inbox == nil || st == nil || len(wrapped) != 2 {
		t.Fatalf("wrapped roots %v, want the inbox directory and the store", keys(wrapped))
	}
	now := time.Now()
	_, data, err := envelope.NewMessage(ident(t, 1), ident(t, 2).DID(), uuid.NewString(), []byte("hi"), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	inbox.Inject = func(op fsx.Op) error {
		if op.Kind == fsx.OpCreate {
			return syscall.ENOSPC
		}
		return nil
	}
	before := st.Count()
	_, err = r.Accept(context.Background(), data)
	var pe *relayproto.Error
	if !errors.As(err, &pe) || pe.Code != "INBOX_UNWRITABLE" {
		t.Fatalf("accept with the inbox full: %v, want INBOX_UNWRITABLE", err)
	}
	if st.Count() != before {
		t.Fatalf("the store was written (%d calls) though the inbox file failed", st.Count()-before)
	}
	inbox.Inject = nil
	if _, err := r.Accept(context.Background(), data); err != nil {
		t.Fatal(err)
	}
	if st.Count() == before {
		t.Fatal("the accept wrote its receipt record past the store's wrapper")
	}
}

func keys(m map[string]*fsx.Faulty) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
