// Package renderer is the renderer pod: a gRPC client of the coordinator's
// RendererService that leases jobs, renders them with a [Provider], uploads
// the previews and completes the jobs with its fencing tokens.
//
// A [Worker] runs three kinds of goroutines:
//
//   - the acquire loop long-polls Acquire for as many leases as it has free
//     capacity, and never holds more than Config.Capacity leases;
//   - one goroutine per lease renders under a per-lease context, uploads the
//     artifact and calls Complete;
//   - the heartbeat loop keeps one bidirectional Heartbeat stream open for all
//     held leases. A lease answered LOST, or pushed as revoked, has its context
//     cancelled at once and its work dropped; revocations are acknowledged as
//     soon as the work has stopped, without waiting for the next tick.
//
// A provider may simulate a stop-the-world stall (mock.Input.OnPause): while
// it lasts the lease is left out of heartbeats, so it can expire behind the
// stalled render exactly as it would behind a frozen process, and the late
// completion meets the coordinator's fencing check.
//
// An upload refused with ABORTED is still followed by Complete, because the
// check that decides is the one in Complete: that is where a stale completion
// is refused and recorded. A completion answered ABORTED is final: the lease is no longer ours, so the
// work is dropped and logged as "completion rejected". When the coordinator is
// unavailable, the worker reconnects with exponential backoff and jitter,
// keeps heartbeating the leases it holds, and lets in-flight work complete
// once the coordinator is back.
//
// Log messages and their keys are stable; scripts match on them:
//
//	lease acquired       job= token= attempt= team=
//	render done          job= token= digest=
//	completed            job= token= outcome=
//	completion rejected  job= token= reason=
//	lease lost           job= token= reason=
//	cancel acknowledged  job= token=
//	render paused        job= token=
package renderer
