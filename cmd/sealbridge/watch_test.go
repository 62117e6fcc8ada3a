package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// watch prints the reset it starts with, then one line per change, and ends
// cleanly when interrupted.
func TestWatch(t *testing.T) {
	home := shortHome(t)
	if code, _, errOut := sb(t, "init", "--home", home, "--identity", "alice"); code != 0 {
		t.Fatalf("init: %s", errOut)
	}
	d := startDaemon(t, home, "alice")
	if code, _, _ := sb(t, "watch", "--home", home, "--identity", "alice", "--topics", "nope"); code != exitUsage {
		t.Fatalf("unknown topic: exit %d", code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := runContext(ctx, []string{"watch", "--home", home, "--identity", "alice", "--topics", "messages"}, pw, io.Discard)
		pw.Close()
		done <- code
	}()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("watch ended")
			}
			return l
		case <-time.After(60 * time.Second):
			t.Fatal("no line from watch")
		}
		return ""
	}
	if l := next(); !strings.Contains(l, "reset (no cursor): snapshot of 0 messages") {
		t.Fatalf("first line: %q", l)
	}
	peer, _ := identity.Generate()
	m, err := client.New(d.SocketPath()).Send(ctx, client.SendRequest{To: client.Recipients{string(peer.DID())}, RelayURL: "http://127.0.0.1:9", Body: []byte("hi")}, "")
	if err != nil {
		t.Fatal(err)
	}
	if l := next(); !strings.HasSuffix(l, " messages "+m.MessageID+" queued") {
		t.Fatalf("change line: %q", l)
	}
	cancel()
	go func() { // drain what watch may still print
		for range lines {
		}
	}()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("watch exit %d", code)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("watch did not stop")
	}
}
