package server

// The lincheckmutation build tag plants one deliberate bug in the read
// path of a replicated coordinator, for the linearizability check's
// mutation test (package lincheck, run under the same tag against
// coordinator binaries built with it) to show that the check catches it:
// a linearizable read is served from this node's store as it is, without
// confirming that the node still leads, so that a follower or a deposed
// leader answers from a state behind the leader's. Without the tag
// staleReadMutant is a constant false and the compiler removes the branch
// it guards.
