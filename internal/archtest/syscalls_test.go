package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// fileCalls are the calls that make a change to a file durable or change a name:
// fsync, rename, link and unlink. Only internal/fsx makes them (the one durable-write
// path); everything else goes through fsx's FS, WriteFile, CreateFile, RemoveFile,
// Staged.Publish… The keys are import paths, the values function names; "" stands
// for a method call x.Sync() on any value (it cannot be told from here whether x is
// an *os.File, so each one outside fsx must be listed below).
var fileCalls = map[string][]string{
	"os":                    {"Rename", "Remove", "RemoveAll", "Link", "Truncate"},
	"syscall":               {"Fsync", "Fdatasync", "Rename", "Renameat", "Unlink", "Unlinkat", "Rmdir", "Link", "Sync"},
	"golang.org/x/sys/unix": {"Fsync", "Fdatasync", "Syncfs", "Rename", "Renameat", "Renameat2", "Unlink", "Unlinkat", "Rmdir", "Link", "Linkat", "Sync"},
	"":                      {"Sync"},
}

// fileCallExceptions are the places outside internal/fsx allowed to make one of
// fileCalls, keyed "path/of/file.go: call", each with its reason. Keep it short.
var fileCallExceptions = map[string]string{
	// The daemon's own runtime files, not data: the socket it listens on (removed
	// when stale or at exit) and the pid file it writes its pid into.
	"pkg/daemon/daemon.go: os.Remove": "the daemon's own Unix socket",
	"pkg/daemon/daemon.go: .Sync()":   "the daemon's pid file",
	// fsck's chmod is made on a descriptor fsx opened (fsx.File), so the Sync is
	// fsx's own method; fsx has no chmod yet.
	"pkg/fsck/chmod.go: .Sync()": "fsx.File.Sync after fchmod on an fsx descriptor",
	// The lock file's first contents are fsynced in its temp before the link that
	// makes it .lock (lockfile's create): fsx.File.Sync on a file fsx created, under
	// the lock temp's own name (.lock-<uuid>.tmp, which the lock sweeps), not fsx's.
	"internal/lockfile/lockfile.go: .Sync()": "fsx.File.Sync of the lock temp before its link",
	// Flushing the relay command's stdout (an *os.File) so a parent reading its
	// listening address sees it.
	"pkg/relay/command.go: .Sync()": "stdout, not a file the relay keeps",
	// get --out writes the user's file through fsx (a temp beside it, renamed over
	// it): the Sync is fsx.File's, on a file fsx created.
	"cmd/sealbridge/get.go: .Sync()": "fsx.File.Sync of get --out's temp before its rename",
	// The demo removes the temporary home it created (and only when asked to).
	"cmd/sealbridge/demo.go: os.RemoveAll": "the demo's own temp directory",
	// Test-only packages: they build broken stores and crash states on purpose.
	"fsfixtures/fsfixtures.go: os.Remove":  "test fixtures",
	"fsfixtures/fsfixtures.go: os.Rename":  "test fixtures",
	"internal/crashtest/model.go: os.Link": "crash-state explorer (test-only)",
}

// TestOnlyFsxMakesFileCalls enforces that only internal/fsx calls fsync, rename,
// link and unlink, outside the few exceptions above. Test files are not checked.
func TestOnlyFsxMakesFileCalls(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "internal/fsx" || (rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		calls, err := findFileCalls(p)
		if err != nil {
			return err
		}
		for _, c := range calls {
			key := rel + ": " + c.call
			if _, ok := fileCallExceptions[key]; ok {
				seen[key] = true
				continue
			}
			t.Errorf("%s:%d: %s: only internal/fsx makes fsync, rename, link and unlink calls; use fsx (or, for a file that is no data, add a justified exception to archtest)", rel, c.line, c.call)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for k := range fileCallExceptions {
		if !seen[k] {
			stale = append(stale, k)
		}
	}
	sort.Strings(stale)
	for _, k := range stale {
		t.Errorf("exception %q matches no call any more: remove it", k)
	}
}

type fileCall struct {
	call string
	line int
}

// findFileCalls parses one Go file and returns its calls of fileCalls.
func findFileCalls(path string) ([]fileCall, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	return fileCallsIn(fset, f), nil
}

func fileCallsIn(fset *token.FileSet, f *ast.File) []fileCall {
	imports := map[string]string{} // local name → import path
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		imports[name] = p
	}
	var out []fileCall
	ast.Inspect(f, func(n ast.Node) bool {
		// A call, or a function value (defer os.Remove(x) is a call too; passing
		// os.Remove along is caught as a selector).
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok {
			if p, ok := imports[id.Name]; ok {
				for _, fn := range fileCalls[p] {
					if sel.Sel.Name == fn {
						out = append(out, fileCall{call: id.Name + "." + fn, line: fset.Position(sel.Pos()).Line})
					}
				}
				return true
			}
		}
		for _, fn := range fileCalls[""] {
			if sel.Sel.Name == fn {
				out = append(out, fileCall{call: "." + fn + "()", line: fset.Position(sel.Pos()).Line})
			}
		}
		return true
	})
	return out
}

// TestFileCallsAreFound checks the scanner on code that makes each kind of call, so
// TestOnlyFsxMakesFileCalls cannot pass by finding nothing.
func TestFileCallsAreFound(t *testing.T) {
	src := `package p

import (
	"os"
	sys "syscall"

	"golang.org/x/sys/unix"
)

func f(g *os.File) {
	os.Rename("a", "b")
	defer os.Remove("a")
	_ = sys.Fsync(3)
	unix.Renameat2(0, "a", 0, "b", 0)
	unix.Unlinkat(0, "a", 0)
	g.Sync()
	rm := os.RemoveAll
	_ = rm
	os.ReadFile("a")   // not a file call
	unix.Openat(0, "a", 0, 0) // nor this
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range fileCallsIn(fset, f) {
		got = append(got, c.call)
	}
	want := []string{"os.Rename", "os.Remove", "sys.Fsync", "unix.Renameat2", "unix.Unlinkat", ".Sync()", "os.RemoveAll"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("found %v, want %v", got, want)
	}
}
