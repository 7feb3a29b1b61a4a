package cluster_test

import (
	"os/exec"
	"strings"
	"testing"
)

// This package's import path, and the writer's.
const (
	clusterPkg = "github.com/leasehold/leasehold/coordinator/internal/cluster"
	enginePkg  = "github.com/leasehold/leasehold/coordinator/internal/engine"
)

// goList runs go list with args and returns its lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// isRaft reports whether path is of hashicorp/raft or of a module named
// after it (raft-wal, its log).
func isRaft(path string) bool { return strings.HasPrefix(path, "github.com/hashicorp/raft") }

// TestOnlyThisPackageImportsRaft keeps replication in its room: no
// package of the module but this one imports hashicorp/raft or raft-wal
// (its tests aside: the wiring's run raft's in-memory transport), and the
// writer depends on nothing of either.
func TestOnlyThisPackageImportsRaft(t *testing.T) {
	t.Parallel()
	pkgs := goList(t, "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "github.com/leasehold/leasehold/...")
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; it missed the module", len(pkgs))
	}
	importers := 0
	for _, line := range pkgs {
		fields := strings.Fields(line)
		for _, imp := range fields[1:] {
			if !isRaft(imp) {
				continue
			}
			if fields[0] != clusterPkg {
				t.Errorf("%s imports %s: only %s may", fields[0], imp, clusterPkg)
			} else {
				importers++
			}
		}
	}
	if importers == 0 {
		t.Errorf("%s imports nothing of raft: the check looks for the wrong paths", clusterPkg)
	}
	for _, dep := range goList(t, "-deps", enginePkg) {
		if isRaft(dep) {
			t.Errorf("the engine depends on %s", dep)
		}
	}
}
