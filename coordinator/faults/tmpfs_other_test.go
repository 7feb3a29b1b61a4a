//go:build !linux

package faults

import (
	"errors"
	"testing"
)

// mountTmpfs is only available on Linux.
func mountTmpfs(*testing.T, int) (string, error) {
	return "", errors.New("tmpfs mounts are tested on Linux only")
}

// growTmpfs is only available on Linux.
func growTmpfs(t *testing.T, _ string, _ int) { t.Fatal("tmpfs mounts are tested on Linux only") }

// mountTmpfsOn is only available on Linux.
func mountTmpfsOn(*testing.T, string, int) error {
	return errors.New("tmpfs mounts are tested on Linux only")
}
