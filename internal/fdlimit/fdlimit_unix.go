//go:build unix

package fdlimit

import (
	"fmt"
	"syscall"
)

// Raise sets the soft limit on open file descriptors to the hard limit,
// and returns the limits then in force. When setting it fails, the limits
// are those read before, with the error.
func Raise() (Limit, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return Limit{}, fmt.Errorf("reading the file descriptor limit: %w", err)
	}
	lim := Limit{Soft: uint64(rl.Cur), Hard: uint64(rl.Max)}
	if rl.Cur >= rl.Max {
		return lim, nil
	}
	rl.Cur = rl.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return lim, fmt.Errorf("raising the file descriptor limit from %d to %d: %w", lim.Soft, lim.Hard, err)
	}
	lim.Soft = lim.Hard
	return lim, nil
}
