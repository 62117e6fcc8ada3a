package relay

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sealbridge/sealbridge/internal/bytesize"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay/jsstore"
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
	// StatusRetention is --status-retention (default DefaultStatusRetention;
	// 0: none retained); Options takes it as StatusRetentionOption says.
	StatusRetention time.Duration
}

// StatusRetentionOption is f.StatusRetention as Options.StatusRetention takes
// it (there, 0 is the default and a negative value none).
func (f *LimitFlags) StatusRetentionOption() time.Duration {
	if f.StatusRetention == 0 {
		return -1
	}
	return f.StatusRetention
}

// LimitFlagsUsage is the flags' part of a relay command's usage text.
const LimitFlagsUsage = `  --quota-envelopes N   envelopes one recipient's inbox may hold (default 0: no bound);
                        more → 429 RELAY_QUOTA, Retry-After: 60
  --quota-bytes N       bytes (envelopes and their bodies, pending ones too) one
                        recipient's inbox may hold (default 0: no bound; else at least
                        131072); a body that alone exceeds it → 413 BODY_TOO_LARGE
  --sender-rate R       new envelopes per second accepted from one sender DID
                        (default 0: no bound); more → 429 RELAY_RATE_LIMITED
  --sender-burst N      envelopes a sender may send at once (default: the rate, at least 1)
  --sender-byte-rate R  bytes per second (envelopes and their bodies) accepted from one
                        sender DID (default 0: no bound); more → 429 RELAY_RATE_LIMITED
  --sender-byte-burst N  bytes a sender may send at once (default: the rate, at least
                        131072); a larger body is taken on a full bucket, then the
                        sender waits
  --max-body SIZE       largest sealed body of a blob envelope kept: 4GiB, 512MiB, or
                        bytes (default 4GiB); larger → 413 BODY_TOO_LARGE
  --allow-list          accept envelopes only for recipients that registered
                        (POST /v1/recipients/register); others → 403 RECIPIENT_NOT_ALLOWED
  --expire-every D      period of the pass removing inbox envelopes past their deadline
                        (default 1m; 0 turns the pass off, they are never served anyway)
  --status-retention D  how long an acknowledged delivery-status envelope is kept for
                        GET /v1/inbox/statuses (default 168h; 0 keeps none)
  --max-conns N         connections served at once (default 0: no bound); more wait
                        to be accepted
  --held-polls-per-address N  inbox fetches with wait= held at once from one client
                        address (IPv4, or IPv6 /64; default 64); more → 503 RELAY_BUSY.
                        Behind a reverse proxy all come from its address: raise it
`

// AddLimitFlags defines the limit flags on fs. Each flag refuses a nonsensical
// value when parsed (a usage error with internal/cli.ParseFlags); call Check
// after parsing for the rules between flags.
func AddLimitFlags(fs *flag.FlagSet) *LimitFlags {
	f := &LimitFlags{Limits: Limits{ExpireEvery: DefaultExpireEvery, MaxBody: DefaultMaxBody},
		StatusRetention: DefaultStatusRetention}
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
	fs.Func("sender-byte-rate", "", func(s string) error {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || v != v || v > 1e15 {
			return fmt.Errorf("want bytes per second, 0 or more, not %q", s)
		}
		f.Limits.SenderByteRate = v
		return nil
	})
	fs.Func("sender-byte-burst", "", func(s string) error {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return fmt.Errorf("want a number of bytes, 0 or more, not %q", s)
		}
		f.Limits.SenderByteBurst = v
		return nil
	})
	fs.Func("max-body", "", func(s string) error {
		v, err := bytesize.Parse(s)
		if err != nil {
			return err
		}
		if v < 1 || v > envelope.MaxBlobSize {
			return fmt.Errorf("want a size from 1 byte to %s, not %q", bytesize.Format(envelope.MaxBlobSize), s)
		}
		f.Limits.MaxBody = v
		return nil
	})
	fs.BoolVar(&f.Limits.AllowList, "allow-list", false, "")
	fs.Func("expire-every", "", func(s string) error {
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 || (v > 0 && v < time.Second) {
			return fmt.Errorf("want a duration of at least 1s, or 0 for no pass, not %q", s)
		}
		f.Limits.ExpireEvery = v
		return nil
	})
	fs.Func("status-retention", "", func(s string) error {
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 || (v > 0 && v < time.Second) {
			return fmt.Errorf("want a duration of at least 1s, or 0 to keep none, not %q", s)
		}
		f.StatusRetention = v
		return nil
	})
	nonNegInt("max-conns", &f.MaxConns)
	fs.Func("held-polls-per-address", "", func(s string) error {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			return fmt.Errorf("want a whole number, 1 or more, not %q", s)
		}
		f.Limits.HeldPollsPerAddress = v
		return nil
	})
	return f
}

