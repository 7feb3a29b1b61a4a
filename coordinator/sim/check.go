package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	"github.com/leasehold/leasehold/coordinator/internal/watch"
)

// checker watches the run from outside every actor: it sees each group's
// committed events, every answer as it leaves the coordinator, and the
// store, and fails the run at the first broken invariant. Its memory
// outlives coordinator crashes, so what it checks holds across restarts.
type checker struct {
	w    *world
	jobs map[uint64]*track
	// ids and batches list the jobs and batches seen, in order, for the
	// actors to pick from.
	ids     []uint64
	batches []uint64
	// maxToken is the largest token granted so far.
	maxToken    uint64
	nonTerminal int
	groups      int
	// sinceFull counts the events since the last whole-store check.
	sinceFull int
	// state is what the last whole-store check saw.
	state store.TokenState
	// acked maps an answered submission (team, request id) to its batch;
	// ackedKeys lists them in the order answered.
	acked     map[[2]string]ackedBatch
	ackedKeys [][2]string
	// recent are the latest grants, for impostors to pick from.
	recent []grantRef
	// grants maps every token granted to its job and renderer.
	grants map[uint64]grantRef
	// touched is the scratch list of jobs one group touched.
	touched []uint64
	// promo is the last promotion of a cluster's writer: the leases live
	// then were promised a TTL and the extension from then.
	promo promotion
}

// promotion is a writer's promotion: its sequence number, when it was
// (simulated time), and the extension it gave live leases.
type promotion struct {
	seq    int
	at     time.Duration
	extend time.Duration
}

// track is what the checker knows of one job, from its events.
type track struct {
	batch uint64
	phase jobs.Phase
	seq   uint32
	// terminal counts the terminal transitions of this cycle.
	terminal int
	// live is the token of the live lease, renderer its holder.
	live     uint64
	renderer string
	// cancelled is set for good once the job is CANCELLED.
	cancelled bool
	// success and successBy are the token and renderer of this cycle's
	// success, digest the digest of that lease's preview.
	success   uint64
	successBy string
	digest    string
	// mark is the last group that touched the job.
	mark int
	// promoSeq and promoToken are the promotion at which the lease
	// promoToken was live (cluster mode).
	promoSeq   int
	promoToken uint64
}

type ackedBatch struct {
	id    uint64
	count int
}

type grantRef struct {
	job, token uint64
	renderer   string
}

func newChecker(w *world) *checker {
	return &checker{w: w, jobs: map[uint64]*track{}, acked: map[[2]string]ackedBatch{}, grants: map[uint64]grantRef{}}
}

// preview is the preview a renderer makes of the lease (job, token): its
// bytes name all three, so a preview stored under another lease, or by
// another renderer, is told apart by its digest.
func preview(job, token uint64, renderer string) ([]byte, string) {
	content := fmt.Appendf(nil, "PNG preview of job %d under token %d by %s", job, token, renderer)
	sum := sha256.Sum256(content)
	return content, hex.EncodeToString(sum[:])
}

// group checks one group node n's writer committed: its events, one by
// one, against what the checker knows (noGrant: dispatch was paused
// throughout it), then the jobs it touched against n's store and writer's
// indexes, and, now and then (see Config.FullCheckEvery), everything.
func (c *checker) group(n *coordinator, evs []watch.JobEvent, noGrant bool) {
	c.events(evs, noGrant)
	c.stored(n, c.touched)
	// The whole-store checks cost a read of every job: run them after
	// eight events per job stored, so that they cost a bounded share of the
	// run however many jobs it stores.
	c.sinceFull += len(evs)
	if c.sinceFull >= max(c.w.cfg.FullCheckEvery, 8*len(c.jobs)) {
		c.full(n)
		c.compareShadow()
	}
}

