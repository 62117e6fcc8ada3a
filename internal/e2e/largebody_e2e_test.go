package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// The large-body tests move one body from A to B through the real binaries. Their
// size is SEALBRIDGE_E2E_BODY ("64MiB" unless set; `just large-body` runs 1GiB):
//
//	SEALBRIDGE_E2E_BODY=1GiB go test ./internal/e2e -run 'TestLargeBody' -v -timeout 60m
const defaultE2EBody = 64 << 20

// rssGrowthBound is how much each process's resident set may grow while it
// carries the body (the bound), whatever the body's size.
const rssGrowthBound = 64 << 20

func largeBodySize(t *testing.T) int64 {
	t.Helper()
	s := os.Getenv("SEALBRIDGE_E2E_BODY")
	if s == "" {
		return defaultE2EBody
	}
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("SEALBRIDGE_E2E_BODY=%q: want a size such as 64MiB or 1GiB", os.Getenv("SEALBRIDGE_E2E_BODY"))
	}
	return n * mult
}

// writeBodyFile writes n pseudo-random bytes (seeded, so a rerun moves the same
// body) to a file in dir, 1 MiB at a time, and returns its path and SHA-256.
func writeBodyFile(t *testing.T, dir string, n int64) (string, string) {
	t.Helper()
	path := filepath.Join(dir, "body.bin")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	r := rand.New(rand.NewPCG(uint64(n), 24))
	buf := make([]byte, 1<<20)
	for left := n; left > 0; {
		b := buf[:min(left, int64(len(buf)))]
		for i := 0; i+8 <= len(b); i += 8 {
			v := r.Uint64()
			for j := range 8 {
				b[i+j] = byte(v >> (8 * j))
			}
		}
		for i := len(b) &^ 7; i < len(b); i++ {
			b[i] = byte(r.Uint32())
		}
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		h.Write(b)
		left -= int64(len(b))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, hex.EncodeToString(h.Sum(nil))
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// countingProxy is a TCP proxy in front of the relay that counts the bytes each
// way: up (clients to the relay: the sender's upload) and down (the relay to its
// clients: the recipient's download). It is how the test counts, at the relay,
// the bytes sent again after a kill. The relay behind it may be restarted on
// another port (setTarget); the proxy's URL, which the daemons use, stays.
type countingProxy struct {
	ln       net.Listener
	target   atomic.Value // string: host:port
	up, down atomic.Int64
	mu       sync.Mutex
	conns    map[net.Conn]bool
	// resumes are the offsets the requests going up start a body from, in
	// order: a PATCH's Upload-Offset (the upload) and a GET's Range (the
	// download), as the proxy saw their headers.
	resumes []resume
}

// resume is one request's starting offset of a body, and the proxy's count
// of bytes in the body's direction when its header went up.
type resume struct {
	upload bool
	offset int64
	at     int64
}

// resumeHeaders are the header lines whose value is where a request starts.
var resumeHeaders = []struct {
	prefix string
	upload bool
}{{"\r\nUpload-Offset: ", true}, {"\r\nRange: bytes=", false}}

// scan notes every resume header in b, the bytes after tail (the end of the
// connection's previous read, so that a header split over two reads is seen).
func (p *countingProxy) scan(tail, b []byte) {
	buf := append(append(make([]byte, 0, len(tail)+len(b)), tail...), b...)
	for _, h := range resumeHeaders {
		for i := 0; ; {
			j := strings.Index(string(buf[i:]), h.prefix)
			if j < 0 {
				break
			}
			start := i + j + len(h.prefix)
			end := start
			for end < len(buf) && buf[end] >= '0' && buf[end] <= '9' {
				end++
			}
			i = start
			if end < len(tail) || end == len(buf) || end == start {
				continue // ended in the previous read (counted there), or cut: the next read has it whole
			}
			n, _ := strconv.ParseInt(string(buf[start:end]), 10, 64)
			moved := p.down.Load()
			if h.upload {
				moved = p.up.Load()
			}
			p.mu.Lock()
			p.resumes = append(p.resumes, resume{upload: h.upload, offset: n, at: moved})
			p.mu.Unlock()
		}
	}
}

// position is where the upload (or the download) of the body is: the offset
// of its last request plus the bytes that went its way since (headers count
// too: a few hundred bytes a request). 0 before its first request.
func (p *countingProxy) position(upload bool) int64 {
	moved := &p.down
	if upload {
		moved = &p.up
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.resumes) - 1; i >= 0; i-- {
		if r := p.resumes[i]; r.upload == upload {
			return r.offset + moved.Load() - r.at
		}
	}
	return 0
}

// resumesSeen is how many resume headers went up so far.
func (p *countingProxy) resumesSeen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.resumes)
}

