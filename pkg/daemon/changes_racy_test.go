package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// oneSecondFS has 1 s timestamps (fsx.Coarse) and reports every ctime as the mtime,
// which the test sets back to the same whole second after each change, so a change
// to a directory keeps its listing stamp. It counts the lstats of receipt files
// (every read of a receipt makes one).
type oneSecondFS struct {
	*fsx.Coarse
	receiptLstats *atomic.Int64
}

func (f oneSecondFS) Lstat(name string) (fsx.Info, error) {
	if strings.HasPrefix(name, string(record.KindReceipts)+"/") {
		f.receiptLstats.Add(1)
	}
	info, err := f.Coarse.Lstat(name)
	info.CtimeNs = info.MtimeNs
	return info, err
}

// On a file system with 1 s timestamps, the change detector does not take an equal
// listing stamp for "unchanged" when it was racy at its last scan: a receipt removed
// (by something other than the store, so the generation does not move) within the
// second of the scan, which leaves the stamp as it was, is reported as removed by a
// later poll. Once a scan ran after the racy window, an unchanged stamp is trusted
// and polls do not read the receipts again.
func TestChangeDetectorSameSecondChangeNotMissed(t *testing.T) {
	ctx := context.Background()
	d, _, _ := healthDaemon(t, Options{})
	sender, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 2 {
		envID := uuid.NewString()
		id := record.ReceiptID(envID)
		now := time.Now().UnixMilli()
		r := &record.Receipt{EnvelopeID: envID, SenderDID: string(sender.DID()), EnvelopeDigest: envelope.Digest([]byte(envID)),
			State: record.ReceiptPersisted, ReceivedAt: now, RetainUntil: now + time.Hour.Milliseconds()}
		if err := d.st.Update(ctx, record.KindReceipts, id, func(record.Record) (record.Record, error) { return r, nil }); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	kindDir := filepath.Join(d.st.Dir(), string(record.KindReceipts))
	sameSecond := time.Unix(1_700_000_000, 0)
	setSameSecond := func() {
		t.Helper()
		if err := os.Chtimes(kindDir, sameSecond, sameSecond); err != nil {
			t.Fatal(err)
		}
	}
	setSameSecond()

	var now atomic.Int64
	at := func(d time.Duration) { now.Store(sameSecond.Add(d).UnixNano()) }
	at(500 * time.Millisecond)
	var lstats atomic.Int64
	st, err := store.Open(d.id.Signer(), store.Options{Home: d.root,
		Now: func() time.Time { return time.Unix(0, now.Load()) },
		WrapFS: func(inner fsx.FS) fsx.FS {
			return oneSecondFS{Coarse: fsx.NewCoarse(inner, time.Second), receiptLstats: &lstats}
		}})
	if err != nil {
		t.Fatal(err)
	}
	d.st = st // the detector reads this store

	dt := d.newDetector()
	dt.poll(ctx) // the baseline, half a second after the directory's timestamp
	stamp, err := st.ListingStamp(record.KindReceipts)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(kindDir, ids[1]+".json")); err != nil {
		t.Fatal(err)
	}
	setSameSecond()
	if after, err := st.ListingStamp(record.KindReceipts); err != nil || after != stamp {
		t.Fatalf("the stamp moved (%+v → %+v, %v): the test does not test a hidden change", stamp, after, err)
	}

	at(2 * time.Second)
	dt.poll(ctx)
	d.changes.mu.Lock()
	p := d.changes.readLocked(0, nil, maxChangePage)
	d.changes.mu.Unlock()
	if len(p.changes) != 1 || p.changes[0].Topic != string(record.KindReceipts) || p.changes[0].ID != ids[1] || p.changes[0].State != stateRemoved {
		t.Fatalf("after a same-second removal, the feed holds %+v; want receipts/%s removed", p.changes, ids[1])
	}

	n := lstats.Load()
	for range 3 {
		at(3 * time.Second)
		dt.poll(ctx)
	}
	if got := lstats.Load(); got != n {
		t.Fatalf("polls of a stamp scanned after the racy window read receipts %d more times; want 0", got-n)
	}
}
