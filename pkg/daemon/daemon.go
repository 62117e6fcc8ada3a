// Package daemon is sealbridged: one identity's outbox store, its carrier, periodic
// maintenance and the local HTTP API on a unix socket (DESIGN §13, docs/DAEMON.md).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Defaults.
const (
	DefaultDrainTimeout  = 10 * time.Second
	defaultMaintainEvery = 10 * time.Minute
)

// Options configure a Daemon.
type Options struct {
	// Home is the data root (resolved like dataroot.Resolve); Identity the identity
	// name (default "default").
	Home, Identity string
	Logger         *slog.Logger
	// SocketPath overrides the socket path, by default the first of
	// dataroot.SocketPaths (as client.SocketPath).
	SocketPath string
	// DrainTimeout bounds the wait for in-flight attempts at shutdown (default 10 s).
	DrainTimeout time.Duration
	// Transport is the carrier's transport (default carrier.NewHTTPTransport).
	Transport carrier.Transport
	Carrier   carrier.Options
	// Version is reported by the metrics' build info.
	Version string
	// MaintainEvery is the period of store maintenance (default 10 min).
	MaintainEvery time.Duration
	// ChangeWindow is the number of changes the change feed retains (default
	// 100,000); ChangePollEvery the period its detector checks the store's listing
	// stamps (default 250 ms). See changes.go.
	ChangeWindow    int
	ChangePollEvery time.Duration
	// InboxRelay is the relay whose inbox the daemon follows (inbound.go); empty:
	// no inbound. PollEvery is the least spacing of its fetches that find
	// nothing (they are long polls) and the period of its fetches from a relay
	// that cannot hold them (default 1 s).
	InboxRelay string
	PollEvery  time.Duration
	// HeadEvery is the interval of the store's head writes (default
	// store.HeadInterval, 1 s): commits are covered by a witnessed head at most this
	// long after they were acknowledged (head.go).
	HeadEvery time.Duration
	// DeliveredRetention and ClosedRetention are how long a message's record is kept
	// after it was delivered (default 24 h) or closed (default 7 days), and
	// ClosedRetention also how long a refused inbound envelope's record is kept; 0
	// means the default, else 1 minute to 10 years. They override the Store's.
	DeliveredRetention, ClosedRetention time.Duration
	// MaxBody bounds a large message body, as its sealed blob's size in bytes
	// (sealbridged --max-body; 0: DefaultMaxBody, 4 GiB): a streamed send over it is
	// refused while it streams (413 BODY_TOO_LARGE) and an inbound envelope naming a
	// larger blob is refused. From envelope.MaxBodySize to envelope.MaxBlobSize
	// (body_limit.go).
	MaxBody int64
	// Store holds further options of the identity's store (tests inject faults with
	// its WrapFS); its Home and Dir are ignored.
	Store store.Options
}

// Daemon is one running sealbridged.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	id      *identity.Identity
	st      *store.Store
	car     *carrier.Carrier
	root    string
	socket  string
	pidFile *os.File
	started time.Time

	ready     chan struct{}
	leasesOK  chan struct{} // closed once in-flight operations of a dead daemon are expired
	prepared  atomic.Bool
	draining  atomic.Bool
	ran       atomic.Bool
	closeOnce sync.Once

	m       *metrics
	changes *changeFeed
	health  *health
	cond    *condLog
	clock   carrier.Clock  // the follower's timers and the condition logger's time
	jitter  func() float64 // the follower's backoff jitter, in [0, 1)

	writeKick  chan struct{} // wakes the write prober (writes.go)
	writeFails atomic.Int64  // failed store writes so far
}

