package fsck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestEveryCodeIsDocumented: docs/FSCK.md has one table row for every Code constant
// of finding.go, under Problems for the constants of the problems block and under
// Notes for those of the notes block, and no row for a code that does not exist.
func TestEveryCodeIsDocumented(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "finding.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string // the Code constants of each const block, in order
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		var codes []string
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				s, err := strconv.Unquote(v.(*ast.BasicLit).Value)
				if err != nil {
					t.Fatal(err)
				}
				codes = append(codes, s)
			}
		}
		if len(codes) > 0 {
			blocks = append(blocks, codes)
		}
	}
	if len(blocks) != 2 {
		t.Fatalf("%d const blocks of codes in finding.go, want 2 (problems, notes)", len(blocks))
	}
	doc, err := os.ReadFile("../../docs/FSCK.md")
	if err != nil {
		t.Fatal(err)
	}
	section := func(title string) map[string]bool {
		_, rest, ok := strings.Cut(string(doc), "\n### "+title+"\n")
		if !ok {
			t.Fatalf("no section %q in FSCK.md", title)
		}
		if i := strings.Index(rest, "\n#"); i >= 0 {
			rest = rest[:i]
		}
		rows := map[string]bool{}
		for _, m := range regexp.MustCompile("(?m)^\\| `([a-z+-]+)` \\|").FindAllStringSubmatch(rest, -1) {
			rows[m[1]] = true
		}
		return rows
	}
	for i, title := range []string{"Problems", "Notes"} {
		rows := section(title)
		for _, c := range blocks[i] {
			if !rows[c] {
				t.Errorf("%s is not documented under %s in docs/FSCK.md", c, title)
			}
			delete(rows, c)
		}
		for c := range rows {
			t.Errorf("docs/FSCK.md documents %s under %s, which finding.go does not have there", c, title)
		}
	}
}
