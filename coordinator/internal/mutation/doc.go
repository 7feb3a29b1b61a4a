// Package mutation is the one switch table of the deliberate bugs planted
// in the coordinator's code, so that a test can show that the suite
// catches each: a bug the tests would let through is a guarantee nobody
// checks. Each Bug names one wrong edit in one place of the real code
// (the state machine, the store's apply, the writer's terms, the
// replication in package cluster, the read path), guarded there by
// On(bug).
//
// Without a mutation build tag (simmutation, lincheckmutation) On is a
// constant false: the compiler removes the branches it guards, and a
// production build carries none of them. With one, a bug is switched on
// at run time: by Set, or for a whole process (a coordinator binary a
// test starts, a test binary) by the environment variable
// LEASEHOLD_MUTATION naming it. TestEveryMutationIsCaught (build tag
// simmutation) builds each package's tests once, switches each bug on in
// turn, runs the tests that must catch it, and fails unless every one of
// them fails under the bug and passes without it.
package mutation