// nextResume waits for the first request after the first n whose header says
// where it starts a body, of the upload (PATCH) or the download (GET), and
// returns that offset.
func (p *countingProxy) nextResume(t *testing.T, n int, upload bool) int64 {
	t.Helper()
	var off int64
	what := "a PATCH after the kill"
	if !upload {
		what = "a ranged GET of the body after the kill"
	}
	until(t, 5*time.Minute, what, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, r := range p.resumes[n:] {
			if r.upload == upload {
				off = r.offset
				return true
			}
		}
		return false
	})
	return off
}

func startProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, conns: map[net.Conn]bool{}}
	p.target.Store(target)
	t.Cleanup(func() { ln.Close(); p.dropAll() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *countingProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *countingProxy) setTarget(hostport string) { p.target.Store(hostport) }

func (p *countingProxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

// dropAll closes every proxied connection: what a killed relay's peers see.
func (p *countingProxy) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *countingProxy) serve(c net.Conn) {
	defer c.Close()
	r, err := net.Dial("tcp", p.target.Load().(string))
	if err != nil {
		return
	}
	defer r.Close()
	p.track(c, true)
	p.track(r, true)
	defer p.track(c, false)
	defer p.track(r, false)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn, n *atomic.Int64) {
		buf := make([]byte, 64<<10)
		var tail []byte
		for {
			k, err := src.Read(buf)
			if k > 0 && n == &p.up {
				p.scan(tail, buf[:k])
				tail = append(tail[:0], buf[max(0, k-64):k]...)
			}
			if k > 0 {
				if _, werr := dst.Write(buf[:k]); werr != nil {
					break
				}
				n.Add(int64(k))
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(r, c, &p.up)
	go pipe(c, r, &p.down)
	<-done
	<-done
}

// relayProc is a sealbridge-relay process on one home.
type relayProc struct {
	cmd  *exec.Cmd
	addr string // host:port it listens on
	done chan struct{}
}

func startRelayAt(t *testing.T, bin, home string) *relayProc {
	t.Helper()
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--home", home, "--log-level", "warn")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &relayProc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); <-p.done })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				lines <- u
			}
		}
	}()
	select {
	case u := <-lines:
		p.addr = strings.TrimPrefix(u, "http://")
	case <-p.done:
		t.Fatal("relay exited at start")
	case <-time.After(60 * time.Second):
		t.Fatal("relay did not start")
	}
	return p
}

func (p *relayProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// procKB is a /proc/PID/status field in KiB (VmRSS: resident now; VmHWM: the
// resident peak since the process started).
func procKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s of %d: %q", field, pid, line)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// rssWatch is one process's resident set when it started carrying the body; its
// growth is its peak since (VmHWM) minus that.
type rssWatch struct {
	name string
	pid  int
	base int64 // KiB
}

func watchRSS(t *testing.T, name string, pid int) rssWatch {
	return rssWatch{name: name, pid: pid, base: procKB(t, pid, "VmRSS")}
}

func (w rssWatch) check(t *testing.T) {
	t.Helper()
	peak := procKB(t, w.pid, "VmHWM")
	grew := (peak - w.base) << 10
	t.Logf("%s: resident %d MiB at the start, peak %d MiB: grew %.1f MiB (bound %d MiB)",
		w.name, w.base>>10, peak>>10, float64(grew)/(1<<20), rssGrowthBound>>20)
	if grew > rssGrowthBound {
		t.Errorf("%s's resident set grew by %d MiB carrying the body, more than %d MiB", w.name, grew>>20, rssGrowthBound>>20)
	}
}

// cliAs runs the sealbridge command as node n and returns its standard output.
func cliAs(t *testing.T, bin string, n *inboundNode, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append(args, "--home", n.home)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sealbridge %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// outboxEnvelope is the id of the one blob envelope in n's outbox (the test's
// body), "" until it is there.
func outboxEnvelope(t *testing.T, n *inboundNode) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(n.storeDir, string(record.KindOutbox), "*.json"))
	for _, p := range m {
		o := readOutbox(t, n, strings.TrimSuffix(filepath.Base(p), ".json"))
		if env, err := envelope.Parse(o.Envelope); err == nil {
			if _, blob := env.Blob(); blob {
				return o.EnvelopeID
			}
		}
	}
	return ""
}

