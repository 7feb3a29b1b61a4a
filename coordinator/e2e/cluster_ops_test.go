package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/testbin"
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

// clusterNode is one coordinator process of a cluster on loopback.
type clusterNode struct {
	id, grpc, raft, dir string
	p                   *proctest.Proc
}

// loopbackCluster is a cluster of coordinator processes.
type loopbackCluster struct {
	nodes  []*clusterNode
	tokens string
}

// peersOf is the --peers list of nodes.
func peersOf(nodes []*clusterNode) string {
	var items []string
	for _, n := range nodes {
		items = append(items, n.id+"="+n.raft+"/"+n.grpc)
	}
	return strings.Join(items, ",")
}

// newLoopbackCluster picks addresses and directories for n nodes and
// starts them.
func newLoopbackCluster(t *testing.T, n int) *loopbackCluster {
	t.Helper()
	lc := &loopbackCluster{tokens: clusterPrincipalsFile(t)}
	for i := range n {
		g, err := testbin.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		r, err := testbin.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		lc.nodes = append(lc.nodes, &clusterNode{id: fmt.Sprintf("n%d", i+1), grpc: g, raft: r, dir: t.TempDir()})
	}
	for _, nd := range lc.nodes {
		lc.start(t, nd, peersOf(lc.nodes))
	}
	return lc
}

// start starts nd with peers and the extra arguments, and waits until it
// listens.
func (lc *loopbackCluster) start(t *testing.T, nd *clusterNode, peers string, extra ...string) {
	t.Helper()
	args := append([]string{"--node-id", nd.id, "--listen", nd.grpc, "--raft-listen", nd.raft, "--peers", peers,
		"--data-dir", nd.dir, "--metrics-listen", "", "--tokens", lc.tokens}, extra...)
	nd.p = procs.Start(t, "coordinator "+nd.id, bins.coordinator, args...)
	nd.p.WaitFor("coordinator listening")
}

// node returns the node of id.
func (lc *loopbackCluster) node(id string) *clusterNode {
	for _, nd := range lc.nodes {
		if nd.id == id {
			return nd
		}
	}
	panic("no node " + id)
}

