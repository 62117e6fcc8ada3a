package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relay"
)

// Bounds of the demo.
const (
	demoMaxMessages  = 100_000
	demoSenders      = 8 // concurrent POST /v1/messages
	demoPollEvery    = 50 * time.Millisecond
	demoInboxEvery   = 100 * time.Millisecond // the daemons' inbox fetches
	demoStartTimeout = 30 * time.Second       // daemons' readiness
	demoStopTimeout  = 30 * time.Second       // daemons' drain (their own bound is 10 s)
)

func demoCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "demo [--messages 100] [--keep] [--timeout 2m]",
		Short: "run two daemons and a relay in a temp home, send messages, check the stores",
		Long: `Runs two daemons (alice and bob) and a relay in a temporary home, sends messages
from alice to bob and checks the three stores (alice's, bob's and the relay's) with
fsck; it succeeds only if every message was relayed and delivered and fsck finds no
problem.`,
		Example: "  sealbridge demo --messages 20 --keep",
		Args:    cli.NoArgs,
	}
	fl := c.Flags()
	n := fl.Int("messages", 100, "how many messages to send (`N`)")
	keep := fl.Bool("keep", false, "keep the temporary home and its logs")
	timeout := fl.Duration("timeout", 2*time.Minute, "give up after `D`")
	c.RunE = func(c *cobra.Command, _ []string) error {
		return runDemo(c.Context(), *n, *keep, *timeout, c.OutOrStdout())
	}
	return cli.Annotate(c, cli.AnnotExit, exitLineOK+
		"  1   failure: not every message was relayed and delivered, or fsck found problems\n"+exitLineUsage)
}

func runDemo(ctx context.Context, n int, keep bool, timeout time.Duration, stdout io.Writer) error {
	if n < 1 || n > demoMaxMessages {
		return usageErrorf("demo: --messages must be between 1 and %d", demoMaxMessages)
	}
	if timeout <= 0 {
		return usageErrorf("demo: --timeout must be positive")
	}
	// A short temp directory: the daemons' unix sockets live under it, and a
	// socket path may not exceed 107 bytes.
	tmp, err := os.MkdirTemp("", "sb-")
	if err != nil {
		return err
	}
	if tmp, err = filepath.EvalSymlinks(tmp); err != nil {
		return err
	}
	dm := &demo{out: stdout, n: n, timeout: timeout, tmp: tmp, keep: keep}
	err = dm.run(ctx)
	if keep {
		fmt.Fprintf(stdout, "kept %s (logs in %s)\n", tmp, filepath.Join(tmp, "logs"))
	} else if rerr := os.RemoveAll(tmp); rerr != nil && err == nil {
		err = fmt.Errorf("remove the demo's home: %w", rerr)
	}
	if err != nil && !keep && !errors.Is(err, context.Canceled) {
		err = withHint(err, "run 'sealbridge demo --keep' to keep the home and the daemons' logs")
	}
	return err
}

type demo struct {
	out     io.Writer
	n       int
	timeout time.Duration
	tmp     string
	keep    bool

	root  string // data root of both identities
	logs  []*os.File
	nodes []*node
}

// node is one in-process daemon.
type node struct {
	name   string
	did    identity.DID
	d      *daemon.Daemon
	c      *client.Client
	cancel context.CancelFunc
	done   chan error

	stopOnce sync.Once
	stopErr  error
}

// stop cancels the daemon and waits for Run to return.
func (n *node) stop() error {
	n.stopOnce.Do(func() {
		n.cancel()
		t := time.NewTimer(demoStopTimeout)
		defer t.Stop()
		select {
		case err := <-n.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				n.stopErr = fmt.Errorf("%s's daemon: %w", n.name, err)
			}
		case <-t.C:
			n.stopErr = fmt.Errorf("%s's daemon did not stop within %s", n.name, demoStopTimeout)
		}
	})
	return n.stopErr
}

func (dm *demo) logger(name string) (*slog.Logger, error) {
	dir := filepath.Join(dm.tmp, "logs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	dm.logs = append(dm.logs, f)
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo})), nil
}

