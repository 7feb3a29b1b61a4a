package leaderdial

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestTheHealthNameIsDefinedOnce keeps HealthService the one spelling of
// the Leader health entry in the module's Go code, tests included: the
// coordinator that reports it and every client, harness and test that
// reads it refer to the constant.
func TestTheHealthNameIsDefinedOnce(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	self := filepath.Join(root, "internal", "leaderdial", "leaderdial.go")
	quoted := []byte(strconv.Quote(HealthService))
	scanned := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || path == self:
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		scanned++
		if bytes.Contains(src, quoted) {
			t.Errorf("%s spells %s; refer to leaderdial.HealthService", path, quoted)
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
