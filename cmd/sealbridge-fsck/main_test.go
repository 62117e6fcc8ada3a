package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func runArgs(t *testing.T, args ...string) result {
	t.Helper()
	return runCtx(t, context.Background(), args...)
}

func runCtx(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := runContext(ctx, args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// doc decodes a --json document strictly (the schema of docs/FSCK.md).
func doc(t *testing.T, r result) document {
	t.Helper()
	var d document
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("--json output is not one document: %v\n%s", err, r.stdout)
	}
	if dec.More() {
		t.Fatalf("--json printed more than one document:\n%s", r.stdout)
	}
	if d.Schema != schema || d.ExitCode != r.code {
		t.Fatalf("document schema %q exitCode %d, process exit %d", d.Schema, d.ExitCode, r.code)
	}
	return d
}

func goldenOf(code int, findings []fsck.Finding) fsfixtures.Golden {
	g := fsfixtures.Golden{ExitCode: code, Findings: []fsfixtures.GoldenFinding{}}
	for _, f := range findings {
		g.Findings = append(g.Findings, fsfixtures.GoldenFinding{Code: string(f.Code), Severity: string(f.Severity),
			Path: f.Path, Explanation: f.Explanation, Action: f.Action, Repairable: f.Repairable})
	}
	return g
}

func TestUsage(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	for _, c := range []struct {
		name    string
		args    []string
		code    int
		stdout  string // substring
		stderr  string // substring
		nothing bool   // stdout must be empty
	}{
		{name: "help", args: []string{"-h"}, code: 0, stdout: "Exit status:"},
		{name: "help lists every exit code", args: []string{"--help"}, code: 0, stdout: "32  cancelled"},
		{name: "no store: the default identity", args: nil, code: 8, stderr: "no identity default at ", nothing: true},
		{name: "two stores", args: []string{dir, dir}, code: 16, stderr: "one STORE-DIR only", nothing: true},
		{name: "unknown flag", args: []string{"--fix", dir}, code: 16, stderr: "unknown flag: --fix", nothing: true},
		{name: "home without identity: default", args: []string{"--home", dir}, code: 8, stderr: "no identity default at " + dir + "/identities/default.key", nothing: true},
		{name: "identity not a name", args: []string{"--identity", "../x"}, code: 16, stderr: "is not an identity name", nothing: true},
		{name: "unknown identity name", args: []string{"--home", dir, "--identity", "alice"}, code: 8, stderr: "sealbridge init --home " + dir + " --identity alice", nothing: true},
		{name: "bad identity", args: []string{"--identity", "did:key:zNope", dir}, code: 16, stderr: "not a valid did:key", nothing: true},
		{name: "dir and home", args: []string{"--home", "/x", "--identity", string(fsfixtures.OwnerDID()), dir}, code: 16, stderr: "not both", nothing: true},
		{name: "empty dir", args: []string{""}, code: 16, stderr: "an argument is empty", nothing: true},
		{name: "empty home", args: []string{"--home", "", "--identity", "default"}, code: 16, stderr: "--home is empty", nothing: true},
		{name: "empty identity", args: []string{"--identity=", dir}, code: 16, stderr: "--identity is empty", nothing: true},
		{name: "a data root", args: []string{fsfixtures.DataRoot(dir)}, code: 8, stderr: "hint: nothing was changed; to check a store of this data root: sealbridge-fsck --home " + fsfixtures.DataRoot(dir) + " --identity NAME|DID", nothing: true},
		{name: "version", args: []string{"--version"}, code: 0, stdout: "sealbridge-fsck "},
		{name: "missing store", args: []string{filepath.Join(dir, "nope")}, code: 8, stderr: "does not exist", nothing: true},
		{name: "store is a file", args: []string{filepath.Join(dir, ".generation")}, code: 8, stderr: "not a directory", nothing: true},
		{name: "foreign identity", args: []string{"--identity", string(fsfixtures.Foreign().DID()), dir}, code: 8, stderr: "another identity", nothing: true},
		{name: "flags after the store", args: []string{dir, "--json"}, code: 0, stdout: `"schema": "sealbridge-fsck/v1"`},
		{name: "clean", args: []string{dir}, code: 0, stdout: "12 records checked, 0 problems"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runArgs(t, c.args...)
			if r.code != c.code || !strings.Contains(r.stdout, c.stdout) || !strings.Contains(r.stderr, c.stderr) || (c.nothing && r.stdout != "") {
				t.Fatalf("exit %d (want %d)\nstdout: %s\nstderr: %s", r.code, c.code, r.stdout, r.stderr)
			}
		})
	}
}

