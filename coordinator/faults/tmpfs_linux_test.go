package faults

import (
	"fmt"
	"syscall"
	"testing"
)

// mountTmpfs mounts a tmpfs of size bytes on a new temporary directory,
// unmounted when the test ends, after the processes started later (which
// use it) are killed. Mounting needs root or CAP_SYS_ADMIN.
func mountTmpfs(t *testing.T, size int) (string, error) {
	t.Helper()
	dir := t.TempDir()
	return dir, mountTmpfsOn(t, dir, size)
}

// mountTmpfsOn mounts a tmpfs of size bytes on dir, which must exist, as
// mountTmpfs does.
func mountTmpfsOn(t *testing.T, dir string, size int) error {
	t.Helper()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		return fmt.Errorf("cannot mount a %d MiB tmpfs on %s: %w", size>>20, dir, err)
	}
	// Cleanups run last registered first: this one after the processes'
	// kills, and before t.TempDir's removal.
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
			_ = syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
	return nil
}

// growTmpfs changes the size of the tmpfs mounted at dir, as growing a
// full volume does.
func growTmpfs(t *testing.T, dir string, size int) {
	t.Helper()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Fatalf("growing the tmpfs on %s to %d MiB: %v", dir, size>>20, err)
	}
}
