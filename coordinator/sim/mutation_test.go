//go:build simmutation

package sim

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

var (
	flagMutationSeeds = flag.Int("mutation-seeds", 10, "seeds a mutation may survive before the test fails")
	flagMutationSteps = flag.Int("mutation-steps", DefaultSteps, "scheduler steps of each mutation run's faulty phase")
	flagMutation      = flag.String("mutation", "", "run only the mutation of this name")
)

// planted is a deliberate bug the simulator must catch: its name, the
// switch that turns it on ("" off), and whether it is run in cluster mode.
type planted struct {
	name    string
	set     func(string) error
	cluster bool
}

// mutations lists every planted bug: the state machine's (jobs), run on a
// single node, and those of replication, the writer's (engine) and the
// coordinator's around it (sim), run in cluster mode.
func mutations() []planted {
	var ms []planted
	for _, m := range jobs.Mutations {
		ms = append(ms, planted{name: m, set: jobs.SetMutation})
	}
	for _, m := range engine.Mutations {
		ms = append(ms, planted{name: m, set: engine.SetMutation, cluster: true})
	}
	for _, m := range Mutations {
		ms = append(ms, planted{name: m, set: SetMutation, cluster: true})
	}
	return ms
}

// TestMutationsAreCaught switches on each deliberate bug in turn and runs
// seeds until the simulator catches it, reporting how many seeds and
// steps that took, then runs the catching seed without the mutation, the
// same up to the step that failed and quiescent after it, which must
// pass. The state machine's (jobs.SetMutation: the fencing
// check removed; a cancel that does not revoke the lease) run on a single
// node; replication's run in cluster mode (engine.SetMutation: effects
// published before the commit returns, in-memory state kept across
// terms, tokens from a counter in memory, no lease extension on
// promotion; SetMutation: a promotion without the barrier, reads without
// verifying leadership). A mutation that survives -mutation-seeds seeds
// fails the test. Run it with
// go test -tags simmutation -run TestMutationsAreCaught ./coordinator/sim.
func TestMutationsAreCaught(t *testing.T) {
	first, _ := seedRange(t)
	for _, m := range mutations() {
		if *flagMutation != "" && m.name != *flagMutation {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			run := func(seed uint64, steps int) (Result, error) {
				return runConfig(t, Config{Seed: seed, Steps: steps, Cluster: m.cluster})
			}
			if err := m.set(m.name); err != nil {
				t.Fatal(err)
			}
			defer m.set("")
			start, steps := time.Now(), 0
			for i := range *flagMutationSeeds {
				res, err := run(first+uint64(i), *flagMutationSteps)
				steps += res.Steps
				var f *Failure
				if errors.As(err, &f) {
					msg, _, _ := strings.Cut(f.Msg, "\n")
					t.Logf("mutation %q caught in %v after %d steps in all, on seed run %d (seed %d, step %d): %s",
						m.name, time.Since(start).Round(time.Millisecond), steps, i+1, f.Seed, f.Step, msg)
					// The same seed without the mutation must pass: else
					// the run failed on something else, and the mutation
					// was not what the checks caught. It takes the same
					// steps up to the one that failed, with every fault,
					// then ends its faulty phase there: a run that shows
					// as much, for less than a whole one.
					if err := m.set(""); err != nil {
						t.Fatal(err)
					}
					if _, err := run(f.Seed, min(f.Step, *flagMutationSteps)); err != nil {
						t.Errorf("seed %d fails without the mutation too: %v", f.Seed, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			t.Errorf("mutation %q survived %d seeds (%d steps)", m.name, *flagMutationSeeds, steps)
		})
	}
}
