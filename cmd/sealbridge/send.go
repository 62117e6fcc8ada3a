package main

import (
	"context"

	"github.com/spf13/cobra"

	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/sealbridge/sealbridge/internal/cli"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// stdin is where send reads a body without --file (tests replace it).
var stdin io.Reader = os.Stdin

// daemonConn is a client of the identity's daemon.
type daemonConn struct {
	w   *who
	did identity.DID
	c   *client.Client
}

// connect loads the identity and returns a client of its daemon's socket.
func (w *who) connect() (*daemonConn, error) {
	id, err := w.load()
	if err != nil {
		return nil, err
	}
	return &daemonConn{w: w, did: id.DID(), c: client.ForIdentity(w.root, string(id.DID()))}, nil
}

// explain turns a client error into the command's error: no daemon (exit 3),
// or the daemon's answer with a hint where one helps.
func (d *daemonConn) explain(err error) error {
	if err == nil {
		return nil
	}
	if client.IsNotRunning(err) && !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EPERM) {
		nd := &noDaemonError{did: string(d.did), home: d.w.root, name: d.w.name, err: err}
		return errcode.WithHint(nd, nd.hint())
	}
	var ce *client.Error
	if errors.As(err, &ce) {
		switch {
		case errors.Is(err, errcode.IdempotencyKeyReused):
			return withHint(err, "this key was used with another request; use a new --idempotency-key")
		case errors.Is(err, errcode.IdempotencyInProgress):
			return withHint(err, "the first request with this key is still running; retry in a moment")
		case errors.Is(err, errcode.OutboxFull):
			return withHint(err, "wait for queued messages to be relayed or closed (sealbridge ls --status queued)")
		case ce.Status == http.StatusNotFound:
			return withHint(err, "list sent messages with: sealbridge ls %s", d.w.flags())
		case ce.Hint != "":
			return withHint(err, "%s", ce.Hint) // the daemon's (a full disk's, …)
		}
	}
	return err
}

// sendFlags are send's flags.
type sendFlags struct {
	to                            []string
	relayURL, deadline, key, file string
}

func sendCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "send --to DID [--to DID…] --relay URL [--deadline 24h|TIME] [--idempotency-key K] [--file F] [--home DIR] [--identity NAME]",
		Short: "send a message (body from --file or standard input); print its id",
		Long: `Sends a message through the identity's daemon and prints its id. The body is read
from --file F, or from standard input (a terminal is refused). With --to repeated
(at most 64 distinct recipients) it sends one message to each, as one request, and
prints one line per recipient: the message id, its status and the recipient.

A body of at most 97280 bytes (95 KiB) travels inside its envelope. A larger one is
streamed to the daemon, never held in memory, and sealed there in 64 KiB chunks as
a blob the envelope names, up to the daemon's --max-body (default 4 GiB, counted
sealed: the body plus 16 bytes per 64 KiB); it goes to one recipient (one --to).

send always sends an Idempotency-Key (a random one unless --idempotency-key gives
it) and retries a lost connection or a 5xx with it (5 attempts, at most 10 s in
all); failing that it prints the key and the command that finishes the send
without a duplicate (exit 4). A large body from a pipe is sent once (it cannot be
read again); from a file it is streamed again from its start. Retries with one
--idempotency-key must send the same request and body: use the default --deadline
or an RFC 3339 TIME, not a duration.`,
		Example: `  echo hello | sealbridge send --home ~/sb --identity alice --to did:key:z6Mk… --relay http://127.0.0.1:8470
  sealbridge send --to did:key:z6Mk… --relay http://127.0.0.1:8470 --file note.txt --deadline 2030-01-01T00:00:00Z
  sealbridge send --to did:key:z6MkA… --to did:key:z6MkB… --relay http://127.0.0.1:8470 --file note.txt
  tar c data/ | sealbridge send --to did:key:z6Mk… --relay http://127.0.0.1:8470`,
		Args: cli.NoArgs,
	}
	w := identityFlags(c)
	var f sendFlags
	fl := c.Flags()
	fl.StringArrayVar(&f.to, "to", nil, "the recipient's did:key `DID` (required; repeat it for several recipients)")
	fl.StringVar(&f.relayURL, "relay", "", "the http(s) `URL` of the relay to send through (required)")
	fl.StringVar(&f.deadline, "deadline", "", "when to give up: a duration from now or an RFC 3339 time (default 24h)")
	cli.Named(fl, "deadline", "24h|TIME")
	fl.StringVar(&f.key, "idempotency-key", "", "`K` makes a retry return the first request's message")
	fl.StringVar(&f.file, "file", "", "read the body from `F` (\"-\": standard input)")
	_ = c.MarkFlagFilename("file")
	c.RunE = func(c *cobra.Command, _ []string) error { return runSend(c.Context(), w, f, c.OutOrStdout()) }
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit,
		exitLineOK+"  1   failure: the daemon refused the message, or it was not accepted\n"+exitLineUsage+exitLineNoDaemon+exitLineUnknown)
}

