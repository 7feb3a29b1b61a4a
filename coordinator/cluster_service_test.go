package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	procstack "github.com/leasehold/leasehold/internal/stack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Tokens of the cluster tests' principals file.
const (
	adminToken     = "admin-token-0123456789abcdef"     // operator of every team, with the backup role
	opsToken       = "ops-token-0123456789abcdef"       // operator of every team
	opsAlphaToken  = "ops-alpha-token-0123456789abcdef" // operator of team alpha
	submitterToken = "alpha-token-0123456789abcdef"     // submitter of team alpha
)

// clusterPrincipals writes the cluster tests' principals file.
func clusterPrincipals(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "principals.json")
	data := `{"principals":[
		{"name":"admin","token":"` + adminToken + `","roles":["operator","backup"],"scope":["*"]},
		{"name":"ops","token":"` + opsToken + `","roles":["operator"],"scope":["*"]},
		{"name":"ops-alpha","token":"` + opsAlphaToken + `","roles":["operator"],"scope":["alpha"]},
		{"name":"alpha-svc","token":"` + submitterToken + `","team":"alpha","roles":["submitter"]}]}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// opsNode is one coordinator of an in-process cluster: real bbolt and
// raft-wal files, raft over the in-memory transport, gRPC on loopback.
type opsNode struct {
	id    string
	c     *Coordinator
	addr  string
	trans *raft.InmemTransport
}

// opsCluster is an in-process cluster of coordinators.
type opsCluster struct {
	nodes []*opsNode
}

// startOpsCluster starts n coordinators that bootstrap one cluster, and
// stops them when the test ends; opts change their configuration.
func startOpsCluster(t *testing.T, n int, opts ...func(*Config)) *opsCluster {
	t.Helper()
	tokens := clusterPrincipals(t)
	tc := &opsCluster{}
	var peers []Peer
	var listeners []net.Listener
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners = append(listeners, lis)
		addr, trans := raft.NewInmemTransport(raft.ServerAddress("raft-" + id + ":7201"))
		peers = append(peers, Peer{ID: id, RaftAddr: string(addr), GRPCAddr: lis.Addr().String()})
		tc.nodes = append(tc.nodes, &opsNode{id: id, addr: lis.Addr().String(), trans: trans})
	}
	for _, a := range tc.nodes {
		for _, b := range tc.nodes {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
	for i, nd := range tc.nodes {
		cfg := Config{
			Listen: nd.addr, DataDir: filepath.Join(t.TempDir(), nd.id), MetricsListen: "127.0.0.1:0", TokensFile: tokens,
			Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 5 * time.Second,
			Cluster: &Cluster{NodeID: nd.id, Peers: peers, transport: nd.trans,
				// raft's defaults here: shorter timeouts make leadership
				// flap on a loaded machine, which the tests do not expect.
				HeartbeatTimeout: time.Second, ElectionTimeout: time.Second, LeaderLeaseTimeout: 500 * time.Millisecond},
		}
		for _, o := range opts {
			o(&cfg)
		}
		c, err := New(cfg)
		if err != nil {
			t.Fatalf("New %s: %v", nd.id, err)
		}
		nd.c = c
		served := make(chan error, 1)
		go func() { served <- c.Serve(listeners[i]) }()
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close %s: %v", nd.id, err)
			}
			if err := <-served; err != nil {
				t.Errorf("Serve %s: %v", nd.id, err)
			}
			// A node closed is gone for the others at once: the in-memory
			// transport would hold a call to it (a last leader's hand-over)
			// for its whole timeout, past the end of the test.
			for _, other := range tc.nodes {
				other.trans.Disconnect(nd.trans.LocalAddr())
			}
		})
	}
	return tc
}

// node returns the node of id.
func (tc *opsCluster) node(id string) *opsNode {
	for _, nd := range tc.nodes {
		if nd.id == id {
			return nd
		}
	}
	panic("no node " + id)
}

// waitLeader returns the node whose Leader health entry turns SERVING
// first among nodes, watching each.
func waitLeader(t *testing.T, nodes ...*opsNode) *opsNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := make([]healthpb.HealthClient, len(nodes))
	for i, nd := range nodes {
		conn, err := grpc.NewClient(nd.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients[i] = healthpb.NewHealthClient(conn)
	}
	i, err := procstack.FirstLeader(ctx, clients)
	if err != nil {
		t.Fatalf("no leader within 30s: %v", err)
	}
	return nodes[i]
}

// dialNode returns a client of nd with token, closed when the test ends.
func dialNode(t *testing.T, nd *opsNode, token string) *client.Client {
	t.Helper()
	c, err := client.Dial(nd.addr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// eventually polls cond until it holds, failing the test after 20 s. It
// is for conditions raft gives no event for (a follower's answers to the
// leader); each poll asks the node again.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		<-tick.C
	}
}

// wantCode fails unless err has code and ErrorInfo reason.
func wantCode(t *testing.T, err error, code codes.Code, reason string) *client.Error {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != code || ce.Reason != reason {
		t.Fatalf("error = %v, want %v %s", err, code, reason)
	}
	return ce
}

// members returns the members of a GetCluster answer by id.
func members(resp *leaseholdv1.GetClusterResponse) map[string]*leaseholdv1.ClusterMember {
	out := map[string]*leaseholdv1.ClusterMember{}
	for _, m := range resp.GetMembers() {
		out[m.GetId()] = m
	}
	return out
}

// followersOf returns the nodes of tc other than leader.
func (tc *opsCluster) followersOf(leader *opsNode) []*opsNode {
	var out []*opsNode
	for _, nd := range tc.nodes {
		if nd != leader {
			out = append(out, nd)
		}
	}
	return out
}

// allReplicated reports whether the leader's answer has every member's
// progress, each follower having stored the leader's whole log.
func allReplicated(t *testing.T, c *client.Client, n int) bool {
	resp, err := c.GetCluster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetMembers()) != n || !resp.GetFromLeader() {
		return false
	}
	for _, m := range resp.GetMembers() {
		if m.GetProgress() == nil || m.GetProgress().GetLagEntries() != 0 {
			return false
		}
	}
	return true
}

// scrape returns the node's /metrics.
func scrape(t *testing.T, nd *opsNode) string {
	t.Helper()
	resp, err := http.Get("http://" + nd.c.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// metricValue returns the value of the sample whose line starts with
// series on the node's /metrics, and whether there is one.
func metricValue(t *testing.T, nd *opsNode, series string) (float64, bool) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(scrape(t, nd))
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

// auditActions returns "ACTION target" of the newest audit records.
func auditActions(t *testing.T, c *client.Client) []string {
	t.Helper()
	resp, err := c.Operator.GetAudit(context.Background(), &leaseholdv1.GetAuditRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range resp.GetRecords() {
		out = append(out, r.GetAction()+" "+r.GetTarget()+" by "+r.GetPrincipal()+": "+r.GetReason())
	}
	return out
}

// TestClusterService runs ClusterService over real gRPC against three
// coordinators on raft's in-memory transport: what the leader and a
// follower report, the refusals, a leadership transfer, a member removed
// and added back, and the raft metrics moving with them.
func TestClusterService(t *testing.T) {
	t.Parallel()
	tc := startOpsCluster(t, 3)
	leader := waitLeader(t, tc.nodes...)
	admin := dialNode(t, leader, adminToken)
	// A failsafe: a call that waits for what never comes fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eventually(t, "every follower caught up", func() bool { return allReplicated(t, admin, 3) })

	t.Run("The leader reports every member with its progress", func(t *testing.T) {
		// The leader's log may grow after the wait above (its writer
		// announces itself, a follower's catch-up ends with an entry of
		// raft's), and a follower's match index follows an append by a
		// round trip: the answer is read once every member has stored the
		// leader's whole log, as the leader knows it.
		var resp *leaseholdv1.GetClusterResponse
		eventually(t, "every member's match index reaches the leader's last index", func() bool {
			var err error
			if resp, err = admin.GetCluster(ctx); err != nil {
				t.Fatal(err)
			}
			for _, m := range resp.GetMembers() {
				if m.GetProgress().GetMatchIndex() != resp.GetLastLogIndex() {
					return false
				}
			}
			return len(resp.GetMembers()) == len(tc.nodes)
		})
		if !resp.GetReplicated() || !resp.GetFromLeader() || resp.GetNodeId() != leader.id || resp.GetLeaderId() != leader.id ||
			resp.GetTerm() == 0 || resp.GetCommitIndex() == 0 || resp.GetAppliedIndex() == 0 {
			t.Fatalf("GetCluster on the leader = %v", resp)
		}
		ms := members(resp)
		for _, nd := range tc.nodes {
			m := ms[nd.id]
			if m == nil || m.GetGrpcAddress() != nd.addr || m.GetSuffrage() != leaseholdv1.Suffrage_SUFFRAGE_VOTER ||
				m.GetLeader() != (nd == leader) || m.GetSelf() != (nd == leader) || m.GetRaftAddress() != "raft-"+nd.id+":7201" {
				t.Errorf("member %s = %v", nd.id, m)
			}
			if (m.GetProgress().GetLastContact() == nil) != (nd == leader) {
				t.Errorf("member %s last contact %v: want one for each follower only", nd.id, m.GetProgress().GetLastContact())
			}
		}
	})

	t.Run("A follower reports its own view, without progress", func(t *testing.T) {
		f := tc.followersOf(leader)[0]
		resp, err := dialNode(t, f, opsToken).GetCluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetReplicated() || resp.GetFromLeader() || resp.GetNodeId() != f.id || resp.GetLeaderId() != leader.id || len(resp.GetMembers()) != 3 {
			t.Fatalf("GetCluster on follower %s = %v", f.id, resp)
		}
		for _, m := range resp.GetMembers() {
			if m.GetProgress() != nil {
				t.Errorf("member %s has progress in a follower's answer: %v", m.GetId(), m.GetProgress())
			}
			if m.GetSelf() != (m.GetId() == f.id) || m.GetLeader() != (m.GetId() == leader.id) {
				t.Errorf("member %v", m)
			}
		}
	})

	t.Run("The raft metrics", func(t *testing.T) {
		if v, ok := metricValue(t, leader, "leasehold_raft_leader"); !ok || v != 1 {
			t.Errorf("leader's leasehold_raft_leader = %v, %v; want 1", v, ok)
		}
		for _, series := range []string{"leasehold_raft_term", "leasehold_raft_commit_index", "leasehold_raft_applied_index",
			"leasehold_raft_leader_changes_total", "leasehold_raft_commit_seconds_count", "leasehold_raft_apply_seconds_count",
			"leasehold_raft_own_entries_total"} {
			if v, ok := metricValue(t, leader, series); !ok || v < 1 {
				t.Errorf("leader's %s = %v, %v; want at least 1", series, v, ok)
			}
		}
		for _, f := range tc.followersOf(leader) {
			// A follower applies every entry from its write set.
			if v, ok := metricValue(t, f, "leasehold_raft_own_entries_total"); !ok || v != 0 {
				t.Errorf("follower %s's leasehold_raft_own_entries_total = %v, %v; want 0", f.id, v, ok)
			}
			if v, ok := metricValue(t, leader, `leasehold_raft_follower_lag_entries{follower="`+f.id+`"}`); !ok || v != 0 {
				t.Errorf("lag of %s = %v, %v; want 0 (caught up)", f.id, v, ok)
			}
			if _, ok := metricValue(t, leader, `leasehold_raft_follower_last_contact_seconds{follower="`+f.id+`"}`); !ok {
				t.Errorf("no last contact of %s", f.id)
			}
			if v, ok := metricValue(t, f, "leasehold_raft_leader"); !ok || v != 0 {
				t.Errorf("follower %s's leasehold_raft_leader = %v, %v; want 0", f.id, v, ok)
			}
			if _, ok := metricValue(t, f, `leasehold_raft_follower_lag_entries{follower="`+leader.id+`"}`); ok {
				t.Errorf("follower %s exports a follower lag", f.id)
			}
			// Stored is not yet applied: the follower applies in its time.
			eventually(t, "follower "+f.id+" applies", func() bool {
				v, ok := metricValue(t, f, "leasehold_raft_apply_seconds_count")
				return ok && v >= 1
			})
			// Its batch commits within 100 ms of its first entry.
			eventually(t, "follower "+f.id+" commits a batch", func() bool {
				v, ok := metricValue(t, f, "leasehold_raft_batch_held_seconds_count")
				return ok && v >= 1
			})
			if _, ok := metricValue(t, f, "leasehold_raft_batch_open_entries"); !ok {
				t.Errorf("follower %s exports no leasehold_raft_batch_open_entries", f.id)
			}
		}
		// The alerts read these; the deploy test, on a single node, cannot
		// see them.
		rules, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", "leasehold.rules.yml"))
		if err != nil {
			t.Fatal(err)
		}
		body := scrape(t, leader)
		names := regexp.MustCompile(`\bleasehold_raft_[a-z0-9_]+\b`).FindAllString(string(rules), -1)
		if len(names) == 0 {
			t.Error("the rules read no raft metric")
		}
		for _, name := range names {
			if !regexp.MustCompile(`(?m)^` + name + `[{ ]`).MatchString(body) {
				t.Errorf("the rules read %s, which the leader does not export", name)
			}
		}
	})

	t.Run("Refusals change nothing", func(t *testing.T) {
		before, err := admin.GetCluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		audit := auditActions(t, admin)
		f := tc.followersOf(leader)[0]
		for _, tok := range []string{opsAlphaToken, submitterToken} {
			_, err := dialNode(t, leader, tok).GetCluster(ctx)
			wantCode(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
			_, err = dialNode(t, leader, tok).TransferLeadership(ctx, "", "because")
			wantCode(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
		}
		ops := dialNode(t, leader, opsToken)
		_, err = ops.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: "n9", RaftAddress: "10.0.0.9:7201", Reason: "grow"})
		wantCode(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
		cases := []struct {
			name   string
			call   func() error
			code   codes.Code
			reason string
		}{
			{"transfer without a reason", func() error { _, err := admin.TransferLeadership(ctx, f.id, " "); return err },
				codes.InvalidArgument, "MISSING_REASON"},
			{"transfer to a malformed id", func() error { _, err := admin.TransferLeadership(ctx, "n 1", "x"); return err },
				codes.InvalidArgument, "INVALID_MEMBER_ID"},
			{"transfer to a stranger", func() error { _, err := admin.TransferLeadership(ctx, "n9", "x"); return err },
				codes.NotFound, "MEMBER_NOT_FOUND"},
			{"add with a malformed address", func() error {
				_, err := admin.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: "n9", RaftAddress: "10.0.0.9", Reason: "x"})
				return err
			}, codes.InvalidArgument, "INVALID_RAFT_ADDRESS"},
			{"add with port 0", func() error {
				_, err := admin.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: "n9", RaftAddress: "10.0.0.9:0", Reason: "x"})
				return err
			}, codes.InvalidArgument, "INVALID_RAFT_ADDRESS"},
			{"add at a member's address", func() error {
				_, err := admin.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: "n9", RaftAddress: "raft-" + f.id + ":7201", Reason: "x"})
				return err
			}, codes.FailedPrecondition, "RAFT_ADDRESS_IN_USE"},
			{"remove a stranger", func() error {
				_, err := admin.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: "n9", Reason: "x"})
				return err
			}, codes.NotFound, "MEMBER_NOT_FOUND"},
			{"remove with a reason too long", func() error {
				_, err := admin.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: f.id, Reason: strings.Repeat("x", 1025)})
				return err
			}, codes.InvalidArgument, "INVALID_REASON"},
		}
		for _, tt := range cases {
			t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.call(), tt.code, tt.reason) })
		}

		// A follower refuses every change, naming the leader.
		onFollower := dialNode(t, f, adminToken)
		_, err = onFollower.TransferLeadership(ctx, "", "x")
		ce := wantCode(t, err, codes.Unavailable, "NOT_LEADER")
		if ce.Metadata["leader_id"] != leader.id || ce.Metadata["leader_addr"] != leader.addr {
			t.Errorf("NOT_LEADER metadata = %v, want the leader %s at %s", ce.Metadata, leader.id, leader.addr)
		}
		_, err = onFollower.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: leader.id, Reason: "x"})
		wantCode(t, err, codes.Unavailable, "NOT_LEADER")
		_, err = onFollower.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: "n9", RaftAddress: "10.0.0.9:7201", Reason: "x"})
		wantCode(t, err, codes.Unavailable, "NOT_LEADER")

		after, err := admin.GetCluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(after.GetMembers()) != len(before.GetMembers()) || after.GetLeaderId() != before.GetLeaderId() || after.GetTerm() != before.GetTerm() {
			t.Errorf("after the refusals: %v; before: %v", after, before)
		}
		if got := auditActions(t, admin); len(got) != len(audit) {
			t.Errorf("audit after the refusals = %q, before %q", got, audit)
		}
	})

	// A named transfer moves the leader there; the old leader counts the change.
	target := tc.followersOf(leader)[0]
	changesBefore, _ := metricValue(t, leader, "leasehold_raft_leader_changes_total")
	resp, err := admin.TransferLeadership(ctx, target.id, "rolling restart of "+leader.id)
	if err != nil {
		t.Fatalf("TransferLeadership: %v", err)
	}
	if !resp.GetChanged() || resp.GetPreviousLeaderId() != leader.id || resp.GetLeaderId() != target.id {
		t.Fatalf("TransferLeadership = %v, want %s to %s", resp, leader.id, target.id)
	}
	if got := waitLeader(t, target); got != target {
		t.Fatalf("leader after the transfer = %s", got.id)
	}
	if v, _ := metricValue(t, leader, "leasehold_raft_leader_changes_total"); v <= changesBefore {
		t.Errorf("old leader's leasehold_raft_leader_changes_total = %v, was %v: the transfer is not counted", v, changesBefore)
	}
	if v, _ := metricValue(t, leader, "leasehold_raft_leader"); v != 0 {
		t.Errorf("old leader's leasehold_raft_leader = %v, want 0", v)
	}
	old := leader
	leader = target
	admin = dialNode(t, leader, adminToken)
	// The audit record was written before the change, by the old leader.
	if got := auditActions(t, admin); len(got) == 0 ||
		got[0] != "CLUSTER_TRANSFER_LEADERSHIP "+old.id+" to "+target.id+" by admin: rolling restart of "+old.id {
		t.Errorf("audit = %q", got)
	}

	// Naming the leader changes nothing.
	same, err := admin.TransferLeadership(ctx, leader.id, "no-op")
	if err != nil || same.GetChanged() || same.GetLeaderId() != leader.id {
		t.Errorf("transfer to the leader itself = %v, %v; want unchanged", same, err)
	}

	// Remove a follower, then add it back: it catches up again.
	gone := tc.followersOf(leader)[0]
	rm, err := admin.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: gone.id, Reason: "replace its disk"})
	if err != nil {
		t.Fatalf("RemoveServer: %v", err)
	}
	st, err := admin.GetCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := members(st)[gone.id]; ok || len(st.GetMembers()) != 2 || rm.GetConfigurationIndex() == 0 {
		t.Fatalf("after removing %s: %v (configuration %d)", gone.id, st, rm.GetConfigurationIndex())
	}
	add, err := admin.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: gone.id, RaftAddress: "raft-" + gone.id + ":7201", Reason: "disk replaced"})
	if err != nil {
		t.Fatalf("AddVoter: %v", err)
	}
	if !add.GetChanged() || add.GetConfigurationIndex() <= rm.GetConfigurationIndex() {
		t.Errorf("AddVoter configuration index %d, not after the removal's %d", add.GetConfigurationIndex(), rm.GetConfigurationIndex())
	}
	eventually(t, gone.id+" caught up after it was added back", func() bool { return allReplicated(t, admin, 3) })
	again, err := admin.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: gone.id, RaftAddress: "raft-" + gone.id + ":7201", Reason: "twice"})
	if err != nil || again.GetChanged() {
		t.Errorf("adding the same voter again = %v, %v; want nothing changed", again, err)
	}
	if got := auditActions(t, admin); len(got) < 2 ||
		got[0] != "CLUSTER_ADD_VOTER "+gone.id+" at raft-"+gone.id+":7201 by admin: disk replaced" ||
		got[1] != "CLUSTER_REMOVE_SERVER "+gone.id+" by admin: replace its disk" {
		t.Errorf("audit = %q", got)
	}

	// A transfer to any voter picks one of the others.
	anyResp, err := admin.TransferLeadership(ctx, "", "any")
	if err != nil || !anyResp.GetChanged() || anyResp.GetLeaderId() == leader.id || anyResp.GetLeaderId() == "" {
		t.Fatalf("transfer to any voter = %v, %v", anyResp, err)
	}
	leader = waitLeader(t, tc.node(anyResp.GetLeaderId()))
	admin = dialNode(t, leader, adminToken)
	eventually(t, "every follower caught up", func() bool { return allReplicated(t, admin, 3) })

	// A follower that stops answering: removing the other one would leave
	// no quorum, and it cannot take over.
	// It is cut off from both others, so that whichever of them leads
	// (a loaded machine may see the leadership move) hears nothing from it.
	down := tc.followersOf(leader)[0]
	down.trans.DisconnectAll()
	for _, nd := range tc.followersOf(down) {
		nd.trans.Disconnect(down.trans.LocalAddr())
	}
	defer func() {
		for _, nd := range tc.followersOf(down) {
			down.trans.Connect(nd.trans.LocalAddr(), nd.trans)
			nd.trans.Connect(down.trans.LocalAddr(), down.trans)
		}
	}()
	eventually(t, down.id+" stops counting", func() bool {
		resp, err := admin.GetCluster(ctx)
		if err != nil || resp.GetLeaderId() != leader.id {
			leader = waitLeader(t, tc.followersOf(down)...)
			admin = dialNode(t, leader, adminToken)
			return false
		}
		lc := members(resp)[down.id].GetProgress().GetLastContact()
		return lc != nil && lc.AsDuration() > 4*time.Second
	})
	var up *opsNode
	for _, nd := range tc.followersOf(down) {
		if nd != leader {
			up = nd
		}
	}
	_, err = admin.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: up.id, Reason: "x"})
	wantCode(t, err, codes.FailedPrecondition, "QUORUM_AT_RISK")
	_, err = admin.TransferLeadership(ctx, down.id, "x")
	wantCode(t, err, codes.FailedPrecondition, "MEMBER_UNREACHABLE")
	// Moving the live follower elsewhere: it would vote there before it answers.
	_, err = admin.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: up.id, RaftAddress: "raft-elsewhere:7201", Reason: "x"})
	wantCode(t, err, codes.FailedPrecondition, "QUORUM_AT_RISK")
	if st, err := admin.GetCluster(ctx); err != nil || len(st.GetMembers()) != 3 || members(st)[up.id].GetRaftAddress() != "raft-"+up.id+":7201" {
		t.Errorf("members after the refused changes = %v, %v", st, err)
	}

	// A new member that never answers stays a nonvoter, outside the quorum.
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	_, err = admin.AddVoter(short, &leaseholdv1.AddVoterRequest{Id: "n4", RaftAddress: "raft-n4:7201", Reason: "grow"})
	wantCode(t, err, codes.DeadlineExceeded, "")
	st, err = admin.GetCluster(ctx)
	if err != nil || members(st)["n4"].GetSuffrage() != leaseholdv1.Suffrage_SUFFRAGE_NONVOTER {
		t.Fatalf("n4 after an add it never answered = %v, %v; want a nonvoter", members(st)["n4"], err)
	}
	if _, err := admin.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: "n4", Reason: "never came"}); err != nil {
		t.Errorf("removing the nonvoter: %v", err)
	}
}

// TestClusterServiceOneVoter checks what a cluster of one voter refuses:
// there is no one to hand leadership to, and its last voter stays.
func TestClusterServiceOneVoter(t *testing.T) {
	t.Parallel()
	tc := startOpsCluster(t, 1)
	leader := waitLeader(t, tc.nodes...)
	admin := dialNode(t, leader, adminToken)
	// A failsafe: a call that waits for what never comes fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := admin.TransferLeadership(ctx, "", "x")
	wantCode(t, err, codes.FailedPrecondition, "NO_TRANSFER_TARGET")
	_, err = admin.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: leader.id, Reason: "x", Force: true})
	wantCode(t, err, codes.FailedPrecondition, "LAST_VOTER")
	if got := auditActions(t, admin); len(got) != 0 {
		t.Errorf("audit = %q, want nothing", got)
	}
}

// TestClusterServiceSingleNode checks that a coordinator without cluster
// flags says so, refuses the changes, and exports no raft metrics.
func TestClusterServiceSingleNode(t *testing.T) {
	t.Parallel()
	s := startStack(t, Config{Listen: "127.0.0.1:0", TokensFile: clusterPrincipals(t), MetricsListen: "127.0.0.1:0"})
	c, err := client.Dial(s.addr, client.WithToken(adminToken))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A failsafe: a call that waits for what never comes fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := c.GetCluster(ctx)
	if err != nil || resp.GetReplicated() || len(resp.GetMembers()) != 0 {
		t.Errorf("GetCluster on a single node = %v, %v; want not replicated", resp, err)
	}
	_, err = c.TransferLeadership(ctx, "", "x")
	wantCode(t, err, codes.FailedPrecondition, "NOT_REPLICATED")
	_, err = c.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: "n2", RaftAddress: "10.0.0.2:7201", Reason: "x"})
	wantCode(t, err, codes.FailedPrecondition, "NOT_REPLICATED")
	_, err = c.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: "n2", Reason: "x"})
	wantCode(t, err, codes.FailedPrecondition, "NOT_REPLICATED")

	mresp, err := http.Get("http://" + s.c.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	body, _ := io.ReadAll(mresp.Body)
	if strings.Contains(string(body), "leasehold_raft_") {
		t.Errorf("a single node exports raft metrics:\n%s", regexp.MustCompile(`(?m)^leasehold_raft_.*$`).FindAllString(string(body), -1))
	}
}

// TestClusterConsole checks the console's overview: the leader's console
// shows an operator of every team the members, the leader and each lag;
// an operator of one team, and a single node's console, show no cluster.
func TestClusterConsole(t *testing.T) {
	t.Parallel()
	tc := startOpsCluster(t, 3, func(cfg *Config) { cfg.Console = true })
	leader := waitLeader(t, tc.nodes...)
	eventually(t, "every follower caught up", func() bool { return allReplicated(t, dialNode(t, leader, opsToken), 3) })
	at := func(nd *opsNode) *consoleBundle {
		return &consoleBundle{base: strings.TrimSuffix(nd.c.ConsoleURL(), "/console/")}
	}

	rows := func(page string) []string {
		var missing []string
		for _, nd := range tc.nodes {
			role := "follower"
			if nd == leader {
				role = "leader"
			}
			row := regexp.MustCompile(`<th scope="row">` + nd.id + `</th><td>` + role + `</td><td>raft-` + nd.id + `:7201</td><td>` +
				regexp.QuoteMeta(nd.addr) + `</td>\s*<td class="num">\d+</td><td class="num">0</td>`)
			if !row.MatchString(page) {
				missing = append(missing, nd.id)
			}
		}
		return missing
	}
	// A follower's match index reaches the leader's at its next answer: the
	// page is read again until every row shows it caught up.
	b := at(leader).browser(t).signIn(opsToken)
	var page string
	eventually(t, "the overview shows every member caught up", func() bool {
		_, page = b.send("GET", "/console/", "")
		return len(rows(page)) == 0
	})
	if !strings.Contains(page, `<h2 id="cluster-h">Cluster</h2>`) || !strings.Contains(page, "Leader <strong>"+leader.id+"</strong>") {
		t.Fatalf("the leader's overview lacks the cluster:\n%s", page)
	}
	_, page = at(leader).browser(t).signIn(opsAlphaToken).send("GET", "/console/", "")
	if strings.Contains(page, "cluster-h") {
		t.Errorf("an operator of team alpha sees the cluster:\n%s", page)
	}

	single := setupConsole(t, Config{})
	_, page = single.browser(t).signIn("dev-operator").send("GET", "/console/", "")
	if strings.Contains(page, "cluster-h") || !strings.Contains(page, `id="teams-h"`) {
		t.Errorf("a single node's overview shows a cluster, or no teams:\n%s", page)
	}
}

// TestClusterTransferFailedLeaderWritesAgain fails a leadership transfer
// while writes arrive: the target is cut off from the leader and lags, so
// raft's transfer waits for it until its timeout and the leader stays.
// The writes refused during the transfer stop the writer; once the
// transfer has failed the leader must take writes again, with no other
// change of leadership to prompt it.
func TestClusterTransferFailedLeaderWritesAgain(t *testing.T) {
	t.Parallel()
	tc := startOpsCluster(t, 3)
	leader := waitLeader(t, tc.nodes...)
	admin := dialNode(t, leader, adminToken)
	sub := dialNode(t, leader, submitterToken)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eventually(t, "every follower caught up", func() bool { return allReplicated(t, admin, 3) })
	submit := func(id string) error {
		_, err := sub.SubmitBatch(ctx, "alpha", id, []*leaseholdv1.Document{{Name: "a.txt", Content: []byte(id)}}, nil)
		return err
	}

	target := tc.followersOf(leader)[0]
	leader.trans.Disconnect(target.trans.LocalAddr())
	for i := range 3 {
		if err := submit(fmt.Sprintf("before-%d", i)); err != nil {
			t.Fatalf("a submit with the target cut off: %v", err)
		}
	}
	transferred := make(chan error, 1)
	go func() {
		_, err := admin.TransferLeadership(ctx, target.id, "a target that cannot catch up")
		transferred <- err
	}()
	refused := 0
	var transferErr error
	for i := 0; ; i++ {
		select {
		case transferErr = <-transferred:
		default:
			if err := submit(fmt.Sprintf("during-%d", i)); err != nil {
				refused++
			}
			continue
		}
		break
	}
	wantCode(t, transferErr, codes.Unavailable, "LEADERSHIP_TRANSFER_FAILED")
	if refused == 0 {
		t.Fatal("no submit was refused during the transfer: the writer was never stopped by it")
	}
	leader.trans.Connect(target.trans.LocalAddr(), target.trans)
	if got := waitLeader(t, tc.nodes...); got != leader {
		t.Fatalf("%s leads after the failed transfer, want %s still", got.id, leader.id)
	}
	if err := submit("after"); err != nil {
		t.Errorf("a submit on the leader after the failed transfer: %v", err)
	}
}
