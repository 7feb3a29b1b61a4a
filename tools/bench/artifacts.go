package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/leasehold/leasehold/internal/s3server"
)

// The artifact store of a run, as the docs recommend for each shape: the
// single node keeps previews above the inline threshold in its own
// directory (the default, no flag, so a build from before the store runs
// as it always did); a cluster shares an S3-compatible store, here
// versitygw on loopback, whose CPU time and bytes written the report puts
// beside the coordinators'.

// storeServer is the S3-compatible server of a cluster run.
type storeServer struct {
	srv *s3server.Server
}

// s3Binary returns versitygw in the -bin directory, building it there
// from its pinned module (scripts/s3server) when missing.
func s3Binary(ctx context.Context, dir string, lg *logger) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if bin := s3server.Binary(abs); bin != "" {
		return bin, nil
	}
	lg.printf("building versitygw into %s", abs)
	cmd := exec.CommandContext(ctx, "go", "-C", filepath.Join("scripts", "s3server"), "build", "-o", filepath.Join(abs, "versitygw"), ".")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building versitygw (run from the repository root): %w", err)
	}
	return filepath.Join(abs, "versitygw"), nil
}

// startStoreServer starts versitygw for a cluster run and returns it with
// the coordinator flags and environment that point at it.
func (s *stack) startStoreServer(ctx context.Context) (args, env []string, err error) {
	bin, err := s3Binary(ctx, s.cfg.bin, s.lg)
	if err != nil {
		return nil, nil, err
	}
	err = s.prog.Run(func() { s.store = &storeServer{srv: s3server.Start(s.prog, bin)} })
	if err != nil {
		return nil, nil, err
	}
	s.lg.printf("artifact store: versitygw at %s, objects in %s", s.store.srv.Endpoint, s.store.srv.Root)
	return []string{"--artifact-store", s.store.srv.URL()}, s.store.srv.Env(), nil
}

// storePid is the store server's process id, 0 without one.
func (s *stack) storePid() int {
	if s.store == nil {
		return 0
	}
	return s.store.srv.Proc.Pid()
}