// TestOperationalErrorJSON: with --json, an operational error is still one document.
func TestOperationalErrorJSON(t *testing.T) {
	r := runArgs(t, "--json", filepath.Join(t.TempDir(), "nope"))
	d := doc(t, r)
	if r.code != exitOperational || d.Error == "" || d.Summary != nil {
		t.Fatalf("exit %d, doc %+v", r.code, d)
	}
}

// removable reports the paths a repair may delete: stale temps, a stale lock and
// orphan lock temps (the only deletions fsck makes).
func removable(findings []fsck.Finding) func(string) bool {
	set := map[string]bool{}
	for _, f := range findings {
		switch f.Code {
		case fsck.CodeTempLeftover, fsck.CodeLockStale, fsck.CodeLockTempLeftover:
			set[f.Path] = true
		}
	}
	return func(p string) bool { return set[p] }
}

// TestFixtures checks, for every fixture: --json equals the
// golden findings and exit code; a read-only run changes nothing (names, bytes, modes,
// mtimes); --repair exits 1 (0 when there is nothing to repair, 8 with a live lock,
// changing nothing); a second run exits 0; every record valid before is still there,
// byte-identical, or — if fsck flagged it — moved into lost+found, byte-identical,
// with its note; and nothing but stale temps and locks was deleted.
func TestFixtures(t *testing.T) {
	for _, name := range fsfixtures.Names() {
		t.Run(name, func(t *testing.T) {
			dir := fsfixtures.Build(t, name)
			valid := fsfixtures.ValidRecords(t, dir)
			files := fsfixtures.Files(t, dir)
			hash := fsfixtures.HashTree(t, dir)

			r := runArgs(t, "--json", dir)
			d := doc(t, r)
			want := fsfixtures.ReadGolden(t, name)
			if diff := fsfixtures.DiffGolden(want, goldenOf(r.code, d.Findings)); diff != "" {
				t.Fatalf("--json differs from %s:\n%s", fsfixtures.GoldenPath(name), diff)
			}
			if h := runArgs(t, dir); h.code != r.code {
				t.Fatalf("human run exit %d, --json run %d", h.code, r.code)
			}
			if got := fsfixtures.HashTree(t, dir); got != hash {
				t.Fatal("a read-only run changed the store")
			}

			rr := runArgs(t, append(signWith(t, name, dir), "--repair", "--json", dir)...)
			rd := doc(t, rr)
			switch {
			case name == "live-lock":
				if rr.code != exitOperational || !strings.Contains(rd.Error, "in use") {
					t.Fatalf("--repair with a live lock: exit %d, error %q", rr.code, rd.Error)
				}
				if got := fsfixtures.HashTree(t, dir); got != hash {
					t.Fatal("--repair with a live lock changed the store")
				}
				return
			case want.ExitCode == exitClean:
				if rr.code != exitClean || len(*rd.Repairs) != 0 {
					t.Fatalf("--repair of a clean store: exit %d, %d repairs", rr.code, len(*rd.Repairs))
				}
			case leavesProblems[name] > 0:
				// A body that is gone cannot be repaired: the record naming it is left
				// reporting blob-missing, not repairable.
				left := leavesProblems[name]
				if rr.code != exitProblems || *rd.Summary.Left != left || len(*rd.Remaining) == 0 {
					t.Fatalf("--repair exit %d, %d left, want %d and %d:\n%s", rr.code, *rd.Summary.Left, exitProblems, left, rr.stdout)
				}
				for _, a := range *rd.Repairs {
					if a.Result != fsck.ResultDone {
						t.Errorf("repair %s %s: %s (%s)", a.Code, a.Path, a.Result, a.Detail)
					}
				}
				for _, f := range *rd.Remaining {
					if f.Severity == fsck.Problem && (f.Code != fsck.CodeBlobMissing || f.Repairable) {
						t.Errorf("left %+v", f)
					}
				}
			default:
				if rr.code != exitRepaired {
					t.Fatalf("--repair exit %d, want 1:\n%s", rr.code, rr.stdout)
				}
				for _, a := range *rd.Repairs {
					if a.Result != fsck.ResultDone {
						t.Errorf("repair %s %s: %s (%s)", a.Code, a.Path, a.Result, a.Detail)
					}
				}
				if *rd.Summary.Left != 0 || rd.RepairCommand != "" {
					t.Errorf("left %d, repairCommand %q", *rd.Summary.Left, rd.RepairCommand)
				}
			}

			wantAgain := exitClean
			if leavesProblems[name] > 0 {
				wantAgain = exitProblems
			}
			again := runArgs(t, "--json", dir)
			if ad := doc(t, again); again.code != wantAgain {
				t.Fatalf("second run exit %d: %+v", again.code, ad.Findings)
			}
			if rr2 := runArgs(t, "--repair", "--json", dir); rr2.code != wantAgain || len(*doc(t, rr2).Repairs) != 0 {
				t.Fatalf("a second --repair was not a no-op: exit %d\n%s", rr2.code, rr2.stdout)
			}

			flagged := map[string]bool{}
			for _, f := range d.Findings {
				flagged[f.Path] = true
			}
			for p, data := range valid {
				if got, err := os.ReadFile(filepath.Join(dir, p)); err == nil && bytes.Equal(got, data) {
					continue
				}
				if !flagged[p] {
					t.Errorf("valid record %s, not flagged, is not in place byte-identical after repair", p)
				}
			}
			fsfixtures.AssertKept(t, dir, files, removable(d.Findings))
		})
	}
}

