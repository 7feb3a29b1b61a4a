package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/security/securitytest"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestJoinFlag checks that --join makes a cluster node that waits to be
// added, and needs the other cluster flags.
func TestJoinFlag(t *testing.T) {
	t.Parallel()
	cfg, _, err := parseFlags([]string{"--dev", "--node-id", "n4", "--raft-listen", "127.0.0.1:7204",
		"--peers", "n4=127.0.0.1:7204/127.0.0.1:7504", "--join"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster == nil || !cfg.Cluster.Join || cfg.Cluster.NodeID != "n4" {
		t.Errorf("cluster = %+v, want node n4 joining", cfg.Cluster)
	}
	var uerr *usageError
	if _, _, err := parseFlags([]string{"--dev", "--join"}, io.Discard); !errors.As(err, &uerr) {
		t.Errorf("--join alone = %v, want a usage error", err)
	}
}

// TestRaftPlaintextOptOut checks that the opt-out lets raft without TLS
// listen off loopback, and that it excludes a certificate.
func TestRaftPlaintextOptOut(t *testing.T) {
	t.Parallel()
	cfg, _, err := parseFlags([]string{"--dev", "--node-id", "n1", "--raft-listen", "0.0.0.0:7201",
		"--peers", "n1=10.0.0.1:7201,n2=10.0.0.2:7201,n3=10.0.0.3:7201", "--raft-insecure-plaintext-trusted-network"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster == nil || !cfg.Cluster.InsecurePlaintext || cfg.Cluster.TLS != nil {
		t.Errorf("cluster = %+v, want plaintext by opt-out", cfg.Cluster)
	}
	dir := t.TempDir()
	ca := securitytest.NewCA(t, "test CA")
	cert, key := securitytest.WriteKeyPair(t, dir, "node", ca.Server(t))
	_, _, err = parseFlags([]string{"--dev", "--tls-cert", cert, "--tls-key", key, "--tls-peer-ca", ca.File(t, dir), "--node-id", "n1",
		"--raft-listen", "127.0.0.1:7201", "--peers", "n1=127.0.0.1:7201", "--raft-insecure-plaintext-trusted-network"}, io.Discard)
	var uerr *usageError
	if !errors.As(err, &uerr) || !strings.Contains(err.Error(), "excludes --tls-cert") {
		t.Errorf("the opt-out with a certificate = %v, want a usage error", err)
	}
}

// TestClusterCommandUsage runs the cluster subcommands with what they
// refuse before dialing or opening anything: each is a usage error (exit
// 2) naming what is wrong.
func TestClusterCommandUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"no subcommand", []string{"cluster"}, nil, "needs a subcommand"},
		{"an unknown subcommand", []string{"cluster", "promote"}, nil, `unknown subcommand "promote"`},
		{"status without a token", []string{"cluster", "status"}, nil, "needs a token: --token or LEASEHOLD_TOKEN"},
		{"a zero timeout", []string{"cluster", "status", "--token", "t", "--timeout", "0s"}, nil, "--timeout=0s"},
		{"a client certificate without its key", []string{"cluster", "status", "--token", "t", "--tls-cert", "c.pem"}, nil, "--tls-cert and --tls-key go together"},
		{"plaintext excluding TLS", []string{"cluster", "remove", "--tls", "--insecure-plaintext"}, []string{"LEASEHOLD_TOKEN=t"}, "--insecure-plaintext excludes"},
		{"a token in plaintext to another host", []string{"cluster", "status", "--addr", "192.0.2.1:7070"}, []string{"LEASEHOLD_TOKEN=t"},
			"pass --tls-ca or --tls, or --insecure-plaintext"},
		{"a stray argument", []string{"cluster", "remove", "n3"}, []string{"LEASEHOLD_TOKEN=t"}, "unexpected arguments"},
		{"recover without a node id", []string{"cluster", "recover", "--peers", "n1=127.0.0.1:7201"}, nil, "--node-id is required"},
		{"recover without peers", []string{"cluster", "recover", "--node-id", "n1"}, nil, "--peers is required"},
		{"recover into peers without the node", []string{"cluster", "recover", "--node-id", "n1", "--peers", "n2=127.0.0.1:7202"}, nil,
			`--node-id="n1" is not one of --peers`},
		{"recover with an even number of peers", []string{"cluster", "recover", "--node-id", "n1", "--peers", "n1=127.0.0.1:7201,n2=127.0.0.1:7202"}, nil,
			"use 1, 3 or 5"},
		{"a peer id with a space", []string{"cluster", "recover", "--node-id", "n 1", "--peers", "n 1=127.0.0.1:7201"}, nil,
			`peer "n 1": a node id holds letters, digits`},
		{"a server peer id with a slash", []string{"--dev", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--node-id", "a/b",
			"--raft-listen", "127.0.0.1:0", "--peers", "a/b=127.0.0.1:7201"}, nil, `peer "a/b": a node id`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			code, stderr := runCommand(t, dir, tc.args, tc.env)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d containing %q", code, stderr, exitUsage, tc.want)
			}
		})
	}
	t.Run("Help lists the subcommands", func(t *testing.T) {
		var out strings.Builder
		if err := runCluster([]string{"--help"}, io.Discard, &out); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("cluster --help = %v, want flag.ErrHelp", err)
		}
		for _, want := range []string{"status", "transfer-leader", "add", "remove", "recover"} {
			if !strings.Contains(out.String(), "  "+want+" ") {
				t.Errorf("usage lacks %s:\n%s", want, out.String())
			}
		}
	})
}

