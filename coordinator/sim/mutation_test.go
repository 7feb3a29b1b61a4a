//go:build simmutation

package sim

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

var flagMutationSeeds = flag.Int("mutation-seeds", 20, "seeds a mutation may survive before the test fails")

// TestMutationsAreCaught switches on each deliberate bug of the state
// machine in turn (jobs.SetMutation: the fencing check removed; a cancel
// that does not revoke the lease) and runs seeds until the simulator
// catches it, reporting how many seeds and steps that took. A mutation
// that survives -mutation-seeds seeds fails the test. Run it with
// go test -tags simmutation -run TestMutationsAreCaught ./coordinator/sim.
func TestMutationsAreCaught(t *testing.T) {
	first, _ := seedRange(t)
	for _, m := range jobs.Mutations {
		t.Run(m, func(t *testing.T) {
			if err := jobs.SetMutation(m); err != nil {
				t.Fatal(err)
			}
			defer jobs.SetMutation("")
			start, steps := time.Now(), 0
			for i := range *flagMutationSeeds {
				res, err := runSeed(t, first+uint64(i), nil)
				steps += res.Steps
				var f *Failure
				if errors.As(err, &f) {
					msg, _, _ := strings.Cut(f.Msg, "\n")
					t.Logf("mutation %q caught in %v by seed %d of %d (%d steps in all, at step %d of that seed): %s",
						m, time.Since(start).Round(time.Millisecond), f.Seed, i+1, steps, f.Step, msg)
					return
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			t.Errorf("mutation %q survived %d seeds (%d steps)", m, *flagMutationSeeds, steps)
		})
	}
}
