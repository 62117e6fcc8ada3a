package carrier

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"time"

	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
	"golang.org/x/sys/unix"
)

// watchedKinds are the directories whose changes can make an envelope dispatchable or
// change its due time: outbox records, batch markers, and message records (which
// commit singles, DESIGN §7).
var watchedKinds = []record.Kind{record.KindOutbox, record.KindBatches, record.KindMessages}

// watch notices writes by other processes and kicks the loop: inotify on the kind
// directories, or polling of their listing stamps when inotify is unavailable.
func (c *Carrier) watch(ctx context.Context) {
	mode := c.o.Watch
	if mode == WatchOff {
		c.st.setWatch("off")
		return
	}
	if mode == WatchAuto || mode == WatchInotify {
		err := c.watchInotify(ctx)
		if err == nil || ctx.Err() != nil || mode == WatchInotify {
			if err != nil && ctx.Err() == nil {
				c.o.Logger.Warn("carrier: inotify unavailable; relying on the sweep", "err", err)
			}
			return
		}
		c.o.Logger.Info("carrier: inotify unavailable; polling the store's stamps", "err", err)
	}
	c.pollStamps(ctx)
}

// pollStamps kicks the loop whenever a watched kind's listing stamp moves.
func (c *Carrier) pollStamps(ctx context.Context) {
	c.st.setWatch("poll")
	last := make([]store.Stamp, len(watchedKinds))
	for i, k := range watchedKinds {
		last[i], _ = c.s.ListingStamp(k)
	}
	// A write between the loop's first look and these stamps moved nothing they
	// will see: look once more now that they are taken.
	c.Kick()
	for {
		t := c.o.Clock.NewTimer(c.o.PollEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		changed := false
		for i, k := range watchedKinds {
			st, err := c.s.ListingStamp(k)
			if err == nil && st != last[i] {
				last[i], changed = st, true
			}
		}
		if changed {
			c.st.notifications.Add(1)
			c.Kick()
		}
	}
}

// inotifyMask: a record published (renamed into place) or removed, and the kind
// directory itself created (watched from the store directory).
const inotifyMask = unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_DELETE | unix.IN_CREATE |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// inotifyWait bounds one poll(2) wait, so cancellation is noticed.
const inotifyWait = 250 * time.Millisecond

// watchInotify watches the store directory and the kind directories. It returns an
// error at once if inotify cannot be set up, else nil when ctx is done.
func (c *Carrier) watchInotify(ctx context.Context) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	dir := c.s.Dir()
	kindWatch := map[int32]bool{}
	var rootWatch int32 = -1
	// addAll adds the watches that are missing. A directory watched only now may
	// have changed before (records published into it, or the whole store
	// directory created with its records between two looks), which no event will
	// report: then it kicks the loop, which lists what is there.
	addAll := func() error {
		added := false
		if rootWatch < 0 {
			wd, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR)
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
			if err == nil {
				rootWatch, added = int32(wd), true
			}
		}
		for _, k := range watchedKinds {
			wd, err := unix.InotifyAddWatch(fd, filepath.Join(dir, string(k)), inotifyMask)
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
			if err == nil && !kindWatch[int32(wd)] {
				kindWatch[int32(wd)], added = true, true
			}
		}
		if added {
			c.Kick()
		}
		return nil
	}
	if err := addAll(); err != nil {
		return err
	}
	c.st.setWatch("inotify")
	buf := make([]byte, 64<<10)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for ctx.Err() == nil {
		if rootWatch < 0 {
			// The store directory does not exist yet (no write so far): look again
			// at the next interval.
			if err := addAll(); err != nil {
				return err
			}
		}
		n, err := unix.Poll(fds, int(inotifyWait/time.Millisecond))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if n <= 0 {
			continue
		}
		got, err := unix.Read(fd, buf)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		relevant, rescan := false, false
		for off := 0; off+unix.SizeofInotifyEvent <= got; {
			// struct inotify_event: int32 wd, uint32 mask, uint32 cookie, uint32 len, name.
			ev := unix.InotifyEvent{
				Wd:   int32(binary.NativeEndian.Uint32(buf[off:])),
				Mask: binary.NativeEndian.Uint32(buf[off+4:]),
				Len:  binary.NativeEndian.Uint32(buf[off+12:]),
			}
			nameLen := int(ev.Len)
			if off+unix.SizeofInotifyEvent+nameLen > got {
				break // a truncated event: never happens with a full-size buffer
			}
			name := ""
			if nameLen > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+nameLen]
				for i, b := range raw {
					if b == 0 {
						raw = raw[:i]
						break
					}
				}
				name = string(raw)
			}
			off += unix.SizeofInotifyEvent + nameLen
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				relevant = true
			case ev.Wd == rootWatch:
				for _, k := range watchedKinds {
					if name == string(k) {
						relevant, rescan = true, true
					}
				}
			case kindWatch[ev.Wd]:
				if ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0 {
					delete(kindWatch, ev.Wd)
					relevant, rescan = true, true
					continue
				}
				// Staged temps (".<uuid>.tmp") come and go outside the lock; only a
				// publication (rename into place) or a removal matters.
				if len(name) > 0 && name[0] != '.' && ev.Mask&(unix.IN_MOVED_TO|unix.IN_MOVED_FROM|unix.IN_DELETE) != 0 {
					relevant = true
				}
			}
		}
		if rescan {
			if err := addAll(); err != nil {
				return err
			}
		}
		if relevant {
			c.st.notifications.Add(1)
			c.Kick()
		}
	}
	return nil
}
