// Package sim is a deterministic simulator of the coordinator's core: the
// real state machine (package jobs), dispatch, timers and group-commit
// writer (package engine) over a real bbolt file, driven from one
// goroutine by a seeded scheduler on a simulated clock.
//
// Around the writer it plays every actor: submitters (batches, retries and
// duplicates of one request id, a request id reused for other documents),
// session renderers (open, replace, close, credits, receipts, heartbeats,
// completions with the preview inline, cancel acknowledgements, drains
// with hand-backs, pauses past their leases, crashes without a word, late,
// stale and replayed completions, other renderers' tokens), a renderer on
// the unary path, and an operator (cancel a job or a batch, replay failed
// jobs, pause and resume dispatch). Between them and the writer is a
// network that delays, loses and reorders messages (a stream keeps its
// order and breaks instead). The coordinator crashes with commands
// queued, and after a commit before its answers leave, and fail-stops when
// a write of a group fails; a restart reopens the file and rebuilds the
// writer from what was committed. The writer's group boundaries are drawn
// by the scheduler too (engine.Stepper).
//
// After every writer group the checker tests every invariant of the
// design on what the group committed (each event against the job's past,
// each touched record against its events, the writer's indexes against
// the store) and on every answer leaving the coordinator; every few
// hundred groups, after each restart and at the end, it checks the whole
// store (store.VerifySince). A quiescent phase without faults must then
// end every job. A failure names its seed, and the same seed replays the
// run step for step.
//
// # Running it
//
//	go test ./coordinator/sim -seeds 20            twenty seeds from a random one
//	go test ./coordinator/sim -seed 42 -seeds 1 -trace   replay seed 42 step by step
//	scripts/sim [-budget 10m] [-sync]              seeds for a wall-clock budget
//	go test -tags simmutation -run TestMutationsAreCaught ./coordinator/sim
//
// The last switches on deliberate bugs of the state machine (the fencing
// check removed; a cancel that leaves the lease in force) and fails unless
// the simulator catches each.
//
// # What it does not cover
//
// Everything below the bbolt API is real but not attacked: power loss,
// torn or reordered writes, a kernel or file system that loses an fsync,
// disk corruption and a full disk cannot be produced by closing and
// reopening a file in one process, and are not simulated. By default the
// file is opened with bbolt's NoSync, since a restart here never needs
// the fsync; Config.Sync keeps it. The gRPC layer (package server: the
// error table, authentication, the wire codec, message limits) is not in
// the loop: actors call the engine as the handlers do, and the
// end-to-end and linearizability tests cover that edge. Fair dispatch is
// exercised but its bound is not checked here (package dispatch has its
// own model tests), nor are wall-clock steps, watches, listings, uploads
// outside a completion, or long polls that wait.
package sim