// committed checks the events of an entry another writer evaluated, which
// committed once a later leader was elected (cluster mode): the events
// alone, since no writer holds the indexes they were evaluated with; the
// next promotion checks the store.
func (c *checker) committed(evs []watch.JobEvent) {
	c.events(evs, false)
	c.sinceFull += len(evs)
}

// events checks committed events in order against what the checker knows
// and notes the jobs they touched.
func (c *checker) events(evs []watch.JobEvent, noGrant bool) {
	w := c.w
	c.groups++
	c.touched = c.touched[:0]
	for _, je := range evs {
		t := c.jobs[je.Job]
		ev := je.Event
		if t == nil {
			if ev.Kind != jobs.EventSubmitted || ev.Seq != 1 {
				w.failf("job %d appears with event %d %v", je.Job, ev.Seq, ev.Kind)
			}
			t = &track{batch: je.Batch, phase: jobs.PhaseUnspecified}
			c.jobs[je.Job] = t
			c.ids = append(c.ids, je.Job)
			if n := len(c.batches); n == 0 || c.batches[n-1] != je.Batch {
				c.batches = append(c.batches, je.Batch)
			}
			w.res.Jobs++
		} else if ev.Seq != t.seq+1 {
			w.failf("job %d: event %d %v after event %d", je.Job, ev.Seq, ev.Kind, t.seq)
		}
		wasLive := t.phase != jobs.PhaseUnspecified && !t.phase.Terminal()
		c.event(je.Job, t, ev, noGrant)
		t.seq, t.phase = ev.Seq, ev.Phase
		switch isLive := !t.phase.Terminal(); {
		case isLive && !wasLive:
			c.nonTerminal++
		case !isLive && wasLive:
			c.nonTerminal--
		}
		if t.mark != c.groups {
			t.mark = c.groups
			c.touched = append(c.touched, je.Job)
		}
	}
}

// compareShadow compares the whole shadow store with the coordinator's
// (Config.Shadow); after every group the shadow itself checks each key the
// group wrote.
func (c *checker) compareShadow() {
	if c.w.coord == nil {
		return
	}
	if sh := c.w.coord.shadow; sh != nil {
		if err := sh.Compare(); err != nil {
			c.w.failf("write-set replication: %v", err)
		}
	}
}

