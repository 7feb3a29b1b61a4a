//go:build simmutation || lincheckmutation

package mutation

import (
	"os"
	"sync/atomic"
)

// Enabled reports whether bugs can be switched on in this build.
const Enabled = true

// active is the bug switched on.
var active atomic.Uint32

// init switches on the bug the environment names, for the whole process.
func init() {
	if err := Set(os.Getenv(Env)); err != nil {
		panic(err)
	}
}

// Set switches on the bug named name, or none with "". It affects every
// goroutine of the process, so tests that switch bugs must not run in
// parallel with others.
func Set(name string) error {
	b := None
	if name != "" {
		var err error
		if b, err = Lookup(name); err != nil {
			return err
		}
	}
	active.Store(uint32(b))
	return nil
}

// On reports whether bug is switched on.
func On(bug Bug) bool { return Bug(active.Load()) == bug }
