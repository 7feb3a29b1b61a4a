package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// clusterNode is one coordinator of an in-process cluster: real bbolt,
// real engine and gRPC on loopback, raft over raft's in-memory transport
// so that the test can cut links.
type clusterNode struct {
	id    string
	c     *Coordinator
	trans *raft.InmemTransport
	addr  string
	// peerAddr is its gRPC address in the peers list: the same port under
	// another name than addr, the address it listens on, so that a test
	// sees which of the two the leader announces.
	peerAddr string
	conn     *grpc.ClientConn
	jobs     leaseholdv1.JobServiceClient
}

type testCluster struct {
	t     *testing.T
	nodes []*clusterNode
}

func newTestCluster(t *testing.T) *testCluster {
	t.Helper()
	tc := &testCluster{t: t}
	var peers []Peer
	var liss []net.Listener
	for i := range 3 {
		id := fmt.Sprintf("n%d", i+1)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		liss = append(liss, lis)
		// A short RPC timeout: a transfer's RPC to a node that stopped ends
		// soon after the test, not raft's default 5 s later.
		addr, trans := raft.NewInmemTransportWithTimeout(raft.ServerAddress(id), 300*time.Millisecond)
		_, port, _ := net.SplitHostPort(lis.Addr().String())
		peerAddr := net.JoinHostPort("localhost", port)
		peers = append(peers, Peer{ID: id, RaftAddr: string(addr), GRPCAddr: peerAddr})
		tc.nodes = append(tc.nodes, &clusterNode{id: id, trans: trans, addr: lis.Addr().String(), peerAddr: peerAddr})
	}
	tc.connect()
	dir := t.TempDir()
	for i, n := range tc.nodes {
		c, err := New(Config{
			Listen:  n.addr,
			DataDir: filepath.Join(dir, n.id),
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
			Cluster: &Cluster{NodeID: n.id, Peers: peers, transport: n.trans,
				HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 50 * time.Millisecond},
		})
		if err != nil {
			t.Fatalf("New %s: %v", n.id, err)
		}
		n.c = c
		served := make(chan error, 1)
		go func() { served <- c.Serve(liss[i]) }()
		t.Cleanup(func() {
			c.Close()
			if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				t.Errorf("Serve %s: %v", n.id, err)
			}
		})
		n.conn, err = grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.conn.Close() })
		n.jobs = leaseholdv1.NewJobServiceClient(n.conn)
	}
	return tc
}

// connect links every node's raft to every other's.
func (tc *testCluster) connect() {
	for _, a := range tc.nodes {
		for _, b := range tc.nodes {
			if a != b {
				a.trans.Connect(raft.ServerAddress(b.id), b.trans)
			}
		}
	}
}

// isolate cuts n's raft links both ways; clients still reach it.
func (tc *testCluster) isolate(n *clusterNode) {
	n.trans.DisconnectAll()
	for _, o := range tc.nodes {
		if o != n {
			o.trans.Disconnect(raft.ServerAddress(n.id))
		}
	}
}

// leader waits for a node among among (every node when none) whose writer
// leads, and returns it. raft's elections run on real timers; the wait
// asks again every few milliseconds, for at most 10 s.
func (tc *testCluster) leader(among ...*clusterNode) *clusterNode {
	tc.t.Helper()
	if len(among) == 0 {
		among = tc.nodes
	}
	var found *clusterNode
	tc.eventually("a leader", func() bool {
		for _, n := range among {
			if n.c.eng.Leading() && n.c.replica.Node().IsLeader() {
				found = n
				return true
			}
		}
		return false
	})
	return found
}

// alphaCtx is a call as dev-alpha, ending with the test.
func (tc *testCluster) alphaCtx() context.Context {
	return metadata.AppendToOutgoingContext(tc.t.Context(), "authorization", "Bearer dev-alpha")
}