func runSend(ctx context.Context, w *who, f sendFlags, stdout io.Writer) error {
	relayURL, deadline, key, file := &f.relayURL, &f.deadline, &f.key, &f.file
	switch {
	case len(f.to) == 0:
		return usageErrorf("send: --to DID is required")
	case len(f.to) > client.MaxRecipients:
		return usageErrorf("send: %d --to, at most %d recipients", len(f.to), client.MaxRecipients)
	case *relayURL == "":
		return usageErrorf("send: --relay URL is required")
	}
	deadlineMs, err := parseDeadline(*deadline, time.Now())
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, to := range f.to {
		if _, err := identity.ParseDID(to); err != nil {
			return usageErrorf("send: --to %q is not a valid did:key: %v", to, err)
		}
		if seen[to] {
			return usageErrorf("send: --to %q is given twice", to)
		}
		seen[to] = true
	}
	canonical, err := relayproto.CanonicalRelayURL(*relayURL)
	if err != nil {
		return withHint(usageErrorf("send: --relay %q: %v", *relayURL, err), "%s", relayproto.RelayURLFix(err))
	}
	*relayURL = canonical
	body, err := openBody(*file)
	if err != nil {
		return err
	}
	defer body.close()
	if body.large() && len(f.to) > 1 {
		return usageErrorf("send: a body over %d bytes is streamed to one recipient; this one has %d --to (send it once per recipient)",
			envelope.MaxBodySize, len(f.to))
	}
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	// The request is made once: every attempt sends the same bytes with one key.
	req := client.SendRequest{To: client.Recipients(f.to), RelayURL: *relayURL, Body: body.small, DeadlineMs: deadlineMs}
	k := *key
	if k == "" {
		k = uuid.NewString()
	}
	var ms []client.Message
	if body.large() {
		ms, err = sendRetries.stream(ctx, d.c, client.SendStreamRequest{To: f.to[0], RelayURL: *relayURL, DeadlineMs: deadlineMs, Key: k}, body)
	} else {
		ms, err = sendRetries.send(ctx, d.c, req, k)
	}
	var ie *incompleteSend
	if errors.As(err, &ie) {
		return ie.explain(d.w, req, *file)
	}
	if err != nil {
		return d.explain(err)
	}
	if len(ms) == 1 {
		fmt.Fprintln(stdout, ms[0].MessageID)
		return nil
	}
	for _, m := range ms {
		fmt.Fprintf(stdout, "%s  %s  %s\n", m.MessageID, m.Status, m.To)
	}
	return nil
}

// sendRetries bounds how send retries a request the daemon did not answer for
// sure (tests replace sleep).
var sendRetries = retryPolicy{attempts: 5, backoff: 100 * time.Millisecond, maxWait: 10 * time.Second, sleep: sleepContext}

// retryPolicy: at most attempts requests; before each retry a wait of backoff,
// doubling, or the daemon's Retry-After if longer; the waits add up to at most maxWait.
type retryPolicy struct {
	attempts int
	backoff  time.Duration
	maxWait  time.Duration
	sleep    func(ctx context.Context, d time.Duration) error
}

func sleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// incompleteSend: the retries ran out (or were interrupted) without a final answer.
type incompleteSend struct {
	key      string
	attempts int
	unknown  bool   // a request may have been accepted: its outcome is unknown
	id       string // the message that may have been accepted, if the daemon named it
	last     error
}

