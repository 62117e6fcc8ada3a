package relay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// headsDir holds, in the file relay's inbox directory, the highest store head
// witnessed per sender: heads/<hex sha256(sender DID)>.head, the head's exact
// bytes (0600, written with fsx.WriteFile: staged, fsynced, renamed, the
// directory fsynced), and beside it <same>.lock, the lock file of its
// compare-and-write.
const headsDir = "heads"

// fileHeads keeps the witnessed heads under one directory. Its rule: a head
// file is replaced only under an exclusive flock of its lock file, by a head
// whose seq is higher than the one read under that lock, so no two writers —
// goroutines, or processes on the same directory — can lower it. (One relay
// process holds an inbox directory at a time anyway; the rule does not rely on
// it.) Safe for concurrent use.
type fileHeads struct {
	fs   fsx.FS
	dirs *fsx.DirsMade
}

func headKey(did identity.DID) string { return recipientDir(did) }

// removeTemps removes what an interrupted head write left (its temps).
func (h *fileHeads) removeTemps() {
	ents, err := h.fs.ReadDir(headsDir)
	if err != nil {
		return // none yet, or unreadable: a write will say
	}
	for _, d := range ents {
		if fsx.IsTempName(d.Name) {
			_ = h.fs.Remove(path.Join(headsDir, d.Name))
		}
	}
}

// read returns sender's head (bytes and seq; nil, 0 when none). A file that
// is not sender's valid head is an error: the highest seq is then unknown.
func (h *fileHeads) read(sender identity.DID) ([]byte, int64, error) {
	data, _, err := fsx.ReadFile(h.fs, path.Join(headsDir, headKey(sender)+".head"), envelope.MaxHeadSize)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, unavailable(relayproto.CodeInboxUnreadable, "the relay cannot read the heads it witnessed", err)
	}
	sh, err := envelope.ParseStoreHead(data)
	if err != nil || sh.Owner != sender {
		return nil, 0, unavailable(relayproto.CodeInboxUnreadable, "the relay cannot read the heads it witnessed",
			fmt.Errorf("relay: %s/%s.head is not a head of %s: %v", headsDir, headKey(sender), sender, err))
	}
	return data, sh.Seq, nil
}

// raise keeps data, sh's bytes, unless the kept head's seq is at least sh.Seq,
// and returns the seq kept, durable on return.
func (h *fileHeads) raise(data []byte, sh *envelope.StoreHead) (int64, error) {
	if err := h.dirs.Ensure(h.fs, headsDir); err != nil {
		return 0, unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write the heads it witnesses", err)
	}
	key := headKey(sh.Owner)
	lf, err := h.fs.OpenFile(path.Join(headsDir, key+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return 0, unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write the heads it witnesses", err)
	}
	defer lf.Close() // releases the flock
	for {
		err = syscall.Flock(int(lf.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return 0, unavailable(relayproto.CodeInboxUnwritable, "the relay cannot lock the heads it witnesses", err)
	}
	_, cur, err := h.read(sh.Owner)
	if err != nil {
		return 0, err
	}
	if cur >= sh.Seq {
		return cur, nil
	}
	if err := fsx.WriteFile(h.fs, headsDir, key+".head", data); err != nil {
		return 0, unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write the heads it witnesses", err)
	}
	return sh.Seq, nil
}

func (f *fileStore) senderHead(_ context.Context, sender identity.DID) ([]byte, error) {
	data, _, err := f.heads.read(sender)
	return data, err
}

func (f *fileStore) raiseHead(_ context.Context, data []byte, sh *envelope.StoreHead) (int64, error) {
	return f.heads.raise(data, sh)
}

func (f *fileStore) sent(_ context.Context, id string) (*held, bool, error) {
	rec, err := store.GetAs[*record.Receipt](f.st, record.ReceiptID(id))
	if err != nil {
		return nil, false, storeError(err)
	}
	if rec == nil || rec.EnvelopeID != id {
		return nil, false, nil
	}
	f.mu.Lock()
	e := f.byID[id]
	waiting := e != nil && e.digest == rec.EnvelopeDigest && e.seq < f.visibleBelow() && e.deadline > f.now().UnixMilli()
	f.mu.Unlock()
	return heldOf(rec), waiting, nil
}