// eventually waits for cond, asking every few milliseconds for at most
// 10 s: raft runs on real timers and tells no one when a follower applied
// an entry or an election ended, so there is no event to wait on.
func (tc *testCluster) eventually(what string, cond func() bool) {
	tc.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			tc.t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// submit submits one document to the leader among among (every node when
// none), retrying on the leader while a failover settles, as a client
// following the leader does (a write is idempotent by its request id); it
// returns the batch id acknowledged.
func (tc *testCluster) submit(req string, among ...*clusterNode) string {
	tc.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := tc.leader(among...)
		resp, err := n.jobs.SubmitBatch(tc.alphaCtx(), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: req,
			Documents: []*leaseholdv1.Document{{Name: req + ".txt", ContentType: "text/plain", Content: []byte(req)}}})
		if err == nil {
			return resp.GetBatch().GetId()
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			tc.t.Fatalf("submit %s on %s: %v", req, n.id, err)
		}
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t)
	var acked []string
	for i := range 5 {
		acked = append(acked, tc.submit(fmt.Sprintf("a-%d", i)))
	}

	// A follower refuses a write, naming the leader.
	l1 := tc.leader()
	var follower *clusterNode
	for _, n := range tc.nodes {
		if n != l1 {
			follower = n
		}
	}
	_, err := follower.jobs.SubmitBatch(tc.alphaCtx(), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "f",
		Documents: []*leaseholdv1.Document{{Name: "f.txt", ContentType: "text/plain", Content: []byte("f")}}})
	if status.Code(err) != codes.Unavailable || reasonOf(err) != "NOT_LEADER" {
		t.Fatalf("a write on a follower: %v, want UNAVAILABLE NOT_LEADER", err)
	}
	// It names the leader's address in the peers list, which the leader
	// announces, rather than the address it listens on.
	if !errorNames(err, l1.id, l1.peerAddr) {
		t.Errorf("the follower's NOT_LEADER does not name the leader %s at %s: %v", l1.id, l1.peerAddr, err)
	}

	// The leader is cut off from both followers: the others elect a new
	// leader, and writes go on there.
	tc.isolate(l1)
	var rest []*clusterNode
	for _, n := range tc.nodes {
		if n != l1 {
			rest = append(rest, n)
		}
	}
	tc.leader(rest...)
	for i := range 5 {
		acked = append(acked, tc.submit(fmt.Sprintf("b-%d", i), rest...))
	}
	// The deposed leader steps down and acknowledges nothing.
	tc.eventually("the deposed leader steps down", func() bool { return !l1.c.eng.Leading() })
	if _, err := l1.jobs.SubmitBatch(tc.alphaCtx(), &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "lost",
		Documents: []*leaseholdv1.Document{{Name: "x.txt", ContentType: "text/plain", Content: []byte("x")}}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a write on the deposed leader: %v, want UNAVAILABLE", err)
	}
	// A cancel reads the job or batch before the writer sees it: the
	// deposed leader, whose store lacks what the new leader took, refuses
	// it NOT_LEADER instead of answering NOT_FOUND from its own store.
	taken := acked[len(acked)-1]
	if _, err := l1.jobs.CancelBatch(tc.alphaCtx(), &leaseholdv1.CancelBatchRequest{BatchId: taken}); status.Code(err) != codes.Unavailable || reasonOf(err) != "NOT_LEADER" {
		t.Errorf("a cancel of batch %s on the deposed leader: %v, want UNAVAILABLE NOT_LEADER", taken, err)
	}
	if _, err := l1.jobs.CancelJob(tc.alphaCtx(), &leaseholdv1.CancelJobRequest{JobId: "j-999999"}); status.Code(err) != codes.Unavailable || reasonOf(err) != "NOT_LEADER" {
		t.Errorf("a cancel of a job on the deposed leader: %v, want UNAVAILABLE NOT_LEADER", err)
	}

	// Heal, hand leadership on, and write on whoever leads.
	tc.connect()
	if err := tc.leader().c.replica.Node().Raft.LeadershipTransfer().Error(); err != nil {
		t.Fatalf("LeadershipTransfer: %v", err)
	}
	for i := range 5 {
		acked = append(acked, tc.submit(fmt.Sprintf("c-%d", i)))
	}

	// Every acknowledged batch is on every node, and the stores are equal.
	l3 := tc.leader()
	want := l3.c.replica.Node().Raft.AppliedIndex()
	for _, n := range tc.nodes {
		tc.eventually(n.id+" applies what the leader did", func() bool {
			return n.c.replica.FSM().Applied() >= l3.c.replica.FSM().Applied() && n.c.replica.Node().Raft.AppliedIndex() >= want
		})
		for _, b := range acked {
			ctx := metadata.AppendToOutgoingContext(tc.alphaCtx(), server.ReadModeKey, server.ReadStale)
			if _, err := n.jobs.GetBatch(ctx, &leaseholdv1.GetBatchRequest{BatchId: b}); err != nil {
				t.Errorf("acknowledged batch %s on %s: %v", b, n.id, err)
			}
		}
		if _, err := n.jobs.GetBatch(metadata.AppendToOutgoingContext(tc.alphaCtx(), server.ReadModeKey, server.ReadStale),
			&leaseholdv1.GetBatchRequest{BatchId: "b-999"}); status.Code(err) != codes.NotFound {
			t.Errorf("a batch never submitted on %s: %v", n.id, err)
		}
	}
	d0, _ := tc.nodes[0].c.st.Digest()
	for _, n := range tc.nodes[1:] {
		if d, _ := n.c.st.Digest(); d != d0 {
			t.Errorf("%s's store differs from n1's", n.id)
		}
	}
	for _, n := range tc.nodes {
		if st, err := n.c.st.Stats(); err != nil || st.PageSize != cluster.StorePageSize {
			t.Errorf("%s's store has pages of %d bytes (%v), want the cluster's %d", n.id, st.PageSize, err, cluster.StorePageSize)
		}
	}
	// A linearizable read on a follower is refused; on the leader it is
	// served.
	for _, n := range tc.nodes {
		_, err := n.jobs.GetBatch(tc.alphaCtx(), &leaseholdv1.GetBatchRequest{BatchId: acked[0]})
		if n == l3 && err != nil {
			t.Errorf("a read on the leader: %v", err)
		}
		if n != l3 && reasonOf(err) != "NOT_LEADER" {
			t.Errorf("a linearizable read on follower %s: %v, want NOT_LEADER", n.id, err)
		}
	}
}

// errorNames reports whether err's ErrorInfo names the leader id and addr.
func errorNames(err error, id, addr string) bool {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()["leader_id"] == id && info.GetMetadata()["leader_addr"] == addr
		}
	}
	return false
}
