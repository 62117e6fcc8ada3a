package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// sealbridge backup runs beside the identity's daemon (it takes the store lock
// itself), prints what it copied and how to restore, and the copy is a store fsck
// finds clean, holding the messages sent before it. Unusable destinations are usage
// errors that write nothing.
func TestBackupCommand(t *testing.T) {
	home := shortHome(t)
	sb(t, "init", "--home", home, "--identity", "alice")
	_, out, _ := sb(t, "init", "--home", home, "--identity", "bob")
	bob := strings.TrimSpace(out)
	_, relayURL := startRelay(t)
	startDaemon(t, home, "alice")
	as := []string{"--home", home, "--identity", "alice"}
	var sent []string
	for _, body := range []string{"one", "two", "three"} {
		stdin = strings.NewReader(body)
		code, out, errs := sb(t, append([]string{"send", "--to", bob, "--relay", relayURL}, as...)...)
		if code != exitOK {
			t.Fatalf("send: %d %s", code, errs)
		}
		sent = append(sent, strings.TrimSpace(out))
	}
	stdin = os.Stdin

	id, err := daemon.LoadIdentity(home, "alice")
	if err != nil {
		t.Fatal(err)
	}
	// A destination laid out as a store directory, so that fsck checks it as one.
	dest := dataroot.StoreDir(filepath.Join(t.TempDir(), "copy"), string(id.DID()))
	if err := os.MkdirAll(filepath.Dir(dest), 0o700); err != nil {
		t.Fatal(err)
	}
	code, out, errs := sb(t, append([]string{"backup", dest}, as...)...)
	if code != exitOK || errs != "" {
		t.Fatalf("backup: exit %d\n%s%s", code, out, errs)
	}
	storeDir := dataroot.StoreDir(home, string(id.DID()))
	for _, want := range []string{"copied ", " to " + dest + "\n", "mv " + storeDir + " " + storeDir + ".old\n",
		"mv " + dest + " " + storeDir + "\n", "sealbridge-fsck --reconcile --home " + home + " --identity alice"} {
		if !strings.Contains(out, want) {
			t.Errorf("backup output lacks %q:\n%s", want, out)
		}
	}
	rep, err := fsck.Check(context.Background(), dest, fsck.Options{Owner: id.DID()})
	if err != nil || rep.Problems() != 0 {
		t.Fatalf("fsck of the copy: %v, %+v", err, rep)
	}
	c, err := store.Open(id.Signer(), store.Options{Dir: dest})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.List(record.KindMessages)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sent {
		if !slices.Contains(msgs, m) {
			t.Errorf("message %s sent before the backup is not in the copy (%v)", m, msgs)
		}
	}

	parent := t.TempDir()
	link := filepath.Join(parent, "link")
	if err := os.Symlink(parent, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		errs string
	}{
		{"dest exists", []string{"backup", dest}, exitUsage, "it exists"},
		{"parent missing", []string{"backup", filepath.Join(parent, "no", "copy")}, exitUsage, "does not exist"},
		{"parent a symlink", []string{"backup", filepath.Join(link, "copy")}, exitUsage, "symbolic link"},
		{"inside the store", []string{"backup", filepath.Join(storeDir, "copy")}, exitUsage, "inside the store"},
		{"no dest", []string{"backup"}, exitUsage, "give exactly one DEST"},
		{"empty dest", []string{"backup", ""}, exitUsage, "empty"},
		{"no such identity", []string{"backup", "--home", home, "--identity", "carol", filepath.Join(parent, "c")}, exitFailure, "sealbridge init"},
	} {
		args := tc.args
		if tc.name != "no such identity" {
			args = append(args, as...)
		}
		code, out, errs := sb(t, args...)
		if code != tc.code || out != "" || !strings.Contains(errs, tc.errs) || !strings.Contains(errs, "sealbridge: hint: ") {
			t.Errorf("%s: exit %d (want %d), stdout %q, stderr %q (want %q and a hint)", tc.name, code, tc.code, out, errs, tc.errs)
		}
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		t.Errorf("refused backups left %v", ents)
	}
}
