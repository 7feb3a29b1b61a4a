//go:build unix

package auth

import (
	"io/fs"
	"os"
	"syscall"
)

// permissionsMean reports whether file permissions restrict who may read a
// file, as they do on Unix.
func permissionsMean() bool { return true }

// ownedByUs reports whether the coordinator's user owns the file.
func ownedByUs(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return !ok || int(st.Uid) == os.Geteuid()
}
