package daemon

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The errors a user reads for a missing identity and a bad key file name the path
// once and carry one "identity" prefix; a bad name is an --identity OptionError.
func TestIdentityErrorsSayItOnce(t *testing.T) {
	home := t.TempDir()
	path := IdentityPath(home, "alice")
	_, err := LoadIdentity(home, "alice")
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing identity: %v, want os.ErrNotExist", err)
	}
	if msg := err.Error(); strings.Count(msg, path) != 1 || strings.Count(msg, "identity") != 1 {
		t.Errorf("missing identity: %q: want the path and \"identity\" once", msg)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("junk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadIdentity(home, "alice")
	if msg := err.Error(); err == nil || strings.Count(msg, path) != 1 || strings.Count(msg, "identity:") != 1 {
		t.Errorf("bad key file: %v: want the path and \"identity:\" once", err)
	}
	var oe *OptionError
	if _, err := LoadIdentity(home, "../x"); !errors.As(err, &oe) || oe.Option != "--identity" {
		t.Errorf("bad name: %v, want an --identity OptionError", err)
	}
}

// A store error answered by the API carries its code in "code" only, so the
// client's error reads "… 500 OUTBOX_STORE_INVALID: messages/…", not
// "OUTBOX_STORE_INVALID: OUTBOX_STORE_INVALID: …".
func TestStoreErrorCodeOnce(t *testing.T) {
	home := t.TempDir()
	id, err := InitIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Home: home, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	msgID := uuid.NewString()
	kindDir := filepath.Join(dataroot.StoreDir(home, string(id.DID())), string(record.KindMessages))
	if err := os.MkdirAll(kindDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kindDir, msgID+".json"), []byte("planted\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	d.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/messages/"+msgID, nil))
	ce := &client.Error{Status: rec.Code}
	if err := json.Unmarshal(rec.Body.Bytes(), ce); err != nil {
		t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
	}
	code := errcode.OutboxStoreInvalid.String()
	if rec.Code != http.StatusInternalServerError || ce.Code != code {
		t.Fatalf("answer %d %+v, want 500 %s", rec.Code, ce, code)
	}
	if msg := ce.Error(); strings.Count(msg, code) != 1 || !strings.Contains(msg, msgID) {
		t.Errorf("client error %q: want %s once and the record", msg, code)
	}
}
