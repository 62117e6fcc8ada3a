package fsx

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// probeOS probes a fresh directory of the real file system, skipping where the file
// system cannot run the probe (no O_TMPFILE).
func probeOS(t *testing.T) (FS, time.Duration) {
	t.Helper()
	fsys := NewOS(t.TempDir())
	g, err := ProbeGranularity(fsys, ".")
	if Errno(err) == syscall.EOPNOTSUPP {
		t.Skipf("the file system of %s has no O_TMPFILE: %v", fsys.Root(), err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return fsys, g
}

// The probe's answer on the real file system is what that file system does to any
// time: a named file's modification time, set through the os package to a time with
// other sub-second digits than the probe's, reads back truncated to exactly that
// granularity. And the probe leaves no trace: no name, no change of the directory.
func TestProbeGranularityOnOS(t *testing.T) {
	fsys, _ := probeOS(t) // once, so the directory exists and is old news
	before, err := fsys.Lstat(".")
	if err != nil {
		t.Fatal(err)
	}
	g, err := ProbeGranularity(fsys, ".")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("timestamp granularity of %s: %v", fsys.Root(), g)
	after, err := fsys.Lstat(".")
	if err != nil {
		t.Fatal(err)
	}
	if before.DirStamp() != after.DirStamp() {
		t.Errorf("the probe changed its directory: %+v → %+v", before.DirStamp(), after.DirStamp())
	}
	if ents, err := fsys.ReadDir("."); err != nil || len(ents) != 0 {
		t.Errorf("the probe left names behind: %v %v", ents, err)
	}

	p := filepath.Join(fsys.Root(), "f")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	const set = 1_700_000_003_987_654_321
	if err := unix.UtimesNano(p, []unix.Timespec{unix.NsecToTimespec(set), unix.NsecToTimespec(set)}); err != nil {
		t.Fatal(err)
	}
	info, err := fsys.Lstat("f")
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(set) - int64(set)%int64(g); info.MtimeNs != want {
		t.Errorf("probe says %v, but the file system kept mtime %d of %d (want %d)", g, info.MtimeNs, int64(set), want)
	}
}

// Through Coarse the probe finds the simulated granularity, and every time reported
// by Lstat and File.Stat is truncated to it; through Faulty it finds the real one and
// nothing is recorded.
func TestProbeGranularityCoarse(t *testing.T) {
	inner, real := probeOS(t)
	if err := os.WriteFile(abs(inner, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	const set = 1_700_000_003_987_654_321
	if err := unix.UtimesNano(abs(inner, "f"), []unix.Timespec{unix.NsecToTimespec(set), unix.NsecToTimespec(set)}); err != nil {
		t.Fatal(err)
	}
	for _, g := range []time.Duration{time.Microsecond, 10 * time.Millisecond, time.Second, 2 * time.Second} {
		if g < real {
			continue // cannot simulate a finer file system than the real one
		}
		c := NewCoarse(inner, g)
		got, err := ProbeGranularity(c, ".")
		if err != nil || got != g {
			t.Errorf("probe through Coarse(%v) = %v, %v", g, got, err)
		}
		li, err := c.Lstat("f")
		if err != nil {
			t.Fatal(err)
		}
		f, err := c.OpenFile("f", syscall.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := f.Stat()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, info := range []Info{li, fi} {
			if want := int64(set) - int64(set)%int64(g); info.MtimeNs != want {
				t.Errorf("Coarse(%v) mtime %d, want %d", g, info.MtimeNs, want)
			}
			if info.CtimeNs%int64(g) != 0 {
				t.Errorf("Coarse(%v) ctime %d not truncated", g, info.CtimeNs)
			}
		}
		di, err := c.Lstat(".")
		if err != nil || di.MtimeNs%int64(g) != 0 || di.CtimeNs%int64(g) != 0 {
			t.Errorf("Coarse(%v) directory times %d %d not truncated (%v)", g, di.MtimeNs, di.CtimeNs, err)
		}
	}

	fz := NewFaulty(inner)
	if got, err := ProbeGranularity(fz, "."); err != nil || got != real {
		t.Errorf("probe through Faulty = %v, %v; want %v", got, err, real)
	}
	if n := fz.Count(); n != 0 {
		t.Errorf("Faulty recorded the probe's unnamed file: %v", fz.Log())
	}
}

// refuseTmpfile is a file system without O_TMPFILE (FAT, NFS).
type refuseTmpfile struct{ FS }

func (r refuseTmpfile) OpenFile(name string, flag int, perm uint32) (File, error) {
	if flag&unix.O_TMPFILE == unix.O_TMPFILE {
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EOPNOTSUPP}
	}
	return r.FS.OpenFile(name, flag, perm)
}

// roundingFS keeps times rounded up to the next second: of no granularity the probe
// knows.
type roundingFS struct{ FS }

func (r roundingFS) OpenFile(name string, flag int, perm uint32) (File, error) {
	f, err := r.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return roundingFile{f}, nil
}

type roundingFile struct{ File }

func (f roundingFile) Stat() (Info, error) {
	info, err := f.File.Stat()
	info.MtimeNs += int64(time.Second) - info.MtimeNs%int64(time.Second)
	return info, err
}

// The probe reports why it could not measure: no O_TMPFILE, no directory, or a kept
// time that is no truncation of the one it set.
func TestProbeGranularityFails(t *testing.T) {
	inner, _ := probeOS(t)
	if _, err := ProbeGranularity(refuseTmpfile{inner}, "."); Errno(err) != syscall.EOPNOTSUPP {
		t.Errorf("without O_TMPFILE: %v", err)
	}
	if _, err := ProbeGranularity(inner, "missing"); !IsNotExist(err) {
		t.Errorf("missing directory: %v", err)
	}
	if _, err := ProbeGranularity(roundingFS{inner}, "."); !errors.Is(err, ErrGranularityUnknown) {
		t.Errorf("rounding file system: %v", err)
	}
}
