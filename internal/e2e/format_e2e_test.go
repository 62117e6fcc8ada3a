package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// treeDigest is every name under root with its mode and the SHA-256 of its bytes: what
// a binary that "changes nothing" must leave as it found.
func treeDigest(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := de.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		b.WriteString(rel + " " + info.Mode().String())
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			b.WriteString(" " + hex.EncodeToString(sum[:]))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// plantHead writes, as the store's owner would, a head of a format newer than this
// build's into the store directory dir.
func plantHead(t *testing.T, dir string, owner *identity.Identity) {
	t.Helper()
	data, err := envelope.SignStoreHead(owner.Signer(), envelope.StoreHead{Owner: owner.DID(),
		Format: store.FormatVersion + 1, Seq: 7, Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, store.HeadFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A store whose head names a newer format than this build's is refused by every
// binary that opens it — the daemon, the backup, fsck (checking and repairing), the
// relay on its own store — with STORE_FORMAT_NEWER, and nothing in it is changed.
func TestEveryBinaryRefusesANewerFormat(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bins := buildRulesBinaries(t)
	h := newRulesHomes(t)
	owner, err := identity.LoadKeyFile(dataroot.KeyFile(h.home, "default"))
	if err != nil {
		t.Fatal(err)
	}
	relayID, err := identity.LoadKeyFile(filepath.Join(h.relayHome, "relay-identity.pem"))
	if err != nil {
		t.Fatal(err)
	}
	plantHead(t, h.storeDir, owner)
	plantHead(t, h.relayStore, relayID)
	before, relayBefore := treeDigest(t, h.home), treeDigest(t, h.relayHome)
	dest := filepath.Join(filepath.Dir(h.home), "copy")
	for _, c := range []struct {
		name, bin, up string
		args          []string
	}{
		{"sealbridged", bins.daemon, "daemon: ready", []string{"--home", h.home}},
		{"sealbridge backup", bins.cli, "", []string{"backup", "--home", h.home, dest}},
		{"sealbridge-fsck", bins.fsck, "", []string{"--home", h.home, "--identity", h.did}},
		{"sealbridge-fsck --repair", bins.fsck, "", []string{"--repair", "--home", h.home, "--identity", h.did}},
		{"sealbridge-relay", bins.relay, "listening ", []string{"--listen", "127.0.0.1:0", "--home", h.relayHome}},
	} {
		res := runRules(t, c.up, c.bin, c.args...)
		switch {
		case res.up:
			t.Errorf("%s started on a store of a newer format:\n%s", c.name, res.out)
		case res.code == 0:
			t.Errorf("%s exited 0 on a store of a newer format:\n%s", c.name, res.out)
		case !strings.Contains(res.out, "STORE_FORMAT_NEWER"):
			t.Errorf("%s (exit %d) does not say STORE_FORMAT_NEWER:\n%s", c.name, res.code, res.out)
		}
	}
	if _, err := os.Lstat(dest); err == nil {
		t.Errorf("sealbridge backup left %s", dest)
	}
	if after := treeDigest(t, h.home); after != before {
		t.Errorf("the home changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if after := treeDigest(t, h.relayHome); after != relayBefore {
		t.Errorf("the relay home changed:\nbefore:\n%s\nafter:\n%s", relayBefore, after)
	}
}
