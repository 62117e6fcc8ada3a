package identity_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sealbridge/sealbridge/pkg/identity"
)

// writeKey writes a fresh identity to dir/name and returns it and the path.
func writeKey(t *testing.T, dir, name string) (*identity.Identity, string) {
	t.Helper()
	id := newID(t)
	path := filepath.Join(dir, name)
	if err := identity.WriteKeyFile(path, id); err != nil {
		t.Fatal(err)
	}
	return id, path
}

// pemBody is the base64 text of a PEM file, which no error may contain.
func pemBody(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if len(l) >= 16 && !strings.HasPrefix(l, "-----") {
			lines = append(lines, l[:min(len(l), 24)])
		}
	}
	return lines
}

func assertNoKeyBytes(t *testing.T, err error, body []string) {
	t.Helper()
	for _, l := range body {
		if strings.Contains(err.Error(), l) {
			t.Fatalf("error contains key file content: %v", err)
		}
	}
}

func TestKeyFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	id, path := writeKey(t, dir, "owner.key")

	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode() != 0o600 {
		t.Fatalf("mode on disk %v, want -rw-------", st.Mode())
	}
	data, _ := os.ReadFile(path)
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" || len(rest) != 0 {
		t.Fatalf("not one PRIVATE KEY PEM block:\n%s", data)
	}
	if _, err := x509.ParsePKCS8PrivateKey(block.Bytes); err != nil {
		t.Fatalf("not PKCS#8: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("staged files left behind: %v", entries)
	}

	loaded, err := identity.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.DID() != id.DID() {
		t.Fatalf("loaded %s, wrote %s", loaded.DID(), id.DID())
	}
	sig, err := identity.SignDomain(loaded.Signer(), identity.DomainEnvelope, b("p"))
	if err != nil || !identity.VerifyDomain(id.Public(), identity.DomainEnvelope, sig, b("p")) {
		t.Fatalf("loaded key does not sign for the written identity: %v", err)
	}

	// Relative paths work too.
	t.Chdir(dir)
	if err := identity.WriteKeyFile("relative.key", id); err != nil {
		t.Fatal(err)
	}
	if got, err := identity.LoadKeyFile("relative.key"); err != nil || got.DID() != id.DID() {
		t.Fatalf("relative: %v %v", got, err)
	}
}

func TestKeyFileModeIgnoresUmask(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	_, path := writeKey(t, t.TempDir(), "k")
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v with umask 0: %v", st.Mode(), err)
	}
}

func TestWriteKeyFileRefusesExisting(t *testing.T) {
	dir := t.TempDir()
	first, path := writeKey(t, dir, "owner.key")
	before, _ := os.ReadFile(path)

	err := identity.WriteKeyFile(path, newID(t))
	if !errors.Is(err, identity.ErrKeyFileExists) {
		t.Fatalf("second write: %v, want ErrKeyFileExists", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("existing key file changed")
	}
	if got, err := identity.LoadKeyFile(path); err != nil || got.DID() != first.DID() {
		t.Fatalf("existing key no longer loads: %v", err)
	}

	// A dangling symlink, a directory and an empty file are occupants too.
	dangling := filepath.Join(dir, "dangling")
	target := filepath.Join(dir, "target")
	if err := os.Symlink(target, dangling); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o700)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	for _, p := range []string{dangling, sub, empty} {
		if err := identity.WriteKeyFile(p, first); !errors.Is(err, identity.ErrKeyFileExists) {
			t.Errorf("WriteKeyFile(%s) = %v, want ErrKeyFileExists", p, err)
		}
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("write through a dangling symlink created its target")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("staged file left behind: %s", e.Name())
		}
	}
}

func TestWriteKeyFileErrors(t *testing.T) {
	id := newID(t)
	if err := identity.WriteKeyFile(filepath.Join(t.TempDir(), "missing", "k"), id); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing directory: %v", err)
	}
	if err := identity.WriteKeyFile(filepath.Join(t.TempDir(), "k"), nil); err == nil {
		t.Error("nil identity written")
	}
	if err := identity.WriteKeyFile("/", id); err == nil {
		t.Error("wrote to /")
	}
}