func (dm *demo) run(ctx context.Context) (err error) {
	defer func() {
		for _, nd := range dm.nodes {
			if serr := nd.stop(); serr != nil && err == nil {
				err = serr
			}
		}
		for _, f := range dm.logs {
			f.Close()
		}
	}()
	start := time.Now()
	dm.root = filepath.Join(dm.tmp, "home")
	fmt.Fprintf(dm.out, "sealbridge demo: %s from alice to bob through a reference relay on loopback\n", plural(dm.n, "message", "messages"))
	if dm.keep {
		fmt.Fprintf(dm.out, "home     %s (kept: --keep)\n", dm.tmp)
	} else {
		fmt.Fprintf(dm.out, "home     %s (removed at the end; --keep keeps it)\n", dm.tmp)
	}

	// The relay.
	rlog, err := dm.logger("relay")
	if err != nil {
		return err
	}
	rid, err := identity.Generate()
	if err != nil {
		return err
	}
	relayHome := filepath.Join(dm.tmp, "relay")
	rel, err := relay.New(relay.Options{Identity: rid, Home: relayHome, Logger: rlog})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := relay.NewServer(rel, rlog)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	stopRelay := sync.OnceFunc(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if serr := srv.Shutdown(sctx); serr != nil {
			_ = srv.Close()
		}
		_ = rel.Close()
	})
	defer stopRelay()
	relayURL := "http://" + ln.Addr().String()
	fmt.Fprintf(dm.out, "relay    %s %s\n", relayURL, rid.DID())

	// The identities and their daemons.
	for _, name := range []string{"alice", "bob"} {
		nd, err := dm.startDaemon(ctx, name, relayURL)
		if err != nil {
			return err
		}
		fmt.Fprintf(dm.out, "%-8s %s\n", name, nd.did)
	}
	alice, bob := dm.nodes[0], dm.nodes[1]
	for _, nd := range dm.nodes {
		if err := dm.waitReady(ctx, nd); err != nil {
			return err
		}
	}
	fmt.Fprintf(dm.out, "daemons  ready in %s\n", round(time.Since(start)))

	// Send.
	sendStart := time.Now()
	if err := dm.send(ctx, alice.c, string(bob.did), relayURL); err != nil {
		return err
	}
	sendTime := time.Since(sendStart)
	fmt.Fprintf(dm.out, "sent %s in %s through alice's local API\n", plural(dm.n, "message", "messages"), round(sendTime))

	// Wait until every message is delivered: confirmed by bob's signed
	// delivery-status (or closed: then it never will be).
	counts, relayTime, werr := dm.wait(ctx, alice.c, serveErr, sendStart)
	deliverTime := time.Since(sendStart)
	if errors.Is(werr, context.Canceled) {
		return werr
	}

	// Stop the daemons, then check their stores offline.
	for _, nd := range dm.nodes {
		if err := nd.stop(); err != nil {
			return err
		}
	}
	st := rel.Stats()
	stopRelay()
	fsckStart := time.Now()
	problems := 0
	stores := []struct {
		name string
		home string
		did  identity.DID
	}{{alice.name, dm.root, alice.did}, {bob.name, dm.root, bob.did}, {"relay", relayHome, rid.DID()}}
	for _, s := range stores {
		p, err := dm.fsck(ctx, s.name, dataroot.StoreDir(s.home, string(s.did)), s.did)
		if err != nil {
			return err
		}
		problems += p
	}
	fsckTime := time.Since(fsckStart)

	relayed, delivered := counts[statusRelayedOrLater], counts["delivered"]
	received, rerr := dm.received(bob)
	if rerr != nil {
		return rerr
	}
	fmt.Fprintln(dm.out)
	fmt.Fprintln(dm.out, "summary")
	fmt.Fprintf(dm.out, "  messages  %d sent, %d relayed, %d delivered, %d closed, %d still queued\n", dm.n, relayed, delivered, counts["closed"], dm.n-relayed-counts["closed"])
	fmt.Fprintf(dm.out, "  bob       %s received (observations)\n", plural(received, "message", "messages"))
	fmt.Fprintf(dm.out, "  relay     %d envelopes accepted, %d duplicates\n", st.Accepted, st.Duplicates)
	fmt.Fprintf(dm.out, "  time      %s in all: sending %s, all relayed %s and all delivered %s after the first send, fsck %s\n",
		round(time.Since(start)), round(sendTime), round(relayTime), round(deliverTime), round(fsckTime))
	fmt.Fprintf(dm.out, "  rate      %.1f messages/s (first send to last relayed)\n", float64(relayed)/relayTime.Seconds())
	fmt.Fprintf(dm.out, "relayed %d/%d\n", relayed, dm.n)
	fmt.Fprintf(dm.out, "delivered %d/%d\n", delivered, dm.n)
	if problems == 0 {
		fmt.Fprintln(dm.out, "fsck: clean")
	} else {
		fmt.Fprintf(dm.out, "fsck: %s\n", plural(problems, "problem", "problems"))
	}
	switch {
	case werr != nil:
		return werr
	case relayed != dm.n:
		return fmt.Errorf("only %d of %d messages were relayed", relayed, dm.n)
	case delivered != dm.n:
		return fmt.Errorf("only %d of %d messages were delivered", delivered, dm.n)
	case received != dm.n:
		return fmt.Errorf("bob holds %d observations, not %d", received, dm.n)
	case problems > 0:
		return fmt.Errorf("fsck found %s", plural(problems, "problem", "problems"))
	}
	return nil
}

