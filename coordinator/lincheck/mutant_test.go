//go:build lincheckmutation

package lincheck_test

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"
	"github.com/leasehold/leasehold/coordinator/lincheck"
	"github.com/leasehold/leasehold/internal/testbin"
)

// TestStaleReadMutantIsCaught runs the cluster workload against
// coordinators built with the lincheckmutation tag and run with the
// planted bug stale-read switched on (package mutation): they serve a
// linearizable read from the node's store without verifying that the
// node leads. The check must reject the history: the reads sent straight
// to followers, and to a leader cut off from its peers, show jobs as they
// were before writes that were already answered.
//
//	go test -tags lincheckmutation -run StaleReadMutant ./coordinator/lincheck
func TestStaleReadMutantIsCaught(t *testing.T) {
	root, err := testbin.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "coordinator")
	build := exec.Command("go", "build", "-tags", "lincheckmutation", "-o", bin, "./coordinator/cmd/coordinator")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the mutant coordinator: %v\n%s", err, out)
	}
	b := budget{ops: envInt(t, "LEASEHOLD_LINCHECK_OPS", 3000), isolations: envCount(t, "LEASEHOLD_LINCHECK_ISOLATIONS", 1)}
	r := runCluster(t, bin, b, mutation.Env+"="+mutation.StaleRead.String())
	bad := check(t, r.records, lincheck.Spec{MaxAttempts: maxAttempts}, false)
	if len(bad) == 0 {
		t.Fatal("the check accepted the history of coordinators that serve linearizable reads without verifying leadership")
	}
	for _, p := range bad {
		t.Logf("caught: %s", p)
	}
}