// New loads the identity, opens its store and takes the one-daemon-per-identity lock
// (flock on dataroot.PIDFile, which holds the pid). If another daemon holds it the
// error reads "… already running (pid N)". A socket path longer than a unix socket
// address holds is refused before anything is written, and so is a data root or
// store that breaks the data-root rules (LoadIdentity and store.Open check them).
func New(opts Options) (*Daemon, error) {
	if err := checkOptions(opts); err != nil {
		return nil, err
	}
	if err := checkMaxBody(opts.MaxBody); err != nil {
		return nil, err
	}
	if opts.MaxBody == 0 {
		opts.MaxBody = DefaultMaxBody
	}
	if u, err := relayproto.CanonicalRelayURL(opts.InboxRelay); err == nil {
		opts.InboxRelay = u // one form of a relay URL everywhere
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.MaintainEvery <= 0 {
		opts.MaintainEvery = defaultMaintainEvery
	}
	if opts.Identity == "" {
		opts.Identity = DefaultIdentity
	}
	root, err := dataroot.Resolve(opts.Home)
	if err != nil {
		return nil, err
	}
	id, err := LoadIdentity(root, opts.Identity)
	if err != nil {
		return nil, err
	}
	socket := opts.SocketPath
	if socket == "" {
		socket = dataroot.SocketPaths(root, string(id.DID()))[0]
	}
	if len(socket) > dataroot.MaxSocketPath {
		hint := fmt.Sprintf("set XDG_RUNTIME_DIR to a short private directory (as systemd does: /run/user/%d) or use a shorter --home", os.Getuid())
		if opts.SocketPath != "" {
			hint = "use a shorter socket path"
		}
		return nil, errcode.WithHint(fmt.Errorf("the socket path %s is %d bytes, longer than the %d a unix socket address holds",
			socket, len(socket), dataroot.MaxSocketPath), hint)
	}
	so := opts.Store
	so.Home, so.Dir = root, ""
	if opts.DeliveredRetention > 0 {
		so.DeliveredRetention = opts.DeliveredRetention
	}
	if opts.ClosedRetention > 0 {
		so.ClosedRetention = opts.ClosedRetention
	}
	st, err := store.Open(id.Signer(), so)
	if err != nil {
		return nil, err
	}
	d := &Daemon{opts: opts, log: opts.Logger.With("did", string(id.DID())), id: id, st: st, root: root,
		socket: socket, ready: make(chan struct{}),
		leasesOK: make(chan struct{}), started: time.Now(), changes: newChangeFeed(opts.ChangeWindow),
		health: newHealth(), clock: carrier.WallClock(), jitter: rand.Float64, writeKick: make(chan struct{}, 1)}
	d.cond = newCondLog(d.log, d.now)
	if err := privateDir(filepath.Join(root, dataroot.RunDir)); err != nil {
		return nil, err
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	// Before anything is served or sent: a store behind a head it signed earlier
	// (its local witness, or a relay's) is refused with STORE_ROLLED_BACK.
	if err := d.checkWitnesses(context.Background()); err != nil {
		d.Close()
		return nil, err
	}
	d.logHead()
	if opts.SocketPath == "" {
		if err := privateDir(filepath.Dir(socket)); err != nil {
			d.Close()
			return nil, err
		}
	}
	tr := opts.Transport
	if tr == nil {
		tr = carrier.NewHTTPTransport(carrier.HTTPOptions{SendTimeout: opts.Carrier.SendTimeout})
	}
	co := opts.Carrier
	// The pid lock is ours: no other carrier of this store is alive, so the
	// leases a dead predecessor left are taken back at once (the relay
	// de-duplicates a second send) instead of waited out.
	co.TakeOverLeases = true
	co.Identity = id // the carrier asks a relay for the head it witnessed (§5 "The head")
	if co.Logger == nil {
		co.Logger = d.log
	}
	if user := co.Events; user != nil {
		co.Events = func(e carrier.Event) { d.carrierEvent(e); user(e) }
	} else {
		co.Events = d.carrierEvent
	}
	d.car = carrier.New(st, tr, co)
	d.m = newMetrics(d)
	return d, nil
}

// privateDir creates dir (mode 0700) if it is missing, and refuses it if it is a
// symlink or not a directory, belongs to another user or is open to group or others.
func privateDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	switch st, _ := fi.Sys().(*syscall.Stat_t); {
	case fi.Mode()&os.ModeSymlink != 0:
		return errcode.WithHint(fmt.Errorf("%s is a symbolic link, not a directory", dir),
			"remove it; sealbridged creates the directory")
	case !fi.IsDir():
		return errcode.WithHint(fmt.Errorf("%s is not a directory", dir), "remove it; sealbridged creates the directory")
	case st != nil && int(st.Uid) != os.Geteuid():
		return errcode.WithHint(fmt.Errorf("%s belongs to uid %d, not to this user (uid %d)", dir, st.Uid, os.Geteuid()),
			"remove it, or run sealbridged as its owner")
	case fi.Mode().Perm()&0o077 != 0:
		return errcode.WithHint(fmt.Errorf("%s has mode %#o: group or others may use it", dir, fi.Mode().Perm()),
			"chmod 700 "+dir)
	}
	return nil
}

// lock takes the pid-file lock and writes our pid into it. The file is never
// removed: a daemon that opened it while we held the lock takes the lock on this
// same file once we release it, so unlinking it would let a third daemon lock a
// new file beside it.
func (d *Daemon) lock() error {
	path := dataroot.PIDFile(d.root, string(d.id.DID()))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("pid file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		data := make([]byte, 32)
		n, _ := f.ReadAt(data, 0)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(data[:n]))
			if _, perr := strconv.Atoi(pid); perr != nil {
				pid = "unknown"
			}
			return errcode.WithHint(fmt.Errorf("sealbridged for %s already running (pid %s)", d.id.DID(), pid),
				"one daemon serves an identity: use the running one, or stop it first (kill "+pid+") and start again")
		}
		return fmt.Errorf("pid file %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			d.log.Warn("daemon: writing the pid file", "err", err)
		}
	}
	d.pidFile = f
	return nil
}

