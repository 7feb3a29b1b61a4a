package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/testbin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// leaderHealth is the health entry only a cluster's leader serves.
const leaderHealth = "leasehold.v1.Leader"

// startCluster starts -cluster nodes of one replicated cluster on this
// machine, each with its own data directory, gRPC, metrics and raft
// ports, waits until every one serves and one leads, and points the stack
// (its address, metrics, coord) at the leader. It returns the time from
// the first exec to the leader's first SERVING.
func (s *stack) startCluster() (time.Duration, error) {
	type node struct{ id, addr, metrics, raft, data string }
	nodes := make([]node, s.cfg.cluster)
	var peers []string
	for i := range nodes {
		n := node{id: fmt.Sprintf("n%d", i+1), data: filepath.Join(s.dir, fmt.Sprintf("data-n%d", i+1))}
		var err error
		for _, p := range []*string{&n.addr, &n.metrics, &n.raft} {
			if *p, err = testbin.FreeAddr(); err != nil {
				return 0, err
			}
		}
		nodes[i] = n
		peers = append(peers, n.id+"="+n.raft+"/"+n.addr)
	}
	started := time.Now()
	children := make(map[string]*testbin.Child)
	for _, n := range nodes {
		args := append(s.bins.devArgs(), "--listen", n.addr, "--data-dir", n.data, "--metrics-listen", n.metrics,
			"--node-id", n.id, "--raft-listen", n.raft, "--peers", strings.Join(peers, ","))
		if s.cfg.logLevel != "" {
			args = append(args, "--log-level", s.cfg.logLevel)
		}
		args = append(args, s.extraFlags...)
		args = append(args, s.cfg.coordinatorFlags...)
		name := "coordinator-" + n.id
		c, err := testbin.StartChild(name, s.bins.coordinator, args, nil, filepath.Join(s.dir, name+".log"), s.fail)
		if err != nil {
			return 0, err
		}
		children[n.id] = c
		s.followers = append(s.followers, c)
	}
	for _, n := range nodes {
		if _, err := testbin.WaitServing(s.ctx, n.addr, s.cfg.healthPoll, children[n.id].Done()); err != nil {
			return 0, fmt.Errorf("waiting for %s to serve: %w\n%s", n.id, err, children[n.id].Tail(20))
		}
	}
	tick := time.NewTicker(s.cfg.healthPoll)
	defer tick.Stop()
	for {
		for _, n := range nodes {
			if leads(s.ctx, n.addr) {
				s.addr, s.metricsAddr, s.data = n.addr, n.metrics, n.data
				s.coord = children[n.id]
				s.followers = s.followers[:0]
				for _, o := range nodes {
					if o.id != n.id {
						s.followers = append(s.followers, children[o.id])
					}
				}
				s.lg.printf("cluster of %d: %s leads at %s", len(nodes), n.id, n.addr)
				return time.Since(started), nil
			}
		}
		select {
		case <-s.ctx.Done():
			return 0, context.Cause(s.ctx)
		case <-tick.C:
		}
	}
}

// leads reports whether the node at addr says it leads.
func leads(ctx context.Context, addr string) bool {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: leaderHealth})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}