// Check applies the rules between the flags (Limits.Check).
func (f *LimitFlags) Check() error {
	if err := f.Limits.Check(); err != nil {
		return fmt.Errorf("%w (see --help)", err)
	}
	return nil
}

// Listen listens on the TCP address addr, serving at most maxConns
// connections at once (LimitListener). A relay command listens before it
// creates anything (its data root, key, store or JetStream stream), so that
// a busy address leaves nothing behind. Its error has the hint of another
// --listen.
func Listen(addr string, maxConns int) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errcode.WithHint(err, "choose another address with --listen (port 0 picks a free one)")
	}
	return LimitListener(ln, maxConns), nil
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

// Environment variables of the NATS credentials (never on the command line).
const (
	EnvNATSCreds    = "SEALBRIDGE_NATS_CREDS"    // a NATS .creds file, as --nats-creds
	EnvNATSUser     = "SEALBRIDGE_NATS_USER"     // user and password, both or neither
	EnvNATSPassword = "SEALBRIDGE_NATS_PASSWORD" //
)

// BackendFlags are the command-line flags of the relay's storage, shared by
// both relay commands.
type BackendFlags struct {
	Backend     string // "file" or "jetstream"
	NATSURL     string
	NATSCreds   string
	Replicas    int
	SyncAlways  bool
	replicasSet bool
	getenv      func(string) string
	natsOptions []nats.Option // tests: appended to the connection's options
}

// BackendFlagsUsage is the flags' part of a relay command's usage text.
const BackendFlagsUsage = `  --backend B           where inboxes and de-duplication records live: file (default:
                        under --home) or jetstream (NATS JetStream, shared by several
                        relay processes of one relay identity)
  --nats-url URLS       JetStream servers, comma-separated (nats://host:4222,…); no
                        credentials in it: they come from --nats-creds or the
                        environment (` + EnvNATSCreds + `, or ` + EnvNATSUser + ` and
                        ` + EnvNATSPassword + `)
  --nats-creds FILE     a NATS .creds file (user JWT and NKey seed)
  --jetstream-replicas N  replicas of the stream and buckets the relay creates
                        (default 3); fewer than 3 needs --jetstream-sync-always
  --jetstream-sync-always  declare that every JetStream server runs with
                        sync_interval: always (fsync on every write)
`

// AddBackendFlags defines the storage flags on fs; call Check after parsing.
func AddBackendFlags(fs *flag.FlagSet) *BackendFlags {
	f := &BackendFlags{Backend: "file", Replicas: jsstore.DefaultReplicas, getenv: os.Getenv}
	fs.Func("backend", "", func(s string) error {
		if s != "file" && s != "jetstream" {
			return fmt.Errorf("want file or jetstream, not %q", s)
		}
		f.Backend = s
		return nil
	})
	// Checked in Check, not here: the flag package would echo the value, and
	// it may hold a password.
	fs.StringVar(&f.NATSURL, "nats-url", "", "")
	fs.Func("nats-creds", "", func(s string) error {
		if s == "" {
			return errors.New("want a file name")
		}
		f.NATSCreds = s
		return nil
	})
	fs.Func("jetstream-replicas", "", func(s string) error {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 5 {
			return fmt.Errorf("want 1 to 5 replicas, not %q", s)
		}
		f.Replicas, f.replicasSet = v, true
		return nil
	})
	fs.BoolVar(&f.SyncAlways, "jetstream-sync-always", false, "")
	return f
}

