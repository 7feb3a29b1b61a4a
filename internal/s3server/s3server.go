// Package s3server starts a real S3-compatible server for tests: versitygw
// with its posix backend (no other service needed), built from the pinned
// module in scripts/s3server by scripts/build into bin/ (or by
// testbin.Prepare), listening on loopback with a bucket of its own.
package s3server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/testbin"
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

	t    proctest.TB
	bin  string
	addr string
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
	addr, err := testbin.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Endpoint: "http://" + addr, Root: root, t: t, bin: bin, addr: addr}
	s.start()
	return s
}

// start starts the process and waits until it listens.
func (s *Server) start() {
	s.t.Helper()
	s.Proc = proctest.Options{}.Start(s.t, "versitygw", s.bin, "--access", AccessKey, "--secret", SecretKey, "--port", s.addr, s.Root)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Proc.WaitLine(ctx, 0, []string{"listening on"}); err != nil {
		s.t.Fatalf("versitygw did not start: %v", err)
	}
}

// Kill kills the server with SIGKILL (a store that went away).
func (s *Server) Kill() {
	s.t.Helper()
	s.Proc.Kill()
}

// Restart starts the server again, on the same address and directory,
// once a Kill has stopped it.
func (s *Server) Restart() {
	s.t.Helper()
	s.start()
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
