package relay

import (
	"flag"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// DefaultExpireEvery is the period of the expiry pass both relay commands run
// unless --expire-every says otherwise.
const DefaultExpireEvery = time.Minute

// LimitFlags are the command-line flags of the limits, shared by both relay
// commands (sealbridge relay and sealbridge-relay).
type LimitFlags struct {
	Limits Limits
	// MaxConns bounds the connections served at once (0: no bound);
	// LimitListener applies it.
	MaxConns int
}

// LimitFlagsUsage is the flags' part of a relay command's usage text.
const LimitFlagsUsage = `  --quota-envelopes N   envelopes one recipient's inbox may hold (default 0: no bound);
                        more → 429 RELAY_QUOTA, Retry-After: 60
  --quota-bytes N       envelope bytes one recipient's inbox may hold (default 0: no
                        bound; else at least 131072)
  --sender-rate R       new envelopes per second accepted from one sender DID
                        (default 0: no bound); more → 429 RELAY_RATE_LIMITED
  --sender-burst N      envelopes a sender may send at once (default: the rate, at least 1)
  --allow-list          accept envelopes only for recipients that registered
                        (POST /v1/recipients/register); others → 403 RECIPIENT_NOT_ALLOWED
  --expire-every D      period of the pass removing inbox envelopes past their deadline
                        (default 1m; 0 turns the pass off, they are never served anyway)
  --max-conns N         connections served at once (default 0: no bound); more wait
                        to be accepted
`

// AddLimitFlags defines the limit flags on fs. Each flag refuses a nonsensical
// value when parsed (a usage error with internal/cli.ParseFlags); call Check
// after parsing for the rules between flags.
func AddLimitFlags(fs *flag.FlagSet) *LimitFlags {
	f := &LimitFlags{Limits: Limits{ExpireEvery: DefaultExpireEvery}}
	nonNegInt := func(name string, p *int) {
		fs.Func(name, "", func(s string) error {
			v, err := strconv.Atoi(s)
			if err != nil || v < 0 {
				return fmt.Errorf("want a whole number, 0 or more, not %q", s)
			}
			*p = v
			return nil
		})
	}
	nonNegInt("quota-envelopes", &f.Limits.QuotaEnvelopes)
	fs.Func("quota-bytes", "", func(s string) error {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return fmt.Errorf("want a number of bytes, 0 or more, not %q", s)
		}
		f.Limits.QuotaBytes = v
		return nil
	})
	fs.Func("sender-rate", "", func(s string) error {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || v != v || v > 1e9 {
			return fmt.Errorf("want envelopes per second, 0 or more, not %q", s)
		}
		f.Limits.SenderRate = v
		return nil
	})
	nonNegInt("sender-burst", &f.Limits.SenderBurst)
	fs.BoolVar(&f.Limits.AllowList, "allow-list", false, "")
	fs.Func("expire-every", "", func(s string) error {
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 || (v > 0 && v < time.Second) {
			return fmt.Errorf("want a duration of at least 1s, or 0 for no pass, not %q", s)
		}
		f.Limits.ExpireEvery = v
		return nil
	})
	nonNegInt("max-conns", &f.MaxConns)
	return f
}

// Check applies the rules between the flags (Limits.Check).
func (f *LimitFlags) Check() error {
	if err := f.Limits.Check(); err != nil {
		return fmt.Errorf("%w (see --help)", err)
	}
	return nil
}

// LimitListener returns ln serving at most n connections at once (n ≤ 0: ln
// itself): past n, Accept waits until a served connection closes, so further
// clients wait in the kernel's listen queue instead of being served.
func LimitListener(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	closeOnce sync.Once
	done      chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