// startDaemon creates the identity and starts its daemon in a goroutine.
// Both follow their inbox at the relay: bob receives the messages, alice the
// delivery confirmations.
func (dm *demo) startDaemon(ctx context.Context, name, relayURL string) (*node, error) {
	id, err := daemon.InitIdentity(dm.root, name)
	if err != nil {
		return nil, err
	}
	log, err := dm.logger(name)
	if err != nil {
		return nil, err
	}
	opts := daemon.Options{Home: dm.root, Identity: name, Logger: log, Version: version(),
		InboxRelay: relayURL, PollEvery: demoInboxEvery}
	if sock := client.SocketPath(dm.root, string(id.DID())); len(sock) > dataroot.MaxSocketPath {
		// A long $TMPDIR: put the socket at a shorter path of our own.
		opts.SocketPath = filepath.Join(dm.tmp, name+".sock")
	}
	d, err := daemon.New(opts)
	if err != nil {
		return nil, fmt.Errorf("%s's daemon: %w", name, err)
	}
	dctx, cancel := context.WithCancel(ctx)
	nd := &node{name: name, did: d.DID(), d: d, c: client.New(d.SocketPath()), cancel: cancel, done: make(chan error, 1)}
	go func() { nd.done <- d.Run(dctx) }()
	dm.nodes = append(dm.nodes, nd)
	return nd, nil
}

