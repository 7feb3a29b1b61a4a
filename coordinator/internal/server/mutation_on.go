//go:build lincheckmutation

package server

// staleReadMutant serves every read without verifying leadership.
const staleReadMutant = true
