package carrier

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/pkg/store"
)

// runReal starts a carrier on the wall clock over store s and returns its sends.
func runReal(t *testing.T, s *store.Store, watch WatchMode) (*Carrier, chan sendRec) {
	t.Helper()
	started := make(chan sendRec, 16)
	tr := &scripted{started: started}
	c := New(s, tr, Options{Watch: watch, PollEvery: 20 * time.Millisecond, SweepEvery: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c, started
}

func expectSend(t *testing.T, started chan sendRec, id string) {
	t.Helper()
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	select {
	case s := <-started:
		if s.envelopeID != id {
			t.Fatalf("sent %s, want %s", s.envelopeID, id)
		}
	case <-timeout.C:
		t.Fatalf("the enqueue by another store instance was not noticed within 60 s")
	}
}

func testOtherWriter(t *testing.T, watch WatchMode, name string) {
	dir := t.TempDir()
	a := openStore(t, dir, store.Options{})
	b := openStore(t, dir, store.Options{}) // another process, as far as a is concerned
	c, started := runReal(t, a, watch)
	waitFor(t, "the watch to start", func() bool { return c.Stats().Watch == name })
	// The first write creates the store directory and the kind directories.
	r1 := request(relayA, 1, time.Now().Add(time.Hour))
	if _, err := b.Enqueue(context.Background(), r1); err != nil {
		t.Fatal(err)
	}
	expectSend(t, started, r1.Envelopes[0].EnvelopeID)
	waitFor(t, "the carrier to be idle", func() bool { return c.quiet(0, 0) })
	r2 := request(relayA, 1, time.Now().Add(time.Hour))
	if _, err := b.Enqueue(context.Background(), r2); err != nil {
		t.Fatal(err)
	}
	expectSend(t, started, r2.Envelopes[0].EnvelopeID)
	if c.Stats().Notifications == 0 {
		t.Fatal("no notification counted")
	}
}

// inotify notices an Enqueue by another Store instance on the same directory.
func TestInotifyNoticesOtherWriter(t *testing.T) { testOtherWriter(t, WatchInotify, "inotify") }

// Stamp polling, the fallback, does too.
func TestPollingNoticesOtherWriter(t *testing.T) { testOtherWriter(t, WatchPoll, "poll") }

// A store directory that does not exist yet when the watch starts (a fresh
// identity) and then appears with work in it, all between two looks of the
// watch, is noticed: the watch that is added late kicks the loop, as no event
// reports what was written before it. The directory is moved into place whole
// so that no event can report it on any schedule.
func TestInotifyNoticesStoreCreatedBetweenLooks(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "p")
	if err := os.Mkdir(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	a, err := store.Open(owner(t).Signer(), store.Options{Dir: filepath.Join(parent, "store")})
	if err != nil {
		t.Fatal(err)
	}
	c, started := runReal(t, a, WatchInotify)
	waitFor(t, "the watch to start", func() bool { return c.Stats().Watch == "inotify" })
	waitFor(t, "the carrier to be idle", func() bool { return c.quiet(0, 0) }) // it has looked
	stage := filepath.Join(parent, "stage")
	if err := os.Mkdir(stage, 0o700); err != nil {
		t.Fatal(err)
	}
	b := openStore(t, stage, store.Options{}) // another process, writing elsewhere first
	r := request(relayA, 1, time.Now().Add(time.Hour))
	if _, err := b.Enqueue(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(stage, "store"), filepath.Join(parent, "store")); err != nil {
		t.Fatal(err)
	}
	expectSend(t, started, r.Envelopes[0].EnvelopeID)
}
