package testbin

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ErrExited is WaitServing's error when the process exits before it serves.
var ErrExited = errors.New("the process exited before it was serving")

// FreeAddr returns a loopback address whose port was free a moment ago,
// below the kernel's range of ephemeral ports and never returned before
// in this process. A port must stay free from the pick until the process
// it is passed to listens on it, and processes started meanwhile open
// outgoing connections (raft peers, renderers): an ephemeral port, as
// listening on port 0 gives, may be taken by one of them in between.
// Where the range leaves no room below it, FreeAddr falls back to port 0.
func FreeAddr() (string, error) {
	freeMu.Lock()
	defer freeMu.Unlock()
	const first = 10000
	low := ephemeralLow()
	if low <= first+100 {
		return ephemeralAddr()
	}
	for range 1000 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(first+rand.IntN(low-first)))
		if freeTaken[addr] {
			continue
		}
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		lis.Close()
		freeTaken[addr] = true
		return addr, nil
	}
	return "", fmt.Errorf("no free loopback port found in %d..%d", first, low-1)
}

var (
	freeMu    sync.Mutex
	freeTaken = map[string]bool{} // addresses FreeAddr has returned
)

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	low := 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	return low
}

// ephemeralAddr is a loopback address with a port the kernel picked.
func ephemeralAddr() (string, error) {
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
