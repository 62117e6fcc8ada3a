package relay

import (
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// natsEvents logs the state changes of a relay command's NATS connection, each
// once: the first disconnect (not every failed reconnect attempt), the
// reconnect (with how long it was down), and a close the command did not ask
// for. The lines name the server by its redacted URL (nats.go's
// ConnectedUrlRedacted: no user info) and the error, never a credential. Its
// methods are safe for concurrent use (nats.go calls them on its own
// goroutine).
type natsEvents struct {
	log *slog.Logger

	mu       sync.Mutex
	up       bool
	closing  bool // the command closes the connection: say nothing
	server   string
	downAt   time.Time
	downErrs int64 // disconnects seen (for tests)
}

// options are the connection options that report to e.
func (e *natsEvents) options() []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(e.disconnected),
		nats.ReconnectHandler(e.reconnected),
		nats.ClosedHandler(e.closed),
	}
}

// connected records the connection's first server, once nats.Connect returned it.
func (e *natsEvents) connected(nc *nats.Conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.up, e.server = true, nc.ConnectedUrlRedacted()
}

func (e *natsEvents) disconnected(_ *nats.Conn, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.up || e.closing {
		return
	}
	e.up, e.downAt = false, time.Now()
	e.downErrs++
	args := []any{"server", e.server}
	if err != nil {
		args = append(args, "err", err.Error())
	}
	e.log.Warn("relay: NATS disconnected; reconnecting (JetStream requests fail until then)", args...)
}

func (e *natsEvents) reconnected(nc *nats.Conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.up || e.closing {
		return
	}
	e.up, e.server = true, nc.ConnectedUrlRedacted()
	e.log.Info("relay: NATS reconnected", "server", e.server, "down_ms", time.Since(e.downAt).Milliseconds())
}

func (e *natsEvents) closed(nc *nats.Conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return
	}
	e.closing, e.up = true, false
	args := []any{"server", e.server}
	if err := nc.LastError(); err != nil {
		args = append(args, "err", err.Error())
	}
	e.log.Error("relay: NATS connection closed; JetStream storage unavailable until restart", args...)
}

// close marks the connection as closed by the command, then closes it.
func (e *natsEvents) close(nc *nats.Conn) {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	nc.Close()
}
