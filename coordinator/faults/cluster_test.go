package faults

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/testbin"
)

// node is one coordinator process of a three-node cluster on loopback.
type node struct {
	id, grpc, raft, dir string
	*proctest.Proc
}

// cluster is a cluster of coordinator processes, started with the same
// peers and extra arguments.
type cluster struct {
	nodes []*node
	args  []string
}

// newCluster picks addresses for nodes named n1, n2, ... with the given
// data directories, and starts them all.
func newCluster(t *testing.T, dirs []string, args ...string) *cluster {
	t.Helper()
	c := &cluster{args: args}
	for i, dir := range dirs {
		g, err := testbin.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		r, err := testbin.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, &node{id: fmt.Sprintf("n%d", i+1), grpc: g, raft: r, dir: dir})
	}
	for _, n := range c.nodes {
		c.start(t, n)
	}
	return c
}

// addrs is every node's gRPC address, comma-separated, as renderers and
// clients take them.
func (c *cluster) addrs() string {
	var a []string
	for _, n := range c.nodes {
		a = append(a, n.grpc)
	}
	return strings.Join(a, ",")
}

// start starts n (again) on its data directory and waits until it
// listens.
func (c *cluster) start(t *testing.T, n *node) {
	t.Helper()
	var peers []string
	for _, p := range c.nodes {
		peers = append(peers, p.id+"="+p.raft+"/"+p.grpc)
	}
	args := proctest.CoordinatorPrincipals(append([]string{"--node-id", n.id, "--listen", n.grpc, "--raft-listen", n.raft,
		"--peers", strings.Join(peers, ","), "--data-dir", n.dir, "--metrics-listen", ""}, c.args...))
	n.Proc = procs.Start(t, "coordinator "+n.id, bins.coordinator, args...)
	n.WaitFor("coordinator listening")
}

// others returns the nodes but n.
func (c *cluster) others(n *node) []*node {
	var out []*node
	for _, o := range c.nodes {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

// waitLeader returns the first of nodes whose leasehold.v1.Leader health
// entry is SERVING, watching each.
func waitLeader(t testing.TB, nodes ...*node) *node {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	found := make(chan *node, len(nodes))
	for _, n := range nodes {
		go func() {
			conn, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
					found <- n
					return
				}
			}
		}()
	}
	select {
	case n := <-found:
		return n
	case <-ctx.Done():
		t.Fatalf("no leader among %d nodes within %v", len(nodes), waitTimeout)
		return nil
	}
}

// clusterView asks n how it sees the cluster.
func clusterView(t testing.TB, n *node) *leaseholdv1.GetClusterResponse {
	t.Helper()
	c, err := client.Dial(n.grpc, client.WithToken(tokenOperator))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.GetCluster(testContext(t))
	if err != nil {
		t.Fatalf("GetCluster on %s: %v", n.id, err)
	}
	return resp
}

// waitApplied waits until every one of nodes has applied the same index
// as the leader, as raft counts it (an entry handed to the store, which
// may still be writing it), and returns that index. The cluster must be
// quiet (no load, no renderer): each try asks again, as nodes tell no
// event when they catch up.
func waitApplied(t testing.TB, leader *node, nodes []*node) uint64 {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		want := clusterView(t, leader).GetAppliedIndex()
		same := true
		var seen []string
		for _, n := range nodes {
			got := clusterView(t, n).GetAppliedIndex()
			seen = append(seen, fmt.Sprintf("%s %d", n.id, got))
			same = same && got == want
		}
		if same {
			return want
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes did not apply the leader's index %d within %v: %s", want, waitTimeout, strings.Join(seen, ", "))
		}
		<-tick.C
	}
}

// storeState opens the stopped node's store and returns the index it
// applied and its digest.
func storeState(t testing.TB, n *node) (uint64, [32]byte) {
	t.Helper()
	st, err := store.Open(filepath.Join(n.dir, "leasehold.db"))
	if err != nil {
		t.Fatalf("opening the store of %s: %v", n.id, err)
	}
	defer st.Close()
	rs, err := st.ReplicaState()
	if err != nil {
		t.Fatal(err)
	}
	d, err := st.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return rs.Applied, d
}