func TestLoadKeyFileRefusesMode(t *testing.T) {
	dir := t.TempDir()
	_, path := writeKey(t, dir, "k")
	body := pemBody(t, path)
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660, 0o606, 0o700, 0o610} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := identity.LoadKeyFile(path)
		if !errors.Is(err, identity.ErrKeyFileMode) {
			t.Fatalf("mode %04o: %v, want ErrKeyFileMode", mode, err)
		}
		assertNoKeyBytes(t, err, body)
	}
	for _, mode := range []os.FileMode{0o400, 0o600} {
		os.Chmod(path, mode)
		if _, err := identity.LoadKeyFile(path); err != nil {
			t.Fatalf("mode %04o refused: %v", mode, err)
		}
	}
}

func TestLoadKeyFileRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	_, path := writeKey(t, dir, "k")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	_, err := identity.LoadKeyFile(link)
	if !errors.Is(err, identity.ErrKeyFileType) {
		t.Fatalf("symlink: %v, want ErrKeyFileType", err)
	}
	if !errors.Is(err, unix.ELOOP) {
		t.Errorf("symlink error lost its errno: %v", err)
	}
}

func TestLoadKeyFileRefusesFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := identity.LoadKeyFile(path)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, identity.ErrKeyFileType) {
			t.Fatalf("FIFO: %v, want ErrKeyFileType", err)
		}
	case <-time.After(60 * time.Second):
		// Unblock the reader so the goroutine ends.
		if fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			unix.Close(fd)
		}
		t.Fatal("LoadKeyFile blocked on a FIFO")
	}
}

func TestLoadKeyFileRefusesOtherTypes(t *testing.T) {
	dir := t.TempDir()
	if _, err := identity.LoadKeyFile(dir); !errors.Is(err, identity.ErrKeyFileType) {
		t.Errorf("directory: %v, want ErrKeyFileType", err)
	}
	if _, err := identity.LoadKeyFile("/dev/null"); !errors.Is(err, identity.ErrKeyFileType) {
		t.Errorf("/dev/null: %v, want ErrKeyFileType", err)
	}
	_, path := writeKey(t, dir, "k")
	second := filepath.Join(dir, "hardlink")
	if err := os.Link(path, second); err != nil {
		t.Skipf("link: %v", err)
	}
	if _, err := identity.LoadKeyFile(path); !errors.Is(err, identity.ErrKeyFileType) {
		t.Errorf("hard-linked: %v, want ErrKeyFileType", err)
	}
	if _, err := identity.LoadKeyFile(filepath.Join(dir, "absent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("absent: %v, want fs.ErrNotExist", err)
	}
}

func TestLoadKeyFileRefusesForeignOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another user needs root")
	}
	_, path := writeKey(t, t.TempDir(), "k")
	body := pemBody(t, path)
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Skipf("chown: %v", err)
	}
	_, err := identity.LoadKeyFile(path)
	if !errors.Is(err, identity.ErrKeyFileOwner) {
		t.Fatalf("foreign owner: %v, want ErrKeyFileOwner", err)
	}
	assertNoKeyBytes(t, err, body)
}