// waitReady waits for the daemon's Ready, then asks its API.
func (dm *demo) waitReady(ctx context.Context, nd *node) error {
	t := time.NewTimer(demoStartTimeout)
	defer t.Stop()
	select {
	case <-nd.d.Ready():
	case err := <-nd.done:
		nd.done <- err // for stop
		return fmt.Errorf("%s's daemon stopped before it was ready: %v", nd.name, err)
	case <-t.C:
		return fmt.Errorf("%s's daemon was not ready within %s", nd.name, demoStartTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	rctx, cancel := context.WithTimeout(ctx, demoStartTimeout)
	defer cancel()
	if err := nd.c.Live(rctx); err != nil {
		return fmt.Errorf("%s's daemon: %w", nd.name, err)
	}
	return nil
}

// send posts dm.n messages to alice's API, demoSenders at a time, each with an
// Idempotency-Key, and shows progress.
func (dm *demo) send(ctx context.Context, c *client.Client, to, relayURL string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan int)
	results := make(chan error)
	var wg sync.WaitGroup
	for range min(demoSenders, dm.n) {
		wg.Go(func() {
			for i := range jobs {
				body := fmt.Appendf(nil, "demo message %d of %d", i+1, dm.n)
				_, err := c.Send(ctx, client.SendRequest{To: client.Recipients{to}, RelayURL: relayURL, Body: body},
					fmt.Sprintf("demo-%d", i+1))
				if err != nil {
					err = fmt.Errorf("send message %d: %w", i+1, err)
				}
				results <- err
			}
		})
	}
	go func() {
		defer close(jobs)
		for i := range dm.n {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { wg.Wait(); close(results) }()
	bar := newProgress(dm.out, "sending", dm.n)
	bar.update(0)
	sent := 0
	var first error
	for err := range results {
		if err != nil {
			if first == nil {
				first = err
				cancel()
			}
			continue
		}
		sent++
		bar.update(sent)
	}
	bar.finish()
	return first
}

// statusRelayedOrLater counts messages that reached the relay: relayed, or
// delivered after that.
const statusRelayedOrLater = "relayed"

// wait polls alice's API until every message is delivered or closed, or the
// timeout passes; it returns the counts by status and when all were relayed
// (since start).
func (dm *demo) wait(ctx context.Context, c *client.Client, relayErr <-chan error, start time.Time) (map[string]int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, dm.timeout)
	defer cancel()
	bar := newProgress(dm.out, "delivering", dm.n)
	defer bar.finish()
	var relayTime time.Duration
	tick := time.NewTicker(demoPollEvery)
	defer tick.Stop()
	var counts map[string]int
	for {
		var err error
		counts, err = countStatuses(ctx, c)
		if err != nil {
			if ctx.Err() != nil {
				break // timed out or interrupted
			}
			return counts, relayTime, err
		}
		if relayTime == 0 && counts[statusRelayedOrLater] >= dm.n {
			relayTime = time.Since(start)
		}
		bar.update(counts["delivered"])
		if counts["delivered"]+counts["closed"] >= dm.n {
			if counts["closed"] > 0 {
				return counts, relayTime, fmt.Errorf("%s closed without being relayed", plural(counts["closed"], "message was", "messages were"))
			}
			return counts, relayTime, nil
		}
		select {
		case <-tick.C:
			continue
		case err := <-relayErr:
			return counts, relayTime, fmt.Errorf("the relay stopped: %w", err)
		case <-ctx.Done():
		}
		break
	}
	if err := context.Cause(ctx); errors.Is(err, context.Canceled) {
		return counts, relayTime, err
	}
	return counts, relayTime, fmt.Errorf("not all messages were delivered within %s (--timeout)", dm.timeout)
}

// countStatuses pages through the daemon's message list.
func countStatuses(ctx context.Context, c *client.Client) (map[string]int, error) {
	counts := map[string]int{}
	after := ""
	for {
		l, err := c.Messages(ctx, "", 1000, after)
		if err != nil {
			return counts, err
		}
		for _, m := range l.Messages {
			switch m.Status {
			case "relayed", "delivered":
				counts[statusRelayedOrLater]++
				if m.Status == "delivered" {
					counts["delivered"]++
				}
			default:
				counts[m.Status]++
			}
		}
		if l.Next == "" || len(l.Messages) == 0 {
			return counts, nil
		}
		after = l.Next
	}
}

// fsck checks one store offline and prints its findings; it returns the
// number of problems.
func (dm *demo) fsck(ctx context.Context, name, dir string, owner identity.DID) (int, error) {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		// A store directory is created by its first write.
		fmt.Fprintf(dm.out, "fsck %-5s no store directory: nothing written yet\n", name)
		return 0, nil
	}
	rep, err := fsck.Check(ctx, dir, fsck.Options{Owner: owner, Tool: "sealbridge demo"})
	if err != nil {
		return 0, fmt.Errorf("fsck of %s's store: %w", name, err)
	}
	fmt.Fprintf(dm.out, "fsck %-5s %s, %d valid, %s\n", name, plural(rep.Records, "record", "records"), rep.Valid, plural(rep.Problems(), "problem", "problems"))
	shown := 0
	for _, f := range rep.Findings {
		if f.Severity != fsck.Problem {
			continue
		}
		if shown++; shown > 10 {
			fmt.Fprintf(dm.out, "  … and %d more\n", rep.Problems()-10)
			break
		}
		fmt.Fprintf(dm.out, "  %s %s: %s\n", f.Code, f.Path, f.Explanation)
	}
	return rep.Problems(), nil
}

// received counts the observations in nd's store (read after its daemon stopped).
func (dm *demo) received(nd *node) (int, error) {
	ids, err := nd.d.Store().List(record.KindObservations)
	if err != nil {
		return 0, fmt.Errorf("%s's received messages: %w", nd.name, err)
	}
	return len(ids), nil
}
