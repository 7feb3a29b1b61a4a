//go:build unix

package fdlimit

import (
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// TestRaise lowers the soft limit below the hard one and checks that
// Raise brings it back up to the hard limit and says so.
func TestRaise(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Max < 64 {
		t.Skipf("hard limit %d is too low to lower the soft one under it", rl.Max)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl) })
	low := syscall.Rlimit{Cur: rl.Max / 2, Max: rl.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	lim, err := Raise()
	if err != nil {
		t.Fatalf("Raise: %v", err)
	}
	if want := (Limit{Soft: uint64(rl.Max), Hard: uint64(rl.Max)}); lim != want {
		t.Errorf("Raise = %+v, want %+v", lim, want)
	}
	var now syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now); err != nil {
		t.Fatal(err)
	}
	if now.Cur != rl.Max {
		t.Errorf("soft limit after Raise = %d, want the hard limit %d", now.Cur, rl.Max)
	}
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