// Close releases the pid lock of a daemon whose Run was never called. Once Run was
// called, Close does nothing: Run releases the lock itself, and only once the
// carrier and the background tasks have stopped writing. The pid file stays: it is
// the lock.
func (d *Daemon) Close() error {
	if d.ran.Load() {
		return nil
	}
	d.release()
	return nil
}

// release closes the pid file, which releases its lock.
func (d *Daemon) release() {
	d.closeOnce.Do(func() {
		if d.pidFile != nil {
			_ = d.pidFile.Close()
		}
	})
}

// Ready is closed once the socket is bound and the store open.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// SocketPath returns the API socket.
func (d *Daemon) SocketPath() string { return d.socket }

// DID returns the daemon's identity.
func (d *Daemon) DID() identity.DID { return d.id.DID() }

// Store returns the daemon's store.
func (d *Daemon) Store() *store.Store { return d.st }

// Run binds the socket, signals readiness, runs the carrier and maintenance, serves
// the API until ctx is done, then drains in-flight attempts (bounded by DrainTimeout)
// and returns nil. It releases the pid lock only once the carrier and the
// background tasks have stopped: they get a second DrainTimeout to stop after the
// drain; if they are still running then, Run logs an error and returns one, and the
// lock stays held until they stop (or the process exits), so that no second daemon
// writes the store beside them. A Daemon runs once.
func (d *Daemon) Run(ctx context.Context) error {
	if !d.ran.CompareAndSwap(false, true) {
		return errors.New("daemon: Run called twice")
	}
	ln, err := d.listen()
	if err != nil {
		d.release()
		return err
	}
	defer os.Remove(d.socket)
	srv := &http.Server{
		Handler:           d.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
		ConnContext:       connContext,
	}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	var wg sync.WaitGroup
	carDone := make(chan struct{})
	go func() {
		defer close(carDone)
		if err := d.car.Run(bg); err != nil && !errors.Is(err, context.Canceled) {
			d.log.Error("daemon: carrier stopped", "err", err)
		}
	}()
	wg.Go(func() { d.startup(bg) })
	wg.Go(func() { d.maintain(bg) })
	wg.Go(func() { d.detectChanges(bg) })
	wg.Go(func() { d.follow(bg) })
	wg.Go(func() { d.probeWrites(bg) })
	wg.Go(func() { d.writeHeads(bg) })
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(&peerListener{UnixListener: ln, uid: os.Getuid(), log: d.log, m: d.m}) }()
	close(d.ready)
	if err := sdNotify("READY=1"); err != nil {
		d.log.Warn("daemon: sd_notify", "err", err)
	}
	d.log.Info("daemon: ready", "socket", d.socket, "pid", os.Getpid())

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("serve: %w", err)
	}
	d.draining.Store(true)
	d.changes.drain() // long polls answer now, so that Shutdown need not wait for them
	_ = sdNotify("STOPPING=1")
	d.log.Info("daemon: draining", "timeout", d.opts.DrainTimeout)
	deadline := time.Now().Add(d.opts.DrainTimeout)
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	// Let the attempts in flight finish, bounded; then stop the carrier, which
	// settles or releases what it still holds.
	for d.car.Stats().InFlight > 0 && sctx.Err() == nil {
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-sctx.Done():
			t.Stop()
		}
	}
	cancel()
	stopBG()
	stopped := make(chan struct{})
	go func() {
		<-carDone
		wg.Wait()
		close(stopped)
	}()
	t := time.NewTimer(d.opts.DrainTimeout)
	defer t.Stop()
	select {
	case <-stopped:
		d.finalHead()
	case <-t.C:
		d.log.Error("daemon: the carrier or a background task did not stop within the drain timeout; the pid lock stays held until it stops or the process exits",
			"timeout", d.opts.DrainTimeout)
		go func() {
			<-stopped
			d.release()
			d.log.Info("daemon: stopped late; pid lock released")
		}()
		return errors.Join(runErr, errcode.WithHint(errors.New("daemon: the carrier did not stop within the drain timeout"),
			"an attempt still in flight is retried once its lease ends; if this repeats, raise --drain-timeout"))
	}
	d.release()
	d.log.Info("daemon: stopped")
	return runErr
}

