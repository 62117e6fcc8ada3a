package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hold, a repeated hold, release, cancel, a repeated cancel and a hold of the
// cancelled message: one line per message saying what happened; a refusal exits 1
// with its code; a command line without exactly one selector is a usage error.
func TestQueueActionCommands(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	startDaemon(t, home, "alice")
	as := []string{"--home", home, "--identity", "alice"}
	srv := httptest.NewServer(http.NotFoundHandler())
	dead := srv.URL // refuses connections: the message stays queued
	srv.Close()
	stdin = strings.NewReader("hello")
	t.Cleanup(func() { stdin = os.Stdin })
	code, out, errs := sb(t, append([]string{"send", "--to", bob, "--relay", dead}, as...)...)
	if code != 0 {
		t.Fatalf("send: %d %s", code, errs)
	}
	id := strings.TrimSpace(out)

	// A retry that changes no record still attempts now, and says so (not
	// "unchanged"): the message is sent at once, or as its target's probe, or its
	// first attempt is still under way.
	code, out, errs = sb(t, append([]string{"retry", id}, as...)...)
	if code != 0 || strings.Contains(out, "unchanged") || !strings.Contains(out, " now") && !strings.Contains(out, "in flight: ") {
		t.Fatalf("retry of a queued message: exit %d %q %q; want what it does now", code, out, errs)
	}

	for _, step := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"hold", id, "--reason", "checking"}, exitOK, id + "  held (1 envelope)\n", ""},
		{[]string{"hold", id}, exitOK, id + "  already held\n", ""},
		{[]string{"release", "--target", dead}, exitOK, id + "  released (1 envelope)\n", ""},
		{[]string{"cancel", id}, exitOK, id + "  cancelled (1 envelope)", ""}, // a note may follow: an attempt in flight
		{[]string{"cancel", id}, exitOK, id + "  unchanged; ", ""},
		{[]string{"hold", id}, exitFailure, id + "  refused MESSAGE_CLOSED: ", "hold: 1 of 1 message refused (MESSAGE_CLOSED)"},
		{[]string{"retry", "--target", dead}, exitOK, "", "no message has envelopes pending to " + dead},
		{[]string{"hold"}, exitUsage, "", "give message ids or --target URL"},
		{[]string{"hold", id, "--target", dead}, exitUsage, "", "not both"},
		{[]string{"retry", "--target", ""}, exitUsage, "", "--target is empty"},
		{[]string{"hold", "not-a-uuid"}, exitUsage, "", `"not-a-uuid" is not a message id`},
		{[]string{"cancel", "--target", "ftp://relay"}, exitUsage, "", `--target "ftp://relay": relay URL: `},
	} {
		code, out, errs := sb(t, append(step.args, as...)...)
		if step.args[0] == "status" && (!strings.Contains(out, "hold by uid:") || !strings.Contains(out, ": checking")) {
			t.Errorf("status of a held message shows no hold by its caller with its reason:\n%s", out)
		}
		if code != step.code || !strings.HasPrefix(out, step.stdout) || !strings.Contains(errs, step.stderr) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, stdout %q…, stderr with %q",
				step.args, code, out, errs, step.code, step.stdout, step.stderr)
		}
	}
	code, out, _ = sb(t, append([]string{"status", id}, as...)...)
	if code != 0 || !strings.Contains(out, "cancelled") {
		t.Errorf("status after cancel: %d\n%s", code, out)
	}
}

// sealbridge relay on a busy address fails with the --listen hint and creates
// nothing: it listens before it makes its data root and key (as sealbridge-relay).
func TestRelayOnABusyPortCreatesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	parent := t.TempDir()
	code, _, errs := sb(t, "relay", "--listen", busy.Addr().String(), "--home", filepath.Join(parent, "root"))
	if code != 1 || !strings.Contains(errs, "address already in use") || !strings.Contains(errs, "hint: choose another address with --listen") {
		t.Fatalf("exit %d, stderr %q; want 1 with the --listen hint", code, errs)
	}
	if ents, err := os.ReadDir(parent); err != nil || len(ents) != 0 {
		t.Fatalf("a relay that could not listen created %v (%v)", ents, err)
	}
}
