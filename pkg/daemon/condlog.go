package daemon

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// condRepeatEvery is how often a condition that persists is logged again.
const condRepeatEvery = time.Minute

// condLog logs conditions rather than events: a condition (a key such as "changes
// messages" or "delivery <relay URL>", holding with a code such as an error code
// and path) is logged as a warning when it appears or shows a code not seen since
// it appeared, and once at info when it clears. While it persists, each key and code
// is logged again at most once per condRepeatEvery, with the number of repeats
// suppressed meanwhile.
type condLog struct {
	log   *slog.Logger
	now   func() time.Time
	every time.Duration

	mu    sync.Mutex
	conds map[string]*condition
}

// condition is one key's state: the codes seen since it appeared.
type condition struct {
	since time.Time
	codes map[string]*condRepeat
}

type condRepeat struct {
	logged     time.Time
	suppressed int
}

func newCondLog(log *slog.Logger, now func() time.Time) *condLog {
	if now == nil {
		now = time.Now
	}
	return &condLog{log: log, now: now, every: condRepeatEvery, conds: map[string]*condition{}}
}

// warn reports that condition key holds with code. It logs msg and attrs unless the
// same key and code was logged less than a minute ago; it reports whether it logged.
func (c *condLog) warn(key, code, msg string, attrs ...any) bool {
	now := c.now()
	c.mu.Lock()
	cd := c.conds[key]
	if cd == nil {
		cd = &condition{since: now, codes: map[string]*condRepeat{}}
		c.conds[key] = cd
	}
	r := cd.codes[code]
	if r == nil {
		r = &condRepeat{}
		cd.codes[code] = r
	} else if now.Sub(r.logged) < c.every {
		r.suppressed++
		c.mu.Unlock()
		return false
	}
	suppressed := r.suppressed
	r.logged, r.suppressed = now, 0
	c.mu.Unlock()
	if suppressed > 0 {
		attrs = append(attrs, "repeated", suppressed, "since", cd.since.UTC().Format(time.RFC3339))
	}
	c.log.Warn(msg, attrs...)
	return true
}

// clear reports that condition key no longer holds. It logs msg and attrs (at info)
// if the condition was holding, and reports whether it was.
func (c *condLog) clear(key, msg string, attrs ...any) bool {
	now := c.now()
	c.mu.Lock()
	cd := c.conds[key]
	delete(c.conds, key)
	c.mu.Unlock()
	if cd == nil {
		return false
	}
	suppressed := 0
	for _, r := range cd.codes {
		suppressed += r.suppressed
	}
	attrs = append(attrs, "lasted", now.Sub(cd.since).Round(time.Millisecond).String())
	if suppressed > 0 {
		attrs = append(attrs, "repeated", suppressed)
	}
	c.log.Info(msg, attrs...)
	return true
}

// errClass is the code a condition caused by err is logged under: the error code
// and its path for coded errors, the errno or "timeout" for network errors (whose
// texts carry ephemeral ports), the HTTP status for a relay's answer, else the text.
func errClass(err error) string {
	var ce *errcode.Error
	if errors.As(err, &ce) {
		return ce.Code.String() + " " + ce.Context
	}
	if c := errcode.CodeOf(err); c != nil {
		return c.String()
	}
	var se *relayproto.Error
	if errors.As(err, &se) {
		return "HTTP " + strconv.Itoa(se.Status)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "dns " + dns.Name
	}
	return err.Error()
}
