package stack

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// rewatchDelay spaces the watches WatchHealth opens again.
const rewatchDelay = 50 * time.Millisecond

// WatchHealth watches service's health entry through hc until it reports
// want, and returns nil then, or ctx's error when ctx ends first. A watch
// that breaks UNAVAILABLE is opened again, waiting for the connection to
// be ready: a node restarting, or closing a connection that sent no token
// (a coordinator closes one that made no authenticated call within its
// --conn-auth-timeout, and the stack's own health connections carry no
// token). Any other error ends the wait.
func WatchHealth(ctx context.Context, hc healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus) error {
	for {
		err := watchOnce(ctx, hc, service, want)
		if err == nil || ctx.Err() != nil || status.Code(err) != codes.Unavailable {
			return err
		}
		t := time.NewTimer(rewatchDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// watchOnce is one watch of WatchHealth.
func watchOnce(ctx context.Context, hc healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus) error {
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	for {
		resp, err := w.Recv()
		if err != nil {
			return err
		}
		if resp.GetStatus() == want {
			return nil
		}
	}
}
