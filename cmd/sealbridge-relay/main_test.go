package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/natstest"
	"github.com/sealbridge/sealbridge/internal/promtest"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/relay"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

func TestVersionAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, &out, &errb); code != 0 ||
		!strings.HasPrefix(out.String(), "sealbridge-relay ") {
		t.Fatalf("%d %q", code, out.String())
	}
	for _, h := range []string{"--help", "-h"} {
		out.Reset()
		code := run(context.Background(), []string{h}, &out, &errb)
		if code != 0 || !strings.HasPrefix(out.String(), "usage: sealbridge-relay") {
			t.Fatalf("%s: %d %q", h, code, out.String())
		}
		for _, want := range []string{"Exit status:", "  0 ", "  1 ", "  2 ", "(default " + relay.DefaultListen + ")", "$SEALBRIDGE_HOME", "--log-format"} {
			if !strings.Contains(out.String(), want) && !strings.Contains(strings.Join(strings.Fields(out.String()), " "), want) { // or wrapped
				t.Errorf("%s does not say %q", h, want)
			}
		}
	}
}

// Usage errors exit 2 with "sealbridge-relay: error:" and the usage hint; an empty
// --home (an unset variable) is one, never the default data root.
func TestUsageErrors(t *testing.T) {
	t.Setenv("SEALBRIDGE_HOME", t.TempDir()) // nothing may touch the real default
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // were a relay to start, it stops at once
	for _, args := range [][]string{
		{"--home", ""}, {"--home="}, {"--listen", ""}, {"--identity-file", ""}, {"--nope"},
		{"--home", t.TempDir(), "extra"}, {"--log-format", "xml"}, {"--log-level", "loud"},
		// The limits refuse nonsense, alone or together.
		{"--quota-envelopes", "-1"}, {"--quota-envelopes", "many"}, {"--quota-bytes", "1000"},
		{"--sender-rate", "-2"}, {"--sender-rate", "NaN"}, {"--sender-burst", "5"},
		{"--expire-every", "-1s"}, {"--expire-every", "1ms"}, {"--max-conns", "-3"}, {"--allow-list=maybe"},
		{"--held-polls-per-address", "0"}, {"--held-polls-per-address", "lots"},
	} {
		var out, errb bytes.Buffer
		code := run(ctx, append([]string{"--listen=127.0.0.1:0"}, args...), &out, &errb)
		if code != 2 || !strings.HasPrefix(errb.String(), "sealbridge-relay: error: ") ||
			!strings.Contains(errb.String(), "sealbridge-relay: hint: run 'sealbridge-relay --help' for usage") {
			t.Errorf("%q: exit %d, stderr %q: want a usage error", args, code, errb.String())
		}
	}
}

// Sensible limits start the relay (it stops at once on the cancelled context).
func TestLimitFlagsAccepted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"--listen=127.0.0.1:0", "--home", t.TempDir(), "--quota-envelopes", "1000",
		"--quota-bytes", "67108864", "--sender-rate", "2.5", "--sender-burst", "10", "--allow-list",
		"--expire-every", "30s", "--max-conns", "512", "--held-polls-per-address", "16"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}

// The relay's data root defaults like every other binary's: $SEALBRIDGE_HOME.
func TestHomeFromEnvironment(t *testing.T) {
	home := t.TempDir()
	t.Setenv("SEALBRIDGE_HOME", home)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"--listen", "127.0.0.1:0"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(home, "relay-identity.pem")); err != nil {
		t.Fatalf("no key under $SEALBRIDGE_HOME: %v", err)
	}
}

