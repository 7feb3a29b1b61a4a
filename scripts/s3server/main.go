// Command versitygw is the S3-compatible server that the artifact store's
// tests and the cluster benchmark run: versitygw's gateway with its posix
// backend and nothing else, so that this module needs only what that
// gateway imports (no Azure or other backends, no command-line framework).
//
//	versitygw --access KEY --secret SECRET [--port ADDR] [--region NAME] ROOT
//
// ROOT holds one directory per bucket; objects are files under it, their
// checksums in extended attributes. The server runs in single-account
// mode with the one access key, and prints "listening on ADDR" once it
// accepts connections. SIGINT or SIGTERM stop it.
//
// It keeps connections alive between requests, as AWS S3 and the other
// services do (versitygw's own default closes each connection after its
// response): a client's connection pool, and what it costs to have none,
// are then measured as they would be against a real store.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/versity/versitygw/backend/meta"
	"github.com/versity/versitygw/backend/posix"
	"github.com/versity/versitygw/embedgw"
)

func main() {
	access := flag.String("access", "", "the access key of the one account (required)")
	secret := flag.String("secret", "", "its secret key (required)")
	port := flag.String("port", "127.0.0.1:7070", "the address to listen on")
	region := flag.String("region", "us-east-1", "the region requests must be signed for")
	flag.Parse()
	if flag.NArg() != 1 || *access == "" || *secret == "" {
		fmt.Fprintln(os.Stderr, "usage: versitygw --access KEY --secret SECRET [--port ADDR] [--region NAME] ROOT")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, flag.Arg(0), *access, *secret, *port, *region); err != nil {
		fmt.Fprintln(os.Stderr, "versitygw:", err)
		os.Exit(1)
	}
}

// run serves the bucket directories under root on addr until ctx ends.
func run(ctx context.Context, root, access, secret, addr, region string) error {
	if err := (meta.XattrMeta{}).Test(root); err != nil {
		return fmt.Errorf("%s must support extended attributes: %w", root, err)
	}
	be, err := posix.New(root, meta.XattrMeta{}, posix.PosixOpts{NewDirPerm: 0o755, Concurrency: 5000, IOBufferSize: 1 << 20})
	if err != nil {
		return err
	}
	go announce(ctx, addr)
	err = embedgw.RunVersityGW(ctx, be, &embedgw.Config{RootUserAccess: access, RootUserSecret: secret, Ports: []string{addr}, Region: region,
		MaxConnections: 250000, MaxRequests: 100000, MultipartMaxParts: 10000, KeepAlive: true, Quiet: true})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// announce prints "listening on addr" once addr accepts connections.
func announce(ctx context.Context, addr string) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			fmt.Println("listening on", addr)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
