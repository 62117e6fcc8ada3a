package store

import (
	"crypto/ed25519"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"golang.org/x/sys/unix"
)

// probeCounter counts the granularity probes (O_TMPFILE opens) made through it, and
// with refuse set answers them as a file system without O_TMPFILE does.
type probeCounter struct {
	fsx.FS
	probes *atomic.Int64
	refuse bool
}

func (p probeCounter) OpenFile(name string, flag int, perm uint32) (fsx.File, error) {
	if flag&unix.O_TMPFILE == unix.O_TMPFILE {
		p.probes.Add(1)
		if p.refuse {
			return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EOPNOTSUPP}
		}
	}
	return p.FS.OpenFile(name, flag, perm)
}

func openGranular(t *testing.T, opts Options) *Store {
	t.Helper()
	s, err := Open(ed25519.NewKeyFromSeed(make([]byte, 32)), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The racy window is the granularity the probe measures in the store directory plus
// the 20 ms floor: on the real file system here (checked against a probe of its own),
// on a simulated 1 s and 2 s file system, and 2 s where the probe cannot run. It is
// probed once per store, and not before the store directory exists (Open touches no
// disk; a read before the first write assumes the coarsest granularity).
func TestGranularityRacyWindow(t *testing.T) {
	var probes atomic.Int64
	s := openGranular(t, Options{Home: t.TempDir(), WrapFS: func(inner fsx.FS) fsx.FS {
		return probeCounter{FS: inner, probes: &probes}
	}})
	if w := s.racyWindow(); w != racyFloor+unknownGranularity {
		t.Errorf("window before the store directory exists = %v, want %v", w, racyFloor+unknownGranularity)
	}
	if err := s.ensureStoreDir(); err != nil {
		t.Fatal(err)
	}
	g, err := fsx.ProbeGranularity(fsx.NewOS(s.Dir()), ".")
	if err != nil {
		t.Skipf("the file system here cannot run the probe: %v", err)
	}
	t.Logf("timestamp granularity of %s: %v", s.Dir(), g)
	probes.Store(0)
	for range 3 {
		if w := s.racyWindow(); w != racyFloor+g {
			t.Fatalf("window on the real file system = %v, want %v", w, racyFloor+g)
		}
	}
	if n := probes.Load(); n != 1 {
		t.Errorf("probed %d times, want once", n)
	}

	for _, tc := range []struct {
		name string
		wrap func(fsx.FS) fsx.FS
		want time.Duration
	}{
		{"1 s file system", func(inner fsx.FS) fsx.FS { return fsx.NewCoarse(inner, time.Second) }, time.Second},
		{"2 s file system", func(inner fsx.FS) fsx.FS { return fsx.NewCoarse(inner, 2*time.Second) }, 2 * time.Second},
		{"no O_TMPFILE", func(inner fsx.FS) fsx.FS { return probeCounter{FS: inner, probes: &probes, refuse: true} }, unknownGranularity},
		{"Faulty", func(inner fsx.FS) fsx.FS { return fsx.NewFaulty(inner) }, g},
	} {
		s := openGranular(t, Options{Dir: s.Dir(), WrapFS: tc.wrap})
		if w := s.racyWindow(); w != racyFloor+tc.want {
			t.Errorf("%s: window = %v, want %v", tc.name, w, racyFloor+tc.want)
		}
		if faulty, ok := s.fs.(*fsx.Faulty); ok && faulty.Count() != 0 {
			t.Errorf("%s: the probe was recorded as mutating calls: %v", tc.name, faulty.Log())
		}
	}
}

// Goroutines asking for the window at once share one probe and one answer.
func TestGranularityProbedOnceConcurrently(t *testing.T) {
	var probes atomic.Int64
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil { // a store directory is 0700
		t.Fatal(err)
	}
	s := openGranular(t, Options{Dir: dir, WrapFS: func(inner fsx.FS) fsx.FS {
		return probeCounter{FS: fsx.NewCoarse(inner, time.Second), probes: &probes}
	}})
	var wg sync.WaitGroup
	windows := make([]time.Duration, 8)
	for i := range windows {
		wg.Go(func() { windows[i] = s.racyWindow() })
	}
	wg.Wait()
	for i, w := range windows {
		if w != racyFloor+time.Second {
			t.Errorf("goroutine %d: window %v", i, w)
		}
	}
	if n := probes.Load(); n != 1 {
		t.Errorf("probed %d times, want once", n)
	}
}