// event checks one event against the job's past: one terminal transition
// per cycle, a live lease only from a grant and only one, tokens above
// every token before, a lease ended (or succeeded) only under its token
// and by its holder, nothing after a cancel, a refusal that changes
// nothing.
func (c *checker) event(id uint64, t *track, ev jobs.Event, noGrant bool) {
	w := c.w
	if p, ok := phaseAfter(ev.Kind); ok && ev.Phase != p {
		w.failf("job %d: %v left the job %v, want %v", id, ev.Kind, ev.Phase, p)
	}
	if t.cancelled && ev.Kind != jobs.EventCancelRejected && ev.Kind != jobs.EventCompletionRejected && ev.Kind != jobs.EventCancelAcknowledged {
		w.failf("job %d was cancelled, then %v (token %d)", id, ev.Kind, ev.Token)
	}
	// Every event that ends a lease names its token and holder: the
	// lease's own for an expiry, a re-queue or a cancel, the caller's for
	// a completion or a hand-back, which the fencing check admits only
	// from the holder.
	endLive := func() {
		if t.live == 0 || ev.Token != t.live || ev.Renderer != t.renderer {
			w.failf("job %d: %v of token %d by %s, live lease %d of %s", id, ev.Kind, ev.Token, ev.Renderer, t.live, t.renderer)
		}
		t.live = 0
	}
	switch ev.Kind {
	case jobs.EventSubmitted:
		if ev.Phase != jobs.PhaseQueued && ev.Phase != jobs.PhaseFailed {
			w.failf("job %d submitted %v", id, ev.Phase)
		}
	case jobs.EventLeased:
		switch {
		case t.live != 0:
			w.failf("job %d leased under %d while leased under %d", id, ev.Token, t.live)
		case t.phase != jobs.PhaseQueued:
			w.failf("job %d leased from %v", id, t.phase)
		case noGrant:
			w.failf("job %d leased under %d while dispatch was paused", id, ev.Token)
		case ev.Token <= c.maxToken:
			w.failf("job %d leased under token %d, not above %d granted before", id, ev.Token, c.maxToken)
		}
		c.maxToken = ev.Token
		t.live, t.renderer = ev.Token, ev.Renderer
		g := grantRef{job: id, token: ev.Token, renderer: ev.Renderer}
		c.grants[ev.Token] = g
		c.recent = append(c.recent, g)
		if len(c.recent) > 256 {
			c.recent = slices.Delete(c.recent, 0, 128)
		}
	case jobs.EventSucceeded:
		if ev.Token == 0 || ev.Token != t.live || ev.Renderer != t.renderer {
			w.failf("job %d SUCCEEDED under token %d of %s; the live lease is %d of %s", id, ev.Token, ev.Renderer, t.live, t.renderer)
		}
		t.live, t.success, t.successBy = 0, ev.Token, ev.Renderer
		_, t.digest = preview(id, ev.Token, ev.Renderer)
	case jobs.EventFailed:
		if t.live != 0 {
			endLive()
		}
	case jobs.EventCancelled:
		if t.live != 0 {
			endLive()
		}
		t.cancelled = true
	case jobs.EventLeaseExpired, jobs.EventAttemptFailed:
		if ev.Kind == jobs.EventLeaseExpired {
			c.expiredAfterFailover(id, t, ev)
		}
		endLive()
	case jobs.EventRequeued:
		if ev.Token != 0 {
			if ev.Reason == jobs.ReleaseNeverHeard {
				c.expiredAfterFailover(id, t, ev)
			}
			endLive()
		} else if t.phase != jobs.PhaseRetryWait {
			w.failf("job %d re-queued from %v", id, t.phase)
		}
	case jobs.EventRetryScheduled:
		if t.live != 0 {
			w.failf("job %d waits to retry with lease %d live", id, t.live)
		}
	case jobs.EventReplayed:
		if t.phase != jobs.PhaseFailed {
			w.failf("job %d replayed from %v", id, t.phase)
		}
		t.terminal, t.success, t.successBy, t.digest = 0, 0, "", ""
	case jobs.EventCompletionRejected, jobs.EventCancelRejected, jobs.EventCancelAcknowledged:
		if ev.Phase != t.phase {
			w.failf("job %d: %v moved it from %v to %v", id, ev.Kind, t.phase, ev.Phase)
		}
		if ev.Kind == jobs.EventCompletionRejected {
			w.res.Rejected++
		}
	}
	if ev.Phase.Terminal() && (ev.Kind == jobs.EventSucceeded || ev.Kind == jobs.EventFailed || ev.Kind == jobs.EventCancelled) {
		t.terminal++
		w.res.Lifecycles++
		if t.terminal > 1 {
			w.failf("job %d: a second terminal transition (%v) in one cycle", id, ev.Kind)
		}
	}
}

// expiredAfterFailover checks an expiry (counted, or uncounted when never
// heard from) against the promise a promotion makes every lease live at
// it: a full TTL and the extension from the promotion, so that a renderer
// reconnecting through a failover finds its leases held. A lease that
// expires sooner expired because of the failover.
func (c *checker) expiredAfterFailover(id uint64, t *track, ev jobs.Event) {
	p := c.promo
	if p.seq == 0 || t.promoSeq != p.seq || t.promoToken != ev.Token {
		return
	}
	if due := epoch.Add(p.at + leaseTTL + p.extend); ev.At.Before(due) {
		c.w.failf("job %d: lease %d, live when the writer was promoted at %v, %v at %v, before the TTL and the extension (%v) from the promotion ran out at %v",
			id, ev.Token, p.at, ev.Kind, ev.At.Sub(epoch), p.extend, due.Sub(epoch))
	}
}

