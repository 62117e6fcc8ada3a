package fsfixtures_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/fsfixtures"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json from what fsck reports")

// exitCode is sealbridge-fsck's exit code for a read-only check (docs/FSCK.md):
// 0 clean, 4 problems left.
func exitCode(r *fsck.Report) int {
	if r.Problems() > 0 {
		return 4
	}
	return 0
}

// GoldenOf projects a report onto its golden form.
func goldenOf(r *fsck.Report) fsfixtures.Golden {
	g := fsfixtures.Golden{ExitCode: exitCode(r), Findings: []fsfixtures.GoldenFinding{}}
	for _, f := range r.Findings {
		g.Findings = append(g.Findings, fsfixtures.GoldenFinding{Code: string(f.Code), Severity: string(f.Severity),
			Path: f.Path, Explanation: f.Explanation, Action: f.Action, Repairable: f.Repairable})
	}
	return g
}

// TestGolden checks every fixture against its golden findings (or rewrites them
// with -update).
func TestGolden(t *testing.T) {
	for _, name := range append(fsfixtures.Names(), fsfixtures.HeadNames()...) {
		t.Run(name, func(t *testing.T) {
			dir := fsfixtures.Build(t, name)
			rep, err := fsck.Check(context.Background(), dir, fsck.Options{})
			if name == fsfixtures.HeadFormatNewer {
				// Refused: exit 8, no findings (sealbridge-fsck's operational error).
				if !errors.Is(err, errcode.StoreFormatNewer) {
					t.Fatalf("Check of a store of a newer format: %v, want STORE_FORMAT_NEWER", err)
				}
				got := fsfixtures.Golden{ExitCode: 8, Findings: []fsfixtures.GoldenFinding{}}
				if *update {
					fsfixtures.WriteGolden(t, name, got)
				} else if diff := fsfixtures.DiffGolden(fsfixtures.ReadGolden(t, name), got); diff != "" {
					t.Error(diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := goldenOf(rep)
			if *update {
				fsfixtures.WriteGolden(t, name, got)
				return
			}
			if diff := fsfixtures.DiffGolden(fsfixtures.ReadGolden(t, name), got); diff != "" {
				t.Errorf("%s: findings differ from %s (rerun with -update if intended):\n%s", name, fsfixtures.GoldenPath(name), diff)
			}
			if rep.Owner != fsfixtures.OwnerDID() || rep.OwnerSource != fsck.OwnerDirectoryName {
				t.Errorf("owner %s (%s), want %s from the directory name", rep.Owner, rep.OwnerSource, fsfixtures.OwnerDID())
			}
		})
	}
}

// TestGoldenFilesHaveNoTempNames guards the golden files: relative paths only, no
// temporary directory names, no times.
func TestGoldenFilesHaveNoTempNames(t *testing.T) {
	for _, name := range append(fsfixtures.Names(), fsfixtures.HeadNames()...) {
		data, err := os.ReadFile(fsfixtures.GoldenPath(name))
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{os.TempDir(), "/tmp/", "T00:", "ageSeconds", `"holder"`} {
			if strings.Contains(string(data), bad) {
				t.Errorf("%s contains %q", fsfixtures.GoldenPath(name), bad)
			}
		}
	}
}

// TestFixturesAreDeterministic: the same fixture built twice has the same files, byte
// for byte (fixed keys, ids and times), but for the epoch that names each build's
// generation file (random by design, docs/FORMAT.md §7): there only the marks match.
func TestFixturesAreDeterministic(t *testing.T) {
	a := fsfixtures.Files(t, fsfixtures.Build(t, "valid"))
	b := fsfixtures.Files(t, fsfixtures.Build(t, "valid"))
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("%d and %d files", len(a), len(b))
	}
	for p, data := range a {
		if p == store.GenerationFile {
			_, ma, _ := strings.Cut(string(data), "\n")
			_, mb, _ := strings.Cut(string(b[p]), "\n")
			if ma != mb {
				t.Errorf("%s: marks %q and %q differ between two builds", p, ma, mb)
			}
			continue
		}
		if string(b[p]) != string(data) {
			t.Errorf("%s differs between two builds", p)
		}
	}
}

// TestValidFixtureIsReadableByTheStore: the store itself reads every record of the
// valid fixture (the fixtures are written by its own API).
func TestValidFixtureIsReadableByTheStore(t *testing.T) {
	dir := fsfixtures.Build(t, "valid")
	s, err := store.Open(fsfixtures.Owner().Signer(), store.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range record.Kinds {
		err := s.Scan(context.Background(), k, func(record.Record) error { n++; return nil })
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	if n != 12 {
		t.Fatalf("%d records, want 12", n)
	}
	if want := fsfixtures.StoreDirOf(fsfixtures.DataRoot(dir), fsfixtures.OwnerDID()); want != dir {
		t.Fatalf("dir %s, want %s", dir, want)
	}
}

func TestValidLargeHasTheRequestedSize(t *testing.T) {
	dir := fsfixtures.Build(t, "valid-large", fsfixtures.Records(301))
	n := 0
	for _, k := range record.Kinds {
		ents, _ := os.ReadDir(filepath.Join(dir, string(k)))
		n += len(ents)
	}
	if n != 301 {
		t.Fatalf("%d records, want 301", n)
	}
}

func TestUnknownFixtureFails(t *testing.T) {
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		fsfixtures.Build(ft, "no-such-fixture")
	}()
	if !ft.failed {
		t.Fatal("an unknown fixture name did not fail the test")
	}
}

type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Fatalf(string, ...any) { f.failed = true; panic("fatal") }
func (f *fakeT) Helper()               {}
