//go:build !simmutation

package engine

// mutant reports whether m is switched on: never, in a build without the
// simmutation tag.
func mutant(mutation) bool { return false }
