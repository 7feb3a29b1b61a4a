package chaos

import (
	"bytes"
	"flag"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The campaign's flags: go test ./tests/chaos -args -cycles 200, or the
// flags after the package (go test ./tests/chaos -cycles 200).
var (
	cycles         = flag.Int("cycles", 20, "crashes of the coordinator, each followed by a check of its data file and a restart")
	seed           = flag.Uint64("seed", 0, "seed of the kill schedule, failpoint counts and load (0: from the clock); timing still varies between runs")
	minUptime      = flag.Duration("min-uptime", 50*time.Millisecond, "shortest time a coordinator serves before its SIGKILL")
	maxUptime      = flag.Duration("max-uptime", 500*time.Millisecond, "longest time a coordinator serves before its SIGKILL")
	failpointEvery = flag.Int("failpoint-every", 4, "every Nth crash is a failpoint's instead of a SIGKILL, the failpoints in turn (0: none)")
	fireTimeout    = flag.Duration("fire-timeout", 20*time.Second, "how long an armed failpoint may take to fire before the coordinator is killed instead")
	drainTimeout   = flag.Duration("drain-timeout", time.Minute, "how long the load may take to drain after the last restart")
	renderers      = flag.Int("renderers", 2, "renderer processes")
	leaseTTL       = flag.Duration("lease-ttl", 2*time.Second, "the coordinator's lease TTL")
	tmp            = flag.String("tmp", "", "parent of the run's temporary directory (default: the system's)")
	keep           = flag.Bool("keep", false, "keep the run's directory (data, logs, journal) even when it passes")
	onRaft         = flag.Bool("raft", false, "run the coordinator as a raft cluster of one voter, and arm the replicated apply's failpoints too")
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// flagConfig is the run the flags describe.
func flagConfig() config {
	return config{
		cycles: *cycles, seed: *seed, minUptime: *minUptime, maxUptime: *maxUptime,
		failpointEvery: *failpointEvery, fireTimeout: *fireTimeout, drainTimeout: *drainTimeout,
		renderers: *renderers, leaseTTL: *leaseTTL, tmp: *tmp, keep: *keep, raft: *onRaft,
	}
}

// TestCrashCampaign crashes and restarts a coordinator under load -cycles
// times and checks the invariants afterwards (see the package
// documentation). It logs a line per crash, the report and a FIGURE line;
// -v shows them on a pass. scripts/test runs it in a step of its own,
// and skips it in the race-enabled run of every package.
func TestCrashCampaign(t *testing.T) {
	if testing.Short() {
		t.Skip("the crash campaign runs real processes for tens of seconds; not with -short")
	}
	cfg := flagConfig()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	res, err := crash(t.Context(), cfg, testLog{t})
	if res != nil {
		var report bytes.Buffer
		res.print(&report)
		t.Log("report:\n" + strings.TrimSuffix(report.String(), "\n"))
		t.Log("FIGURE " + res.figure())
	}
	switch {
	case err != nil:
		t.Fatal(err)
	case !res.passed():
		t.Fatalf("the campaign failed (seed %d): see the report above; data and logs kept in %s", cfg.seed, res.dir)
	}
}

// testLog writes the campaign's progress lines to the test's log, each
// Write (one Fprintf) a line.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestConfigRefusesBadValues checks the settings before anything is built
// or started.
func TestConfigRefusesBadValues(t *testing.T) {
	t.Parallel()
	good := flagConfig()
	good.cycles = 20
	if err := good.validate(); err != nil {
		t.Fatalf("the default settings: %v", err)
	}
	for _, tc := range []struct {
		change func(*config)
		want   string
	}{
		{func(c *config) { c.cycles = 0 }, "-cycles must be at least 1"},
		{func(c *config) { c.minUptime, c.maxUptime = time.Second, 10*time.Millisecond }, "-min-uptime"},
		{func(c *config) { c.minUptime = 0 }, "-min-uptime"},
		{func(c *config) { c.renderers = 0 }, "-renderers"},
		{func(c *config) { c.failpointEvery = -1 }, "-failpoint-every"},
		{func(c *config) { c.drainTimeout = 0 }, "-drain-timeout"},
	} {
		c := good
		tc.change(&c)
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want an error containing %q", c, err, tc.want)
		}
	}
}
