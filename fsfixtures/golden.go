package fsfixtures

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
)

// Golden is what sealbridge-fsck must report for a fixture in its default, read-only
// mode: the exit code and every finding (paths relative to the store directory; no
// temporary directory names, ages or times).
type Golden struct {
	ExitCode int             `json:"exitCode"`
	Findings []GoldenFinding `json:"findings"`
}

// GoldenFinding is the stable part of one fsck finding (docs/FSCK.md).
type GoldenFinding struct {
	Code        string `json:"code"`
	Severity    string `json:"severity"`
	Path        string `json:"path"`
	Explanation string `json:"explanation"`
	Action      string `json:"action"`
	Repairable  bool   `json:"repairable"`
}

// GoldenPath returns the path of fixture name's golden file,
// fsfixtures/testdata/<name>.golden.json.
func GoldenPath(name string) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("fsfixtures: cannot locate the package directory")
	}
	return filepath.Join(filepath.Dir(file), "testdata", name+".golden.json")
}

// ReadGolden reads fixture name's golden file.
func ReadGolden(t testing.TB, name string) Golden {
	t.Helper()
	data, err := os.ReadFile(GoldenPath(name))
	if err != nil {
		t.Fatalf("fsfixtures: %v (run go test ./fsfixtures -update to create it)", err)
	}
	var g Golden
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		t.Fatalf("fsfixtures: %s: %v", GoldenPath(name), err)
	}
	if g.Findings == nil {
		g.Findings = []GoldenFinding{}
	}
	return g
}

// WriteGolden rewrites fixture name's golden file (for -update).
func WriteGolden(t testing.TB, name string, g Golden) {
	t.Helper()
	if g.Findings == nil {
		g.Findings = []GoldenFinding{}
	}
	data, err := json.MarshalIndent(g, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(GoldenPath(name)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(GoldenPath(name), append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// DiffGolden returns a readable description of the differences between want and
// got, or "" if they are equal.
func DiffGolden(want, got Golden) string {
	var b strings.Builder
	if want.ExitCode != got.ExitCode {
		fmt.Fprintf(&b, "exit code: want %d, got %d\n", want.ExitCode, got.ExitCode)
	}
	key := func(f GoldenFinding) string { return f.Path + " " + f.Code }
	wm, gm := map[string]GoldenFinding{}, map[string]GoldenFinding{}
	for _, f := range want.Findings {
		wm[key(f)] = f
	}
	for _, f := range got.Findings {
		gm[key(f)] = f
	}
	for _, f := range want.Findings {
		g, ok := gm[key(f)]
		switch {
		case !ok:
			fmt.Fprintf(&b, "missing: %+v\n", f)
		case g != f:
			fmt.Fprintf(&b, "changed:\n  want %+v\n  got  %+v\n", f, g)
		}
	}
	for _, f := range got.Findings {
		if _, ok := wm[key(f)]; !ok {
			fmt.Fprintf(&b, "unexpected: %+v\n", f)
		}
	}
	if b.Len() == 0 && len(want.Findings) == len(got.Findings) {
		for i := range want.Findings {
			if want.Findings[i] != got.Findings[i] {
				fmt.Fprintf(&b, "order differs at %d: want %s, got %s\n", i, key(want.Findings[i]), key(got.Findings[i]))
				break
			}
		}
	}
	return b.String()
}

// HashTree returns a digest of everything under dir (dir included) that a read-only
// tool must not change: every name, its type, permission bits, size, modification
// time in nanoseconds, and the bytes of regular files or the target of symbolic
// links. Symbolic links are not followed.
func HashTree(t testing.TB, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %s %o uid=%d size=%d mtime=%d", rel, info.Mode().Type(), info.Mode().Perm(), st.Uid, info.Size(), st.Mtim.Nano())
		switch {
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			line += " sha256=" + hex.EncodeToString(sum[:])
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + target
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatalf("fsfixtures: hash tree: %v", err)
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:])
}

// Files returns the bytes of every regular file under dir by relative path, without
// following symbolic links.
func Files(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			out[filepath.ToSlash(rel)] = data
		}
		return nil
	})
	if err != nil {
		t.Fatalf("fsfixtures: files: %v", err)
	}
	return out
}
