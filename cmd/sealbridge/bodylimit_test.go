package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
)

// send refuses a body over envelope.MaxBodySize (the daemon's one limit) from a
// file or standard input before it connects: with no daemon running the answer is
// the limit and a hint, not "no daemon". A body of exactly the limit is sent, and
// send --help states the limit. (Before: 16 MiB was read, then the daemon answered
// 400 or 413 with other numbers.)
func TestSendBodyLimitBeforeConnecting(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	as := []string{"--home", home, "--identity", "alice", "--to", bob, "--relay", "http://127.0.0.1:9"}
	limit := fmt.Sprint(envelope.MaxBodySize)

	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), envelope.MaxBodySize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin = os.Stdin })
	for name, extra := range map[string][]string{"file": {"--file", big}, "stdin": nil} {
		stdin = bytes.NewReader(bytes.Repeat([]byte("x"), envelope.MaxBodySize+1))
		code, _, errs := sb(t, append([]string{"send"}, append(as, extra...)...)...)
		if code != exitFailure || !strings.Contains(errs, "over the limit of "+limit+" bytes") ||
			!strings.Contains(errs, "sealbridge: hint: a message body is at most "+limit+" bytes") {
			t.Errorf("%s: a body one byte over the limit, no daemon: exit %d\n%s", name, code, errs)
		}
	}

	startDaemon(t, home, "alice")
	exact := filepath.Join(t.TempDir(), "exact")
	if err := os.WriteFile(exact, bytes.Repeat([]byte("x"), envelope.MaxBodySize), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := sb(t, append([]string{"send", "--file", exact}, as...)...); code != exitOK {
		t.Fatalf("a body of exactly the limit: exit %d\n%s", code, errs)
	}
	if _, out, _ := sb(t, "send", "--help"); !strings.Contains(strings.Join(strings.Fields(out), " "), "at most "+limit+" bytes") {
		t.Fatalf("send --help does not state the limit %s:\n%s", limit, out)
	}
}
