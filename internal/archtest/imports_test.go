// Package archtest holds the test that keeps the package map of DESIGN §2: imports
// point down only, and every package uses only the dependencies it is allowed.
package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/sealbridge/sealbridge"

// allowed lists, per package, the module packages and third-party modules its
// non-test code may import. The standard library is always allowed.
var allowed = map[string][]string{
	"pkg/errcode":        {},
	"internal/buildinfo": {},
	"internal/dataroot":  {"pkg/errcode"},
	"internal/lru":       {},
	"internal/uuid":      {},
	// cli: the command trees' conventions; cobra (with pflag and its doc package)
	// makes each binary's help, completions and man pages from one definition.
	"internal/cli":       {"pkg/errcode", "internal/bytesize", "github.com/spf13/cobra", "github.com/spf13/pflag"},
	"internal/bytesize":  {},
	"internal/fsx":       {"internal/uuid", "golang.org/x/sys"},
	"internal/lockfile":  {"internal/fsx", "github.com/gofrs/flock", "golang.org/x/sys"},
	"internal/crashtest": {"internal/fsx"},
	// conctest: the concurrency explorer's history, model and checker (test-only); the
	// explorer itself, which drives the store and the carrier, is in its tests.
	"internal/conctest": {"pkg/record", "pkg/errcode", "github.com/anishathalye/porcupine", "golang.org/x/sys"},
	// identity: its key files are written and read through internal/fsx, never by
	// system calls of its own.
	// It makes its key-file refusals' fixes as the data-root rules do (dataroot,
	// errcode hints).
	"pkg/identity": {"internal/fsx", "internal/dataroot", "pkg/errcode", "filippo.io/edwards25519", "github.com/mr-tron/base58"},
	"pkg/envelope": {"pkg/identity", "internal/uuid", "filippo.io/age"},
	"pkg/record":   {"pkg/envelope", "pkg/identity", "pkg/errcode", "internal/uuid"},
	// relayproto: the relay protocol, both of its sides: relay serves it, carrier and daemon speak it.
	"pkg/relayproto": {"pkg/envelope", "pkg/identity", "internal/uuid"},
	"pkg/store": {"pkg/record", "internal/fsx", "internal/lockfile", "internal/lru", "internal/dataroot", "pkg/identity",
		"pkg/envelope", "pkg/errcode", "internal/uuid"},
	// fsck: envelope only to learn an outbox envelope's blob (envelope.Parse, Blob).
	"pkg/fsck":    {"pkg/record", "pkg/store", "pkg/envelope", "pkg/identity", "internal/fsx", "internal/lockfile", "internal/dataroot", "pkg/errcode"},
	"pkg/carrier": {"pkg/record", "pkg/store", "pkg/envelope", "pkg/errcode", "pkg/identity", "pkg/relayproto", "internal/uuid", "golang.org/x/sys"},
	// reconcile: brings a restored store forward to what its relays hold, with the
	// carrier's own settle rule (carrier.SettleAccepted); it never posts.
	"pkg/reconcile": {"pkg/carrier", "pkg/store", "pkg/record", "pkg/envelope", "pkg/errcode", "pkg/identity", "pkg/relayproto"},
	"pkg/relay": {"pkg/record", "pkg/store", "pkg/envelope", "pkg/identity", "pkg/errcode", "pkg/relayproto", "internal/dataroot", "internal/fsx", "internal/uuid", "internal/bytesize",
		"pkg/relay/jsstore", "internal/promx", "github.com/nats-io/nats.go", "github.com/prometheus/client_golang"},
	// relay/jsstore: the relay's JetStream storage; it keeps bytes and fields and
	// neither parses envelopes nor signs (pkg/envelope only for the strict decoder).
	"pkg/relay/jsstore": {"pkg/envelope", "pkg/identity", "internal/uuid", "github.com/nats-io/nats.go"},
	"pkg/client":        {"pkg/errcode", "internal/dataroot"},
	"pkg/daemon": {"pkg/record", "pkg/carrier", "pkg/store", "pkg/identity", "pkg/envelope", "pkg/client", "pkg/errcode", "pkg/relayproto", "internal/bytesize",
		"internal/dataroot", "internal/uuid", "internal/promx", "github.com/prometheus/client_golang"},
	// promx: the Prometheus registry and /metrics handler the daemon and the relay share.
	"internal/promx": {"github.com/prometheus/client_golang"},
	// promtest: the promtool-like check of a /metrics answer, for tests only.
	"internal/promtest": {"github.com/prometheus/client_golang"},
	// natstest: in-process NATS servers for tests and benchmarks only; no other
	// package may import it (only _test.go files do), so nats-server stays out of
	// every binary.
	"internal/natstest": {"github.com/nats-io/nats-server/v2", "github.com/nats-io/nats.go"},
	"fsfixtures":        {"pkg/store", "pkg/record", "internal/dataroot", "pkg/identity", "pkg/envelope", "internal/fsx", "internal/uuid"},
}

