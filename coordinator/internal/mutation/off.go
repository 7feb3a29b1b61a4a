//go:build !simmutation && !lincheckmutation

package mutation

// On reports whether bug is switched on: never, in a build without a
// mutation tag, where it is a constant false.
func On(Bug) bool { return false }

// Enabled reports whether bugs can be switched on in this build.
const Enabled = false
