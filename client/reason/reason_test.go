package reason_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// moduleRoot is the repository root, two levels above this package.
var moduleRoot = filepath.Join("..", "..")

// listed is one constant of the list.
type listed struct {
	name string
	// errorInfo is false for the reasons a lease ended with, which are
	// not ErrorInfo reasons and have no place in the errors table.
	errorInfo bool
}

// readList parses reason.go and returns its reasons by value.
func readList(t *testing.T) map[string]listed {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "reason.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	list := map[string]listed{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		errorInfo := !strings.HasPrefix(gd.Doc.Text(), "Reasons a lease ended")
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Reason" {
				continue
			}
			for i, n := range vs.Names {
				v, err := strconv.Unquote(vs.Values[i].(*ast.BasicLit).Value)
				if err != nil {
					t.Fatal(err)
				}
				if prev, ok := list[v]; ok {
					t.Errorf("%s and %s are both %q", prev.name, n.Name, v)
				}
				if !regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`).MatchString(v) {
					t.Errorf("%s = %q is not UPPER_SNAKE_CASE", n.Name, v)
				}
				list[v] = listed{name: n.Name, errorInfo: errorInfo}
			}
		}
	}
	if len(list) < 50 {
		t.Fatalf("read %d reasons from reason.go; the parser missed the list", len(list))
	}
	return list
}

// notReasons are string literals outside the list that equal a reason but
// name something else, by file (relative to the module root).
var notReasons = map[string][]string{
	// The names of the EventKind values; LEASE_EXPIRED is also an event.
	"coordinator/internal/jobs/job.go": {"LEASE_EXPIRED"},
}

// TestNoReasonLiteralOutsideTheList scans every Go file of the module but
// the generated code and the tests, which pin the wire text on purpose:
// a string literal that equals a reason must be a constant of this
// package instead. The names of gRPC codes (values keyed by codes.X, as
// in client's code-name table) are not reasons, nor are notReasons.
func TestNoReasonLiteralOutsideTheList(t *testing.T) {
	t.Parallel()
	list := readList(t)
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	scanned := 0
	err = filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(moduleRoot, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			abs, _ := filepath.Abs(path)
			if rel == "gen" || d.Name() == "testdata" || abs == self || (strings.HasPrefix(d.Name(), ".") && rel != ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		scanned++
		for _, lit := range reasonLiterals(t, path, list) {
			if slices.Contains(notReasons[rel], lit.value) {
				continue
			}
			t.Errorf("%s:%d: %q is reason.%s; use the constant", rel, lit.line, lit.value, list[lit.value].name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 100 {
		t.Fatalf("scanned %d Go files; the walk missed the module", scanned)
	}
}

type literal struct {
	value string
	line  int
}

// reasonLiterals returns the string literals of the file at path that
// equal a listed reason, leaving out the values of gRPC code-name tables.
func reasonLiterals(t *testing.T, path string, list map[string]listed) []literal {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	codeNames := map[ast.Expr]bool{}
	var found []literal
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.KeyValueExpr:
			if sel, ok := n.Key.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "codes" {
					codeNames[n.Value] = true
				}
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING || codeNames[n] {
				return true
			}
			v, err := strconv.Unquote(n.Value)
			if err != nil {
				return true
			}
			if _, ok := list[v]; ok {
				found = append(found, literal{v, fset.Position(n.Pos()).Line})
			}
		}
		return true
	})
	return found
}

// TestTheLeafPackagesImportNothing keeps the reasons and the limits
// (../limits) usable from every layer, the coordinator's pure state machine
// included.
func TestTheLeafPackagesImportNothing(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{".", filepath.Join("..", "limits")} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		if len(files) == 0 {
			t.Errorf("no Go files in %s", dir)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				t.Errorf("%s imports %s", name, imp.Path.Value)
			}
		}
	}
}

// errorsPages are where the limits and errors tables may live, first
// found first.
var errorsPages = []string{"docs/limits-and-errors.md"}

var backquoted = regexp.MustCompile("`([A-Z][A-Z0-9_]{2,})`")

// TestTheErrorsPageMatchesTheList compares the list with the page that
// documents the limits and errors: every reason the reason column of its
// tables names is in the list, and every ErrorInfo reason of the list is
// named on the page.
func TestTheErrorsPageMatchesTheList(t *testing.T) {
	t.Parallel()
	list := readList(t)
	var page string
	var data []byte
	for _, p := range errorsPages {
		b, err := os.ReadFile(filepath.Join(moduleRoot, p))
		if err == nil && strings.Contains(string(b), "| situation | code | reasons |") {
			page, data = p, b
			break
		}
	}
	if page == "" {
		t.Fatalf("none of %v holds the errors table (| situation | code | reasons |)", errorsPages)
	}
	tables := 0
	inTable := false
	for line := range strings.SplitSeq(string(data), "\n") {
		switch {
		case line == "| situation | code | reasons |" || line == "| limit | default | flag | reason |":
			inTable = true
			tables++
			continue
		case !strings.HasPrefix(line, "|"):
			inTable = false
		}
		if !inTable {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for _, m := range backquoted.FindAllStringSubmatch(cells[len(cells)-1], -1) {
			if _, ok := list[m[1]]; !ok {
				t.Errorf("%s: the table names reason %s, which the list does not have", page, m[1])
			}
		}
	}
	if tables != 2 {
		t.Errorf("%s: found %d of the limits and errors tables, want 2", page, tables)
	}
	named := map[string]bool{}
	for _, m := range backquoted.FindAllStringSubmatch(string(data), -1) {
		named[m[1]] = true
	}
	for v, l := range list {
		if l.errorInfo && !named[v] {
			t.Errorf("%s does not name reason %s (reason.%s)", page, v, l.name)
		}
	}
}

// codeNames are the gRPC code names as the proto comments write them.
var codeNames = "CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|" +
	"RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED"

// afterCode matches a code followed by the reasons a comment gives it, as
// in "INVALID_ARGUMENT MISSING_REASON, INVALID_REASON".
var afterCode = regexp.MustCompile(`\b(` + codeNames + `)((?:[ ,/]+(?:or |and )?[A-Z][A-Z0-9_]{3,}\b)+)`)

// TestTheProtoCommentsNameListedReasons checks the reasons the API's proto
// comments give after a code against the list.
func TestTheProtoCommentsNameListedReasons(t *testing.T) {
	t.Parallel()
	list := readList(t)
	protos, _ := filepath.Glob(filepath.Join(moduleRoot, "proto", "leasehold", "v1", "*.proto"))
	if len(protos) == 0 {
		t.Fatal("no protos")
	}
	isCode := regexp.MustCompile(`^(` + codeNames + `)$`)
	seen := 0
	for _, p := range protos {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			_, comment, ok := strings.Cut(line, "//")
			if !ok {
				continue
			}
			for _, m := range afterCode.FindAllStringSubmatch(comment, -1) {
				for _, r := range regexp.MustCompile(`[A-Z][A-Z0-9_]{3,}`).FindAllString(m[2], -1) {
					seen++
					if _, ok := list[r]; !ok && !isCode.MatchString(r) {
						t.Errorf("%s:%d: %s %s is not a listed reason", filepath.Base(p), i+1, m[1], r)
					}
				}
			}
		}
	}
	if seen < 20 {
		t.Errorf("found %d reasons in the proto comments; the pattern missed them", seen)
	}
}