func TestLoadKeyFileRefusesSize(t *testing.T) {
	dir := t.TempDir()
	_, path := writeKey(t, dir, "k")
	data, _ := os.ReadFile(path)
	big := filepath.Join(dir, "big")
	padded := append(data, bytes.Repeat([]byte("\n"), 16<<10)...)
	if err := os.WriteFile(big, padded, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.LoadKeyFile(big); !errors.Is(err, identity.ErrKeyFileSize) {
		t.Fatalf("oversize: %v, want ErrKeyFileSize", err)
	}
}

func TestLoadKeyFileRefusesContent(t *testing.T) {
	dir := t.TempDir()
	id, path := writeKey(t, dir, "k")
	good, _ := os.ReadFile(path)
	block, _ := pem.Decode(good)

	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKCS8PrivateKey(ec)
	pub := id.Public()
	spki, _ := x509.MarshalPKIXPublicKey(ed25519.PublicKey(pub))
	truncated := append([]byte(nil), block.Bytes[:len(block.Bytes)-1]...)

	cases := map[string][]byte{
		"empty":            nil,
		"garbage":          []byte("not a key\n"),
		"leading text":     append([]byte("comment\n"), good...),
		"trailing block":   append(append([]byte(nil), good...), good...),
		"trailing text":    append(append([]byte(nil), good...), "x\n"...),
		"ECDSA PKCS#8":     pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecDER}),
		"public key":       pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}),
		"wrong type label": pem.EncodeToMemory(&pem.Block{Type: "ED25519 PRIVATE KEY", Bytes: block.Bytes}),
		"headers":          pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: block.Bytes}),
		"truncated DER":    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: truncated}),
		"bad base64":       bytes.Replace(good, []byte("\n-----END"), []byte("!\n-----END"), 1),
	}
	for name, data := range cases {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := identity.LoadKeyFile(p)
		if !errors.Is(err, identity.ErrKeyFileFormat) {
			t.Errorf("%s: %v, want ErrKeyFileFormat", name, err)
			continue
		}
		assertNoKeyBytes(t, err, pemBody(t, path))
		assertNoKeyBytes(t, err, pemBody(t, p))
	}

	// Trailing white space is fine.
	p := filepath.Join(dir, "trailing-space")
	os.WriteFile(p, append(append([]byte(nil), good...), "\n\n"...), 0o600)
	if _, err := identity.LoadKeyFile(p); err != nil {
		t.Errorf("trailing newline refused: %v", err)
	}
}

func TestLoadOrCreateKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.key")
	first, created, err := identity.LoadOrCreateKeyFile(path)
	if err != nil || !created {
		t.Fatalf("first call: created=%v err=%v", created, err)
	}
	again, created, err := identity.LoadOrCreateKeyFile(path)
	if err != nil || created || again.DID() != first.DID() {
		t.Fatalf("second call: created=%v err=%v same=%v", created, err, again != nil && again.DID() == first.DID())
	}
	// An unusable file is an error, never silently replaced by a new identity.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := identity.LoadOrCreateKeyFile(path); !errors.Is(err, identity.ErrKeyFileMode) {
		t.Fatalf("0644 key file: %v, want ErrKeyFileMode", err)
	}
}

// TestKeyFileErrorsSayItOnce: each refusal names the package and the path once
// ("identity: key file PATH is not …"), never "identity: key file PATH: identity:
// key file …".
func TestKeyFileErrorsSayItOnce(t *testing.T) {
	dir := t.TempDir()
	_, good := writeKey(t, dir, "good.key")
	junk := filepath.Join(dir, "junk.key")
	if err := os.WriteFile(junk, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.key")
	if err := os.WriteFile(open, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.key")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	load := func(p string) func() error {
		return func() error { _, err := identity.LoadKeyFile(p); return err }
	}
	for _, c := range []struct {
		name, path string
		do         func() error
		want       error
	}{
		{"format", junk, load(junk), identity.ErrKeyFileFormat},
		{"mode", open, load(open), identity.ErrKeyFileMode},
		{"symlink", link, load(link), identity.ErrKeyFileType},
		{"directory", dir, load(dir), identity.ErrKeyFileType},
		{"exists", good, func() error { return identity.WriteKeyFile(good, newID(t)) }, identity.ErrKeyFileExists},
	} {
		err := c.do()
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
		msg := err.Error()
		if strings.Count(msg, "identity:") != 1 || strings.Count(msg, c.path) != 1 || !strings.HasPrefix(msg, "identity: key file "+c.path+" ") {
			t.Errorf("%s: %q: want \"identity: key file %s …\" with the prefix and the path once", c.name, msg, c.path)
		}
	}
}