// checkNATSURLs refuses a server list that is malformed or names
// credentials, without repeating what it was given.
func checkNATSURLs(s string) error {
	for i, raw := range strings.Split(s, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if strings.Contains(raw, "@") || (err == nil && u.User != nil) {
			// Any "@", even one a parser would read as part of a fragment or
			// query ("nats://user:pa#ss@host"), may be a password's.
			return fmt.Errorf("--nats-url: server %d has credentials in it (an @): credentials never go on the command line; give --nats-creds FILE or set %s and %s",
				i+1, EnvNATSUser, EnvNATSPassword)
		}
		if raw == "" || err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("--nats-url: server %d is not nats://host:port (a comma-separated list)", i+1)
		}
	}
	return nil
}

// Check applies the rules between the flags and the environment.
func (f *BackendFlags) Check() error {
	js := f.Backend == "jetstream"
	if f.NATSURL != "" {
		if err := checkNATSURLs(f.NATSURL); err != nil {
			return err
		}
	}
	switch {
	case js && f.NATSURL == "":
		return errors.New("--backend jetstream needs --nats-url (see --help)")
	case !js && (f.NATSURL != "" || f.NATSCreds != "" || f.replicasSet || f.SyncAlways):
		return errors.New("the --nats-* and --jetstream-* flags need --backend jetstream (see --help)")
	case js && (f.getenv(EnvNATSUser) == "") != (f.getenv(EnvNATSPassword) == ""):
		return fmt.Errorf("set both %s and %s, or neither", EnvNATSUser, EnvNATSPassword)
	case js && f.NATSCreds == "" && f.getenv(EnvNATSCreds) != "" && f.getenv(EnvNATSUser) != "":
		return fmt.Errorf("set %s or %s, not both", EnvNATSCreds, EnvNATSUser)
	case js && f.NATSCreds != "" && f.getenv(EnvNATSUser) != "":
		return fmt.Errorf("give --nats-creds or set %s, not both", EnvNATSUser)
	}
	return nil
}

// Open connects to JetStream when the flags say so, makes the durability
// refusals of jsstore.Check (with JetStreamHint's hint) before anything is
// created, and fills o's JetStream fields; the returned function closes the
// connection (after the Relay's Close). With the file backend it changes
// nothing. Call it before creating the data root or the key.
func (f *BackendFlags) Open(o *Options, name string) (closeConn func(), err error) {
	if f.Backend != "jetstream" {
		return func() {}, nil
	}
	if f.Replicas < jsstore.MinReplicas && !f.SyncAlways { // decided before connecting
		return nil, errcode.WithHint(fmt.Errorf("--jetstream-replicas %d needs --jetstream-sync-always: with fewer than %d replicas an acknowledged envelope is durable only when every JetStream server runs with sync_interval: always",
			f.Replicas, jsstore.MinReplicas),
			"configure the servers so and add --jetstream-sync-always (one server: docs/RELAY.md \"Single-node JetStream\"), or keep the default of 3 replicas on a cluster of 3 or more")
	}
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.Timeout(10 * time.Second)}
	creds := cmp.Or(f.NATSCreds, f.getenv(EnvNATSCreds))
	switch {
	case creds != "":
		if err := checkCredsFile(creds); err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserCredentials(creds))
	case f.getenv(EnvNATSUser) != "":
		opts = append(opts, nats.UserInfo(f.getenv(EnvNATSUser), f.getenv(EnvNATSPassword)))
	}
	events := &natsEvents{log: cmp.Or(o.Logger, slog.Default())}
	opts = append(opts, events.options()...)
	opts = append(opts, f.natsOptions...)
	nc, err := nats.Connect(f.NATSURL, opts...)
	if err != nil {
		return nil, errcode.WithHint(fmt.Errorf("connect to NATS at %s: %w", f.NATSURL, err),
			"check --nats-url and the credentials (--nats-creds, "+EnvNATSCreds+", "+EnvNATSUser+"/"+EnvNATSPassword+")")
	}
	events.connected(nc)
	o.JetStream = nc
	o.JetStreamOptions.Replicas = f.Replicas
	o.JetStreamOptions.SyncAlways = f.SyncAlways
	// The durability refusals, before the command creates anything (its data
	// root and key, then New the stream and buckets).
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	if err := jsstore.Check(ctx, nc, o.JetStreamOptions); err != nil {
		events.close(nc)
		if h := JetStreamHint(err); h != "" {
			err = errcode.WithHint(err, h)
		}
		return nil, err
	}
	return func() { events.close(nc) }, nil
}