// listen binds the socket, replacing a stale one (nobody answering) but never a live one.
func (d *Daemon) listen() (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(d.socket), 0o700); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(d.socket); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", d.socket)
		}
		c, err := net.DialTimeout("unix", d.socket, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is in use by a live process", d.socket)
		}
		d.log.Info("daemon: replacing a stale socket", "socket", d.socket)
		if err := os.Remove(d.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: d.socket, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(d.socket, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// startup expires the leases of operations a dead daemon left in flight (only one
// daemon per identity runs, so they are orphans), then prepares the indexes. It runs
// in the background: the API is served meanwhile. Each step is retried until it
// succeeds; a failure is a health problem, logged when it appears and when it clears.
func (d *Daemon) startup(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		n, err := d.st.ExpireOperationLeases(ctx, d.started)
		if err == nil {
			d.recovered("startup leases", "daemon: operation leases expired")
			if n > 0 {
				d.log.Info("daemon: took over operations left in flight", "operations", n)
			}
			break
		}
		if ctx.Err() != nil {
			return
		}
		d.problem("startup leases", "daemon: expiring operation leases", err)
		if !sleepCtx(ctx, time.Duration(min(attempt+1, 10))*time.Second) {
			return
		}
	}
	close(d.leasesOK)
	for attempt := 0; ; attempt++ {
		err := d.st.Prepare(ctx)
		if err == nil {
			d.recovered("startup indexes", "daemon: indexes prepared")
			break
		}
		if ctx.Err() != nil {
			return
		}
		d.problem("startup indexes", "daemon: preparing indexes", err)
		if !sleepCtx(ctx, time.Duration(min(attempt+1, 10))*time.Second) {
			return
		}
	}
	d.prepared.Store(true)
	d.car.Kick()
}

// maintain runs store maintenance once at start, as soon as the operation leases
// a dead predecessor left are expired (startup), and then every MaintainEvery. The
// pass at start finishes what a crash left half done — a message record behind its
// envelopes (the carrier's settlement renames the envelope first), a batch whose
// members all settled — instead of leaving it so for a whole period. A failed pass,
// or steps that failed, are logged as a condition (when it appears, at most once a
// minute while it repeats, and when it clears).
func (d *Daemon) maintain(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-d.leasesOK:
	}
	t := time.NewTicker(d.opts.MaintainEvery)
	defer t.Stop()
	for {
		if !d.maintainOnce(ctx) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// maintainOnce runs one maintenance pass; it returns false once ctx ended.
func (d *Daemon) maintainOnce(ctx context.Context) bool {
	rep, err := d.st.Maintain(ctx)
	if err == nil && len(rep.Errors) > 0 {
		err = rep.Errors[0]
	}
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		d.m.storeError(err)
		if writeFailure(err) {
			d.writeFailed(err)
			return true
		}
		d.cond.warn("maintenance", errClass(err), "daemon: maintenance", "failed_steps", len(rep.Errors), "err", err)
		return true
	}
	d.cond.clear("maintenance", "daemon: maintenance works again")
	d.log.Debug("daemon: maintenance", "report", fmt.Sprintf("%+v", rep))
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sdNotify sends state to systemd's $NOTIFY_SOCKET, if set.
func sdNotify(state string) error {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil
	}
	if strings.HasPrefix(name, "@") {
		name = "\x00" + name[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}

// peerListener accepts only connections from the owning uid (SO_PEERCRED).
type peerListener struct {
	*net.UnixListener
	uid int
	log *slog.Logger
	m   *metrics
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.UnixListener.AcceptUnix()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && uid == l.uid {
			return &peerConn{UnixConn: c, uid: uid}, nil
		}
		l.log.Warn("daemon: refused a connection from another user", "uid", uid, "err", err)
		l.m.refused.Inc()
		c.Close()
	}
}

func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if serr != nil {
		return -1, serr
	}
	return int(cred.Uid), nil
}
