package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/stack"
)

// Tokens of the cluster tests' principals file.
const (
	clusterAdminToken = "cluster-admin-token-0123456789" // operator of every team with the backup role
	clusterOpsToken   = "cluster-ops-token-0123456789"   // operator of every team
)

// clusterPrincipalsFile writes the principals of the cluster tests: the
// two operators, and a submitter of team alpha.
func clusterPrincipalsFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "principals.json")
	data := `{"principals":[
		{"name":"admin","token":"` + clusterAdminToken + `","roles":["operator","backup"],"scope":["*"]},
		{"name":"ops","token":"` + clusterOpsToken + `","roles":["operator"],"scope":["*"]},
		{"name":"alpha-svc","token":"cluster-alpha-token-0123456789","team":"alpha","roles":["submitter"]}]}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// newLoopbackCluster starts a cluster of three coordinator processes on
// loopback with the cluster tests' principals, and waits for a leader.
func newLoopbackCluster(t *testing.T) *stack.Stack {
	t.Helper()
	opts := options()
	opts.Nodes, opts.Tokens = 3, clusterPrincipalsFile(t)
	return stack.Start(t, opts)
}

// clusterCmd runs "coordinator cluster ARGS" against addr as token.
func clusterCmd(t *testing.T, addr, token string, args ...string) cliResult {
	t.Helper()
	return runTool(t, bins.coordinator, []string{"LEASEHOLD_TOKEN=" + token}, append(append([]string{"cluster"}, args...), "--addr", addr)...)
}

// statusRows returns the member rows of "coordinator cluster status",
// by id: the table's fields.
func statusRows(t *testing.T, out string) map[string][]string {
	t.Helper()
	rows := map[string][]string{}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[1], "ID ") {
		t.Fatalf("status output:\n%s", out)
	}
	for _, line := range lines[2:] {
		f := strings.Fields(line)
		rows[f[0]] = f
	}
	return rows
}

// waitCaughtUp runs status on the leader until every one of n members
// shows a lag of 0: the leader tells no event when a follower catches up,
// so each try asks it again.
func waitCaughtUp(t *testing.T, leader *stack.Node, n int) map[string][]string {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		res := clusterCmd(t, leader.Addr, clusterOpsToken, "status")
		if res.code != 0 {
			t.Fatalf("status: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		rows := statusRows(t, res.stdout)
		ok := len(rows) == n
		for _, f := range rows {
			ok = ok && len(f) >= 7 && f[6] == "0"
		}
		if ok {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("members not caught up within %v:\n%s", waitTimeout, res.stdout)
		}
		<-tick.C
	}
}

// TestClusterCommands runs the cluster subcommands of the coordinator
// binary against three coordinator processes on loopback: status shows
// every member, transfer-leader moves the leader, and a member removed
// and added back catches up with what was written meanwhile.
func TestClusterCommands(t *testing.T) {
	t.Parallel()
	lc := newLoopbackCluster(t)
	leader := lc.Leader()

	rows := waitCaughtUp(t, leader, 3)
	for _, nd := range lc.Coordinators {
		f := rows[nd.ID]
		role := "follower"
		if nd == leader {
			role = "leader"
		}
		if f == nil || f[1] != "voter" || f[2] != role || f[3] != nd.Raft || f[4] != nd.Addr {
			t.Errorf("status row of %s = %q, want a %s voter at %s, %s", nd.ID, f, role, nd.Raft, nd.Addr)
		}
	}
	// leasehold top shows the cluster to an operator of every team, and
	// not to a submitter.
	top := runCLI(t, leader.Addr, clusterOpsToken, "top", "--count", "1")
	if top.code != 0 || !strings.Contains(top.stdout, "\ncluster  leader "+leader.ID+"  term ") {
		t.Errorf("top: exit %d\n%s%s", top.code, top.stdout, top.stderr)
	}
	for _, nd := range lc.Coordinators {
		if !regexp.MustCompile(`(?m)^` + nd.ID + ` +(leader|follower) +` + regexp.QuoteMeta(nd.Raft) + ` +\d+ +0 `).MatchString(top.stdout) {
			t.Errorf("top has no row of %s caught up:\n%s", nd.ID, top.stdout)
		}
	}
	top = runCLI(t, leader.Addr, "cluster-alpha-token-0123456789", "top", "--count", "1")
	if top.code != 0 || strings.Contains(top.stdout, "cluster") || !strings.Contains(top.stdout, "leasehold top") {
		t.Errorf("top as a submitter: exit %d\n%s%s", top.code, top.stdout, top.stderr)
	}
	single := startCoordinator(t)
	top = runCLI(t, single.Addr, tokenOperator, "top", "--count", "1")
	if top.code != 0 || strings.Contains(top.stdout, "cluster") || !strings.Contains(top.stdout, "leasehold top") {
		t.Errorf("top on a single node: exit %d\n%s%s", top.code, top.stdout, top.stderr)
	}

	var follower *stack.Node
	for _, nd := range lc.Coordinators {
		if nd != leader {
			follower = nd
			break
		}
	}
	res := clusterCmd(t, follower.Addr, clusterOpsToken, "status")
	if res.code != 0 || !strings.Contains(res.stdout, "leader "+leader.ID+",") || !strings.Contains(res.stdout, "as follower "+follower.ID+" sees it") {
		t.Errorf("status on follower %s: exit %d\n%s%s", follower.ID, res.code, res.stdout, res.stderr)
	}

	// Refusals: a follower names the leader; a missing reason or token.
	res = clusterCmd(t, follower.Addr, clusterOpsToken, "transfer-leader", "--reason", "x")
	if res.code != 1 || !strings.Contains(res.stderr, "(UNAVAILABLE NOT_LEADER)") || !strings.Contains(res.stderr, leader.ID+" at "+leader.Addr) {
		t.Errorf("transfer-leader on a follower: exit %d, stderr %q", res.code, res.stderr)
	}
	res = clusterCmd(t, leader.Addr, clusterOpsToken, "transfer-leader")
	if res.code != 1 || !strings.Contains(res.stderr, "(INVALID_ARGUMENT MISSING_REASON)") {
		t.Errorf("transfer-leader without a reason: exit %d, stderr %q", res.code, res.stderr)
	}
	res = runTool(t, bins.coordinator, nil, "cluster", "status", "--addr", leader.Addr)
	if res.code != 2 || !strings.Contains(res.stderr, "needs a token") {
		t.Errorf("status without a token: exit %d, stderr %q", res.code, res.stderr)
	}
	res = clusterCmd(t, leader.Addr, clusterOpsToken, "add", "--id", "n9", "--raft-addr", "127.0.0.1:1", "--reason", "x")
	if res.code != 1 || !strings.Contains(res.stderr, "(PERMISSION_DENIED PERMISSION_DENIED)") {
		t.Errorf("add without the backup role: exit %d, stderr %q", res.code, res.stderr)
	}

	// transfer-leader moves the leader where it is told.
	res = clusterCmd(t, leader.Addr, clusterOpsToken, "transfer-leader", "--to", follower.ID, "--reason", "rolling restart")
	if want := "leadership moved from " + leader.ID + " to " + follower.ID; res.code != 0 || !strings.HasPrefix(res.stdout, want) {
		t.Fatalf("transfer-leader: exit %d, stdout %q, stderr %q; want %q", res.code, res.stdout, res.stderr, want)
	}
	if got := lc.Leader(follower); got != follower {
		t.Fatalf("leader after the transfer: %s", got.ID)
	}
	leader = follower

	// remove, a write meanwhile, add: the node is back with the write.
	var gone *stack.Node
	for _, nd := range lc.Coordinators {
		if nd != leader {
			gone = nd
			break
		}
	}
	res = clusterCmd(t, leader.Addr, clusterOpsToken, "remove", "--id", gone.ID, "--reason", "replace its disk")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "removed "+gone.ID) {
		t.Fatalf("remove: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	if rows := waitCaughtUp(t, leader, 2); rows[gone.ID] != nil {
		t.Fatalf("%s is still listed after its removal", gone.ID)
	}
	c := dial(t, leader.Addr, "cluster-alpha-token-0123456789")
	batch := submitOne(t, c, "written while "+gone.ID+" was out")
	res = clusterCmd(t, leader.Addr, clusterAdminToken, "add", "--id", gone.ID, "--raft-addr", gone.Raft, "--reason", "disk replaced")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "added "+gone.ID+" at "+gone.Raft) {
		t.Fatalf("add: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	waitCaughtUp(t, leader, 3)
	// The node's own store has the batch: a stale read on it, which any
	// node serves from its store.
	back := dial(t, gone.Addr, "cluster-alpha-token-0123456789")
	ctx := metadata.AppendToOutgoingContext(testContext(t), "leasehold-read", "stale")
	if b, err := back.GetBatch(ctx, batch); err != nil || b.GetId() != batch {
		t.Errorf("stale GetBatch(%s) on %s = %v, %v", batch, gone.ID, b, err)
	}

	audit := runCLI(t, leader.Addr, clusterOpsToken, "audit", "--limit", "3")
	for _, want := range []string{"CLUSTER_ADD_VOTER", "CLUSTER_REMOVE_SERVER", "CLUSTER_TRANSFER_LEADERSHIP"} {
		if !strings.Contains(audit.stdout, want) {
			t.Errorf("leasehold audit lacks %s:\n%s%s", want, audit.stdout, audit.stderr)
		}
	}
}

// submitOne submits a batch of one document to team alpha, under a
// request id of its content, and returns its id.
func submitOne(t *testing.T, c *client.Client, content string) string {
	t.Helper()
	resp, err := c.SubmitBatch(testContext(t), "alpha", content, []*leaseholdv1.Document{doc("doc.txt", content)}, nil)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	return resp.GetBatch().GetId()
}

// TestClusterRecover loses the quorum of a three-node cluster for good (two
// nodes killed and their directories gone) and recovers the survivor as a
// cluster of one, with the data it held.
func TestClusterRecover(t *testing.T) {
	t.Parallel()
	lc := newLoopbackCluster(t)
	leader := lc.Leader()
	c := dial(t, leader.Addr, "cluster-alpha-token-0123456789")
	batch := submitOne(t, c, "kept through the recovery")
	waitCaughtUp(t, leader, 3)

	survivor := lc.Node("n1")
	for _, nd := range lc.Coordinators {
		if nd != survivor {
			nd.Kill()
		}
	}
	// Recovery refuses a directory a running node holds.
	res := runTool(t, bins.coordinator, nil, "cluster", "recover", "--data-dir", survivor.DataDir, "--node-id", survivor.ID,
		"--peers", survivor.ID+"="+survivor.Raft+"/"+survivor.Addr)
	if res.code != 1 || !strings.Contains(res.stderr, "locked by a running coordinator") {
		t.Errorf("recover of a running node: exit %d, stderr %q", res.code, res.stderr)
	}
	survivor.Kill()
	peers := survivor.ID + "=" + survivor.Raft + "/" + survivor.Addr
	res = runTool(t, bins.coordinator, nil, "cluster", "recover", "--data-dir", survivor.DataDir, "--node-id", survivor.ID, "--peers", peers)
	if res.code != 0 || !regexp.MustCompile(`^recovered n1 in .*: a cluster of 1 voters \(n1\), from log index \d+ of term \d+\n`).MatchString(res.stdout) {
		t.Fatalf("recover: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	args := lc.NodeArgs(lc.Index(survivor))
	args[slices.Index(args, "--peers")+1] = peers
	lc.StartNodeWith(lc.Index(survivor), args)
	if got := lc.Leader(survivor); got != survivor {
		t.Fatal("the survivor does not lead")
	}
	rows := waitCaughtUp(t, survivor, 1)
	if rows[survivor.ID] == nil || rows[survivor.ID][2] != "leader" {
		t.Errorf("status after the recovery: %q", rows)
	}
	c = dial(t, survivor.Addr, "cluster-alpha-token-0123456789")
	if b, err := c.GetBatch(testContext(t), batch); err != nil || b.GetId() != batch {
		t.Errorf("GetBatch(%s) after the recovery = %v, %v", batch, b, err)
	}
	// It takes writes again.
	submitOne(t, c, "after the recovery")

	// A single node's directory has no cluster to recover.
	single := startCoordinator(t)
	single.Kill()
	res = runTool(t, bins.coordinator, nil, "cluster", "recover", "--data-dir", single.DataDir, "--node-id", "n1", "--peers", "n1=127.0.0.1:1")
	if res.code != 1 || !strings.Contains(res.stderr, "holds no raft state") {
		t.Errorf("recover of a single node's directory: exit %d, stderr %q", res.code, res.stderr)
	}
}
