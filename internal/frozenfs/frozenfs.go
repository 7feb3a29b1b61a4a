// Package frozenfs gives a test a filesystem of its own that it can
// freeze: an ext4 image on a loop device, mounted on a temporary
// directory, and frozen with fsfreeze. While frozen every write to it
// (and every fsync) blocks until the thaw, as on a storage stall: the
// fault of a coordinator whose data disk stops answering.
//
// It needs root, losetup, mkfs.ext4 and fsfreeze; without them Mount
// skips the test. It is imported by tests only.
package frozenfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Usable reports why Mount would skip the test (no root, a tool
// missing), or nil: for a test that runs without frozen disks rather than
// not at all.
func Usable() error {
	if os.Geteuid() != 0 {
		return errors.New("mounting a loop device and fsfreeze need root")
	}
	for _, tool := range []string{"losetup", "mkfs.ext4", "fsfreeze"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed: %w", tool, err)
		}
	}
	return nil
}

// Mount creates an ext4 filesystem of size bytes in an image file,
// attaches it to a loop device and mounts it on a new temporary
// directory, which it returns. When the test ends, after the processes
// started later (which use it) are killed, it is unmounted and the loop
// device detached. Without root, the tools or a free loop device the test
// is skipped.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	if err := Usable(); err != nil {
		t.Skipf("%v; they are needed to test a storage stall", err)
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "ext4.img")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatalf("creating the filesystem image: %v", err)
	}
	// Initialise the inode tables and journal now: lazy initialisation
	// would write in the background after the mount.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device to attach the image to (losetup: %v: %s); a storage stall needs one", err, bytes.TrimSpace(out))
	}
	dev := strings.TrimSpace(string(out))
	// Cleanups run last registered first: the detach after the unmount.
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("detaching %s: %v\n%s", dev, err, out)
		}
	})
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		t.Skipf("cannot mount %s as ext4 on %s (%v); a storage stall needs it", dev, mnt, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	// Find out now, before any process starts, whether it can be frozen.
	if out, err := exec.Command("fsfreeze", "--freeze", mnt).CombinedOutput(); err != nil {
		t.Skipf("fsfreeze cannot freeze %s (%v: %s); a storage stall needs it", mnt, err, bytes.TrimSpace(out))
	}
	if out, err := exec.Command("fsfreeze", "--unfreeze", mnt).CombinedOutput(); err != nil {
		t.Fatalf("thawing %s: %v\n%s", mnt, err, out)
	}
	return mnt
}

// Freeze freezes the filesystem mounted on mnt with fsfreeze: every write
// to it blocks until the thaw. It returns the thaw, which a cleanup also
// runs if the test ends first: a process blocked on a frozen disk cannot
// die, so this cleanup, registered after the processes', must run before
// their kills. It may be called from any goroutine.
func Freeze(t testing.TB, mnt string) (thaw func()) {
	t.Helper()
	if out, err := exec.Command("fsfreeze", "--freeze", mnt).CombinedOutput(); err != nil {
		t.Errorf("freezing %s: %v\n%s", mnt, err, out)
		return func() {}
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if out, err := exec.Command("fsfreeze", "--unfreeze", mnt).CombinedOutput(); err != nil {
				t.Errorf("thawing %s: %v\n%s", mnt, err, out)
			}
		})
	}
	t.Cleanup(thaw)
	return thaw
}
