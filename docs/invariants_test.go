package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// citedInvariant matches an invariant a comment cites by number, as in
// "invariant 3" or "invariants 4 and 7".
var citedInvariant = regexp.MustCompile(`(?i)\binvariants? ((?:\d+(?:, | and | or |-))*\d+)`)

// TestInvariantsPage checks that docs/invariants.md lists the invariants
// that Go comments cite by number, and that every test it names exists.
func TestInvariantsPage(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("invariants.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\d+)\. `).FindAllStringSubmatch(page, -1) {
		listed[m[1]] = true
	}
	if len(listed) == 0 {
		t.Fatal("invariants.md lists no invariant (\"## N. ...\" headings)")
	}
	tests := map[string]bool{}
	cited := 0
	err = filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(moduleRoot, path)
		if d.IsDir() {
			if rel == "gen" || d.Name() == "testdata" || (strings.HasPrefix(d.Name(), ".") && rel != ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") {
				tests[fd.Name.Name] = true
			}
		}
		for _, cg := range f.Comments {
			text := cg.Text()
			for _, m := range citedInvariant.FindAllStringSubmatchIndex(text, -1) {
				line := fset.Position(cg.Pos()).Line + strings.Count(text[:m[0]], "\n")
				for _, n := range regexp.MustCompile(`\d+`).FindAllString(text[m[2]:m[3]], -1) {
					cited++
					if !listed[n] {
						t.Errorf("%s:%d cites invariant %s, which docs/invariants.md does not list", rel, line, n)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cited == 0 {
		t.Error("no Go comment cites an invariant by number; the pattern missed them")
	}
	for _, m := range regexp.MustCompile("`(?:[a-z]+\\.)?(Test[A-Za-z0-9_]+)`").FindAllStringSubmatch(page, -1) {
		if !tests[m[1]] {
			t.Errorf("invariants.md names %s, which no test file declares", m[1])
		}
	}
}
