package lockfile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Holder is the holder info written into a lock file, one JSON object:
// {"pid":…,"host":…,"boot":…,"procStart":…,"time":"<RFC 3339, ns>"}.
// Boot and ProcStart are empty/zero where /proc is not readable.
type Holder struct {
	Pid  int    `json:"pid"`
	Host string `json:"host"`
	// Boot is /proc/sys/kernel/random/boot_id of the holder's host.
	Boot string `json:"boot,omitempty"`
	// ProcStart is field 22 (starttime, clock ticks since boot) of /proc/<pid>/stat of
	// the holder: with Pid, it identifies the process across pid reuse.
	ProcStart uint64 `json:"procStart,omitempty"`
	// Time is when the holder created the lock (its Options.Now).
	Time time.Time `json:"time"`
}

func newHolder(o Options) Holder {
	self := selfInfo()
	return Holder{
		Pid:       self.pid,
		Host:      o.Host,
		Boot:      self.boot,
		ProcStart: self.start,
		Time:      o.Now().UTC(), // no monotonic reading: Time is what the file says
	}
}

// recordSize is the size of a lock record: one 512-byte sector. Every write of ".lock"
// covers the whole file (at least recordSize bytes) in one pwrite at offset 0.
const recordSize = 512

// freeRecord is what ".lock" says when nobody holds it. Its time is the Unix epoch so
// that a writer of the earlier protocol (which unlinks ".lock" on release and takes
// the name alone to mean "held") finds a free lock stale at once and breaks it,
// instead of waiting out the stale bound.
var freeRecord = []byte(`{"free":true,"time":"1970-01-01T00:00:00Z"}`)

// encodeRecord returns rec padded with spaces and a final newline to the largest of
// recordSize, min (the size of the file it overwrites, so that no byte of an earlier
// record is left behind) and len(rec)+1 rounded up to a multiple of recordSize.
func encodeRecord(rec []byte, min int64) ([]byte, error) {
	size := max(int64(recordSize), min)
	if need := int64(len(rec)) + 1; need > size {
		size = (need + recordSize - 1) / recordSize * recordSize
	}
	if size > maxHolderSize {
		return nil, fmt.Errorf("lockfile: a lock record of %d bytes is larger than %d", size, maxHolderSize)
	}
	out := make([]byte, size)
	copy(out, rec)
	for i := len(rec); i < len(out)-1; i++ {
		out[i] = ' '
	}
	out[len(out)-1] = '\n'
	return out, nil
}

// parseRecord parses the content of a lock file: the free record (free), holder info
// (h), or neither — empty, torn, or not ours (false, nil).
func parseRecord(data []byte) (free bool, h *Holder) {
	data = bytes.Trim(data, " \t\r\n")
	if bytes.Equal(data, freeRecord) {
		return true, nil
	}
	return false, parseHolder(data)
}

// parseHolder parses holder info; nil if empty or not ours.
func parseHolder(data []byte) *Holder {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil
	}
	var h Holder
	if err := json.Unmarshal(data, &h); err != nil {
		return nil
	}
	return &h
}

type self struct {
	pid      int
	euid     int
	boot     string
	start    uint64
	procOK   bool // /proc/self/stat was readable: /proc is mounted
	hostname string
}

var selfOnce = sync.OnceValue(func() self {
	s := self{pid: os.Getpid(), euid: os.Geteuid()}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		s.boot = string(bytes.TrimSpace(b))
	}
	if st, ok := readProcStat("self"); ok {
		s.start, s.procOK = st.start, true
	}
	if h, err := os.Hostname(); err == nil {
		s.hostname = h
	}
	return s
})

func selfInfo() self { return selfOnce() }

func hostname() string { return selfInfo().hostname }

type procStat struct {
	state byte
	start uint64
}

// readProcStat reads the state (field 3) and starttime (field 22) of /proc/<pid>/stat.
// Field 2 is the command in parentheses and may contain anything, so fields are
// counted after its last ')'.
func readProcStat(pid string) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return procStat{}, false
	}
	return parseProcStat(b)
}

func parseProcStat(b []byte) (procStat, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return procStat{}, false
	}
	return procStat{state: f[0][0], start: start}, true
}

// holderGone reports whether the holder, recorded on this host, is certainly not
// running any more. It is only ever asked about a lock whose flock nobody holds.
func holderGone(h *Holder) bool {
	s := selfInfo()
	if h.Boot != "" && s.boot != "" && h.Boot != s.boot {
		return true // this host rebooted since
	}
	if h.Pid == os.Getpid() {
		// Either this process — which holds the flock of every lock it holds, so a
		// free flock means a leaked lock — or an earlier process with our pid.
		return true
	}
	switch err := syscall.Kill(h.Pid, 0); err {
	case syscall.ESRCH:
		return true
	case nil, syscall.EPERM:
	default:
		return false
	}
	st, ok := readProcStat(strconv.Itoa(h.Pid))
	if !ok {
		if !s.procOK {
			return false // no /proc here: kill(2) said it exists
		}
		_, err := os.Stat("/proc/" + strconv.Itoa(h.Pid))
		return os.IsNotExist(err) // exited between kill and read
	}
	if st.state == 'Z' || st.state == 'X' || st.state == 'x' {
		return true // exited, not yet reaped
	}
	if h.ProcStart != 0 && s.procOK && st.start != h.ProcStart {
		return true // the pid was reused
	}
	return false
}

// whole reports whether h is holder details as this package writes them, with a pid
// (every holder record carries one, and a time). Anything else that is not the free
// record — an empty file, a torn record, a file of another kind — names no holder.
// Details with a pid and no time are not refused here: their age, from the zero time,
// makes them stale at once by the age rule.
func (h *Holder) whole() bool { return h != nil && h.Pid > 0 }

// isStale applies the staleness rule to a probed lock whose flock we hold.
func isStale(p probed, o Options) bool {
	if p.live || !p.present {
		return false
	}
	h := p.holder
	if !h.whole() {
		// Empty, torn or not ours, and nobody holds its flock: no holder of this
		// package is there. Every holder holds the flock for as long as it holds the
		// store, and ".lock" never appears before its first contents (create), so
		// this is what a crash left — typically a power cut, after which a record
		// never fsynced may read empty or torn. Waiting would only delay every
		// writer by Options.Stale.
		return true
	}
	if h.Host != "" && h.Host == o.Host && holderGone(h) {
		return true
	}
	if predatesBoot(p.info.MtimeNs) {
		// Written before this host last booted: whoever made it is gone.
		return true
	}
	return age(p, o) > o.Stale
}

// predatesBoot reports whether a file time lies before this host's last boot (with a
// margin of a minute for clock adjustments). It answers false when the boot time is
// unknown.
func predatesBoot(ns int64) bool {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil || si.Uptime <= 0 {
		return false
	}
	boot := time.Now().Add(-time.Duration(si.Uptime) * time.Second)
	return time.Unix(0, ns).Before(boot.Add(-time.Minute))
}

// age is the age of a lock with whole holder details: from the recorded time.
func age(p probed, o Options) time.Duration { return o.Now().Sub(p.holder.Time) }