// promoted records the promotion of a writer, which gave every live lease
// a TTL and extend from now.
func (c *checker) promoted(extend time.Duration) {
	c.promo = promotion{seq: c.promo.seq + 1, at: c.w.now, extend: extend}
	for _, id := range c.ids {
		if t := c.jobs[id]; t.live != 0 {
			t.promoSeq, t.promoToken = c.promo.seq, t.live
		}
	}
}

// grantSeen checks a grant as it reaches renderer: nothing leaves the
// coordinator before its entry is committed, so the grant is one the
// checker has seen committed, of that job to that renderer.
func (c *checker) grantSeen(renderer string, gr engine.Grant) {
	token := gr.Job.Lease.Token
	if g, ok := c.grants[token]; !ok || g.job != gr.Job.ID || g.renderer != renderer {
		c.w.failf("renderer %s was granted job %d under token %d, which no committed entry granted it (committed: %+v, found %v)",
			renderer, gr.Job.ID, token, g, ok)
	}
}

// read checks a read of the batch of key, answered by node n: the
// submission was answered before the read was sent, so a read that does
// not see it is stale.
func (c *checker) read(n *coordinator, key [2]string, b reads.BatchView, err error) {
	a := c.acked[key]
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		c.w.failf("stale read: %s answered that batch %d (%s/%s, answered before the read was sent) does not exist", n.name, a.id, key[0], key[1])
	case err != nil:
		c.w.failf("reading batch %d on %s: %v", a.id, n.name, err)
	case b.Batch.ID != a.id || int(b.Batch.Count) != a.count:
		c.w.failf("read of batch %d (%s/%s) on %s answered %+v", a.id, key[0], key[1], n.name, b.Batch)
	}
}

// recentAcked picks one of the latest answered submissions.
func (c *checker) recentAcked() ([2]string, bool) {
	n := len(c.ackedKeys)
	if n == 0 {
		return [2]string{}, false
	}
	return c.ackedKeys[n-1-c.w.pick(min(n, 4))], true
}

// phaseAfter is the phase an event of kind leaves its job in, for the
// kinds that decide it.
func phaseAfter(kind jobs.EventKind) (jobs.Phase, bool) {
	switch kind {
	case jobs.EventLeased, jobs.EventLeaseExpired, jobs.EventAttemptFailed:
		// An attempt's end is recorded before the job moves on.
		return jobs.PhaseLeased, true
	case jobs.EventSucceeded:
		return jobs.PhaseSucceeded, true
	case jobs.EventFailed:
		return jobs.PhaseFailed, true
	case jobs.EventCancelled:
		return jobs.PhaseCancelled, true
	case jobs.EventRequeued, jobs.EventReplayed:
		return jobs.PhaseQueued, true
	case jobs.EventRetryScheduled:
		return jobs.PhaseRetryWait, true
	}
	return 0, false
}

// stored checks node n's writer's indexes for the jobs in ids, and their
// records against what their events said: phase, history length, attempts
// within the maximum, the live lease, and that a success's artifact is the
// preview of its own lease.
func (c *checker) stored(n *coordinator, ids []uint64) {
	w := c.w
	if err := n.s.CheckIndexes(ids, c.record); err != nil {
		w.failf("the writer's indexes disagree with the store:\n%v", err)
	}
}

