package faults

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/stack"
)

// node is one coordinator process of a three-node cluster on loopback.
type node = stack.Node

// newCluster starts a cluster of three nodes named n1, n2, n3 on the
// given data directories, all with args, and waits for a leader.
func newCluster(t *testing.T, dirs []string, args ...string) *stack.Stack {
	t.Helper()
	opts := options()
	opts.Nodes, opts.DataDirs, opts.Args = 3, dirs, args
	return stack.Start(t, opts)
}

// clusterView asks n how it sees the cluster.
func clusterView(t testing.TB, n *node) *leaseholdv1.GetClusterResponse {
	t.Helper()
	c, err := client.Dial(n.Addr, client.WithToken(tokenOperator))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.GetCluster(testContext(t))
	if err != nil {
		t.Fatalf("GetCluster on %s: %v", n.ID, err)
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
			seen = append(seen, fmt.Sprintf("%s %d", n.ID, got))
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
	st, err := store.Open(filepath.Join(n.DataDir, "leasehold.db"))
	if err != nil {
		t.Fatalf("opening the store of %s: %v", n.ID, err)
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