// TestMain re-executes the test binary as the relay when asked.
func TestMain(m *testing.M) {
	if os.Getenv("SEALBRIDGE_RELAY_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestProcessServesAndStopsOnSIGTERM(t *testing.T) {
	home := t.TempDir()
	start := func() (*exec.Cmd, string, string) {
		cmd := exec.Command(os.Args[0], "--listen", "127.0.0.1:0", "--home", home)
		cmd.Env = append(os.Environ(), "SEALBRIDGE_RELAY_MAIN=1")
		cmd.Stderr = io.Discard
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		lines := make(chan string, 2)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		var got []string
		deadline := time.After(60 * time.Second)
		for len(got) < 2 {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("relay exited early: %v", got)
				}
				got = append(got, l)
			case <-deadline:
				t.Fatal("relay did not print its address")
			}
		}
		addr, ok1 := strings.CutPrefix(got[0], "listening ")
		did, ok2 := strings.CutPrefix(got[1], "relay ")
		if !ok1 || !ok2 {
			t.Fatalf("output %q", got)
		}
		return cmd, addr, did
	}
	cmd, addr, did := start()
	if _, err := identity.ParseDID(did); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(home, "relay-identity.pem")); err != nil {
		t.Fatal(err)
	}
	bob, _ := identity.FromSeed(bytes.Repeat([]byte{2}, 32))
	alice, _ := identity.FromSeed(bytes.Repeat([]byte{1}, 32))
	_, data, err := envelope.NewMessage(alice, bob.DID(), uuid.NewString(), []byte("hi"), time.Now().Add(time.Hour), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c := &relayproto.Client{BaseURL: addr}
	raw, rc, err := c.Post(context.Background(), data)
	if err != nil || string(rc.RelayDID) != did {
		t.Fatalf("post: %v", err)
	}
	// The operations endpoints: live, ready, and metrics promtool would accept.
	for _, path := range []string{relay.PathLivez, relay.PathReadyz, relay.PathMetrics} {
		resp, err := http.Get(addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		if path == relay.PathMetrics {
			promtest.Check(t, body)
			for _, want := range []string{`sealbridge_relay_envelopes_total{outcome="accepted"} 1`, `sealbridge_relay_build_info{backend="file",did="` + did + `",version="`} {
				if !strings.Contains(string(body), want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	// Restart: same identity, same receipt for the same envelope.
	_, addr2, did2 := start()
	if did2 != did {
		t.Fatalf("identity changed: %s %s", did, did2)
	}
	c2 := &relayproto.Client{BaseURL: addr2}
	raw2, _, err := c2.Post(context.Background(), data)
	if err != nil || !bytes.Equal(raw, raw2) {
		t.Fatalf("duplicate after restart: %v", err)
	}
}

// The storage flags: nonsense, credentials in the URL, NATS flags without the
// JetStream backend and a half-set user/password pair are usage errors.
func TestBackendFlagUsageErrors(t *testing.T) {
	t.Setenv("SEALBRIDGE_HOME", t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--backend", "redis"}, want: "want file or jetstream"},
		{args: []string{"--backend", "jetstream"}, want: "needs --nats-url"},
		{args: []string{"--backend", "jetstream", "--nats-url", "nats://alice:s3cret@127.0.0.1:4222"}, want: "credentials never go on the command line"},
		{args: []string{"--backend", "jetstream", "--nats-url", "nats://127.0.0.1:4222,nats://tok@10.0.0.1:4222"}, want: "credentials never go on the command line"},
		{args: []string{"--backend", "jetstream", "--nats-url", "nats://relay:2024#s3cret@127.0.0.1:4222"}, want: "credentials never go on the command line"},
		{args: []string{"--backend", "jetstream", "--nats-url", "nats://relay:2024?s3cret@127.0.0.1:4222"}, want: "credentials never go on the command line"},
		{args: []string{"--nats-url", "nats://127.0.0.1:4222"}, want: "need --backend jetstream"},
		{args: []string{"--jetstream-sync-always"}, want: "need --backend jetstream"},
		{args: []string{"--backend", "jetstream", "--nats-url", "nats://127.0.0.1:4222", "--jetstream-replicas", "0"}, want: "replicas"},
		{args: []string{"--backend", "jetstream", "--nats-url", "nats://127.0.0.1:4222"},
			env: map[string]string{"SEALBRIDGE_NATS_USER": "relay"}, want: "SEALBRIDGE_NATS_PASSWORD"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		var out, errb bytes.Buffer
		code := run(ctx, append([]string{"--listen=127.0.0.1:0"}, tc.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q: want a usage error saying %q", tc.args, code, errb.String(), tc.want)
		}
		if strings.Contains(errb.String(), "s3cret") {
			t.Errorf("%q: the password is echoed: %q", tc.args, errb.String())
		}
		for k := range tc.env {
			os.Unsetenv(k)
		}
	}
}

// On one JetStream server the relay refuses each half of the single-node
// recipe before anything is created, with one error line and a hint that
// agree and name the flags to use: --jetstream-replicas 1 alone is refused
// (exit 1) before it connects; --jetstream-sync-always alone (the default 3
// replicas) exits 1 with no stream made and not JetStream's raw 10074.
// Nothing is created: no stream, no data root, no key. Both together start.
func TestJetStreamBackendDurability(t *testing.T) {
	s := natstest.Node(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	parent := t.TempDir()
	home := filepath.Join(parent, "home")
	base := []string{"--listen=127.0.0.1:0", "--home", home, "--backend", "jetstream", "--nats-url", s.ClientURL()}
	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"--jetstream-replicas", "1"}, 1, []string{"needs --jetstream-sync-always", "sync_interval: always", `"Single-node JetStream"`}},
		{[]string{"--jetstream-sync-always"}, 1, []string{"not clustered", "hint: this NATS server is not clustered", "--jetstream-replicas 1 --jetstream-sync-always", `"Single-node JetStream"`}},
		{nil, 1, []string{"not clustered", "--jetstream-replicas 1 --jetstream-sync-always"}},
	} {
		var out, errb bytes.Buffer
		code := run(ctx, append(base, tc.args...), &out, &errb)
		stderr := errb.String()
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d; stderr %q", tc.args, code, tc.code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%q: stderr %q does not say %q", tc.args, stderr, w)
			}
		}
		for _, bad := range []string{"10074", "non-clustered mode", "Options.", "nats stream edit", "; hint:"} {
			if strings.Contains(stderr, bad) {
				t.Errorf("%q: stderr %q says %q", tc.args, stderr, bad)
			}
		}
		if st, _ := s.Jsz(nil); st.Streams != 0 {
			t.Fatalf("%q: the refused relay created %d streams", tc.args, st.Streams)
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 0 {
			t.Fatalf("%q: the refused relay created its data root", tc.args)
		}
	}
	var out, errb bytes.Buffer
	if code := run(ctx, append(base, "--jetstream-replicas", "1", "--jetstream-sync-always"), &out, &errb); code != 0 {
		t.Fatalf("declared sync_interval: always: exit %d, stderr %q", code, errb.String())
	}
}

// recipeBlock returns the code block of docs/RELAY.md after the line holding marker.
func recipeBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, marker)
	if !ok {
		t.Fatalf("docs/RELAY.md has no %q", marker)
	}
	_, rest, _ = strings.Cut(rest, "```\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("no code block after %q", marker)
	}
	return block
}

// The single-node recipe of docs/RELAY.md works as written: its nats-server
// configuration (port and store_dir replaced by a free port and a temporary
// directory) starts the in-process server, and the relay started with the
// recipe's flags accepts an envelope and holds it in a one-replica stream.
func TestSingleNodeRecipe(t *testing.T) {
	data, err := os.ReadFile("../../docs/RELAY.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	conf := recipeBlock(t, doc, "<!-- single-node recipe: nats-server.conf")
	cmdLine := recipeBlock(t, doc, "<!-- single-node recipe: relay")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	for _, want := range []string{"listen: 127.0.0.1:4222", "store_dir: /var/lib/nats/jetstream", "sync_interval: always"} {
		if !strings.Contains(conf, want) {
			t.Fatalf("the recipe's configuration lacks %q:\n%s", want, conf)
		}
	}
	conf = strings.NewReplacer("127.0.0.1:4222", "127.0.0.1:"+port, "/var/lib/nats/jetstream", t.TempDir()).Replace(conf)
	s := natstest.NodeFromConfig(t, conf)
	if !s.JetStreamEnabled() {
		t.Fatal("the recipe's server has no JetStream")
	}
	args := strings.Fields(strings.NewReplacer("~/sb-relay", t.TempDir(), "nats://127.0.0.1:4222", "nats://127.0.0.1:"+port).Replace(cmdLine))
	if len(args) == 0 || args[0] != "sealbridge-relay" {
		t.Fatalf("the recipe's command %q", cmdLine)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, w := io.Pipe()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		code := run(ctx, append(args[1:], "--listen", "127.0.0.1:0"), w, &errb)
		w.Close()
		done <- code
	}()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		t.Fatalf("the recipe's relay exited: %d %s", <-done, errb.String())
	}
	addr, ok := strings.CutPrefix(sc.Text(), "listening ")
	if !ok {
		t.Fatalf("output %q", sc.Text())
	}
	go io.Copy(io.Discard, stdout)
	alice, _ := identity.FromSeed(bytes.Repeat([]byte{1}, 32))
	bob, _ := identity.FromSeed(bytes.Repeat([]byte{2}, 32))
	_, env, err := envelope.NewMessage(alice, bob.DID(), uuid.NewString(), []byte("hi"), time.Now().Add(time.Hour), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := (&relayproto.Client{BaseURL: addr}).Post(context.Background(), env); err != nil {
		t.Fatalf("post to the recipe's relay: %v", err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	js, err := jetstream.New(natstest.Connect(t, s.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(context.Background(), "SEALBRIDGE_INBOX")
	if err != nil {
		t.Fatalf("no inbox stream on the recipe's server: %v", err)
	}
	if info := st.CachedInfo(); info.Config.Replicas != 1 || info.State.Msgs != 1 {
		t.Fatalf("the inbox stream: %d replicas, %d messages; want 1 and 1", info.Config.Replicas, info.State.Msgs)
	}
}

// An --identity-file the relay cannot create (its directory missing, as
// /etc/sealbridge for a normal user) is refused with a hint naming a place that
// works.
func TestIdentityFileUncreatableHint(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	file := filepath.Join(t.TempDir(), "no-such-dir", "relay-identity.pem")
	var out, errb bytes.Buffer
	code := run(ctx, []string{"--listen=127.0.0.1:0", "--home", t.TempDir(), "--identity-file", file}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "sealbridge-relay: hint: the key file's directory "+filepath.Dir(file)+" must exist") ||
		!strings.Contains(errb.String(), "leave out --identity-file") {
		t.Fatalf("exit %d, stderr %q; want 1 with a hint", code, errb.String())
	}
}

// A NATS .creds file holds a secret (an NKey seed): like a key file, one that others
// may read, or a symbolic link, is refused before anything connects.
func TestNATSCredsFileMustBePrivate(t *testing.T) {
	t.Setenv("SEALBRIDGE_HOME", t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := t.TempDir()
	open := filepath.Join(dir, "relay.creds")
	if err := os.WriteFile(open, []byte("-----BEGIN NATS USER JWT-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.creds")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	for _, creds := range []string{open, link} {
		var out, errb bytes.Buffer
		code := run(ctx, []string{"--listen=127.0.0.1:0", "--backend", "jetstream", "--nats-url", "nats://127.0.0.1:1",
			"--jetstream-sync-always", "--jetstream-replicas", "1", "--nats-creds", creds}, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), "NATS credentials file") || !strings.Contains(errb.String(), "chmod 600") {
			t.Errorf("--nats-creds %s: exit %d, stderr %q; want refused, saying chmod 600", filepath.Base(creds), code, errb.String())
		}
	}
}

// Every storage and limit flag pkg/relay defines is described by its usage text,
// which the help, the completions and the man page take its descriptions from.
func TestRelayFlagsDescribed(t *testing.T) {
	gfs := flag.NewFlagSet("x", flag.ContinueOnError)
	relay.AddBackendFlags(gfs)
	relay.AddLimitFlags(gfs)
	undescribed, unknown := cli.AddGoFlags(pflag.NewFlagSet("x", pflag.ContinueOnError), gfs, relay.BackendFlagsUsage+relay.LimitFlagsUsage)
	if undescribed != nil || unknown != nil {
		t.Fatalf("flags without a description in relay.BackendFlagsUsage/LimitFlagsUsage: %q; described but not defined: %q", undescribed, unknown)
	}
}

// On a busy address the relay exits 1 with the --listen hint before it creates
// anything: no data root, no key file, no store.
func TestBusyPortCreatesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	parent := t.TempDir()
	root := filepath.Join(parent, "root")
	keyFile := filepath.Join(parent, "relay.pem")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--listen", busy.Addr().String(), "--home", root, "--identity-file", keyFile}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "address already in use") || !strings.Contains(errb.String(), "hint: choose another address with --listen") {
		t.Fatalf("exit %d, stderr %q; want 1 with the --listen hint", code, errb.String())
	}
	if ents, err := os.ReadDir(parent); err != nil || len(ents) != 0 {
		t.Fatalf("a relay that could not listen created %v (%v)", ents, err)
	}
}