// TestWriteClusterStatus checks the status table from a leader, from a
// follower and from a single node.
func TestWriteClusterStatus(t *testing.T) {
	t.Parallel()
	members := func(progress bool) []*leaseholdv1.ClusterMember {
		ms := []*leaseholdv1.ClusterMember{
			{Id: "n1", RaftAddress: "10.0.0.1:7201", GrpcAddress: "10.0.0.1:7070", Suffrage: leaseholdv1.Suffrage_SUFFRAGE_VOTER, Leader: true},
			{Id: "n2", RaftAddress: "10.0.0.2:7201", Suffrage: leaseholdv1.Suffrage_SUFFRAGE_VOTER},
			{Id: "n3", RaftAddress: "10.0.0.3:7201", Suffrage: leaseholdv1.Suffrage_SUFFRAGE_VOTER},
		}
		if progress {
			ms[0].Progress = &leaseholdv1.ReplicationProgress{MatchIndex: 42}
			ms[1].Progress = &leaseholdv1.ReplicationProgress{MatchIndex: 40, LagEntries: 2, LastContact: durationpb.New(12 * time.Millisecond)}
		}
		return ms
	}
	var leader strings.Builder
	writeClusterStatus(&leader, &leaseholdv1.GetClusterResponse{Replicated: true, NodeId: "n1", LeaderId: "n1", FromLeader: true, Term: 3,
		CommitIndex: 42, AppliedIndex: 42, Members: members(true)})
	want := "cluster: leader n1, term 3, commit index 42, applied 42 (as the leader sees it)\n" +
		"ID  SUFFRAGE  ROLE      RAFT ADDRESS   GRPC ADDRESS   MATCH  LAG  LAST CONTACT\n" +
		"n1  voter     leader    10.0.0.1:7201  10.0.0.1:7070  42     0    -\n" +
		"n2  voter     follower  10.0.0.2:7201  -              40     2    12ms ago\n" +
		"n3  voter     follower  10.0.0.3:7201  -              -      -    not since this leader began\n"
	if leader.String() != want {
		t.Errorf("from the leader:\n%s\nwant:\n%s", leader.String(), want)
	}
	var follower strings.Builder
	writeClusterStatus(&follower, &leaseholdv1.GetClusterResponse{Replicated: true, NodeId: "n2", Term: 3, Members: members(false)})
	if !strings.HasPrefix(follower.String(), "cluster: leader none known, term 3, commit index 0, applied 0 (as follower n2 sees it;") ||
		strings.Contains(follower.String(), "not since") {
		t.Errorf("from a follower:\n%s", follower.String())
	}
	var single strings.Builder
	writeClusterStatus(&single, &leaseholdv1.GetClusterResponse{})
	if single.String() != "single node: this coordinator runs without a cluster\n" {
		t.Errorf("from a single node: %q", single.String())
	}
}
