package limits_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheLimitsImportNothing keeps the limits usable from every layer, the
// coordinator's pure state machine included.
func TestTheLimitsImportNothing(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
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