// record checks one stored job against its track.
func (c *checker) record(tx *store.Tx, j jobs.Job) {
	w := c.w
	t := c.jobs[j.ID]
	if t == nil {
		w.failf("job %d is stored, but no event of it was published", j.ID)
	}
	switch {
	case j.Phase != t.phase || j.EventSeq != t.seq:
		w.failf("job %d is stored %v at event %d, its events say %v at %d", j.ID, j.Phase, j.EventSeq, t.phase, t.seq)
	case j.Attempt > j.Policy.MaxAttempts:
		w.failf("job %d at attempt %d of %d", j.ID, j.Attempt, j.Policy.MaxAttempts)
	case j.Phase == jobs.PhaseLeased && j.Lease.Token != t.live:
		w.failf("job %d is LEASED under %d, its events say %d", j.ID, j.Lease.Token, t.live)
	case j.Phase != jobs.PhaseSucceeded && j.Artifact != (jobs.Artifact{}):
		w.failf("job %d is %v with an artifact %+v", j.ID, j.Phase, j.Artifact)
	case j.Phase == jobs.PhaseSucceeded:
		digest := t.digest
		a := j.Artifact
		if a.Token != t.success || a.Renderer != t.successBy || a.Digest != digest {
			w.failf("job %d SUCCEEDED under %d by %s with artifact %+v, want digest %s", j.ID, t.success, t.successBy, a, digest)
		}
		if st, err := tx.Staged(j.ID, a.Token); err != nil || st.Digest != digest {
			w.failf("job %d: stored preview of token %d has digest %q (%v), want %s", j.ID, a.Token, st.Digest, err, digest)
		}
	}
}

// full checks everything on node n: the store against itself
// (store.VerifySince), and what restarted checks; in a cluster, it also
// has the other nodes compare their stores with n's when they reach n's
// applied index.
func (c *checker) full(n *coordinator) {
	w := c.w
	c.sinceFull = 0
	sum, state, err := n.st.VerifySince(c.state)
	if err == nil {
		err = sum.Err()
	}
	if err != nil {
		w.failf("the store disagrees with itself:\n%v", err)
	}
	c.state = state
	if state.LastToken != c.maxToken {
		w.failf("token counter %d, the last token granted %d", state.LastToken, c.maxToken)
	}
	if w.raft != nil {
		w.raft.checkpoint(n)
	}
	c.restarted(n)
}

// restarted checks node n's coordinator that just came up over the file
// earlier processes committed (or its writer just promoted): the writer's
// rebuilt indexes against every job, every job against its events, and
// every answered submission.
func (c *checker) restarted(n *coordinator) {
	w := c.w
	if !n.up {
		return
	}
	stored := 0
	if err := n.s.CheckIndexes(nil, func(tx *store.Tx, j jobs.Job) {
		stored++
		c.record(tx, j)
	}); err != nil {
		w.failf("the writer's indexes disagree with the store:\n%v", err)
	}
	if stored != len(c.jobs) {
		w.failf("%d jobs stored, %d published", stored, len(c.jobs))
	}
	err := n.st.View(func(tx *store.Tx) error {
		if last := tx.LastToken(); last != c.maxToken {
			w.failf("token counter %d, the last token granted %d", last, c.maxToken)
		}
		for _, key := range c.ackedKeys {
			a := c.acked[key]
			b, found, err := tx.Batch(a.id)
			if err != nil {
				return err
			}
			if !found || b.Team != key[0] || b.RequestID != key[1] || int(b.Count) != a.count {
				w.failf("answered submission %s/%s (batch %d of %d jobs) is stored as %+v (found %v)", key[0], key[1], a.id, a.count, b, found)
			}
		}
		return nil
	})
	if err != nil {
		w.failf("reading the store: %v", err)
	}
}

// failStopped checks that a group whose commit failed left nothing behind
// in node n's store: no token it took is stored.
func (c *checker) failStopped(n *coordinator) {
	w := c.w
	err := n.st.View(func(tx *store.Tx) error {
		if last := tx.LastToken(); last != c.maxToken {
			w.failf("after a failed commit the token counter is %d, the last token granted %d", last, c.maxToken)
		}
		return nil
	})
	if err != nil {
		w.failf("reading the store: %v", err)
	}
}