func (e *incompleteSend) Error() string {
	what := "was not accepted"
	if e.unknown {
		what = "may have been accepted"
		if e.id != "" {
			what += " as message " + e.id
		}
	}
	return fmt.Sprintf("send: no final answer after %d attempts with Idempotency-Key %s; the message %s: %v", e.attempts, e.key, what, e.last)
}

// explain adds the command that finishes the job: the same request with the same
// key, which the daemon answers with the message if it was accepted and sends it
// otherwise — never twice.
func (e *incompleteSend) explain(w *who, req client.SendRequest, file string) error {
	cmd := "sealbridge send " + w.flags()
	for _, to := range req.To {
		cmd += " --to " + shellQuote(to)
	}
	cmd += " --relay " + shellQuote(req.RelayURL)
	if req.DeadlineMs != 0 {
		cmd += " --deadline " + time.UnixMilli(req.DeadlineMs).UTC().Format(time.RFC3339Nano)
	}
	cmd += " --idempotency-key " + shellQuote(e.key)
	if file != "" && file != "-" {
		if abs, err := filepath.Abs(file); err == nil {
			file = abs
		}
		return withHint(e, "finish it without sending it twice, with the same file: %s --file %s", cmd, shellQuote(file))
	}
	return withHint(e, "finish it without sending it twice by piping the same body to: %s (another body is refused with IDEMPOTENCY_KEY_REUSED)", cmd)
}

// send sends req with key, retrying what leaves the outcome open — the connection
// lost before an answer, a 5xx with an unknown outcome or a Retry-After, 409
// IDEMPOTENCY_IN_PROGRESS — with the same key
// and request. A final answer (the message, or a refusal) is returned as is; a
// daemon not running at the first attempt too (nothing was sent). Otherwise the
// result is an *incompleteSend.
func (p retryPolicy) send(ctx context.Context, c *client.Client, req client.SendRequest, key string) ([]client.Message, error) {
	return p.run(ctx, key, func() ([]client.Message, error) { return c.SendAll(ctx, req, key) }, nil)
}

// stream is send for a large body, streamed (client.SendStream) with r's key: each
// retry streams the body again from its start, which only a regular file can do; a
// body from a pipe is sent once, and an attempt whose outcome is open ends the
// retries there (the hint says to pipe the same body again with the key).
func (p retryPolicy) stream(ctx context.Context, c *client.Client, r client.SendStreamRequest, body *messageBody) ([]client.Message, error) {
	return p.run(ctx, r.Key, func() ([]client.Message, error) {
		m, err := c.SendStream(ctx, r, body.reader(), body.size)
		if err != nil {
			return nil, err
		}
		return []client.Message{*m}, nil
	}, body.rewind)
}

// run is send's retry loop around attempt; rewind, if set, prepares each retry's
// request (an error ends the retries).
func (p retryPolicy) run(ctx context.Context, key string, attempt func() ([]client.Message, error), rewind func() error) ([]client.Message, error) {
	out := &incompleteSend{key: key}
	wait, waited := p.backoff, time.Duration(0)
	for {
		out.attempts++
		ms, err := attempt()
		if err == nil {
			return ms, nil
		}
		out.last = err
		var ce *client.Error
		retryAfter := time.Duration(0)
		switch {
		// A 5xx is retried when a retry may answer otherwise: the outcome is unknown, or
		// the daemon says when to retry (busy). A full disk is answered at once.
		case errors.As(err, &ce) && ce.Status >= 500 && (ce.Outcome == "unknown" || ce.RetryAfter > 0):
			if ce.Outcome == "unknown" {
				out.unknown = true
				out.id = ce.MessageID
			}
			retryAfter = ce.RetryAfter
		case errors.As(err, &ce) && errors.Is(err, errcode.IdempotencyInProgress):
			out.unknown = true // a request with this key is in flight
			retryAfter = ce.RetryAfter
		case ce != nil:
			return nil, err // the daemon's final answer
		case ctx.Err() != nil:
			out.unknown = true // interrupted: the request may have reached the daemon
			return nil, out
		case client.IsNotRunning(err):
			if out.attempts == 1 {
				return nil, err // nothing was sent
			}
		default:
			out.unknown = true // the connection broke after the request was sent
		}
		if out.attempts >= p.attempts {
			return nil, out
		}
		d := max(wait, retryAfter)
		if d = min(d, p.maxWait-waited); d <= 0 {
			return nil, out
		}
		if err := p.sleep(ctx, d); err != nil {
			return nil, out
		}
		if rewind != nil {
			if err := rewind(); err != nil {
				return nil, out
			}
		}
		waited += d
		wait *= 2
	}
}