// leavesProblems are the fixtures whose repair leaves problems it cannot repair, with
// how many: a large body that is gone (absent, or moved to lost+found because it was
// damaged) leaves each record that still needs it reporting blob-missing.
var leavesProblems = map[string]int{"blob-missing": 2, "blob-truncated": 1, "blob-digest": 1}

// stateFixtures are the fixtures whose repair rewrites records (the state rules),
// which needs the owner's key.
var stateFixtures = map[string]bool{"message-status": true, "held-flags": true}

// signWith gives a state fixture's data root the owner's key file and returns the
// arguments that name it; nil for the other fixtures.
func signWith(t *testing.T, name, dir string) []string {
	t.Helper()
	if !stateFixtures[name] {
		return nil
	}
	root := fsfixtures.DataRoot(dir)
	if err := os.MkdirAll(filepath.Join(root, dataroot.IdentitiesDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := identity.WriteKeyFile(dataroot.KeyFile(root, "owner"), fsfixtures.Owner()); err != nil {
		t.Fatal(err)
	}
	return []string{"--identity", "owner"}
}

// TestStateRepairNeedsTheKey: without the owner's key, a state problem is reported
// as not repairable and repair leaves it (exit 4) and the records as they were.
func TestStateRepairNeedsTheKey(t *testing.T) {
	dir := fsfixtures.Build(t, "message-status")
	hash := fsfixtures.HashTree(t, dir)
	r := runArgs(t, "--repair", "--json", dir)
	if r.code != exitProblems {
		t.Fatalf("--repair without the key: exit %d, want %d", r.code, exitProblems)
	}
	if got := fsfixtures.HashTree(t, dir); got != hash {
		t.Fatal("--repair without the key changed the store")
	}
}

// TestHumanOutput: one summary line, one line per finding, and for problems left the
// exact command that repairs them — which does.
func TestHumanOutput(t *testing.T) {
	dir := fsfixtures.Build(t, "combined")
	r := runArgs(t, dir)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	want := fsfixtures.ReadGolden(t, "combined")
	if r.code != exitProblems || len(lines) != len(want.Findings)+2 {
		t.Fatalf("exit %d, %d lines for %d findings:\n%s", r.code, len(lines), len(want.Findings), r.stdout)
	}
	if !strings.HasPrefix(lines[0], "sealbridge-fsck: "+dir+": 16 records checked, 9 problems (9 repairable), 6 notes, in ") {
		t.Errorf("summary line: %s", lines[0])
	}
	for i, f := range want.Findings {
		if l := lines[i+1]; !strings.Contains(l, f.Code) || !strings.Contains(l, f.Path+": "+f.Explanation) {
			t.Errorf("line %d %q does not show %s %s", i+1, l, f.Code, f.Path)
		}
	}
	last := lines[len(lines)-1]
	cmd := "sealbridge-fsck --repair " + dir
	if !strings.HasSuffix(last, ": "+cmd) {
		t.Fatalf("last line %q does not end with the repair command %q", last, cmd)
	}
	fields := strings.Fields(cmd)[1:]
	if rr := runArgs(t, fields...); rr.code != exitRepaired || !strings.Contains(rr.stdout, "after repair: 0 problems left") {
		t.Fatalf("the printed command: exit %d\n%s", rr.code, rr.stdout)
	}
	if again := runArgs(t, dir); again.code != exitClean {
		t.Fatalf("after the printed command: exit %d\n%s", again.code, again.stdout)
	}
}

// TestHomeIdentity: --home DIR --identity DID names the same store, and the repair
// command it prints uses the same form.
func TestHomeIdentity(t *testing.T) {
	dir := fsfixtures.Build(t, "truncated-record")
	home := fsfixtures.DataRoot(dir)
	owner := string(fsfixtures.OwnerDID())
	r := runArgs(t, "--json", "--home", home, "--identity", owner)
	d := doc(t, r)
	if r.code != exitProblems || d.Store != dir || d.OwnerSource != string(fsck.OwnerGiven) {
		t.Fatalf("exit %d, store %s (%s)", r.code, d.Store, d.OwnerSource)
	}
	want := "sealbridge-fsck --repair --home " + home + " --identity " + owner
	if d.RepairCommand != want {
		t.Fatalf("repairCommand %q, want %q", d.RepairCommand, want)
	}
	if rr := runArgs(t, strings.Fields(want)[1:]...); rr.code != exitRepaired {
		t.Fatalf("repair via --home: exit %d\n%s%s", rr.code, rr.stdout, rr.stderr)
	}
	t.Setenv("SEALBRIDGE_HOME", home)
	if r := runArgs(t, "--identity", owner); r.code != exitClean || !strings.Contains(r.stdout, dir) {
		t.Fatalf("--identity with $SEALBRIDGE_HOME: exit %d\n%s", r.code, r.stdout)
	}
}

// TestProgress: a bar on a terminal for a large store (or with --progress), lines
// with --progress on a non-terminal, and nothing otherwise.
func TestProgress(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	defer func(f func(io.Writer) bool) { isTerminal = f }(isTerminal)
	for _, c := range []struct {
		tty      bool
		args     []string
		contains string
	}{
		{false, []string{dir}, ""},
		{true, []string{dir}, ""}, // a small store: no bar
		{true, []string{"--progress", dir}, "\r\033[Kchecking ["},
		{false, []string{"--progress", dir}, "sealbridge-fsck: checked 12/12 records\n"},
	} {
		isTerminal = func(io.Writer) bool { return c.tty }
		r := runArgs(t, c.args...)
		if r.code != 0 || (c.contains == "" && r.stderr != "") || !strings.Contains(r.stderr, c.contains) {
			t.Errorf("tty=%v %v: exit %d, stderr %q", c.tty, c.args, r.code, r.stderr)
		}
		if c.tty && c.contains != "" && !strings.HasSuffix(r.stderr, "\r\033[K") {
			t.Errorf("the bar is not cleared at the end: %q", r.stderr)
		}
	}
	// A bar for a large store on a terminal, without --progress.
	var b bytes.Buffer
	bar := &progressBar{w: &b, tty: true, now: func() time.Time { return time.Unix(0, 0) }}
	bar.update(fsck.Progress{Stage: fsck.StageVerify, Done: 1, Total: largeStore})
	if !strings.Contains(b.String(), "checking [") {
		t.Errorf("no bar for a large store: %q", b.String())
	}
}

// TestCancelDuringCheck: a cancelled check exits 32 and changes nothing.
func TestCancelDuringCheck(t *testing.T) {
	dir := fsfixtures.Build(t, "valid-large", fsfixtures.Records(600))
	hash := fsfixtures.HashTree(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer func() { testOnlyProgress = nil }()
	testOnlyProgress = func(p fsck.Progress) {
		if p.Done > 0 && p.Done < p.Total {
			cancel()
		}
	}
	r := runCtx(t, ctx, "--json", dir)
	if r.code != exitCancelled || !strings.Contains(r.stderr, "cancelled; the store is intact") {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	if doc(t, r).Error == "" {
		t.Fatal("no error in the document")
	}
	if fsfixtures.HashTree(t, dir) != hash {
		t.Fatal("a cancelled check changed the store")
	}
}

// TestCancelDuringRepair: Ctrl-C between repairs exits 32 with the store intact
// (every file in place or in lost+found with its note); the next --repair finishes.
func TestCancelDuringRepair(t *testing.T) {
	dir := fsfixtures.Build(t, "combined")
	files := fsfixtures.Files(t, dir)
	first := runArgs(t, "--json", dir)
	findings := doc(t, first).Findings
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer func() { testOnlyRepair = nil }()
	n := 0
	testOnlyRepair = func(fsck.ActionResult) {
		if n++; n == 3 {
			cancel()
		}
	}
	r := runCtx(t, ctx, "--repair", dir)
	if r.code != exitCancelled || !strings.Contains(r.stderr, "(3 changes made)") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	fsfixtures.AssertKept(t, dir, files, removable(findings))
	testOnlyRepair = nil
	if rr := runArgs(t, "--repair", dir); rr.code != exitRepaired {
		t.Fatalf("the next repair: exit %d\n%s", rr.code, rr.stdout)
	}
	if again := runArgs(t, dir); again.code != exitClean {
		t.Fatalf("then: exit %d\n%s", again.code, again.stdout)
	}
	fsfixtures.AssertKept(t, dir, files, removable(findings))
}

// TestNotRepairableLeavesExit4: a problem fsck cannot repair keeps --repair at 4
// and names what to do.
func TestNotRepairableLeavesExit4(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	lf := filepath.Join(dir, "lost+found")
	if err := os.WriteFile(lf, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runArgs(t, "--repair", dir)
	if r.code != exitProblems || !strings.Contains(r.stdout, "not repairable: rename or remove it by hand") {
		t.Fatalf("exit %d\n%s", r.code, r.stdout)
	}
	if !slices.Contains(strings.Split(r.stdout, "\n"), "1 problem left that sealbridge-fsck cannot repair: see the actions above, then run: sealbridge-fsck --repair "+dir) {
		t.Fatalf("no advice line:\n%s", r.stdout)
	}
}
