// Package maintenance holds the coordinator's background services, each a
// small loop with Start and Stop around a runOnce that its tests call
// directly, as River's maintenance services are built:
//
//   - Retention purges expired records through the writer, in bounded steps
//     so that the commands queued behind a step wait only for it;
//   - Summarizer writes the summaries of rate-limited refusal logs;
//   - FailureWatcher tells the coordinator once the writer fail-stops.
//
// A service tolerates being stopped without having been started and being
// stopped twice; Stop waits for its goroutine.
package maintenance
