// Package renderer is the renderer pod: a gRPC client of the coordinator's
// RendererService that keeps one Session stream open, renders the leases it
// is granted with a [Provider] and completes them with their fencing tokens.
//
// # Providers
//
// A [Provider] turns an [Input] (the document and the lease it is rendered
// under) into an [Output], a raster preview, or an error; a [*Failure]
// carries its failure class to the coordinator. Package mock is the
// deterministic provider the renderer binary runs, with its fault
// injection; a renderer of another kind is a Worker with a provider of its
// own (see the package example).
//
// # Goroutines
//
// Run's goroutine is the worker's loop, as River's producer is: it alone
// holds the leases, the outbox of completions and hand-backs, the credits
// and the session, so no lock guards them. It starts
//
//   - one goroutine per lease, which renders under the lease's own context
//     and reports the outcome to the loop; a preview too large to travel
//     inline gets a second one, which uploads it and reports the
//     completion that names its digest;
//   - one goroutine per session, which opens the stream and sends each
//     request the loop hands it, and a receiver of its own, which passes
//     each SessionResponse to the loop.
//
// The loop applies each report and response as it comes and never waits
// for a render or a peer: it hands the sender one request at a time, and
// batches whatever is pending meanwhile into the next one, kept under a
// byte budget and, in each list, to Config.Capacity items (the coordinator
// refuses a longer list). It keeps the heartbeat, backoff and drain timers, and
// returns only once every goroutine it started has ended.
//
// # The session
//
// The first request carries the hello (renderer id, a random instance id
// that stays the same on every reconnect of the process, capacity, the
// largest response the worker receives, and the leases still in progress
// from an earlier session) and, as credits, the free slots. After that every
// slot that frees (its lease's goroutine ended, whatever the outcome) is one
// more credit, sent with the completion that freed it, so the coordinator
// can complete and refill in one command. The worker never holds more leases
// than its capacity: a grant beyond it is handed back at once.
//
// Grants are acknowledged in received on the next request. Leases being
// worked on are heartbeated at the welcome's interval (or
// Config.HeartbeatInterval), except during a provider's simulated stall
// (Input.OnPause): it stands for a frozen process, so the lease can expire
// behind it and the late completion meets the coordinator's fencing check.
// A lease answered LOST, or revoked, has its context cancelled at once and
// its result dropped; a revocation is acknowledged in cancel_acks once the
// work has stopped.
//
// A preview up to the welcome's max_inline_artifact_bytes (and within the
// request budget) travels inline; a larger one is uploaded with
// UploadArtifact and the completion names its digest. A welcome without an
// inline limit means every preview is uploaded. An upload refused with
// ABORTED is still followed by the completion, because the check that
// decides is the completion's: that is where a stale completion is refused
// and recorded. Every completion is answered by a CompletionResult naming
// its lease, which the worker matches by (job id, token), whatever its
// place among the answers; one refused with ABORTED is final and logged as
// "completion rejected", and a result naming no completion in flight is
// logged as an error. Completions and hand-backs not answered when a
// session breaks are sent again on the next one, in their order:
// completion is idempotent for the same token and outcome.
//
// A completion answered UNAVAILABLE ARTIFACT_STORE_UNAVAILABLE changed
// nothing: the coordinator could not reach its artifact store. The worker
// keeps the lease, heartbeating it and naming it in a new session's hello,
// and sends the same completion again from Config.BackoffMin doubling up
// to BackoffMax apart, until it is answered otherwise or the lease is
// answered lost; a drain's timeout hands such leases back. Uploads to the
// store (UploadArtifact, or a presigned PUT when the welcome says
// presigned_uploads) are retried the same way while the lease lives.
//
// # Reconnecting and refusals
//
// The connection redials from 100 ms up to 1 s apart and a Session waits
// for it to be ready, so the worker is back within about a second of the
// coordinator's return. A session that breaks is reopened with backoff:
// from Config.BackoffMin doubling up to BackoffMax, with up to 20% jitter,
// and from BackoffMin again once a session was welcomed. ABORTED
// SESSION_REPLACED is reopened at once.
//
// Given every replica of a coordinator cluster (Config.Coordinator), the
// connection polls each replica's leasehold.v1.Leader health entry (a
// Check every 250 ms, each within 250 ms; package leaderdial) and a
// Session goes to the one that answers SERVING. A leader that steps down
// ends its sessions with UNAVAILABLE NOT_LEADER: the worker reopens at
// once, the Session waits for the new leader, and its hello holds the
// leases in progress, which the new leader keeps (it extends every live
// lease when it takes over); completions left unanswered are sent again.
// A NOT_LEADER again before a welcome is retried from 10 ms up to
// BackoffMax apart.
//
// A leader that hangs says nothing, so the worker also leaves one on its
// own evidence, and reopens at once, holding its leases as above: when
// another replica answers SERVING while its own leader does not (or its
// leader answers NOT_SERVING, or no answer came for 3 s), the session ends
// with leaderdial.ErrLeaderMoved ("leader moved"); and when a replicated
// coordinator has sent nothing, not even the keepalive it sends at a third
// of the heartbeat interval, for three keepalive intervals (a heartbeat
// interval, 5 s by default), the worker ends the session itself
// ("coordinator silent"), unless it was the one stopped meanwhile (its
// timer fired far behind its time). A leader merely slow is not left: one
// missed poll only keeps new calls off it. UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT and
// UNIMPLEMENTED end Run with an error. ALREADY_EXISTS RENDERER_ID_IN_USE is
// logged as an error and retried from 1 s up to 30 s apart, without end: the
// usual cause is this pod's previous process, whose session the coordinator
// has not yet seen die; a genuine duplicate shows as that error and as
// /readyz staying 503.
//
// # Draining
//
// When Run's context is done the worker sends draining=true at once and
// takes no new work (a grant that still arrives is handed back), lets the
// renders in flight finish and complete for up to Config.DrainTimeout (or
// until [Worker.EndDrain]), then hands back every lease still unfinished,
// which the coordinator re-queues without counting the attempt, waits up
// to 2 s for the answers, closes the stream and returns nil.
//
// # Transport and traces
//
// Config.TLS connects over TLS, with a client certificate for a coordinator
// that requires mutual TLS. Without it the token goes only to a
// coordinator on loopback (New refuses another host) unless
// Config.InsecurePlaintext. With Config.TracerProvider the worker traces
// its calls and, for each lease, a "leasehold.render" span around the
// provider and a "leasehold.complete" span from the render's end to the
// coordinator's answer (uploads included), both children of the trace
// context the grant carries: the job's submission.
//
// # Logs
//
// Log messages and their keys are stable; scripts match on them. The three
// lines every document would write (lease acquired, render done,
// completed) are at Debug: at thousands of documents a second they would
// be most of the log.
//
//	renderer started     id= instance= coordinator= capacity=
//	session started      instance= heartbeat_interval= lease_ttl= ...
//	session ended        err= retry_in=
//	coordinator not the leader  err= leader= retry_in=
//	leader moved         err=
//	coordinator silent   silent_for= holding=
//	lease acquired       job= token= attempt= team=
//	render done          job= token= digest= bytes=
//	completed            job= token= outcome= phase= replayed= [class=]
//	completion rejected  job= token= reason=
//	lease lost           job= token= reason=
//	the coordinator's artifact store is unavailable; keeping the lease  job= token= retry_in=
//	cancel acknowledged  job= token=
//	lease handed back    job= token= why=
//	render paused        job= token=
//	draining             leases= timeout=
//	renderer id in use   id= err= retry_in=
package renderer
