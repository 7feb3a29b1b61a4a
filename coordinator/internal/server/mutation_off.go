//go:build !lincheckmutation

package server

// staleReadMutant is false in a build without the lincheckmutation tag.
const staleReadMutant = false
