package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/daemon"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// bin is the sealbridge-fsck binary built once for this package's tests.
var bin string

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "sealbridge-fsck-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// No test sees the user's data root: the default one is under an empty home.
	home := filepath.Join(tmp, "home")
	os.Setenv("HOME", home)
	for _, v := range []string{"SEALBRIDGE_HOME", "SEALBRIDGE_IDENTITY", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"} {
		os.Unsetenv(v)
	}
	bin = filepath.Join(tmp, "sealbridge-fsck")
	// -buildvcs=auto: stamp the VCS revision when built inside a checkout.
	if out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building sealbridge-fsck: %v\n%s", err, out)
		os.RemoveAll(tmp)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

// execBin runs the binary, in a temporary working directory, and returns its exit
// code and output.
func execBin(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return result{0, out.String(), errb.String()}
	case errors.As(err, &ee):
		return result{ee.ExitCode(), out.String(), errb.String()}
	}
	t.Fatal(err)
	return result{}
}

// TestBinary: the built program agrees with the goldens and the exit codes.
func TestBinary(t *testing.T) {
	for _, name := range []string{"combined", "valid", "live-lock"} {
		t.Run(name, func(t *testing.T) {
			dir := fsfixtures.Build(t, name)
			hash := fsfixtures.HashTree(t, dir)
			r := execBin(t, "--json", dir)
			if diff := fsfixtures.DiffGolden(fsfixtures.ReadGolden(t, name), goldenOf(r.code, doc(t, r).Findings)); diff != "" {
				t.Fatalf("binary --json differs from the golden:\n%s", diff)
			}
			if fsfixtures.HashTree(t, dir) != hash {
				t.Fatal("a read-only run changed the store")
			}
			want := map[string]int{"combined": exitRepaired, "valid": exitClean, "live-lock": exitOperational}[name]
			if rr := execBin(t, "--repair", dir); rr.code != want {
				t.Fatalf("--repair exit %d, want %d\n%s%s", rr.code, want, rr.stdout, rr.stderr)
			}
			if name == "live-lock" {
				if fsfixtures.HashTree(t, dir) != hash {
					t.Fatal("--repair with a live lock (held by another process) changed the store")
				}
				return
			}
			if again := execBin(t, dir); again.code != exitClean {
				t.Fatalf("second run exit %d\n%s", again.code, again.stdout)
			}
		})
	}
}

func TestBinaryVersionAndHelp(t *testing.T) {
	r := execBin(t, "--version")
	if r.code != 0 || !regexp.MustCompile(`^sealbridge-fsck \S+( rev [0-9a-f]{12}(\+dirty)?)? go1\.\S+\n$`).MatchString(r.stdout) {
		t.Fatalf("exit %d: %q", r.code, r.stdout)
	}
	h := execBin(t, "-h")
	for _, code := range []string{"  0 ", "  1 ", "  4 ", "  8 ", "  16 ", "  32 "} {
		if !strings.Contains(h.stdout, code) {
			t.Errorf("help does not list exit code %q", code)
		}
	}
	// No arguments: the default identity at the default data root (none here).
	if u := execBin(t); u.code != exitOperational || !strings.Contains(u.stderr, "no identity default at "+filepath.Join(os.Getenv("HOME"), ".local/state/sealbridge/identities/default.key")) {
		t.Fatalf("no arguments: exit %d\n%s", u.code, u.stderr)
	}
}

// interruptAfter starts the binary, waits for a stderr line matching trigger, sends
// SIGINT, and returns the exit code and stderr.
func interruptAfter(t *testing.T, trigger *regexp.Regexp, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var errb strings.Builder
	sc := bufio.NewScanner(stderr)
	signalled := false
	for sc.Scan() {
		errb.WriteString(sc.Text() + "\n")
		if !signalled && trigger.MatchString(sc.Text()) {
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			signalled = true
		}
	}
	err = cmd.Wait()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if !signalled {
		t.Fatalf("never saw %q on stderr:\n%s", trigger, errb.String())
	}
	return result{code, out.String(), errb.String()}
}

