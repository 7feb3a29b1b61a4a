package engine

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// failsafe bounds every wait on a channel the engine should close or send
// on. It is generous: it only turns a hang into a failure.
const failsafe = 10 * time.Second

// failure is a renderer's classified failure of the attempt under token.
func failure(job, token uint64, renderer string, class jobs.FailureClass, msg string) CompleteRequest {
	return CompleteRequest{Job: job, Completion: jobs.Completion{Token: token, Renderer: renderer, Class: class, Message: msg}}
}

// acquireAll grants every lease the engine will hand out now and returns
// the granted job ids in grant order.
func (b *testBundle) acquireAll(t *testing.T, renderer string) []uint64 {
	t.Helper()
	var ids []uint64
	for _, g := range b.acquire(t, renderer, 10_000) {
		ids = append(ids, g.Job.ID)
	}
	return ids
}

// tick moves the clock by d and lets the writer expire and re-queue what
// became due.
func (b *testBundle) tick(t *testing.T, d time.Duration) {
	t.Helper()
	b.clock.Advance(d)
	if err := b.e.Tick(context.Background()); err != nil {
		t.Fatalf("Tick: %v", err)
	}
}

// allJobs lists every stored job, with its history, in id order.
func (b *testBundle) allJobs(t *testing.T) []jobs.Job {
	t.Helper()
	var out []jobs.Job
	var after uint64
	for {
		page, err := b.e.ListJobs(reads.JobFilter{After: after, Limit: 1000, History: true})
		if err != nil {
			t.Fatalf("ListJobs: %v", err)
		}
		out = append(out, page.Jobs...)
		if page.Next == 0 {
			return out
		}
		after = page.Next
	}
}

// allAudit lists every audit record, newest first.
func (b *testBundle) allAudit(t *testing.T) []jobs.AuditRecord {
	t.Helper()
	page, err := b.e.ListAudit(reads.AuditFilter{Limit: 10_000})
	if err != nil {
		t.Fatalf("ListAudit: %v", err)
	}
	return page.Records
}

// rejections lists the recorded rejections of one job, newest first.
func (b *testBundle) rejections(t *testing.T, job uint64) []jobs.Rejection {
	t.Helper()
	page, err := b.e.ListRejections(reads.RejectionFilter{Job: job, Limit: 10_000})
	if err != nil {
		t.Fatalf("ListRejections: %v", err)
	}
	return page.Rejections
}

// artifactAt reads the preview stored under the lease (job, token).
func (b *testBundle) artifactAt(t *testing.T, job, token uint64) (store.Artifact, error) {
	t.Helper()
	var a store.Artifact
	err := b.st.View(func(tx *store.Tx) error {
		var err error
		a, err = tx.Artifact(job, token)
		return err
	})
	return a, err
}

// document reads a job's stored inline content (nil when none).
func (b *testBundle) document(t *testing.T, job uint64) []byte {
	t.Helper()
	var d []byte
	if err := b.st.View(func(tx *store.Tx) error { d = tx.Document(job); return nil }); err != nil {
		t.Fatal(err)
	}
	return d
}

// openSession opens a session for renderer (instance "i-1") with the given
// credit, and fails the test on an error.
func (b *testBundle) openSession(t *testing.T, renderer string, credits int) *Conn {
	t.Helper()
	conn, _, err := b.e.Open(context.Background(), SessionOpen{Renderer: rend(renderer), Instance: "i-1", Capacity: 4})
	if err != nil {
		t.Fatalf("OpenSession(%s): %v", renderer, err)
	}
	if credits > 0 {
		b.send(t, conn, SessionInput{Credits: credits})
	}
	return conn
}

// send applies one session message and fails the test on an error.
func (b *testBundle) send(t *testing.T, conn *Conn, in SessionInput) SessionResult {
	t.Helper()
	res, err := b.e.Receive(context.Background(), conn, in)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return res
}

// take drains a connection's outbox: the grants and revocations the writer
// published to it so far, and its end.
func take(c *Conn) ([]Grant, []LeaseStatus, error) { return c.Outbox.Take() }

// refs names the leases of grants.
func refs(gs []Grant) []LeaseRef {
	out := make([]LeaseRef, len(gs))
	for i, g := range gs {
		out[i] = LeaseRef{Job: g.Job.ID, Token: g.Job.Lease.Token}
	}
	return out
}

// grantedIDs returns the job ids of grants in order.
func grantedIDs(gs []Grant) []uint64 {
	out := make([]uint64, len(gs))
	for i, g := range gs {
		out[i] = g.Job.ID
	}
	return out
}

// block holds the writer inside a group until the returned release is
// called: the command's apply waits, so every command sent meanwhile queues
// behind it and is drained into the next group. block returns once the
// writer is applying it.
func (b *testBundle) block(t *testing.T) (release func()) {
	t.Helper()
	c := &blockCmd{entered: make(chan struct{}), release: make(chan struct{})}
	errC := make(chan error, 1)
	go func() { errC <- b.e.do(context.Background(), c) }()
	waitClosed(t, c.entered, "the blocking command to be applied")
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(c.release)
			if err := <-errC; err != nil {
				t.Errorf("blocking command: %v", err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// blockCmd waits inside its apply until released.
type blockCmd struct {
	base
	noText
	entered, release chan struct{}
}

func (c *blockCmd) evaluate(*group) error {
	close(c.entered)
	<-c.release
	return nil
}

// probeCmd records the group it was applied in.
type probeCmd struct {
	base
	noText
	g *group
}

func (c *probeCmd) evaluate(g *group) error {
	c.g = g
	return nil
}

// waitQueued waits until n requests wait in the writer's queue. Each was
// stamped with its send time before it was queued.
func (b *testBundle) waitQueued(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(failsafe)
	for len(b.e.reqC) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued after %v, want %d", len(b.e.reqC), failsafe, n)
		}
		runtime.Gosched()
	}
}

// async runs fn on its own goroutine and returns a channel closed when it
// returned.
func async(fn func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	return done
}

// countEvents counts the events of kind in j's history.
func countEvents(j jobs.Job, kind jobs.EventKind) int {
	n := 0
	for _, ev := range j.History {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// terminalEvents counts j's terminal transitions (SUCCEEDED, FAILED,
// CANCELLED events).
func terminalEvents(j jobs.Job) int {
	return countEvents(j, jobs.EventSucceeded) + countEvents(j, jobs.EventFailed) + countEvents(j, jobs.EventCancelled)
}

// assertNotGranted fails when any of ids is among granted.
func assertNotGranted(t *testing.T, granted []uint64, ids ...uint64) {
	t.Helper()
	for _, id := range ids {
		if slices.Contains(granted, id) {
			t.Errorf("job %d was granted (grants %v), want it never dispatched", id, granted)
		}
	}
}

// waitClosed fails unless c is closed within the failsafe timeout.
func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(failsafe):
		t.Fatalf("%s: not closed after %v", what, failsafe)
	}
}