// final checks the end of the quiescent phase on node n (the single node,
// or the cluster's leader): everything, and every job ended.
func (c *checker) final(n *coordinator) {
	c.full(n)
	c.compareShadow()
	if c.nonTerminal != 0 {
		c.w.failf("%s at the end", c.unfinishedSummary())
	}
}

// submitted checks a submission's answer as it leaves the coordinator: one
// request id is one batch, stored whole; a reused request id is refused.
func (c *checker) submitted(sub *submission, res engine.SubmitResult, err error) {
	w := c.w
	key := [2]string{sub.req.Team, sub.req.RequestID}
	prev, seen := c.acked[key]
	switch {
	case sub.reuse:
		if !errors.Is(err, jobs.ErrRequestIDReused) && !errors.Is(err, engine.ErrStorageFailed) && !w.leadershipErr(err) {
			w.failf("request id %s/%s reused for other documents: answered %+v, %v", key[0], key[1], res.Batch.Batch, err)
		}
		return
	case err != nil:
		if !errors.Is(err, engine.ErrStorageFailed) && !errors.Is(err, jobs.ErrTeamQueueFull) && !w.leadershipErr(err) {
			w.failf("submission %s/%s refused: %v", key[0], key[1], err)
		}
		return
	case seen && prev.id != res.Batch.Batch.ID:
		w.failf("request id %s/%s answered with batch %d, then %d", key[0], key[1], prev.id, res.Batch.Batch.ID)
	case int(res.Batch.Batch.Count) != len(sub.req.Docs) || res.Batch.Counts.Total() != int64(len(sub.req.Docs)):
		w.failf("batch %d answered with %d jobs (%v) for %d documents", res.Batch.Batch.ID, res.Batch.Batch.Count, res.Batch.Counts, len(sub.req.Docs))
	case seen && !res.Replayed:
		w.failf("request id %s/%s stored twice", key[0], key[1])
	}
	if !seen {
		c.ackedKeys = append(c.ackedKeys, key)
	}
	c.acked[key] = ackedBatch{id: res.Batch.Batch.ID, count: len(sub.req.Docs)}
	for _, id := range res.Batch.Batch.JobIDs() {
		if c.jobs[id] == nil {
			w.failf("batch %d answered before its job %d was published", res.Batch.Batch.ID, id)
		}
	}
}

// cancelled checks a cancel's answer against the result that stands: a
// job answered cancelled is CANCELLED; one answered already terminal
// ended otherwise.
func (c *checker) cancelled(req engine.CancelRequest, res engine.CancelResult, err error) {
	w := c.w
	if req.Job == 0 {
		if err != nil && !errors.Is(err, engine.ErrStorageFailed) && !w.leadershipErr(err) {
			w.failf("cancel of batch %d: %v", req.Batch, err)
		}
		return
	}
	t := c.jobs[req.Job]
	switch {
	case err == nil:
		if t.phase != jobs.PhaseCancelled || res.Job.Phase != jobs.PhaseCancelled {
			w.failf("cancel of job %d answered %v, the job is %v (answer says %v)", req.Job, res.Result, t.phase, res.Job.Phase)
		}
	case errors.Is(err, jobs.ErrAlreadyTerminal):
		if t.phase != jobs.PhaseSucceeded && t.phase != jobs.PhaseFailed {
			w.failf("cancel of job %d answered already terminal, the job is %v", req.Job, t.phase)
		}
	case errors.Is(err, engine.ErrStorageFailed), w.leadershipErr(err):
	default:
		w.failf("cancel of job %d: %v", req.Job, err)
	}
}

// completed checks a completion's answer against the result that stands:
// a success answered applied or replayed is the job's success.
func (c *checker) completed(req engine.CompleteRequest, res engine.CompleteResult, err error) {
	w := c.w
	if err != nil {
		if !jobs.IsFence(err) && !errors.Is(err, engine.ErrStorageFailed) && !w.leadershipErr(err) {
			w.failf("completion of job %d under %d by %s: %v", req.Job, req.Token, req.Renderer, err)
		}
		return
	}
	if res.Replayed {
		w.res.Replayed++
	}
	t := c.jobs[req.Job]
	if req.Success && (t.success != req.Token || t.successBy != req.Renderer) {
		w.failf("success of job %d under %d by %s answered as applied (replayed %v), the job is %v with success %d of %s",
			req.Job, req.Token, req.Renderer, res.Replayed, t.phase, t.success, t.successBy)
	}
}

