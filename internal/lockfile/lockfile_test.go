package lockfile_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gofrs/flock"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
)

var bg = context.Background()

func lstat(t *testing.T, name string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(name, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func mustAcquire(t *testing.T, fsys fsx.FS, o lockfile.Options) *lockfile.Lock {
	t.Helper()
	l, err := lockfile.Acquire(bg, fsys, o)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return l
}

func mustUnlock(t *testing.T, l *lockfile.Lock) {
	t.Helper()
	if err := l.Unlock(); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

// dirHash hashes names, types, modes, sizes, inodes, mtimes and contents.
func dirHash(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	for _, name := range listDir(t, dir) {
		st := lstat(t, filepath.Join(dir, name))
		fmt.Fprintf(h, "%s %o %d %d %d %d %d\n", name, st.Mode, st.Size, st.Ino, st.Nlink, st.Mtim.Nano(), st.Ctim.Nano())
		if st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeLock plants ".lock" content: the given holder info (nil: empty), written over
// the lock file (created if there is none, truncated if there is: its inode stays).
func writeLock(t *testing.T, dir string, h *lockfile.Holder) {
	t.Helper()
	var data []byte
	if h != nil {
		var err error
		if data, err = json.Marshal(h); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, lockfile.LockName), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// freeRecord is the content of a free ".lock", before its padding.
const freeRecord = `{"free":true,"time":"1970-01-01T00:00:00Z"}`

// checkFree checks that dir holds only ".lock", saying free, and that Inspect reports
// no lock.
func checkFree(t *testing.T, dir string) {
	t.Helper()
	if got := listDir(t, dir); !slices.Equal(got, []string{lockfile.LockName}) {
		t.Fatalf("dir = %v, want only .lock", got)
	}
	b, err := os.ReadFile(filepath.Join(dir, lockfile.LockName))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 512 || string(b[:len(freeRecord)]) != freeRecord || strings.TrimLeft(string(b[len(freeRecord):]), " ") != "\n" {
		t.Fatalf(".lock = %q, want the free record padded to 512 bytes", b)
	}
	if st, err := lockfile.Inspect(fsx.NewOS(dir), lockfile.Options{}); err != nil || st.Present || st.Live || st.Stale || st.Holder != nil {
		t.Fatalf("Inspect of a free lock = %+v, %v", st, err)
	}
}

func readHolder(t *testing.T, dir string) lockfile.Holder {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, lockfile.LockName))
	if err != nil {
		t.Fatal(err)
	}
	var h lockfile.Holder
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("holder info %q: %v", b, err)
	}
	return h
}

func procStart(t *testing.T, pid string) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	n, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func bootID(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skipf("no boot id: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// ---------------------------------------------------------------------------------

func TestAcquireUnlockBasics(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	before := time.Now()
	l := mustAcquire(t, fsys, lockfile.Options{})
	st := lstat(t, filepath.Join(dir, lockfile.LockName))
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Mode&0o777 != 0o600 || st.Nlink != 1 {
		t.Fatalf(".lock mode %o nlink %d", st.Mode, st.Nlink)
	}
	if got := listDir(t, dir); !slices.Equal(got, []string{".lock"}) {
		t.Fatalf("dir = %v, want only .lock", got)
	}
	h := readHolder(t, dir)
	if h.Pid != os.Getpid() || h.Host != hostname(t) || h.Time.Before(before) || h.Time.After(time.Now()) {
		t.Fatalf("holder = %+v", h)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil && h.Boot != strings.TrimSpace(string(b)) {
		t.Fatalf("boot = %q", h.Boot)
	}
	if _, err := os.Stat("/proc/self/stat"); err == nil && h.ProcStart != procStart(t, "self") {
		t.Fatalf("procStart = %d", h.ProcStart)
	}
	if l.Holder() != h {
		t.Fatalf("Lock.Holder() = %+v, file says %+v", l.Holder(), h)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	// A second Acquire in this very process is excluded (flock is per open file).
	if _, err := lockfile.Acquire(bg, fsys, lockfile.Options{Wait: 20 * time.Millisecond}); !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("second Acquire: %v, want ErrBusy", err)
	} else if !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("busy error %q does not name the holder", err)
	}
	mustUnlock(t, l)
	checkFree(t, dir)
	if got := lstat(t, filepath.Join(dir, lockfile.LockName)); got.Ino != st.Ino || got.Size != 512 {
		t.Fatalf(".lock after Unlock: inode %d → %d, size %d", st.Ino, got.Ino, got.Size)
	}
	if err := l.Unlock(); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	if err := l.Check(); !errors.Is(err, lockfile.ErrLost) {
		t.Fatalf("Check after Unlock: %v", err)
	}
	// Faulty records exactly the protocol's mutating calls: the first Acquire of a
	// store makes ".lock" durably (temp with the free record, fsynced before the link,
	// unlink, the directory fsynced: after a power cut ".lock" is never empty); every
	// hold then writes the holder's details and the free record over it, and closes it.
	for _, tc := range []struct {
		name string
		dir  string
		want string
	}{
		{"first", t.TempDir(), "create .lock-* ; write .lock-* free; fsync .lock-* ; close .lock-* ; link .lock-* .lock; unlink .lock-* ; syncdir . ; write .lock holder; write .lock free; close .lock "},
		{"next", dir, "write .lock holder; write .lock free; close .lock "},
	} {
		fa := fsx.NewFaulty(fsx.NewOS(tc.dir))
		mustUnlock(t, mustAcquire(t, fa, lockfile.Options{}))
		var ops []string
		for _, op := range fa.Log() {
			path := op.Path
			if lockfile.IsTempName(path) {
				path = ".lock-*"
			}
			what := op.Path2
			if op.Kind == fsx.OpWrite {
				what = "holder"
				if strings.HasPrefix(string(op.Data), freeRecord) {
					what = "free"
				}
				if len(op.Data) != 512 || op.Offset != 0 {
					t.Errorf("%s: a write of %d bytes at %d, want the whole 512-byte file", tc.name, len(op.Data), op.Offset)
				}
			}
			ops = append(ops, string(op.Kind)+" "+path+" "+what)
		}
		if got := strings.Join(ops, "; "); got != tc.want {
			t.Errorf("%s Acquire+Unlock: ops\n got %s\nwant %s", tc.name, got, tc.want)
		}
		checkFree(t, tc.dir)
	}
}

// An acquire/release cycle of a store whose ".lock" exists creates, links, renames and
// unlinks no file, lists no directory, and keeps the lock's inode.
func TestCycleCreatesAndRemovesNothing(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	mustUnlock(t, mustAcquire(t, fsys, lockfile.Options{})) // makes .lock
	ino := lstat(t, filepath.Join(dir, lockfile.LockName)).Ino
	fa := fsx.NewFaulty(fsys)
	lists := &countingFS{FS: fa}
	for range 3 {
		l := mustAcquire(t, lists, lockfile.Options{})
		if err := l.Check(); err != nil {
			t.Fatal(err)
		}
		mustUnlock(t, l)
	}
	for _, op := range fa.Log() {
		switch op.Kind {
		case fsx.OpCreate, fsx.OpRemove, fsx.OpLink, fsx.OpRename, fsx.OpMkdir, fsx.OpRmdir:
			t.Errorf("a lock cycle made a %s of %s %s", op.Kind, op.Path, op.Path2)
		}
	}
	if lists.readDirs.Load() != 0 {
		t.Errorf("3 lock cycles listed the root %d times", lists.readDirs.Load())
	}
	if got := lstat(t, filepath.Join(dir, lockfile.LockName)).Ino; got != ino {
		t.Errorf(".lock inode changed %d → %d", ino, got)
	}
	checkFree(t, dir)
}

// countingFS counts the opens of ".lock" and the directory listings, and can run a
// hook after each open of ".lock".
type countingFS struct {
	fsx.FS
	opens     atomic.Int32
	readDirs  atomic.Int32
	afterOpen func(n int32)
}

func (c *countingFS) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if name == lockfile.LockName {
		n := c.opens.Add(1)
		if c.afterOpen != nil {
			c.afterOpen(n)
		}
	}
	return f, err
}

func (c *countingFS) ReadDir(name string) ([]fsx.DirEntry, error) {
	c.readDirs.Add(1)
	return c.FS.ReadDir(name)
}

func TestIsTempName(t *testing.T) {
	for name, want := range map[string]bool{
		".lock-0f8fad5b-d9cb-469f-a165-70867728950e.tmp": true,
		".lock-0f8fad5b-d9cb-469f-a165-70867728950e":     false,
		".0f8fad5b-d9cb-469f-a165-70867728950e.tmp":      false,
		".lock-0F8FAD5B-D9CB-469F-A165-70867728950E.tmp": false,
		".lock-.tmp": false,
		".lock":      false,
	} {
		if got := lockfile.IsTempName(name); got != want {
			t.Errorf("IsTempName(%q) = %v", name, got)
		}
	}
}

// 1. A SIGKILLed holder's lock is broken at once by the pid rule, not by age.
func TestKilledHolderBrokenByPid(t *testing.T) {
	for _, reap := range []bool{false, true} {
		t.Run(fmt.Sprintf("reaped=%v", reap), func(t *testing.T) {
			dir := t.TempDir()
			fsys := fsx.NewOS(dir)
			c := startChild(t, "hold", dir)
			c.expect("locked")
			if h := readHolder(t, dir); h.Pid != c.pid() {
				t.Fatalf("holder pid %d, child %d", h.Pid, c.pid())
			}
			if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if reap {
				_ = c.wait()
			} // else it stays a zombie until the cleanup reaps it

			// Another host's contender may not use the pid rule: it waits for age.
			_, err := lockfile.Acquire(bg, fsys, lockfile.Options{Wait: 30 * time.Millisecond, Stale: time.Hour, Host: "elsewhere.invalid"})
			if !errors.Is(err, lockfile.ErrBusy) {
				t.Fatalf("other-host Acquire: %v, want ErrBusy", err)
			}
			start := time.Now()
			l, err := lockfile.Acquire(bg, fsys, lockfile.Options{Wait: time.Second, Stale: time.Hour})
			if err != nil {
				t.Fatalf("Acquire after SIGKILL: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("took %v", d)
			}
			t.Logf("acquired %v after SIGKILL", time.Since(start))
			if h := readHolder(t, dir); h.Pid != os.Getpid() {
				t.Fatalf("holder after break: %+v", h)
			}
			mustUnlock(t, l)
		})
	}
}

// 2. A live holder is never broken, whatever the stale bound and the clock say.
func TestLiveHolderNeverBroken(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	c := startChild(t, "hold", dir)
	c.expect("locked")
	lockPath := filepath.Join(dir, lockfile.LockName)
	ino := lstat(t, lockPath).Ino

	future := func() time.Time { return time.Now().Add(100 * 365 * 24 * time.Hour) }
	o := lockfile.Options{Wait: 50 * time.Millisecond, Stale: time.Nanosecond, Now: future}
	_, err := lockfile.Acquire(bg, fsys, o)
	if !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("Acquire: %v, want ErrBusy", err)
	}
	want := fmt.Sprintf("pid %d on host %q", c.pid(), hostname(t))
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
	o.Wait = -1 // a single attempt
	if _, err := lockfile.Acquire(bg, fsys, o); !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("single-attempt Acquire: %v", err)
	}
	if broke, err := lockfile.BreakStale(fsys, o); broke || err != nil {
		t.Fatalf("BreakStale = %v, %v", broke, err)
	}
	if removed, err := lockfile.CleanOrphans(fsys, o); len(removed) != 0 || err != nil {
		t.Fatalf("CleanOrphans = %v, %v", removed, err)
	}
	st, err := lockfile.Inspect(fsys, o)
	if err != nil || !st.Present || !st.Live || st.Stale || st.Holder == nil || st.Holder.Pid != c.pid() {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}
	if got := lstat(t, lockPath).Ino; got != ino {
		t.Fatalf(".lock inode changed %d → %d", ino, got)
	}
	// Context cancellation ends the wait early with ctx's error.
	ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := lockfile.Acquire(ctx, fsys, lockfile.Options{Wait: time.Minute}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with ctx: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("ctx wait took %v", d)
	}

	// Once the holder lets go, the lock is ours.
	c.stdin.Close()
	c.expect("unlocked")
	if err := c.wait(); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, mustAcquire(t, fsys, lockfile.Options{}))
}

// checkAlternation checks that lines strictly alternate "enter X", "exit X".
func checkAlternation(t *testing.T, lines []string, want int) {
	t.Helper()
	if len(lines) != want {
		t.Fatalf("%d lines, want %d", len(lines), want)
	}
	for i := 0; i < len(lines); i += 2 {
		id, ok := strings.CutPrefix(lines[i], "enter ")
		if !ok || lines[i+1] != "exit "+id {
			t.Fatalf("overlap at line %d: %q, %q", i+1, lines[i], lines[i+1])
		}
	}
}

// handovers counts how often consecutive holds belong to different holders.
func handovers(lines []string) int {
	n := 0
	for i := 2; i < len(lines); i += 2 {
		if lines[i] != lines[i-2] {
			n++
		}
	}
	return n
}

// 3a. Two processes, 1,000 acquisitions each: never inside together.
func TestMutualExclusionProcesses(t *testing.T) {
	const n = 1000
	dir := t.TempDir()
	shared := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(shared, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var cs []*child
	for range 2 {
		cs = append(cs, startChild(t, "loop", dir, helperFile+"="+shared, helperN+"="+strconv.Itoa(n)))
	}
	for _, c := range cs {
		c.expect("ready")
	}
	for _, c := range cs {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cs {
		c.expect("done")
		if err := c.wait(); err != nil {
			t.Fatal(err)
		}
	}
	lines := fileLines(t, shared)
	checkAlternation(t, lines, 4*n)
	t.Logf("the lock changed hands %d times", handovers(lines))
	for _, c := range cs {
		if got := strings.Count(strings.Join(lines, "\n")+"\n", fmt.Sprintf("enter %d\n", c.pid())); got != n {
			t.Fatalf("child %d entered %d times", c.pid(), got)
		}
	}
	checkFree(t, dir)
}

// 3b. Eight goroutines of one process exclude each other too.
func TestMutualExclusionGoroutines(t *testing.T) {
	const workers, n = 8, 150
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	shared := filepath.Join(t.TempDir(), "log")
	f, err := os.OpenFile(shared, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for range n {
				err := lockfile.With(bg, fsys, lockfile.Options{Wait: 50 * time.Second}, func() error {
					if v := inside.Add(1); v > maxInside.Load() {
						maxInside.Store(v)
					}
					defer inside.Add(-1)
					if _, err := fmt.Fprintf(f, "enter %d\n", w); err != nil {
						return err
					}
					_, err := fmt.Fprintf(f, "exit %d\n", w)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if maxInside.Load() != 1 {
		t.Fatalf("%d goroutines inside at once", maxInside.Load())
	}
	lines := fileLines(t, shared)
	checkAlternation(t, lines, 2*workers*n)
	t.Logf("the lock changed hands %d times", handovers(lines))
}

// 4. A ".lock" that names no holder (empty, as a power cut leaves a lock file whose
// first contents were never fsynced, or torn, or not ours) and whose flock is free is
// taken at once: no wait, however young it is and however long the stale bound.
func TestEmptyLockTakenAtOnce(t *testing.T) {
	for _, content := range []string{"", `{"pid":`, `{"fid":12,"host":"h","time":"2026-12-02T01:02:03Z"}`, "\x00\x00\x00", "not a lock"} {
		t.Run(fmt.Sprintf("%q", content), func(t *testing.T) {
			dir := t.TempDir()
			fsys := fsx.NewOS(dir)
			p := filepath.Join(dir, lockfile.LockName)
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			ino := lstat(t, p).Ino
			// The clock stands at the file's mtime and the stale bound is an hour: no
			// age rule can free it. Wait -1 is a single attempt: any wait is ErrBusy.
			mtime := time.Unix(0, lstat(t, p).Mtim.Nano())
			o := lockfile.Options{Wait: -1, Stale: time.Hour, Now: func() time.Time { return mtime }}
			st, err := lockfile.Inspect(fsys, o)
			if err != nil || !st.Present || st.Live || !st.Stale || st.Holder != nil && st.Holder.Pid > 0 {
				t.Fatalf("Inspect = %+v, %v; want present, not live, stale", st, err)
			}
			l, err := lockfile.Acquire(bg, fsys, o)
			if err != nil {
				t.Fatalf("Acquire of a lock naming no holder, flock free: %v, want it at once", err)
			}
			if h := readHolder(t, dir); h.Pid != os.Getpid() || !h.Time.Equal(mtime) {
				t.Fatalf("holder %+v", h)
			}
			if lstat(t, p).Ino != ino {
				t.Fatal(".lock replaced: it is taken over in place")
			}
			mustUnlock(t, l)
			checkFree(t, dir)
		})
	}
}

// An empty ".lock" whose flock someone holds is live: never taken, whatever it says.
func TestEmptyLockWithHeldFlockIsLive(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	p := filepath.Join(dir, lockfile.LockName)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fl := flock.New(p, flock.SetFlag(os.O_RDONLY))
	if ok, err := fl.TryLock(); !ok || err != nil {
		t.Fatalf("flock: %v %v", ok, err)
	}
	defer fl.Unlock()
	if _, err := lockfile.Acquire(bg, fsys, lockfile.Options{Wait: -1}); !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("Acquire: %v, want ErrBusy", err)
	}
	if st, err := lockfile.Inspect(fsys, lockfile.Options{}); err != nil || !st.Live || st.Stale {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}
	if b, err := os.ReadFile(p); err != nil || len(b) != 0 {
		t.Fatalf(".lock = %q, %v: written while its flock was held", b, err)
	}
}

// Staleness rules for an unflocked lock with holder info on this host.
func TestStaleRules(t *testing.T) {
	host := hostname(t)
	boot := bootID(t)
	initStart := procStart(t, "1")
	dead := deadPid(t, t.TempDir())
	now := time.Now()
	for _, tc := range []struct {
		name  string
		h     lockfile.Holder
		host  string // contender's host ("" = default)
		stale bool
	}{
		{"alive pid, same start", lockfile.Holder{Pid: 1, Host: host, Boot: boot, ProcStart: initStart, Time: now}, "", false},
		{"alive pid, no start recorded", lockfile.Holder{Pid: 1, Host: host, Time: now}, "", false},
		{"pid reused", lockfile.Holder{Pid: 1, Host: host, Boot: boot, ProcStart: initStart + 1, Time: now}, "", true},
		{"rebooted", lockfile.Holder{Pid: 1, Host: host, Boot: "00000000-0000-4000-8000-000000000000", ProcStart: initStart, Time: now}, "", true},
		{"dead pid", lockfile.Holder{Pid: dead, Host: host, Boot: boot, Time: now}, "", true},
		{"dead pid, other host", lockfile.Holder{Pid: dead, Host: "elsewhere.invalid", Boot: boot, Time: now}, "", false},
		{"dead pid, contender elsewhere", lockfile.Holder{Pid: dead, Host: host, Time: now}, "elsewhere.invalid", false},
		{"this process, leaked", lockfile.Holder{Pid: os.Getpid(), Host: host, Time: now}, "", true},
		{"old", lockfile.Holder{Pid: 1, Host: "elsewhere.invalid", Time: now.Add(-31 * time.Second)}, "", true},
		{"non-positive pid: no holder (torn), stale at once", lockfile.Holder{Pid: -1, Host: host, Time: now}, "", true},
		{"no time: no holder (torn), stale at once", lockfile.Holder{Pid: 1, Host: "elsewhere.invalid"}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fsys := fsx.NewOS(dir)
			writeLock(t, dir, &tc.h)
			o := lockfile.Options{Wait: 10 * time.Millisecond, Stale: 30 * time.Second, Host: tc.host}
			st, err := lockfile.Inspect(fsys, o)
			if err != nil || st.Stale != tc.stale || st.Live || st.Holder == nil || st.Holder.Pid != tc.h.Pid {
				t.Fatalf("Inspect = %+v, %v; want stale=%v", st, err, tc.stale)
			}
			l, err := lockfile.Acquire(bg, fsys, o)
			if tc.stale {
				if err != nil {
					t.Fatalf("Acquire: %v", err)
				}
				mustUnlock(t, l)
			} else {
				if !errors.Is(err, lockfile.ErrBusy) {
					t.Fatalf("Acquire: %v, want ErrBusy", err)
				}
				if want := fmt.Sprintf("pid %d on host %q", tc.h.Pid, tc.h.Host); !strings.Contains(err.Error(), want) {
					t.Fatalf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// 5. Planted ".lock": symlink, directory, FIFO, other owner — refused, untouched.
func TestPlantedLockRefused(t *testing.T) {
	o := lockfile.Options{Wait: 20 * time.Millisecond, Stale: time.Nanosecond,
		Now: func() time.Time { return time.Now().Add(time.Hour) }}
	check := func(t *testing.T, dir string) {
		t.Helper()
		fsys := fsx.NewOS(dir)
		before := dirHash(t, dir)
		if _, err := lockfile.Acquire(bg, fsys, o); !errors.Is(err, lockfile.ErrInvalid) {
			t.Fatalf("Acquire: %v, want ErrInvalid", err)
		}
		if st, err := lockfile.Inspect(fsys, o); !errors.Is(err, lockfile.ErrInvalid) || !st.Present {
			t.Fatalf("Inspect = %+v, %v", st, err)
		}
		if broke, err := lockfile.BreakStale(fsys, o); broke || !errors.Is(err, lockfile.ErrInvalid) {
			t.Fatalf("BreakStale = %v, %v", broke, err)
		}
		if after := dirHash(t, dir); after != before {
			t.Fatal("directory changed")
		}
	}
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(t.TempDir(), "target")
		if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, lockfile.LockName)); err != nil {
			t.Fatal(err)
		}
		tst := lstat(t, target)
		check(t, dir)
		if b, err := os.ReadFile(target); err != nil || string(b) != "precious" {
			t.Fatalf("target = %q, %v", b, err)
		}
		if lstat(t, target).Mtim != tst.Mtim {
			t.Fatal("target touched")
		}
	})
	t.Run("dangling symlink", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Symlink(filepath.Join(dir, "nowhere"), filepath.Join(dir, lockfile.LockName)); err != nil {
			t.Fatal(err)
		}
		check(t, dir)
	})
	t.Run("directory", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, lockfile.LockName), 0o700); err != nil {
			t.Fatal(err)
		}
		check(t, dir)
	})
	t.Run("fifo", func(t *testing.T) {
		dir := t.TempDir()
		if err := syscall.Mkfifo(filepath.Join(dir, lockfile.LockName), 0o600); err != nil {
			t.Fatal(err)
		}
		check(t, dir)
	})
	t.Run("other owner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to chown")
		}
		dir := t.TempDir()
		writeLock(t, dir, nil)
		if err := os.Chown(filepath.Join(dir, lockfile.LockName), 65534, 65534); err != nil {
			t.Fatal(err)
		}
		check(t, dir)
	})
}

// 6. Inspect reports absent / live / stale and changes nothing; BreakStale spares live locks.
func TestInspect(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	o := lockfile.Options{Stale: time.Hour}

	st, err := lockfile.Inspect(fsys, o)
	if err != nil || st.Present || st.Live || st.Stale || st.Holder != nil || len(st.Orphans) != 0 {
		t.Fatalf("absent: %+v, %v", st, err)
	}

	// Live: held by this process.
	l := mustAcquire(t, fsys, o)
	orphan := ".lock-0f8fad5b-d9cb-469f-a165-70867728950e.tmp"
	if err := os.WriteFile(filepath.Join(dir, orphan), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before := dirHash(t, dir)
	future := lockfile.Options{Stale: time.Nanosecond, Now: func() time.Time { return time.Now().Add(time.Hour) }}
	for _, opts := range []lockfile.Options{o, future} {
		st, err = lockfile.Inspect(fsys, opts)
		if err != nil || !st.Present || !st.Live || st.Stale || st.Holder == nil || st.Holder.Pid != os.Getpid() ||
			!slices.Equal(st.Orphans, []string{orphan}) || st.Info.Ino != lstat(t, filepath.Join(dir, ".lock")).Ino {
			t.Fatalf("live: %+v, %v", st, err)
		}
		if broke, err := lockfile.BreakStale(fsys, opts); broke || err != nil {
			t.Fatalf("BreakStale(live) = %v, %v", broke, err)
		}
	}
	if after := dirHash(t, dir); after != before {
		t.Fatal("Inspect/BreakStale changed the directory of a live lock")
	}
	if err := l.Check(); err != nil {
		t.Fatalf("Check after BreakStale: %v", err)
	}
	mustUnlock(t, l)
	if err := os.Remove(filepath.Join(dir, orphan)); err != nil {
		t.Fatal(err)
	}

	// Stale: left by a dead process of this host.
	writeLock(t, dir, &lockfile.Holder{Pid: deadPid(t, t.TempDir()), Host: hostname(t), Time: time.Now()})
	before = dirHash(t, dir)
	st, err = lockfile.Inspect(fsys, o)
	if err != nil || !st.Present || st.Live || !st.Stale || st.Holder == nil {
		t.Fatalf("stale: %+v, %v", st, err)
	}
	if after := dirHash(t, dir); after != before {
		t.Fatal("Inspect changed the directory of a stale lock")
	}
	ino := lstat(t, filepath.Join(dir, lockfile.LockName)).Ino
	if broke, err := lockfile.BreakStale(fsys, o); !broke || err != nil {
		t.Fatalf("BreakStale(stale) = %v, %v", broke, err)
	}
	checkFree(t, dir) // taken back in place: the same file says free
	if got := lstat(t, filepath.Join(dir, lockfile.LockName)).Ino; got != ino {
		t.Fatalf("BreakStale replaced .lock (%d → %d)", ino, got)
	}
	before = dirHash(t, dir)
	if broke, err := lockfile.BreakStale(fsys, o); broke || err != nil {
		t.Fatalf("BreakStale(free) = %v, %v", broke, err)
	}
	if after := dirHash(t, dir); after != before {
		t.Fatal("BreakStale changed a free lock")
	}
	if err := os.Remove(filepath.Join(dir, lockfile.LockName)); err != nil {
		t.Fatal(err)
	}
	if broke, err := lockfile.BreakStale(fsys, o); broke || err != nil {
		t.Fatalf("BreakStale(absent) = %v, %v", broke, err)
	}
	if got := listDir(t, dir); len(got) != 0 {
		t.Fatalf("BreakStale(absent) made %v", got)
	}
}

// 7. Check and Unlock report ErrLost when ".lock" was replaced or removed behind our back.
func TestLost(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	lockPath := filepath.Join(dir, lockfile.LockName)

	l := mustAcquire(t, fsys, lockfile.Options{})
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("someone else"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, lockPath); err != nil {
		t.Fatal(err)
	}
	ino := lstat(t, lockPath).Ino
	if err := l.Check(); !errors.Is(err, lockfile.ErrLost) {
		t.Fatalf("Check: %v, want ErrLost", err)
	}
	if err := l.Unlock(); !errors.Is(err, lockfile.ErrLost) {
		t.Fatalf("Unlock: %v, want ErrLost", err)
	}
	if lstat(t, lockPath).Ino != ino {
		t.Fatal("Unlock removed someone else's .lock")
	}
	if err := l.Unlock(); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	// Our flock was released: the replaced file, once old, is breakable, and the
	// (former) inode of our lock is not held by anyone.
	if err := os.Remove(lockPath); err != nil {
		t.Fatal(err)
	}

	l = mustAcquire(t, fsys, lockfile.Options{})
	if err := os.Remove(lockPath); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(); !errors.Is(err, lockfile.ErrLost) {
		t.Fatalf("Check after removal: %v", err)
	}
	if err := l.Unlock(); !errors.Is(err, lockfile.ErrLost) {
		t.Fatalf("Unlock after removal: %v", err)
	}
	// Nothing is held now: a fresh Acquire succeeds at once.
	mustUnlock(t, mustAcquire(t, fsys, lockfile.Options{Wait: -1}))
}

// With unlocks after an error and after a panic.
func TestWith(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	boom := errors.New("boom")
	err := lockfile.With(bg, fsys, lockfile.Options{}, func() error {
		if _, err := os.Lstat(filepath.Join(dir, lockfile.LockName)); err != nil {
			t.Errorf("no .lock inside With: %v", err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("With: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		_ = lockfile.With(bg, fsys, lockfile.Options{}, func() error { panic("fn") })
	}()
	checkFree(t, dir)
	// fn ran with a lock that was then lost: both errors reachable.
	err = lockfile.With(bg, fsys, lockfile.Options{}, func() error {
		return errors.Join(boom, os.Remove(filepath.Join(dir, lockfile.LockName)))
	})
	if !errors.Is(err, boom) || !errors.Is(err, lockfile.ErrLost) {
		t.Fatalf("With (lost): %v", err)
	}
}

// 8. Failing each mutating call of Acquire+Unlock in turn: an error, no panic, no wedge.
func TestFaults(t *testing.T) {
	orphan := ".lock-0f8fad5b-d9cb-469f-a165-70867728950e.tmp"
	scenarios := []struct {
		name  string
		setup func(t *testing.T, dir string)
	}{
		{"first", func(*testing.T, string) {}},
		{"free", func(t *testing.T, dir string) { mustUnlock(t, mustAcquire(t, fsx.NewOS(dir), lockfile.Options{})) }},
		{"stale lock and orphan", func(t *testing.T, dir string) {
			writeLock(t, dir, &lockfile.Holder{Pid: os.Getpid(), Host: hostname(t), Time: time.Now()})
			orphan := filepath.Join(dir, orphan)
			if err := os.WriteFile(orphan, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			old := time.Now().Add(-time.Hour)
			if err := os.Chtimes(orphan, old, old); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			// Count the mutating calls of an undisturbed run.
			dir := t.TempDir()
			sc.setup(t, dir)
			fa := fsx.NewFaulty(fsx.NewOS(dir))
			mustUnlock(t, mustAcquire(t, fa, lockfile.Options{}))
			total := fa.Count()
			var kinds []string
			for _, op := range fa.Log() {
				kinds = append(kinds, string(op.Kind))
			}
			t.Logf("%d mutating calls: %v", total, kinds)
			checkFree(t, dir)
			for n := 1; n <= total; n++ {
				for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOSPC} {
					dir := t.TempDir()
					sc.setup(t, dir)
					fa := fsx.NewFaulty(fsx.NewOS(dir))
					fa.Inject = fsx.FailNth(n, errno)
					l, err := lockfile.Acquire(bg, fa, lockfile.Options{Wait: 100 * time.Millisecond})
					if err == nil {
						err = l.Unlock()
					}
					failed := fa.Log()[n-1]
					switch {
					case err == nil && !tolerated(failed):
						t.Fatalf("fail call %d (%s %s) with %v: no error", n, failed.Kind, failed.Path, errno)
					case err != nil && !errors.Is(err, errno):
						t.Fatalf("fail call %d (%s %s) with %v: got %v", n, failed.Kind, failed.Path, errno, err)
					}
					// No wedge: with faults off, the lock is available right away.
					fa.Inject = nil
					l, err = lockfile.Acquire(bg, fa, lockfile.Options{Wait: 200 * time.Millisecond})
					if err != nil {
						t.Fatalf("after failing call %d (%s %s) with %v: Acquire: %v; dir %v", n, failed.Kind, failed.Path, errno, err, listDir(t, dir))
					}
					mustUnlock(t, l)
					if got := listDir(t, dir); len(got) != 1 {
						// A temp whose removal failed is an orphan: swept once stale.
						t.Logf("failing call %d (%s %s) with %v left %v; sweeping it as stale", n, failed.Kind, failed.Path, errno, got)
						if _, err := lockfile.CleanOrphans(fa, lockfile.Options{Now: func() time.Time { return time.Now().Add(time.Hour) }}); err != nil {
							t.Fatal(err)
						}
					}
					checkFree(t, dir)
				}
			}
		})
	}
}

// tolerated reports whether a failure of op may leave Acquire+Unlock successful: the
// best-effort removal of an orphan temp by the sweep after acquisition, and the close
// that releases the lock (the descriptor and its flock are gone whatever close says).
func tolerated(op fsx.Op) bool {
	return op.Kind == fsx.OpRemove && op.Path == ".lock-0f8fad5b-d9cb-469f-a165-70867728950e.tmp" ||
		op.Kind == fsx.OpClose && op.Path == lockfile.LockName
}

// 9. A crash between temp and link leaves an orphan temp: Acquire works, and the
// orphan goes once older than Stale (and only if its flock is free) — swept by the
// Acquire that next makes ".lock" (here: after ".lock" was lost) or takes over a stale
// one, not by every Acquire.
func TestOrphanTemp(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	orphan := ".lock-0f8fad5b-d9cb-469f-a165-70867728950e.tmp"
	busy := ".lock-7c9e6679-7425-40de-944b-e07fc1f90ae7.tmp"
	for _, name := range []string{orphan, busy} {
		data, _ := json.Marshal(lockfile.Holder{Pid: 1, Host: hostname(t), Time: time.Now()})
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// busy is the temp of an acquirer of an earlier version in progress: its flock is held.
	fl := flock.New(filepath.Join(dir, busy), flock.SetFlag(os.O_RDONLY))
	if ok, err := fl.TryLock(); !ok || err != nil {
		t.Fatalf("flock busy temp: %v %v", ok, err)
	}
	defer fl.Unlock()

	o := lockfile.Options{Stale: 30 * time.Second}
	l := mustAcquire(t, fsys, o)
	if got := listDir(t, dir); !slices.Equal(got, []string{".lock", orphan, busy}) {
		t.Fatalf("fresh orphan removed too early: %v", got)
	}
	mustUnlock(t, l)
	st, err := lockfile.Inspect(fsys, o)
	if err != nil || st.Present || !slices.Equal(st.Orphans, []string{orphan, busy}) {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}

	// A free ".lock" is taken without a sweep, however old the orphans.
	o.Now = func() time.Time { return time.Now().Add(time.Minute) }
	mustUnlock(t, mustAcquire(t, fsys, o))
	if got := listDir(t, dir); !slices.Equal(got, []string{".lock", orphan, busy}) {
		t.Fatalf("after Acquire of a free lock at +1m: %v", got)
	}
	// ".lock" lost: the Acquire that makes it again sweeps.
	if err := os.Remove(filepath.Join(dir, lockfile.LockName)); err != nil {
		t.Fatal(err)
	}
	l = mustAcquire(t, fsys, o)
	if got := listDir(t, dir); !slices.Equal(got, []string{".lock", busy}) {
		t.Fatalf("after making .lock at +1m: %v", got)
	}
	mustUnlock(t, l)

	fl.Unlock()
	removed, err := lockfile.CleanOrphans(fsys, o)
	if err != nil || !slices.Equal(removed, []string{busy}) {
		t.Fatalf("CleanOrphans = %v, %v", removed, err)
	}
	checkFree(t, dir)

	// Taking over a stale lock sweeps too.
	writeOrphan(t, dir, orphan, time.Now())
	writeLock(t, dir, &lockfile.Holder{Pid: os.Getpid(), Host: hostname(t), Time: time.Now()})
	mustUnlock(t, mustAcquire(t, fsys, o))
	checkFree(t, dir)
}

// Whole holder details of another host, dated before this host's last boot, are
// stale at once (no holder survives a reboot); the same details dated now are waited
// for (another host's flocks may not reach us).
func TestLockFromBeforeBootIsStale(t *testing.T) {
	dir := t.TempDir()
	fsys := fsx.NewOS(dir)
	writeLock(t, dir, &lockfile.Holder{Pid: 1, Host: "elsewhere.invalid", Time: time.Now()})
	o := lockfile.Options{Wait: -1, Stale: time.Hour}
	if _, err := lockfile.Acquire(bg, fsys, o); !errors.Is(err, lockfile.ErrBusy) {
		t.Fatalf("another host's fresh lock: %v, want ErrBusy", err)
	}
	long := time.Unix(86400, 0) // long before any boot of this host
	if err := os.Chtimes(filepath.Join(dir, lockfile.LockName), long, long); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, mustAcquire(t, fsys, o))
	checkFree(t, dir)
}

// pad pads a record as the package does: spaces and a final newline, to size bytes.
func pad(rec []byte, size int) []byte {
	out := append([]byte(nil), rec...)
	for len(out) < size-1 {
		out = append(out, ' ')
	}
	return append(out, '\n')
}

// A crash in the middle of a write of ".lock" (its record is never fsynced after its
// first contents) may leave any prefix of the write over the record before it. Every
// such torn record, for every write the protocol makes, is taken at once with its
// flock free — even dated now, as a file-system shutdown and remount without a reboot
// leaves it — unless it reads as the whole details of one of the two holders (then it
// is a crashed holder's lock, stale once Options.Stale has passed or, dated before
// this boot, at once): never as a lock held for longer.
func TestTornRecordIsRecoverable(t *testing.T) {
	now := time.Now().UTC()
	holder, err := json.Marshal(lockfile.Holder{Pid: 1, Host: "elsewhere.invalid", Boot: "0f8fad5b-d9cb-469f-a165-70867728950e", ProcStart: 4242, Time: now})
	if err != nil {
		t.Fatal(err)
	}
	legacy, _ := json.Marshal(lockfile.Holder{Pid: 7, Host: "elsewhere.invalid", Time: now.Add(-time.Second)})
	free := pad([]byte(freeRecord), 512)
	held := pad(holder, 512)
	for _, tc := range []struct{ name, old, new []byte }{
		{[]byte("acquire: holder over free"), free, held},
		{[]byte("release: free over holder"), held, free},
		{[]byte("take-over: free over an unpadded holder of an earlier version"), legacy, free},
		{[]byte("take-over: free over an empty file"), nil, free},
	} {
		t.Run(string(tc.name), func(t *testing.T) {
			dir := t.TempDir()
			fsys := fsx.NewOS(dir)
			p := filepath.Join(dir, lockfile.LockName)
			for k := 0; k <= len(tc.new); k++ {
				torn := append([]byte(nil), tc.new[:k]...)
				if k < len(tc.old) {
					torn = append(torn, tc.old[k:]...)
				}
				if err := os.WriteFile(p, torn, 0o600); err != nil {
					t.Fatal(err)
				}
				at := lockfile.Options{Wait: -1, Now: func() time.Time { return now }}
				st, err := lockfile.Inspect(fsys, at)
				switch {
				case err != nil || st.Live:
					t.Fatalf("torn at %d (%q): Inspect = %+v, %v", k, torn, st, err)
				case st.Present && !st.Stale:
					if h := st.Holder; h == nil || !(h.Pid == 1 && h.Time.Equal(now)) && !(h.Pid == 7 && h.Time.Equal(now.Add(-time.Second))) {
						t.Fatalf("torn at %d (%q), dated now: waited for as %+v, which is neither holder's details", k, torn, st.Holder)
					}
				default:
					l, err := lockfile.Acquire(bg, fsys, at)
					if err != nil {
						t.Fatalf("torn at %d (%q), dated now: Acquire: %v, want it at once", k, torn, err)
					}
					mustUnlock(t, l)
					if err := os.WriteFile(p, torn, 0o600); err != nil {
						t.Fatal(err)
					}
				}
				later := lockfile.Options{Wait: -1, Now: func() time.Time { return time.Now().Add(lockfile.DefaultStale + time.Second) }}
				st, err = lockfile.Inspect(fsys, later)
				if err != nil || st.Live || st.Present && !st.Stale {
					t.Fatalf("torn at %d (%q): Inspect once Stale has passed = %+v, %v", k, torn, st, err)
				}
				long := time.Unix(86400, 0)
				if err := os.Chtimes(p, long, long); err != nil {
					t.Fatal(err)
				}
				l, err := lockfile.Acquire(bg, fsys, lockfile.Options{Wait: -1})
				if err != nil {
					t.Fatalf("torn at %d (%q), dated before boot: Acquire: %v", k, torn, err)
				}
				mustUnlock(t, l)
				checkFree(t, dir)
			}
		})
	}

	// Taking over a stale lock writes the free record before the holder's details, so
	// no write lands holder details on other holder details (whose torn mix could
	// carry a time in the future).
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, lockfile.LockName), held, 0o600); err != nil {
		t.Fatal(err)
	}
	fa := fsx.NewFaulty(fsx.NewOS(dir))
	mustUnlock(t, mustAcquire(t, fa, lockfile.Options{Now: func() time.Time { return now.Add(time.Hour) }}))
	var writes []string
	for _, op := range fa.Log() {
		if op.Kind == fsx.OpWrite {
			what := "holder"
			if bytes.Equal(op.Data, free) {
				what = "free"
			}
			writes = append(writes, what)
		}
	}
	if got := strings.Join(writes, " "); got != "free holder free" {
		t.Fatalf("take-over writes: %s, want free holder free", got)
	}
}
