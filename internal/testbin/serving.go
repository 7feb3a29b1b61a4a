package testbin

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ErrExited is WaitServing's error when the process exits before it serves.
var ErrExited = errors.New("the process exited before it was serving")

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr() (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer lis.Close()
	return lis.Addr().String(), nil
}

// WaitServing returns when the gRPC health service at addr (plaintext)
// first answers SERVING for the server as a whole. It first waits, every
// poll, for the port to accept connections (a coordinator opens it once
// its store is loaded), then calls Check every poll until SERVING; the
// time it returns is therefore late by at most about one poll. It fails
// with ErrExited when exited is closed first.
func WaitServing(ctx context.Context, addr string, poll time.Duration, exited <-chan struct{}) (time.Time, error) {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	wait := func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return ErrExited
		case <-tick.C:
			return nil
		}
	}
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			break
		}
		if err := wait(); err != nil {
			return time.Time{}, err
		}
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return time.Time{}, err
	}
	defer cc.Close()
	health := healthpb.NewHealthClient(cc)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := health.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return time.Now(), nil
		}
		if err := wait(); err != nil {
			return time.Time{}, err
		}
	}
}
