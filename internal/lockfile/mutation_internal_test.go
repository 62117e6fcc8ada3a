package lockfile

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
)

// TestParseProcStatEdges: the command may be empty, so ')' may be the first byte,
// and exactly 20 fields after it are enough to reach starttime (field 22).
func TestParseProcStatEdges(t *testing.T) {
	fields := func(n int) string {
		f := make([]string, n)
		f[0] = "S"
		for i := 1; i < n; i++ {
			f[i] = "0"
		}
		if n >= 20 {
			f[19] = "4242"
		}
		return strings.Join(f, " ")
	}
	for _, tc := range []struct {
		in    string
		ok    bool
		start uint64
	}{
		{") " + fields(20), true, 4242},
		{"7 (a b) " + fields(20), true, 4242},
		{"7 (x) " + fields(19), false, 0},
		{"7 x " + fields(20), false, 0},
	} {
		st, ok := parseProcStat([]byte(tc.in))
		if ok != tc.ok || ok && (st.start != tc.start || st.state != 'S') {
			t.Errorf("parseProcStat(%q) = %+v, %v; want start %d, %v", tc.in, st, ok, tc.start, tc.ok)
		}
	}
}

// lockAt is a probed, unflocked ".lock" with the given holder and mtime.
func lockAt(h *Holder, mtime time.Time) probed {
	return probed{present: true, holder: h, info: fsx.Info{Mode: syscall.S_IFREG | 0o600, MtimeNs: mtime.UnixNano()}}
}

// TestIsStaleBoundaries pins each rule of isStale at its edge, on a controlled clock.
func TestIsStaleBoundaries(t *testing.T) {
	now := time.Now()
	host := "this-host"
	o := Options{Stale: time.Minute, Now: func() time.Time { return now }, Host: host}
	for _, tc := range []struct {
		name string
		p    probed
		o    Options
		want bool
	}{
		// Pid 0 is no process (kill(0, 0) would ask about our own process group): no
		// holder writes it, so it is a torn record.
		{"pid 0 on this host, fresh: no holder (torn)", lockAt(&Holder{Pid: 0, Host: host, Time: now}, now), o, true},
		{"exactly Stale old", lockAt(&Holder{Pid: 1, Host: "other", Time: now.Add(-time.Minute)}, now), o, false},
		{"just past Stale", lockAt(&Holder{Pid: 1, Host: "other", Time: now.Add(-time.Minute - 1)}, now), o, true},
		// No recorded time: the age is the file's.
		{"holder without a time, fresh file: as old as the zero time", lockAt(&Holder{Pid: 1, Host: "other"}, now), o, true},
		// Pid 0 names no holder even on another host, where no pid rule applies.
		{"pid 0 on another host, fresh: no holder (torn)", lockAt(&Holder{Pid: 0, Host: "other", Time: now}, now), o, true},
		{"pid 1 on another host, fresh: a holder", lockAt(&Holder{Pid: 1, Host: "other", Time: now}, now), o, false},
		// A recorded time wins over the file's.
		{"old holder time, fresh file", lockAt(&Holder{Pid: 1, Host: "other", Time: now.Add(-2 * time.Minute)}, now), o, true},
		{"fresh holder time, old file", lockAt(&Holder{Pid: 1, Host: "other", Time: now}, now.Add(-2*time.Minute)), o, false},
		{"no holder (empty or torn), fresh file", lockAt(nil, now), o, true},
		{"live", probed{present: true, live: true, info: fsx.Info{MtimeNs: 1}}, o, false},
		{"absent", probed{}, o, false},
	} {
		o := tc.o.withDefaults()
		if got := isStale(tc.p, o); got != tc.want {
			t.Errorf("%s: isStale = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestZeroStaleMeansDefault: Options.Stale 0 is the 30 s default, not "stale at once".
func TestZeroStaleMeansDefault(t *testing.T) {
	now := time.Now()
	o := Options{Now: func() time.Time { return now }, Host: "this-host"}.withDefaults()
	if o.Stale != DefaultStale || o.Wait != DefaultWait {
		t.Fatalf("defaults: Stale %v, Wait %v", o.Stale, o.Wait)
	}
	p := lockAt(&Holder{Pid: 1, Host: "other", Time: now.Add(-time.Second)}, now)
	if isStale(p, o) {
		t.Fatal("a 1 s old lock is stale with the default Stale")
	}
	if w := (Options{Wait: -1}).withDefaults().Wait; w != -1 {
		t.Fatalf("Wait -1 became %v", w)
	}
	if w := (Options{Wait: 5 * time.Second}).withDefaults().Wait; w != 5*time.Second {
		t.Fatalf("Wait 5s became %v", w)
	}
}

// TestPredatesBootMargin: a file time within a minute after the last boot does not
// predate it (the margin absorbs clock adjustments); one well before does.
func TestPredatesBootMargin(t *testing.T) {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil || si.Uptime <= 0 {
		t.Skip("no uptime here")
	}
	boot := time.Now().Add(-time.Duration(si.Uptime) * time.Second)
	if predatesBoot(boot.Add(30 * time.Second).UnixNano()) {
		t.Error("30 s after boot counts as before boot")
	}
	if !predatesBoot(boot.Add(-2 * time.Minute).UnixNano()) {
		t.Error("2 min before boot does not count as before boot")
	}
	if time.Since(boot) > 3*time.Minute && predatesBoot(time.Now().Add(-90*time.Second).UnixNano()) {
		t.Error("90 s ago counts as before boot")
	}
}