// parseDeadline parses --deadline: empty (the daemon's default, now + 24 h), a
// duration from now ("24h"), or an RFC 3339 time. It returns Unix milliseconds
// (0 for the default). A retry with the same --idempotency-key must be the same
// request, so it should use the default or an absolute time: a duration makes
// each retry's deadline different.
func parseDeadline(s string, now time.Time) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return 0, usageErrorf("send: --deadline must be in the future")
		}
		return now.Add(d).UnixMilli(), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return 0, usageErrorf("send: --deadline %q is neither a duration (24h) nor an RFC 3339 time", s)
	}
	if !t.After(now) {
		return 0, usageErrorf("send: --deadline must be in the future")
	}
	return t.UnixMilli(), nil
}

// messageBody is a send's body: small (at most envelope.MaxBodySize bytes, held:
// the JSON send of today) or large (streamed from its source, never held whole).
type messageBody struct {
	small  []byte    // the body when small; the first bytes read when large
	src    io.Reader // large: where the rest comes from
	name   string    // the file's name, or "standard input"
	file   *os.File  // large, a regular file: rewound for a retry
	start  int64     // where the body starts in file
	size   int64     // large: its length if known (a regular file), else -1
	closer io.Closer // the file send opened, if any
}

// openBody opens the message body: file, or standard input when file is "" or "-"
// (a terminal is refused). It reads up to one byte over envelope.MaxBodySize to tell
// a small body from a large one, and no further.
func openBody(file string) (*messageBody, error) {
	b := &messageBody{name: "standard input", size: -1}
	r := stdin
	if file != "" && file != "-" {
		f, err := os.Open(file)
		if errors.Is(err, os.ErrNotExist) {
			return nil, withHint(err, "give an existing file with --file, or pipe the body on standard input")
		}
		if err != nil {
			return nil, err
		}
		r, b.name, b.closer = f, file, f
	} else if isTerminal(r) {
		return nil, usageErrorf("send: no body: give --file F or pipe the body on standard input")
	}
	if f, ok := r.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			if start, err := f.Seek(0, io.SeekCurrent); err == nil {
				b.file, b.start, b.size = f, start, fi.Size()-start
			}
		}
	}
	head := make([]byte, envelope.MaxBodySize+1)
	n, err := io.ReadFull(r, head)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		b.small = head[:n]
		b.close()
		return b, nil
	case err != nil:
		b.close()
		return nil, fmt.Errorf("read %s: %w", b.name, err)
	}
	b.small, b.src = head, r
	if b.file == nil {
		b.size = -1
	}
	return b, nil
}

// large reports whether the body is over envelope.MaxBodySize (streamed).
func (b *messageBody) large() bool { return b.src != nil }

// reader is a large body from its start.
func (b *messageBody) reader() io.Reader {
	return io.MultiReader(bytes.NewReader(b.small), b.src)
}

// rewind prepares a large body to be sent again from its start: a regular file is
// read again from where the body starts (the bytes of every attempt are the same,
// as the Idempotency-Key requires, as long as the file is not changed meanwhile); a
// pipe cannot be.
func (b *messageBody) rewind() error {
	if b.file == nil {
		return fmt.Errorf("%s cannot be read again", b.name)
	}
	if _, err := b.file.Seek(b.start+int64(len(b.small)), io.SeekStart); err != nil {
		return err
	}
	return nil
}

func (b *messageBody) close() {
	if b.closer != nil {
		b.closer.Close()
		b.closer = nil
	}
}

func statusCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "status ID [--json] [--home DIR] [--identity NAME]",
		Short: "show one sent message",
		Long: `Shows one sent message: status, attempts, last error, next attempt, times; with
--json, the daemon's JSON object.`,
		Example: "  sealbridge status --home ~/sb --identity alice 0190b6a4-…",
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("status: give exactly one message ID")
			}
			return checkMessageID("status", args[0])
		},
	}
	w := identityFlags(c)
	asJSON := c.Flags().Bool("json", false, "print the daemon's JSON object")
	c.RunE = func(c *cobra.Command, args []string) error {
		return runStatus(c.Context(), w, args[0], *asJSON, c.OutOrStdout())
	}
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit, daemonExit("failure (no such message: MESSAGE_NOT_FOUND)"))
}

func runStatus(ctx context.Context, w *who, id string, asJSON bool, stdout io.Writer) error {
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	m, err := d.c.Message(ctx, id)
	if err != nil {
		return d.explain(err)
	}
	if asJSON {
		return writeJSON(stdout, m)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	row("message", m.MessageID)
	row("kind", m.Kind)
	row("status", m.Status)
	row("closed by", m.ClosedBy)
	row("last error", m.LastError)
	row("to", m.To)
	row("relay", m.RelayURL)
	row("attempts", fmt.Sprint(m.Attempts))
	row("next attempt", nextAttempt(m))
	row("held", describeAction(m.Held))
	if m.Operator != nil && m.Held == nil {
		row("last action", describeAction(m.Operator))
	}
	row("created", formatTime(m.CreatedAt))
	row("updated", formatTime(m.UpdatedAt))
	row("deadline", formatTime(m.Deadline))
	return tw.Flush()
}

// lsFlags are ls's flags.
type lsFlags struct {
	status, after string
	limit         int
	all, json     bool
}

func lsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "ls [--status S] [--limit N] [--after ID] [--all] [--json] [--home DIR] [--identity NAME]",
		Short: "list sent messages",
		Long: `Lists sent messages by id: kind (message: one you sent; confirmation: the delivery
confirmation the daemon sent back for a message it received), status (with closedBy
and "(held)" when an operator holds it), attempts, next attempt, the recipient (its
did:key shortened) and the last error's gist (its outcome and cause, for a queued or
closed message); status ID and --json have both whole.`,
		Example: `  sealbridge ls --home ~/sb --identity alice --status queued
  sealbridge ls --all --json --status closed | jq -r .lastError`,
		Args: cli.NoArgs,
	}
	w := identityFlags(c)
	var f lsFlags
	fl := c.Flags()
	fl.StringVar(&f.status, "status", "", "only messages with this status `S`: "+strings.Join(messageStatuses, ", "))
	fl.IntVar(&f.limit, "limit", 0, "at most `N` messages (default: the daemon's page size); with --all, the page size")
	fl.StringVar(&f.after, "after", "", "start after message `ID` (the \"more:\" line names it)")
	fl.BoolVar(&f.all, "all", false, "page through every message")
	fl.BoolVar(&f.json, "json", false, "JSON lines: one object per message, as the daemon reports it")
	_ = c.RegisterFlagCompletionFunc("status", cobra.FixedCompletions(messageStatuses, cobra.ShellCompDirectiveNoFileComp))
	c.RunE = func(c *cobra.Command, _ []string) error {
		return runLs(c.Context(), w, f, c.OutOrStdout(), c.ErrOrStderr())
	}
	return cli.Annotate(cli.Annotate(c, annotDaemon, "1"), cli.AnnotExit, daemonExit("failure"))
}

// messageStatuses are the statuses ls --status takes.
var messageStatuses = []string{"queued", "relayed", "delivered", "closed"}