func TestImportEdges(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}", module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, "|")
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		for _, imp := range strings.Fields(imports) {
			if !isThirdPartyOrModule(imp) {
				continue // standard library
			}
			if err := checkEdge(rel, imp); err != "" {
				t.Errorf("%s imports %s: %s", rel, imp, err)
			}
		}
	}
}

func isThirdPartyOrModule(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return strings.Contains(first, ".")
}

// checkEdge returns why pkg may not import imp, or "".
func checkEdge(pkg, imp string) string {
	inModule := strings.HasPrefix(imp, module+"/")
	target := strings.TrimPrefix(imp, module+"/")
	if strings.HasPrefix(pkg, "cmd/") {
		switch {
		case !inModule:
			return ""
		case strings.HasPrefix(target, "cmd/"):
			return "commands never import each other"
		case target == "fsfixtures" || target == "internal/crashtest" || target == "internal/conctest" || target == "internal/archtest" ||
			target == "internal/natstest" || target == "internal/promtest":
			return "test-only packages"
		}
		return ""
	}
	list, ok := allowed[pkg]
	if !ok {
		return "package is not in the package map (add it to archtest with its allowed imports)"
	}
	for _, a := range list {
		if target == a || (!inModule && (imp == a || strings.HasPrefix(imp, a+"/"))) {
			return ""
		}
	}
	return "not an allowed edge (DESIGN §2)"
}

func TestCheckEdgeRefusesUpwardImports(t *testing.T) {
	for _, c := range []struct{ pkg, imp string }{
		{"pkg/store", module + "/pkg/carrier"},
		{"pkg/identity", module + "/pkg/store"},
		{"internal/fsx", module + "/pkg/errcode"},
		{"pkg/client", module + "/pkg/store"},
		{"cmd/sealbridge", module + "/cmd/sealbridged"},
		{"cmd/sealbridge", module + "/fsfixtures"},
		{"cmd/sealbridge", module + "/internal/conctest"},
		{"pkg/store", module + "/internal/conctest"},
		{"internal/conctest", module + "/pkg/store"},
		{"pkg/store", "github.com/some/thing"},
		{"pkg/unknown", module + "/pkg/errcode"},
		{"pkg/relayproto", module + "/pkg/relay"},
		{"pkg/relayproto", module + "/pkg/store"},
		{"pkg/daemon", module + "/pkg/relay"},
		{"cmd/sealbridge-relay", module + "/internal/natstest"},
		{"pkg/relay", module + "/internal/natstest"},
		{"pkg/relay/jsstore", "github.com/nats-io/nats-server/v2/server"},
	} {
		if checkEdge(c.pkg, c.imp) == "" {
			t.Errorf("%s → %s was allowed", c.pkg, c.imp)
		}
	}
	for _, c := range []struct{ pkg, imp string }{
		{"pkg/store", module + "/internal/fsx"},
		{"internal/fsx", "golang.org/x/sys/unix"},
		{"cmd/sealbridge", module + "/pkg/store"},
		{"pkg/daemon", module + "/pkg/relayproto"},
		{"pkg/relay", module + "/pkg/relayproto"},
	} {
		if why := checkEdge(c.pkg, c.imp); why != "" {
			t.Errorf("%s → %s refused: %s", c.pkg, c.imp, why)
		}
	}
}
