package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// TestOverviewCommands runs leasehold top, batches and renderers against a
// real coordinator and renderer, as each kind of caller.
func TestOverviewCommands(t *testing.T) {
	t.Parallel()
	coord := startCoordinator(t)
	startRenderer(t, coord.Addr, "r1")
	alpha := dial(t, coord.Addr, tokenAlpha)
	beta := dial(t, coord.Addr, tokenBeta)
	ctx := testContext(t)
	a, err := alpha.SubmitBatch(ctx, "alpha", "a", []*leaseholdv1.Document{doc("a1.txt", "1"), doc("a2.txt", "2")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := beta.SubmitBatch(ctx, "beta", "b", []*leaseholdv1.Document{doc("b1.txt", "1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitBatchDone(t, alpha, a.GetBatch().GetId())
	waitBatchDone(t, beta, b.GetBatch().GetId())
	// The overview trails commits by up to its publication interval; wait
	// on its stream for the one that shows all three jobs finished.
	waitOverview(t, dial(t, coord.Addr, tokenOperator), func(o *leaseholdv1.Overview) bool {
		done := uint32(0)
		for _, team := range o.GetTeams() {
			for _, pc := range team.GetCounts() {
				if pc.GetPhase() == leaseholdv1.Phase_PHASE_SUCCEEDED {
					done += pc.GetCount()
				}
			}
		}
		return done == 3
	})

	res := runCLI(t, coord.Addr, tokenOperator, "batches", "--state", "done", "-o", "json")
	if res.code != 0 || strings.Count(res.stdout, "\n") != 2 {
		t.Errorf("batches as the operator: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = runCLI(t, coord.Addr, tokenOperatorAlpha, "batches")
	if res.code != 0 || !strings.Contains(res.stdout, a.GetBatch().GetId()) || strings.Contains(res.stdout, "beta") {
		t.Errorf("batches as dev-operator-alpha: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = runCLI(t, coord.Addr, tokenOperator, "renderers")
	if res.code != 0 || !strings.Contains(res.stdout, "r1") || !strings.Contains(res.stdout, "connected") {
		t.Errorf("renderers: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	res = runCLI(t, coord.Addr, tokenBeta, "top", "--count", "1", "-o", "json")
	var msg struct {
		Overview struct {
			Teams []struct {
				Team string `json:"team"`
			} `json:"teams"`
		} `json:"overview"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &msg); err != nil || len(msg.Overview.Teams) != 1 || msg.Overview.Teams[0].Team != "beta" {
		t.Errorf("top as dev-beta = %s (%v), want beta's figures only; stderr %s", res.stdout, err, res.stderr)
	}
	res = runCLI(t, coord.Addr, tokenOperator, "top", "--count", "2")
	if res.code != 0 || strings.Count(res.stdout, "leasehold top") != 2 || !strings.Contains(res.stdout, "alpha") {
		t.Errorf("top: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// waitOverview follows the overview stream until ok holds for one.
func waitOverview(t *testing.T, c *client.Client, ok func(*leaseholdv1.Overview) bool) {
	t.Helper()
	for msg, err := range c.WatchOverview(testContext(t), &leaseholdv1.WatchOverviewRequest{}) {
		if err != nil {
			t.Fatalf("watching the overview: %v", err)
		}
		if ok(msg.GetOverview()) {
			return
		}
	}
	t.Fatal("overview stream ended")
}