// singleNodeRecipe is the hint's pointer to the single-node recipe.
const singleNodeRecipe = `run the server with sync_interval: always (docs/RELAY.md "Single-node JetStream") and start the relay with --jetstream-replicas 1 --jetstream-sync-always`

// JetStreamHint is the command-line hint for a refusal of jsstore.Open (a
// *jsstore.NotDurableError), "" for another error: the flags and server
// settings that fix its case, and nothing that would not.
func JetStreamHint(err error) string {
	var e *jsstore.NotDurableError
	if !errors.As(err, &e) {
		return ""
	}
	switch {
	case e.SingleServer && e.Existing:
		return "this NATS server is not clustered, so it keeps one replica: " + singleNodeRecipe
	case e.SingleServer:
		return "this NATS server is not clustered, so it keeps one replica: " + singleNodeRecipe + ", or use a cluster of 3 or more"
	case e.Existing:
		return fmt.Sprintf("give it %d replicas (nats stream edit %s --replicas %d), or run every JetStream server with sync_interval: always and add --jetstream-sync-always",
			jsstore.MinReplicas, e.Stream, jsstore.MinReplicas)
	}
	return fmt.Sprintf("use --jetstream-replicas %d on a cluster of 3 or more, or run every JetStream server with sync_interval: always and add --jetstream-sync-always",
		jsstore.MinReplicas)
}

// checkCredsFile holds a NATS .creds file (it holds an NKey seed) to the rules of a
// private key file (SECURITY.md): a regular file, not a symbolic link, one link,
// owned by this user, no group or other permission bits.
func checkCredsFile(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("the NATS credentials file %s: %w", path, err)
	}
	info, err := fsx.NewOS(filepath.Dir(abs)).Lstat(filepath.Base(abs))
	if err == nil {
		err = fsx.CheckPrivateFile(abs, info)
	}
	if err != nil {
		return errcode.WithHint(fmt.Errorf("the NATS credentials file: %w", err),
			"it holds a secret: make it a regular file of yours with mode 0600 (chmod 600 "+abs+")")
	}
	return nil
}

// LoadOrCreateIdentity is identity.LoadOrCreateKeyFile for a relay command's
// key file (--identity-file): a file or directory it cannot reach or create
// (missing, not writable, read-only) gets a hint that names a place that
// works. Refusals that carry a hint of their own keep it.
func LoadOrCreateIdentity(file string) (id *identity.Identity, created bool, err error) {
	id, created, err = identity.LoadOrCreateKeyFile(file)
	if err == nil || errcode.HintOf(err) != "" {
		return id, created, err
	}
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) {
		dir := filepath.Dir(file)
		err = errcode.WithHint(err, fmt.Sprintf("the key file's directory %s must exist and be yours to write for the first start to create the key (mkdir -m 700 -p %s), and a key file there yours to read; or leave out --identity-file to keep the key in the data root (--home)", dir, dir))
	}
	return id, created, err
}