// waitLeader returns the first of nodes whose leasehold.v1.Leader health
// entry is SERVING, watching each.
func waitLeader(t *testing.T, nodes ...*clusterNode) *clusterNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	found := make(chan *clusterNode, len(nodes))
	for _, nd := range nodes {
		go func() {
			conn, err := grpc.NewClient(nd.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return
			}
			defer conn.Close()
			w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "leasehold.v1.Leader"}, grpc.WaitForReady(true))
			if err != nil {
				return
			}
			for {
				resp, err := w.Recv()
				if err != nil {
					return
				}
				if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
					found <- nd
					return
				}
			}
		}()
	}
	select {
	case nd := <-found:
		return nd
	case <-ctx.Done():
		t.Fatalf("no leader among %d nodes within %v", len(nodes), waitTimeout)
		return nil
	}
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
func waitCaughtUp(t *testing.T, leader *clusterNode, n int) map[string][]string {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		res := clusterCmd(t, leader.grpc, clusterOpsToken, "status")
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
	lc := newLoopbackCluster(t, 3)
	leader := waitLeader(t, lc.nodes...)

	rows := waitCaughtUp(t, leader, 3)
	for _, nd := range lc.nodes {
		f := rows[nd.id]
		role := "follower"
		if nd == leader {
			role = "leader"
		}
		if f == nil || f[1] != "voter" || f[2] != role || f[3] != nd.raft || f[4] != nd.grpc {
			t.Errorf("status row of %s = %q, want a %s voter at %s, %s", nd.id, f, role, nd.raft, nd.grpc)
		}
	}
	// leasehold top shows the cluster to an operator of every team, and
	// not to a submitter.
	top := runCLI(t, leader.grpc, clusterOpsToken, "top", "--count", "1")
	if top.code != 0 || !strings.Contains(top.stdout, "\ncluster  leader "+leader.id+"  term ") {
		t.Errorf("top: exit %d\n%s%s", top.code, top.stdout, top.stderr)
	}
	for _, nd := range lc.nodes {
		if !regexp.MustCompile(`(?m)^` + nd.id + ` +(leader|follower) +` + regexp.QuoteMeta(nd.raft) + ` +\d+ +0 `).MatchString(top.stdout) {
			t.Errorf("top has no row of %s caught up:\n%s", nd.id, top.stdout)
		}
	}
	top = runCLI(t, leader.grpc, "cluster-alpha-token-0123456789", "top", "--count", "1")
	if top.code != 0 || strings.Contains(top.stdout, "cluster") || !strings.Contains(top.stdout, "leasehold top") {
		t.Errorf("top as a submitter: exit %d\n%s%s", top.code, top.stdout, top.stderr)
	}
	single := startCoordinator(t)
	top = runCLI(t, single.addr, tokenOperator, "top", "--count", "1")
	if top.code != 0 || strings.Contains(top.stdout, "cluster") || !strings.Contains(top.stdout, "leasehold top") {
		t.Errorf("top on a single node: exit %d\n%s%s", top.code, top.stdout, top.stderr)
	}

	var follower *clusterNode
	for _, nd := range lc.nodes {
		if nd != leader {
			follower = nd
			break
		}
	}
	res := clusterCmd(t, follower.grpc, clusterOpsToken, "status")
	if res.code != 0 || !strings.Contains(res.stdout, "leader "+leader.id+",") || !strings.Contains(res.stdout, "as follower "+follower.id+" sees it") {
		t.Errorf("status on follower %s: exit %d\n%s%s", follower.id, res.code, res.stdout, res.stderr)
	}

	// Refusals: a follower names the leader; a missing reason or token.
	res = clusterCmd(t, follower.grpc, clusterOpsToken, "transfer-leader", "--reason", "x")
	if res.code != 1 || !strings.Contains(res.stderr, "(UNAVAILABLE NOT_LEADER)") || !strings.Contains(res.stderr, leader.id+" at "+leader.grpc) {
		t.Errorf("transfer-leader on a follower: exit %d, stderr %q", res.code, res.stderr)
	}
	res = clusterCmd(t, leader.grpc, clusterOpsToken, "transfer-leader")
	if res.code != 1 || !strings.Contains(res.stderr, "(INVALID_ARGUMENT MISSING_REASON)") {
		t.Errorf("transfer-leader without a reason: exit %d, stderr %q", res.code, res.stderr)
	}
	res = runTool(t, bins.coordinator, nil, "cluster", "status", "--addr", leader.grpc)
	if res.code != 2 || !strings.Contains(res.stderr, "needs a token") {
		t.Errorf("status without a token: exit %d, stderr %q", res.code, res.stderr)
	}
	res = clusterCmd(t, leader.grpc, clusterOpsToken, "add", "--id", "n9", "--raft-addr", "127.0.0.1:1", "--reason", "x")
	if res.code != 1 || !strings.Contains(res.stderr, "(PERMISSION_DENIED PERMISSION_DENIED)") {
		t.Errorf("add without the backup role: exit %d, stderr %q", res.code, res.stderr)
	}

	// transfer-leader moves the leader where it is told.
	res = clusterCmd(t, leader.grpc, clusterOpsToken, "transfer-leader", "--to", follower.id, "--reason", "rolling restart")
	if want := "leadership moved from " + leader.id + " to " + follower.id; res.code != 0 || !strings.HasPrefix(res.stdout, want) {
		t.Fatalf("transfer-leader: exit %d, stdout %q, stderr %q; want %q", res.code, res.stdout, res.stderr, want)
	}
	if got := waitLeader(t, follower); got != follower {
		t.Fatalf("leader after the transfer: %s", got.id)
	}
	leader = follower

	// remove, a write meanwhile, add: the node is back with the write.
	var gone *clusterNode
	for _, nd := range lc.nodes {
		if nd != leader {
			gone = nd
			break
		}
	}
	res = clusterCmd(t, leader.grpc, clusterOpsToken, "remove", "--id", gone.id, "--reason", "replace its disk")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "removed "+gone.id) {
		t.Fatalf("remove: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	if rows := waitCaughtUp(t, leader, 2); rows[gone.id] != nil {
		t.Fatalf("%s is still listed after its removal", gone.id)
	}
	c := dial(t, leader.grpc, "cluster-alpha-token-0123456789")
	batch := submitOne(t, c, "written while "+gone.id+" was out")
	res = clusterCmd(t, leader.grpc, clusterAdminToken, "add", "--id", gone.id, "--raft-addr", gone.raft, "--reason", "disk replaced")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "added "+gone.id+" at "+gone.raft) {
		t.Fatalf("add: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	waitCaughtUp(t, leader, 3)
	// The node's own store has the batch: a stale read on it, which any
	// node serves from its store.
	back := dial(t, gone.grpc, "cluster-alpha-token-0123456789")
	ctx := metadata.AppendToOutgoingContext(testContext(t), "leasehold-read", "stale")
	if b, err := back.GetBatch(ctx, batch); err != nil || b.GetId() != batch {
		t.Errorf("stale GetBatch(%s) on %s = %v, %v", batch, gone.id, b, err)
	}

	audit := runCLI(t, leader.grpc, clusterOpsToken, "audit", "--limit", "3")
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
	lc := newLoopbackCluster(t, 3)
	leader := waitLeader(t, lc.nodes...)
	c := dial(t, leader.grpc, "cluster-alpha-token-0123456789")
	batch := submitOne(t, c, "kept through the recovery")
	waitCaughtUp(t, leader, 3)

	survivor := lc.node("n1")
	for _, nd := range lc.nodes {
		if nd != survivor {
			nd.p.Kill()
		}
	}
	// Recovery refuses a directory a running node holds.
	res := runTool(t, bins.coordinator, nil, "cluster", "recover", "--data-dir", survivor.dir, "--node-id", survivor.id,
		"--peers", survivor.id+"="+survivor.raft+"/"+survivor.grpc)
	if res.code != 1 || !strings.Contains(res.stderr, "locked by a running coordinator") {
		t.Errorf("recover of a running node: exit %d, stderr %q", res.code, res.stderr)
	}
	survivor.p.Kill()
	peers := survivor.id + "=" + survivor.raft + "/" + survivor.grpc
	res = runTool(t, bins.coordinator, nil, "cluster", "recover", "--data-dir", survivor.dir, "--node-id", survivor.id, "--peers", peers)
	if res.code != 0 || !regexp.MustCompile(`^recovered n1 in .*: a cluster of 1 voters \(n1\), from log index \d+ of term \d+\n`).MatchString(res.stdout) {
		t.Fatalf("recover: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	lc.start(t, survivor, peers)
	if got := waitLeader(t, survivor); got != survivor {
		t.Fatal("the survivor does not lead")
	}
	rows := waitCaughtUp(t, survivor, 1)
	if rows[survivor.id] == nil || rows[survivor.id][2] != "leader" {
		t.Errorf("status after the recovery: %q", rows)
	}
	c = dial(t, survivor.grpc, "cluster-alpha-token-0123456789")
	if b, err := c.GetBatch(testContext(t), batch); err != nil || b.GetId() != batch {
		t.Errorf("GetBatch(%s) after the recovery = %v, %v", batch, b, err)
	}
	// It takes writes again.
	submitOne(t, c, "after the recovery")

	// A single node's directory has no cluster to recover.
	single := t.TempDir()
	p := procs.Start(t, "single", bins.coordinator, proctest.CoordinatorPrincipals([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", single})...)
	p.WaitFor("coordinator listening")
	p.Kill()
	res = runTool(t, bins.coordinator, nil, "cluster", "recover", "--data-dir", single, "--node-id", "n1", "--peers", "n1=127.0.0.1:1")
	if res.code != 1 || !strings.Contains(res.stderr, "holds no raft state") {
		t.Errorf("recover of a single node's directory: exit %d, stderr %q", res.code, res.stderr)
	}
}