// sessionAnswered checks the answers of one session message.
func (c *checker) sessionAnswered(renderer string, in engine.SessionInput, res engine.SessionResult) {
	if len(res.Completions) != len(in.Completions) {
		c.w.failf("a session message of %d completions answered %d", len(in.Completions), len(res.Completions))
	}
	for i, req := range in.Completions {
		req.Renderer = renderer
		c.completed(req, res.Completions[i], res.Completions[i].Err)
	}
	c.leaseStatuses(renderer, "heartbeat", res.Heartbeats)
	c.leaseStatuses(renderer, "hand-back", res.HandBacks)
}

// leaseStatuses checks the answers to heartbeats or hand-backs by
// renderer: a lease answered held (extended), or handed back, is one
// granted to that renderer for that job. The fencing check must refuse
// the same calls under another renderer's token, or an unknown one.
func (c *checker) leaseStatuses(renderer, what string, sts []engine.LeaseStatus) {
	for _, s := range sts {
		if !s.Held && s.Reason != jobs.ReleaseHandedBack {
			continue
		}
		if g, ok := c.grants[s.Token]; !ok || g.job != s.Job || g.renderer != renderer {
			c.w.failf("%s of job %d under %d by %s answered %+v; the token was granted %+v (found %v)", what, s.Job, s.Token, renderer, s, g, ok)
		}
	}
}

// anyJob picks a job seen, recent ones more often.
func (c *checker) anyJob() (uint64, bool) {
	if len(c.ids) == 0 {
		return 0, false
	}
	n := len(c.ids)
	if c.w.chance(0.7) {
		return c.ids[n-1-c.w.pick(min(n, 200))], true
	}
	return c.ids[c.w.pick(n)], true
}

// anyBatch picks a batch seen, recent ones more often.
func (c *checker) anyBatch() (uint64, bool) {
	if len(c.batches) == 0 {
		return 0, false
	}
	n := len(c.batches)
	return c.batches[n-1-c.w.pick(min(n, 20))], true
}

// failedJobs picks up to n FAILED jobs among recent ones.
func (c *checker) failedJobs(n int) []uint64 {
	var out []uint64
	for i := len(c.ids) - 1; i >= 0 && i >= len(c.ids)-500 && len(out) < n; i-- {
		if c.jobs[c.ids[i]].phase == jobs.PhaseFailed && c.w.chance(0.5) {
			out = append(out, c.ids[i])
		}
	}
	return out
}

// recentGrant picks a recent grant to another renderer than not (to any,
// with ""), one still live if it finds one.
func (c *checker) recentGrant(not string) (grantRef, bool) {
	var found grantRef
	ok := false
	for range 8 {
		if len(c.recent) == 0 {
			break
		}
		g := c.recent[len(c.recent)-1-c.w.pick(min(len(c.recent), 64))]
		if g.renderer == not {
			continue
		}
		found, ok = g, true
		if c.jobs[g.job].live == g.token {
			break
		}
	}
	return found, ok
}

// unfinishedSummary names the jobs not ended.
func (c *checker) unfinishedSummary() string {
	var some []string
	for _, id := range c.ids {
		if t := c.jobs[id]; !t.phase.Terminal() && len(some) < 8 {
			some = append(some, fmt.Sprintf("%d %v (lease %d of %s)", id, t.phase, t.live, t.renderer))
		}
	}
	return fmt.Sprintf("%d jobs unfinished (%v)", c.nonTerminal, some)
}
