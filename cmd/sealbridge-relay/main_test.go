package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/natstest"
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
		"--expire-every", "30s", "--max-conns", "512"}, &out, &errb)
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

// On a JetStream that is neither replicated nor declared synced the relay
// exits 1 at start saying which setting to change; declared, it starts.
func TestJetStreamBackendDurability(t *testing.T) {
	s := natstest.Node(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	base := []string{"--listen=127.0.0.1:0", "--home", t.TempDir(), "--backend", "jetstream", "--nats-url", s.ClientURL()}
	var out, errb bytes.Buffer
	code := run(ctx, append(base, "--jetstream-replicas", "1"), &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "--jetstream-sync-always") || !strings.Contains(errb.String(), "--jetstream-replicas 3") {
		t.Fatalf("unreplicated, undeclared: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run(ctx, append(base, "--jetstream-replicas", "1", "--jetstream-sync-always"), &out, &errb); code != 0 {
		t.Fatalf("declared sync_interval: always: exit %d, stderr %q", code, errb.String())
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