// TestSIGINTDuringCheck: Ctrl-C during a check exits 32 and the store is unchanged.
func TestSIGINTDuringCheck(t *testing.T) {
	dir := fsfixtures.Build(t, "valid-large", fsfixtures.Records(6000))
	hash := fsfixtures.HashTree(t, dir)
	r := interruptAfter(t, regexp.MustCompile(`^sealbridge-fsck: checked [1-9][0-9]*/6000 records$`), "--progress", dir)
	if r.code != exitCancelled || !strings.Contains(r.stderr, "cancelled; the store is intact") {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	if fsfixtures.HashTree(t, dir) != hash {
		t.Fatal("an interrupted check changed the store")
	}
}

// TestSIGINTDuringRepair: Ctrl-C during a repair exits 32, every file is in place or
// in lost+found with its note, and the next repair finishes the job.
func TestSIGINTDuringRepair(t *testing.T) {
	dir := fsfixtures.Build(t, "valid-large", fsfixtures.Records(900))
	// Break every batch marker (a second line): 300 unusable markers and their 300
	// orphan members to move, one by one.
	const total = 600
	ents, err := os.ReadDir(filepath.Join(dir, string(record.KindBatches)))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		f, err := os.OpenFile(filepath.Join(dir, string(record.KindBatches), e.Name()), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("{}\n"); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	files := fsfixtures.Files(t, dir)
	r := interruptAfter(t, regexp.MustCompile(`^sealbridge-fsck: repaired [1-9][0-9]*/600 problems$`), "--progress", "--repair", dir)
	if r.code != exitCancelled || !regexp.MustCompile(`cancelled; the store is intact \(\d+ changes? made\)`).MatchString(r.stderr) {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	fsfixtures.AssertKept(t, dir, files, func(string) bool { return false })
	moved := len(fsfixtures.LostFound(t, dir))
	if moved == 0 || moved == total {
		t.Fatalf("interrupted after %d of %d moves: not during the repair", moved, total)
	}
	t.Logf("interrupted after %d of %d moves", moved, total)
	rr := runArgs(t, "--repair", "--json", dir)
	if rr.code != exitRepaired {
		t.Fatalf("the next repair: exit %d\n%s", rr.code, rr.stdout)
	}
	var d document
	if err := json.Unmarshal([]byte(rr.stdout), &d); err != nil || len(*d.Repairs) != total-moved {
		t.Fatalf("the next repair made %d moves, want %d (%v)", len(*d.Repairs), total-moved, err)
	}
	if again := runArgs(t, dir); again.code != exitClean {
		t.Fatalf("then: exit %d", again.code)
	}
	fsfixtures.AssertKept(t, dir, files, func(string) bool { return false })
}

// TestIdentityWithNoStoreYet: right after `sealbridge init` (daemon.InitIdentity: the
// key file, no store yet), --identity NAME checks a healthy identity with nothing
// stored: exit 0 with the note store-absent, for a check and a repair alike, and
// nothing is created. On the code before, it exited 8 ("does not exist"). A STORE-DIR
// given by path that does not exist is still an operational error.
func TestIdentityWithNoStoreYet(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	id, err := daemon.InitIdentity(root, "new")
	if err != nil {
		t.Fatal(err)
	}
	storeDir := dataroot.StoreDir(root, string(id.DID()))
	r := execBin(t, "--home", root, "--identity", "new")
	if r.code != exitClean || !strings.Contains(r.stdout, ": 0 records checked, 0 problems (0 repairable), 1 note") ||
		!strings.Contains(r.stdout, "store-absent") || !strings.Contains(r.stdout, "its owner has stored nothing yet") {
		t.Fatalf("check: exit %d\nstdout:\n%sstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = execBin(t, "--home", root, "--identity", "new", "--json")
	d := doc(t, r)
	if r.code != exitClean || d.ExitCode != exitClean || d.Owner != string(id.DID()) || len(d.Findings) != 1 ||
		d.Findings[0].Code != "store-absent" || d.Findings[0].Severity != "note" || d.Error != "" {
		t.Fatalf("--json: exit %d\n%s", r.code, r.stdout)
	}
	if r := execBin(t, "--home", root, "--identity", "new", "--repair"); r.code != exitClean {
		t.Fatalf("--repair: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Lstat(storeDir); !os.IsNotExist(err) {
		t.Fatalf("fsck created the store directory: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, dataroot.DeliveryDir)); !os.IsNotExist(err) {
		t.Fatalf("fsck created delivery/: %v", err)
	}
	// Named by its path, a missing directory is still what it was: exit 8.
	if r := execBin(t, storeDir); r.code != exitOperational || !strings.Contains(r.stderr, "does not exist") {
		t.Fatalf("STORE-DIR that does not exist: exit %d\n%s", r.code, r.stderr)
	}
	// An identity that does not exist is not an empty store either.
	if r := execBin(t, "--home", root, "--identity", "other"); r.code != exitOperational {
		t.Fatalf("--identity of no identity: exit %d\n%s", r.code, r.stderr)
	}
}
