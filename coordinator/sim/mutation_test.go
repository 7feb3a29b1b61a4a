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

var (
	flagMutationSeeds = flag.Int("mutation-seeds", 10, "seeds a mutation may survive before the test fails")
	flagMutationSteps = flag.Int("mutation-steps", DefaultSteps, "scheduler steps of each mutation run's faulty phase")
)

// TestMutationsAreCaught switches on each deliberate bug of the state
// machine in turn (jobs.SetMutation: the fencing check removed; a cancel
// that does not revoke the lease) and runs seeds until the simulator
// catches it, reporting how many seeds and steps that took, then runs the
// catching seed without the mutation, which must pass. A mutation that
// survives -mutation-seeds seeds fails the test. Run it with
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
				res, err := runSeedSteps(t, first+uint64(i), *flagMutationSteps, nil)
				steps += res.Steps
				var f *Failure
				if errors.As(err, &f) {
					msg, _, _ := strings.Cut(f.Msg, "\n")
					t.Logf("mutation %q caught in %v after %d steps in all, on seed run %d (seed %d, step %d): %s",
						m, time.Since(start).Round(time.Millisecond), steps, i+1, f.Seed, f.Step, msg)
					// The same seed without the mutation must pass: else
					// the run failed on something else, and the mutation
					// was not what the checks caught.
					if err := jobs.SetMutation(""); err != nil {
						t.Fatal(err)
					}
					if _, err := runSeedSteps(t, f.Seed, *flagMutationSteps, nil); err != nil {
						t.Errorf("seed %d fails without the mutation too: %v", f.Seed, err)
					}
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
