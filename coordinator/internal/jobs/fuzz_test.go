package jobs

import (
	"encoding/binary"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// maxFuzzCommands bounds the commands one fuzz input applies.
const maxFuzzCommands = 128

// FuzzTransitions applies a sequence of commands decoded from the fuzz
// input to one job and checks the model's invariants (the model of
// TestJobInvariantsUnderRandomCommands) after each: every byte of cmds is
// one command (grant, heartbeat, completion, expiry, cancel, replay, the
// clock moving, ...), and params decides their arguments (which token,
// which renderer, which outcome, how far the clock moves). The seeds in
// testdata/fuzz/FuzzTransitions walk the lifecycle's main paths.
func FuzzTransitions(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, cmds, params []byte) {
		cmds = cmds[:min(len(cmds), maxFuzzCommands)]
		rapid.MakeFuzz(func(rt *rapid.T) {
			m := newModel(rt)
			all := m.actions()
			check := all[""]
			delete(all, "")
			names := slices.Sorted(maps.Keys(all))
			check(rt)
			for _, c := range cmds {
				all[names[int(c)%len(names)]](rt)
				check(rt)
			}
		})(t, paramStream(params, len(cmds)))
	})
}

// paramStream turns params into the bit stream rapid draws the commands'
// arguments from, in its fuzzing format of eight bytes a draw: each byte
// of params (cycled, or an index when there are none) fills one draw, so
// that the fuzzer changes one argument by changing one byte. The stream is
// long enough for n commands' draws.
func paramStream(params []byte, n int) []byte {
	words := 64 + 256*n
	out := make([]byte, 8*words)
	for i := range words {
		b := byte(i)
		if len(params) > 0 {
			b = params[i%len(params)] ^ byte(i/len(params))
		}
		binary.LittleEndian.PutUint64(out[8*i:], uint64(b)*0x0101010101010101)
	}
	return out
}
