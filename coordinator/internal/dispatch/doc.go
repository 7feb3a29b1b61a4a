// Package dispatch chooses which ready job the coordinator leases next, fairly
// across teams.
//
// Each team has its own first-in, first-out ready queue. A [Scheduler] rotates
// among the teams that have ready work by weighted deficit round-robin (a team's
// quantum is its weight and every job costs one), and it caps the leases one
// team may hold at a share of the live renderer capacity while another team has
// work waiting, so a team that arrives behind a bulk import is served at once
// rather than after it (invariant 9 of docs/invariants.md: dispatch never takes a job
// from a team at or over its cap while another team with ready work is under
// its own). When every team with ready work is at its cap the rotation goes on
// regardless, so capacity is never left idle: a lone team may use every
// renderer.
//
// With [Config.FIFO] set, fairness is off and jobs are handed out in plain
// global push order across all teams; this is the baseline that fair dispatch
// is measured against.
//
// The package is pure: it imports the standard library only and has no
// goroutines, no clock and no locks. A Scheduler is owned by the coordinator's
// single writer goroutine and must not be used from any other goroutine
// concurrently. Choosing the next job never scans the backlog: Next and Push
// cost O(1) amortized in the number of queued jobs (O(log teams) in FIFO mode),
// plus O(teams) when teams at their cap are passed over, and Remove takes a job
// out of the middle of a queue in O(1) amortized by lazy deletion. Queued jobs
// are located through an index laid out for ids that come from a counter, as
// job ids do, so that a backlog of a million jobs is served about as fast as a
// backlog of a thousand, at about 50 bytes per queued job.
package dispatch
