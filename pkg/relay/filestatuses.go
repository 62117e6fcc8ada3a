package relay

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Retained delivery statuses of the file storage (docs/RELAY.md "Retained
// delivery statuses"). An acknowledged delivery status's inbox file is renamed
// (not copied) to statuses/<recipient dir>/<name>, the new directory fsynced,
// before the inbox directory is fsynced and its receipt record raised: the
// envelope leaves the inbox and is retained in one durable step. Its name is
//
//	<16 hex: sequence>-<envelopeId>-<16 hex: receivedAt ms>-<16 hex: retained until ms>.st
//
// with a new sequence number (allocSeq: retention order, the statuses' cursor,
// never below one already served), so a file says everything the index holds.
// The expiry pass removes a file at or after its end of retention; a fetch
// never serves it then.
const statusesDir = "statuses"

// statusEntry is one retained delivery status.
type statusEntry struct {
	seq        uint64
	envelopeID string
	receivedAt int64
	until      int64
	file       string // in f.fs
}

func statusFileName(seq uint64, id string, receivedAt, until int64) string {
	return fmt.Sprintf("%016x-%s-%016x-%016x.st", seq, id, receivedAt, until)
}

func parseStatusFileName(name string) (e statusEntry, ok bool) {
	// 16 + 1 + 36 + 1 + 16 + 1 + 16 + 3
	if len(name) != 90 || name[16] != '-' || name[53] != '-' || name[70] != '-' || !strings.HasSuffix(name, ".st") {
		return e, false
	}
	seq, err1 := strconv.ParseUint(name[:16], 16, 64)
	recv, err2 := strconv.ParseUint(name[54:70], 16, 63)
	until, err3 := strconv.ParseUint(name[71:87], 16, 63)
	e = statusEntry{seq: seq, envelopeID: name[17:53], receivedAt: int64(recv), until: int64(until)}
	return e, err1 == nil && err2 == nil && err3 == nil && uuid.Valid(e.envelopeID)
}

// loadStatuses reads the retained statuses into f.statuses, after the
// inboxes are loaded.
func (f *fileStore) loadStatuses() error {
	dirs, err := readDirSorted(f.fs, statusesDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("relay: read the retained statuses: %w", err)
	}
	for _, d := range dirs {
		if d.Type != fs.ModeDir || len(d.Name) != 64 {
			continue
		}
		dir := path.Join(statusesDir, d.Name)
		files, err := readDirSorted(f.fs, dir)
		if err != nil {
			return fmt.Errorf("relay: read the retained statuses: %w", err)
		}
		for _, fi := range files {
			e, ok := parseStatusFileName(fi.Name)
			if !ok {
				if fsx.IsTempName(fi.Name) {
					_ = f.fs.Remove(path.Join(dir, fi.Name))
				}
				continue
			}
			e.file = path.Join(dir, fi.Name)
			if f.byID[e.envelopeID] != nil {
				// The envelope is back in its inbox (a crash before the
				// acknowledgement's inbox directory was fsynced): not
				// acknowledged, so not retained yet.
				_ = f.fs.Remove(e.file)
				continue
			}
			f.statuses[d.Name] = append(f.statuses[d.Name], &e)
			f.lastSeq = max(f.lastSeq, e.seq)
		}
	}
	return nil
}

// retainStatuses moves the files of the delivery statuses among gone
// (entries of inbox rdir, taken out of it by an acknowledgement) to the
// statuses directory, durably, and indexes them. The caller then removes the
// rest and fsyncs the inbox directory (removeEntries), which makes the renames'
// other half durable.
func (f *fileStore) retainStatuses(rdir string, gone []*entry) error {
	if f.statusRetention <= 0 {
		return nil
	}
	var moved []*statusEntry
	var dones []func()
	defer func() {
		for _, d := range dones {
			d()
		}
	}()
	dir := path.Join(statusesDir, rdir)
	until := f.now().Add(f.statusRetention).UnixMilli()
	for _, e := range gone {
		if !e.status {
			continue
		}
		if len(moved) == 0 {
			if err := f.dirs.Ensure(f.fs, statusesDir); err != nil {
				return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its retained statuses", err)
			}
			if err := f.dirs.Ensure(f.fs, dir); err != nil {
				return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its retained statuses", err)
			}
		}
		seq, done := f.allocSeq()
		dones = append(dones, done)
		se := &statusEntry{seq: seq, envelopeID: e.envelopeID, receivedAt: e.receivedAt, until: until}
		se.file = path.Join(dir, statusFileName(seq, e.envelopeID, e.receivedAt, until))
		if err := f.fs.Rename(e.file, se.file); err != nil {
			return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its retained statuses", err)
		}
		moved = append(moved, se)
	}
	if len(moved) == 0 {
		return nil
	}
	if err := f.fs.SyncDir(dir); err != nil {
		return unavailable(relayproto.CodeInboxUnwritable, "the relay cannot write its retained statuses", err)
	}
	f.mu.Lock()
	f.statuses[rdir] = append(f.statuses[rdir], moved...)
	slices.SortFunc(f.statuses[rdir], func(a, b *statusEntry) int {
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	f.mu.Unlock()
	return nil
}

func (f *fileStore) statusesPage(_ context.Context, recipient identity.DID, since int64, cursor string, limit int) (*relayproto.InboxPage, error) {
	after, err := parseFileCursor(cursor)
	if err != nil {
		return nil, err
	}
	nowMs := f.now().UnixMilli()
	f.mu.Lock()
	var pick []*statusEntry
	more := false
	below := f.visibleBelow()
	for _, e := range f.statuses[recipientDir(recipient)] {
		if e.seq <= after || e.until <= nowMs || e.receivedAt < since {
			continue
		}
		if e.seq >= below {
			break
		}
		if len(pick) == limit {
			more = true
			break
		}
		pick = append(pick, e)
	}
	f.mu.Unlock()
	page := &relayproto.InboxPage{Envelopes: []relayproto.InboxEnvelope{}, Cursor: strconv.FormatUint(after, 10)}
	bytes := 0
	for _, e := range pick {
		data, _, err := fsx.ReadFile(f.fs, e.file, envelope.MaxSize)
		if errors.Is(err, os.ErrNotExist) {
			page.Cursor = strconv.FormatUint(e.seq, 10)
			continue // expired meanwhile
		}
		if err != nil {
			return nil, unavailable(relayproto.CodeInboxUnreadable, "the relay cannot read its retained statuses", err)
		}
		if len(page.Envelopes) > 0 && bytes+len(data) > maxPageBytes {
			more = true
			break
		}
		bytes += len(data)
		page.Cursor = strconv.FormatUint(e.seq, 10)
		page.Envelopes = append(page.Envelopes, relayproto.InboxEnvelope{
			Cursor: page.Cursor, EnvelopeID: e.envelopeID, EnvelopeDigest: envelope.Digest(data),
			ReceivedAt: e.receivedAt, Envelope: data,
		})
	}
	page.More = more
	return page, nil
}

// expireStatuses removes the retained statuses whose retention ended at or
// before nowMs and returns how many.
func (f *fileStore) expireStatuses(nowMs int64) (int, error) {
	f.mu.Lock()
	gone := map[string][]*statusEntry{}
	for rdir, list := range f.statuses {
		kept := list[:0]
		for _, e := range list {
			if e.until <= nowMs {
				gone[rdir] = append(gone[rdir], e)
			} else {
				kept = append(kept, e)
			}
		}
		if len(kept) == 0 {
			delete(f.statuses, rdir)
		} else {
			f.statuses[rdir] = kept
		}
	}
	f.mu.Unlock()
	n := 0
	var firstErr error
	for rdir, list := range gone {
		for _, e := range list {
			if err := f.fs.Remove(e.file); err != nil && !errors.Is(err, os.ErrNotExist) && firstErr == nil {
				firstErr = err
			}
			n++
		}
		if err := f.fs.SyncDir(path.Join(statusesDir, rdir)); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return n, unavailable(relayproto.CodeInboxUnwritable, "the relay cannot remove its expired statuses", firstErr)
	}
	return n, nil
}
