package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/internal/fakeserver"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// setupCluster starts a fake cluster of three replicas and an environment
// whose Dial is the real one, with LEASEHOLD_ADDR naming every replica.
func setupCluster(t *testing.T) (*testBundle, *fakeserver.Cluster) {
	t.Helper()
	b := &testBundle{fake: fakeserver.New(), vars: map[string]string{}}
	cl := fakeserver.StartCluster(t, b.fake, 3)
	b.vars["LEASEHOLD_ADDR"] = cl.Target()
	b.env = Env{
		Stdin:  strings.NewReader(""),
		Getenv: func(k string) string { return b.vars[k] },
		Dial: func(addr string, opts ...client.Option) (*client.Client, error) {
			b.dialed = append(b.dialed, addr)
			return client.Dial(addr, opts...)
		},
		NewRequestID: func() string { return "rid" },
	}
	return b, cl
}

// servedOn returns the replicas that served method's calls, in order.
func servedOn(cl *fakeserver.Cluster, method string) []int {
	var nodes []int
	for _, c := range cl.Served(method) {
		nodes = append(nodes, c.Node)
	}
	return nodes
}

// TestClusterCommands ensures the commands work unchanged against every
// replica of a cluster, named in LEASEHOLD_ADDR or --addr: each call goes
// to the leader, and after leadership moves, to the new one.
func TestClusterCommands(t *testing.T) {
	t.Parallel()
	b, cl := setupCluster(t)
	cl.SetLeader(2)
	dir := t.TempDir()
	writeFiles(t, dir, "a.pdf")
	if code, out, errOut := b.run(t, "submit", "--team", "team-a", filepath.Join(dir, "a.pdf")); code != ExitOK {
		t.Fatalf("submit: exit status %d, stdout %q, stderr %q", code, out, errOut)
	}
	cl.SetLeader(0)
	code, out, errOut := b.run(t, "--addr", strings.Join(cl.Addrs(), ", "), "get", "j-1")
	if code != ExitOK || !strings.Contains(out, "j-1") {
		t.Fatalf("get after the leader moved: exit status %d, stdout %q, stderr %q", code, out, errOut)
	}
	if diff := cmp.Diff([]int{2}, servedOn(cl, leaseholdv1.JobService_SubmitBatch_FullMethodName)); diff != "" {
		t.Errorf("replicas that served submit (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0}, servedOn(cl, leaseholdv1.JobService_GetJob_FullMethodName)); diff != "" {
		t.Errorf("replicas that served get (-want +got):\n%s", diff)
	}
}

// TestStaleFlag ensures --stale asks for a stale read, which a follower
// serves while no replica leads, and prints exactly what a read from the
// leader prints.
func TestStaleFlag(t *testing.T) {
	t.Parallel()
	b, cl := setupCluster(t)
	b.fake.AddJob(&leaseholdv1.Job{Id: "j-1", BatchId: "b-1", Team: "team-a", Phase: leaseholdv1.Phase_PHASE_QUEUED})
	code, fromLeader, errOut := b.run(t, "get", "j-1")
	if code != ExitOK {
		t.Fatalf("get: exit status %d, stderr %q", code, errOut)
	}
	cl.SetLeader(-1)
	code, stale, errOut := b.run(t, "get", "j-1", "--stale", "--timeout", "20s")
	if code != ExitOK {
		t.Fatalf("get --stale with no leader: exit status %d, stderr %q", code, errOut)
	}
	if diff := cmp.Diff(fromLeader, stale); diff != "" {
		t.Errorf("stale output differs from the leader's (-leader +stale):\n%s", diff)
	}
	served := cl.Served(leaseholdv1.JobService_GetJob_FullMethodName)
	if len(served) != 2 || served[0].Stale || !served[1].Stale {
		t.Errorf("get calls served = %+v, want a linearizable read, then a stale one", served)
	}
}

// TestAddrList ensures a malformed replica list is a usage error, sent
// nowhere.
func TestAddrList(t *testing.T) {
	t.Parallel()
	b, _ := setupCluster(t)
	for _, addr := range []string{"127.0.0.1:1,,127.0.0.1:2", "127.0.0.1:1,127.0.0.1", "127.0.0.1:1,127.0.0.1:1"} {
		code, _, errOut := b.run(t, "--addr", addr, "get", "j-1")
		if code != ExitUsage || !strings.Contains(errOut, "--addr") {
			t.Errorf("--addr %q: exit status %d, stderr %q; want %d naming --addr", addr, code, errOut, ExitUsage)
		}
	}
	if len(b.dialed) != 0 {
		t.Errorf("dialed %q, want nothing", b.dialed)
	}
}
