// Package s3server starts a real S3-compatible server for tests: versitygw
// with its posix backend (no other service needed), built from the pinned
// module in scripts/s3server by scripts/build into bin/ (or by
// testbin.Prepare), listening on loopback with a bucket of its own.
package s3server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/internal/proctest"
)

// Credentials of the test server; the store's clients read them from the
// standard AWS environment (Env).
const (
	AccessKey = "leasehold-test"
	SecretKey = "leasehold-test-secret"
	Bucket    = "previews"
)

// Server is a running versitygw.
type Server struct {
	// Endpoint is its http://127.0.0.1:port.
	Endpoint string
	// Root is the directory its posix backend keeps buckets in.
	Root string
	Proc *proctest.Proc
}

// Binary returns the path of versitygw under dir (LEASEHOLD_BIN or bin/),
// or "" when it was not built.
func Binary(dir string) string {
	p := filepath.Join(dir, "versitygw")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// Start starts versitygw from bin on a free loopback port with an empty
// bucket, stopped when the test ends.
func Start(t proctest.TB, bin string) *Server {
	t.Helper()
	root := filepath.Join(t.TempDir(), "s3")
	if err := os.MkdirAll(filepath.Join(root, Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := proctest.Options{}.Start(t, "versitygw", bin, "--access", AccessKey, "--secret", SecretKey, "--port", addr, root)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.WaitLine(ctx, 0, []string{"listening on"}); err != nil {
		t.Fatalf("versitygw did not start: %v", err)
	}
	return &Server{Endpoint: "http://" + addr, Root: root, Proc: p}
}

// URL is the --artifact-store URL of the server's bucket.
func (s *Server) URL() string {
	return fmt.Sprintf("s3://%s?endpoint=%s&region=us-east-1", Bucket, s.Endpoint)
}

// Env is the environment a process needs to reach the server.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey, "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true"}
}

// Pause stops the server with SIGSTOP (a hung store) and returns once it
// is stopped.
func (s *Server) Pause() { s.Proc.Freeze() }

// Resume continues a paused server.
func (s *Server) Resume() { s.Proc.Signal(syscall.SIGCONT) }