func runLs(ctx context.Context, w *who, f lsFlags, stdout, stderr io.Writer) error {
	status, limit, after, all, asJSON := &f.status, &f.limit, &f.after, &f.all, &f.json
	if *limit < 0 {
		return usageErrorf("ls: --limit must not be negative")
	}
	if *status != "" && !slices.Contains(messageStatuses, *status) {
		return usageErrorf("ls: --status %q is not a status; give one of %s", *status, strings.Join(messageStatuses, ", "))
	}
	if err := w.resolve(); err != nil {
		return err
	}
	d, err := w.connect()
	if err != nil {
		return err
	}
	var tw *tabwriter.Writer
	if !*asJSON {
		tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "MESSAGE\tKIND\tSTATUS\tATTEMPTS\tUPDATED\tNEXT ATTEMPT\tTO\tLAST ERROR")
	}
	enc := json.NewEncoder(stdout)
	unreadable, next := 0, *after
	for {
		l, err := d.c.Messages(ctx, *status, *limit, next)
		if err != nil {
			return d.explain(err)
		}
		for _, m := range l.Messages {
			if m.Error != nil {
				unreadable++
			}
			if *asJSON {
				if err := enc.Encode(m); err != nil {
					return err
				}
				continue
			}
			lsRow(tw, &m)
		}
		next = l.Next
		if !*all || next == "" {
			break
		}
	}
	if tw != nil {
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if unreadable > 0 {
		fmt.Fprintf(stderr, "sealbridge: %d message record(s) could not be read\nsealbridge: hint: check the store with: sealbridge-fsck --home %s --identity %s\n",
			unreadable, shellQuote(w.root), shellQuote(string(d.did)))
	}
	if next != "" {
		fmt.Fprintf(stderr, "sealbridge: more: sealbridge ls %s --after %s (or --all)\n", w.flags(), shellQuote(next))
	}
	return nil
}

// lsRow is one message's row of the ls table.
func lsRow(tw io.Writer, m *client.Message) {
	if m.Error != nil {
		fmt.Fprintf(tw, "%s\t\t%s\t\t\t\t\t%s\n", m.MessageID, "UNREADABLE", oneLine(m.Error.Message))
		return
	}
	st := m.Status
	if m.ClosedBy != "" {
		st += "/" + m.ClosedBy
	}
	if m.Held != nil {
		st += " (held)"
	}
	last := ""
	if m.Status == "queued" || m.Status == "closed" {
		last = shortReason(m.LastError)
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", m.MessageID, m.Kind, st, m.Attempts, formatTime(m.UpdatedAt),
		nextAttempt(m), shortDID(m.To), last)
}

// shortDID is a did:key as a table shows it: "did:key:z6Mk…abcd", its method's
// prefix and the last four characters (--json and status have it whole).
func shortDID(did string) string {
	id, ok := strings.CutPrefix(did, "did:key:")
	if !ok || len(id) <= 12 {
		return did
	}
	return "did:key:" + id[:4] + "…" + id[len(id)-4:]
}

// writeJSONLines writes each item as one JSON object on a line (the --json of a list).
func writeJSONLines[T any](w io.Writer, items []T) error {
	enc := json.NewEncoder(w)
	for _, it := range items {
		if err := enc.Encode(it); err != nil {
			return err
		}
	}
	return nil
}

// writeJSON writes v as one indented JSON object (the --json of one item).
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// describeAction is an operator's action as status shows it: which, by whom, when,
// and why; "" for none.
func describeAction(a *client.OperatorAction) string {
	if a == nil {
		return ""
	}
	s := a.Op + " by " + a.By + " at " + formatTime(a.At)
	if a.Reason != "" {
		s += ": " + a.Reason
	}
	return s
}

// nextAttempt is when a queued message's next attempt is due: a time, "now" if it
// is due, "" if the message is not queued.
func nextAttempt(m *client.Message) string {
	switch {
	case m.Status != "queued":
		return ""
	case m.NextAttemptAt.IsZero() || !m.NextAttemptAt.After(time.Now()):
		return "now"
	}
	s := formatTime(m.NextAttemptAt) + " (in " + time.Until(m.NextAttemptAt).Round(time.Second).String() + ")"
	switch m.WaitingFor {
	case "target":
		s += ", waiting for its relay's next probe"
	case "lease":
		s += ", when the attempt under way ends"
	case "backoff":
		s += ", after its backoff"
	case "held":
		s += ", held"
	}
	return s
}

// oneLine keeps a table cell on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Local().Format(time.RFC3339)
}