// until polls cond until it holds or within passes (waitFor without a state).
func until(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	waitFor(t, what, within, func() (bool, string) { return cond(), "" })
}

// readOutbox reads and verifies the outbox record of envelope id in n's store.
func readOutbox(t *testing.T, n *inboundNode, id string) *record.Outbox {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(n.storeDir, string(record.KindOutbox), id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := identity.ParseDID(string(n.did))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := record.Parse(record.KindOutbox, id, data, n.did, pub)
	if err != nil {
		t.Fatalf("outbox %s: %v", id, err)
	}
	return rec.(*record.Outbox)
}

// largeBodyWorld is A and B, each with its daemon, and the relay behind the
// counting proxy.
type largeBodyWorld struct {
	dir               string
	daemonBin, cliBin string
	relayBin          string
	relayHome         string
	relay             *relayProc
	proxy             *countingProxy
	a, b              *inboundNode
	pa, pb            *daemonProc
	size              int64
	bodyPath, bodySum string
	messageID         string
}

func newLargeBodyWorld(t *testing.T) *largeBodyWorld {
	t.Helper()
	if testing.Short() {
		t.Skip("builds binaries and moves a large body")
	}
	bin := buildCommands(t)
	w := &largeBodyWorld{dir: t.TempDir(), daemonBin: filepath.Join(bin, "sealbridged"),
		cliBin: filepath.Join(bin, "sealbridge"), relayBin: filepath.Join(bin, "sealbridge-relay"),
		relayHome: t.TempDir(), size: largeBodySize(t)}
	w.relay = startRelayAt(t, w.relayBin, w.relayHome)
	w.proxy = startProxy(t, w.relay.addr)
	w.a = newInboundNode(t, "A", w.proxy.URL())
	w.b = newInboundNode(t, "B", w.proxy.URL())
	w.pa = w.a.start(t, w.daemonBin)
	w.pb = w.b.start(t, w.daemonBin)
	start := time.Now()
	w.bodyPath, w.bodySum = writeBodyFile(t, w.dir, w.size)
	t.Logf("a %d MiB body written in %s", w.size>>20, time.Since(start).Round(time.Millisecond))
	return w
}

// send sends the body file from A to B with the CLI and returns at once with
// the command running; the message id arrives on the channel.
func (w *largeBodyWorld) send(t *testing.T) <-chan string {
	t.Helper()
	ids := make(chan string, 1)
	go func() {
		cmd := exec.Command(w.cliBin, "send", "--home", w.a.home, "--to", string(w.b.did), "--relay", w.proxy.URL(),
			"--file", w.bodyPath, "--idempotency-key", "large-body-1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Errorf("sealbridge send: %v\n%s", err, stderr.String())
			ids <- ""
			return
		}
		ids <- strings.TrimSpace(string(out))
	}()
	return ids
}

// delivered waits until B holds the message and A shows it delivered, then
// fetches the body with `sealbridge get --out` and compares its SHA-256.
func (w *largeBodyWorld) delivered(t *testing.T, within time.Duration) {
	t.Helper()
	until(t, within, "A shows the message delivered", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m, err := w.a.c.Message(ctx, w.messageID)
		return err == nil && m.Status == "delivered"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := w.b.c.Inbox(ctx, 0, "")
	if err != nil || len(l.Messages) != 1 || l.Messages[0].MessageID != w.messageID || !l.Messages[0].Blob || l.Messages[0].BodySize != w.size {
		t.Fatalf("B's inbox: %+v %v; want the one message %s with a blob body", l, err, w.messageID)
	}
	out := filepath.Join(w.dir, "received.bin")
	start := time.Now()
	cliAs(t, w.cliBin, w.b, "get", w.messageID, "--out", out)
	got := fileSHA256(t, out)
	t.Logf("sealbridge get --out: %d MiB in %s", w.size>>20, time.Since(start).Round(time.Millisecond))
	if got != w.bodySum {
		t.Fatalf("B's body has SHA-256 %s, A sent %s", got, w.bodySum)
	}
	os.Remove(out)
}

// TestLargeBodyEndToEnd: a body of SEALBRIDGE_E2E_BODY bytes from A to B through
// the binaries arrives with an equal SHA-256, and no daemon's nor the relay's
// resident set grows by more than 64 MiB meanwhile (their peak from /proc).
func TestLargeBodyEndToEnd(t *testing.T) {
	w := newLargeBodyWorld(t)
	watches := []rssWatch{watchRSS(t, "A's daemon", w.pa.cmd.Process.Pid), watchRSS(t, "B's daemon", w.pb.cmd.Process.Pid),
		watchRSS(t, "the relay", w.relay.cmd.Process.Pid)}
	start := time.Now()
	w.messageID = <-w.send(t)
	if w.messageID == "" {
		t.FailNow()
	}
	t.Logf("accepted in %s", time.Since(start).Round(time.Millisecond))
	w.delivered(t, 10*time.Minute+time.Duration(w.size>>20)*time.Second)
	t.Logf("%d MiB delivered in %s (%.1f MiB/s); bytes through the relay: up %d MiB, down %d MiB",
		w.size>>20, time.Since(start).Round(time.Millisecond), float64(w.size)/(1<<20)/time.Since(start).Seconds(),
		w.proxy.up.Load()>>20, w.proxy.down.Load()>>20)
	for _, rw := range watches {
		rw.check(t)
	}
	if up := w.proxy.up.Load(); up > w.size+w.size/50+(1<<20) {
		t.Errorf("%d bytes went up to the relay for a %d-byte body: more than once", up, w.size)
	}
}

// relayOffset asks the relay (behind the proxy) how much of envelope id's body
// it holds durably: the whole sealed size once the upload is complete (no
// upload is pending), 0 before it began.
func (w *largeBodyWorld) relayOffset(t *testing.T, id string, sealed int64) int64 {
	t.Helper()
	c := &relayproto.Client{BaseURL: w.proxy.URL()}
	var off int64
	until(t, time.Minute, "the relay answers HEAD of the body", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		o, _, err := c.BodyOffset(ctx, id)
		var pe *relayproto.Error
		switch {
		case err == nil:
			off = o
			return true
		case errors.As(err, &pe) && pe.Code == relayproto.CodeUploadUnknown:
			off = sealed
			return true
		}
		return false
	})
	return off
}

// partialSize is how much of envelope id's body B's store kept (its .part
// file), the whole sealed size once B holds the blob, 0 before it began.
func (w *largeBodyWorld) partialSize(t *testing.T, id string, sealed int64) int64 {
	t.Helper()
	if fi, err := os.Stat(filepath.Join(w.b.storeDir, "blobs", "."+id+".part")); err == nil {
		return fi.Size()
	}
	if m, _ := filepath.Glob(filepath.Join(w.b.storeDir, "blobs", "[0-9a-f]*")); len(m) > 0 {
		return sealed
	}
	return 0
}

// killPoint is one SIGKILL of the test: who (A's daemon, the relay or B's
// daemon) once the upload ("up") or the download ("down") has passed the share
// at of the sealed body.
type killPoint struct {
	who, phase string
	at         float64
}

// TestLargeBodyResumesAcrossKills: the sending daemon, the relay and the
// receiving daemon are each SIGKILLed at several points the test chooses (a
// share of the body through the relay) and restarted. The body arrives whole,
// and what went through the relay again after each kill is at most one chunk
// plus what was not yet durable: for the upload, the bytes the relay had taken
// before the kill beyond the durable offset it reports after it; for the
// download, the bytes B had taken beyond the partial blob it kept. The test
// counts both at the relay (the proxy in front of it).
func TestLargeBodyResumesAcrossKills(t *testing.T) {
	w := newLargeBodyWorld(t)
	const chunk = envelope.BlobChunkSize + 16
	// slack covers what is not body: request and answer headers, the envelope's
	// posts, inbox pages and acks, the probes after a kill.
	const slack = 1 << 20
	if w.messageID = <-w.send(t); w.messageID == "" {
		t.FailNow()
	}
	envID := outboxEnvelope(t, w.a)
	if envID == "" {
		t.Fatal("A's outbox holds no blob envelope after the send was accepted")
	}
	sealed := w.sealedSize(t, envID)
	points := []killPoint{
		{"A", "up", 0.15}, {"relay", "up", 0.35}, {"A", "up", 0.55}, {"relay", "up", 0.8},
		{"B", "down", 0.2}, {"relay", "down", 0.45}, {"B", "down", 0.7},
	}
	var allowUp, allowDown int64
	for _, k := range points {
		up := k.phase == "up"
		until(t, 10*time.Minute, fmt.Sprintf("%.0f%% of the %s", 100*k.at, k.phase), func() bool {
			return w.proxy.position(up) > int64(k.at*float64(sealed))
		})
		seen := w.proxy.resumesSeen()
		switch k.who {
		case "A":
			w.pa.cmd.Process.Signal(syscall.SIGKILL)
			<-w.pa.done
		case "B":
			w.pb.cmd.Process.Signal(syscall.SIGKILL)
			<-w.pb.done
		case "relay":
			w.relay.kill()
			w.proxy.dropAll()
		}
		at := w.proxy.position(up) // where the transfer was when it died
		seen = max(seen, w.proxy.resumesSeen())
		switch k.who {
		case "A":
			w.pa = w.a.start(t, w.daemonBin)
		case "B":
			w.pb = w.b.start(t, w.daemonBin)
		case "relay":
			w.relay = startRelayAt(t, w.relayBin, w.relayHome)
			w.proxy.setTarget(w.relay.addr)
		}
		// Where the transfer starts again: the offset of the first PATCH (or
		// ranged GET) after the kill, as its header says — the relay's durable
		// offset that the carrier was told, or what B's partial blob kept.
		durable := w.proxy.nextResume(t, seen, up)
		lost := max(0, min(at, sealed)-durable)
		t.Logf("%s killed with %.1f MiB of the %s through the relay; %.1f MiB durable after it: %.1f MiB not yet durable",
			k.who, float64(at)/(1<<20), k.phase, float64(durable)/(1<<20), float64(lost)/(1<<20))
		if lost > 16<<20 {
			t.Errorf("%s's kill lost %d MiB that had been taken but not made durable: more than the 16 MiB of a sync interval and socket buffers", k.who, lost>>20)
		}
		if up {
			allowUp += lost + chunk
		} else {
			allowDown += lost + chunk
		}
	}
	w.delivered(t, 10*time.Minute)
	upAgain, downAgain := w.proxy.up.Load()-sealed, w.proxy.down.Load()-sealed
	t.Logf("sent again: up %.2f MiB (allowed %.2f MiB + slack), down %.2f MiB (allowed %.2f MiB + slack)",
		float64(upAgain)/(1<<20), float64(allowUp)/(1<<20), float64(downAgain)/(1<<20), float64(allowDown)/(1<<20))
	if upAgain > allowUp+slack {
		t.Errorf("%d bytes went up again after the kills; one chunk plus what was not durable allows %d", upAgain, allowUp+slack)
	}
	if downAgain > allowDown+slack {
		t.Errorf("%d bytes came down again after the kills; one chunk plus what was not durable allows %d", downAgain, allowDown+slack)
	}
}

// sealedSize is the sealed size A's envelope id names.
func (w *largeBodyWorld) sealedSize(t *testing.T, id string) int64 {
	t.Helper()
	env, err := envelope.Parse(readOutbox(t, w.a, id).Envelope)
	if err != nil {
		t.Fatal(err)
	}
	ref, ok := env.Blob()
	if !ok {
		t.Fatalf("envelope %s has no blob", id)
	}
	return ref.Size
}
