package store

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// maxProblems bounds the problems Verify lists; it counts the rest.
const maxProblems = 100

// OpenReadOnly opens an existing database file for reading only, as an
// operator's check does: it creates, stamps and migrates nothing, and it
// shares the file lock with other readers only, so it fails with ErrLocked
// (after a second) while a coordinator has the file open. Only View, Check
// and Verify may be used on the Store it returns.
func OpenReadOnly(path string) (*Store, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{
		Timeout:      lockTimeout,
		ReadOnly:     true,
		FreelistType: bbolt.FreelistArrayType,
	})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("opening %s: %w (%w)", path, ErrLocked, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Summary is what Verify found in a store.
type Summary struct {
	// Schema is the file's schema version (0 when it has none).
	Schema uint64
	// Jobs, Unfinished and Batches count the job records, the entries of
	// the index of unfinished jobs, and the batch records.
	Jobs, Unfinished, Batches int
	// LastToken is the token counter: the largest fencing token granted.
	LastToken uint64
	// Problems lists what is wrong, at most maxProblems entries; Omitted
	// counts the ones left out. None means the store is consistent.
	Problems []string
	Omitted  int
	// Pointers are the objects of the artifact store that jobs' pointers
	// name, in key order.
	Pointers []StoredPointer
	// tokens maps every lease token to its job, and leasesTo counts the
	// leases per renderer, for VerifySince; pointers collects Pointers.
	tokens   map[uint64]uint64
	leasesTo map[string]int
	pointers map[[2]string]*StoredPointer
}

// StoredPointer is an object of the artifact store that succeeded jobs
// name: <Team>/sha256/<Digest>, of Size bytes.
type StoredPointer struct {
	Team, Digest string
	Size         int64
	// Count is how many jobs name it; Jobs lists the first few of them.
	Count int
	Jobs  []uint64
}

// maxPointerJobs bounds StoredPointer.Jobs.
const maxPointerJobs = 5

// Err returns the problems as one error, or nil when there are none.
func (s Summary) Err() error {
	errs := make([]error, 0, len(s.Problems)+1)
	for _, p := range s.Problems {
		errs = append(errs, errors.New(p))
	}
	if s.Omitted > 0 {
		errs = append(errs, fmt.Errorf("and %d more problems", s.Omitted))
	}
	return errors.Join(errs...)
}

// problemf records a problem.
func (s *Summary) problemf(format string, args ...any) {
	if len(s.Problems) == maxProblems {
		s.Omitted++
		return
	}
	s.Problems = append(s.Problems, fmt.Sprintf(format, args...))
}

// Verify checks the store's consistency in one read transaction: first
// bbolt's own check of the file (every page reachable or free, none twice,
// keys in order), then, on a file of the current schema, that the records
// agree with one another as every commit leaves them:
//
//   - a job is in the index of unfinished jobs exactly when its phase is not
//     terminal, in the index of finished jobs (at its finish time) exactly
//     when it is terminal, and in its team's index;
//   - the indexes hold nothing else, and every batch reference (counts,
//     request ids, the team index) names a stored batch;
//   - every batch's jobs exist and name it, but for those retention
//     deleted, and every job belongs to a batch: a batch is stored whole
//     or not at all;
//   - the counts per phase of every batch and every team are those of its
//     jobs;
//   - every lease token is at most the token counter, increases along each
//     job's leases and belongs to one lease only.
//
// It reads every job record, so its cost follows the whole store, not the
// live work, and it keeps every lease token in memory. A problem found is
// listed in Summary.Problems; the error reports only a file that could not
// be read at all.
func (s *Store) Verify() (Summary, error) {
	var sum Summary
	err := s.view(func(btx *bbolt.Tx) error {
		for err := range btx.Check() {
			sum.problemf("bbolt: %v", err)
		}
		meta := btx.Bucket(bucketMeta)
		if meta == nil || meta.Get(keySchema) == nil {
			sum.problemf("the file has no schema version: no coordinator wrote it")
			return nil
		}
		sum.Schema = btoi(meta.Get(keySchema))
		if sum.Schema != SchemaVersion {
			return nil // an earlier schema is migrated on start; its records are not read here
		}
		for _, b := range allBuckets {
			if btx.Bucket(b) == nil && requiredBucket(b) {
				sum.problemf("bucket %q is missing", b)
			}
		}
		if len(sum.Problems) > 0 {
			return nil
		}
		verifyRecords(&Tx{tx: btx}, &sum, false)
		return nil
	})
	return sum, err
}

// verifyRecords checks that the records of a schema 2 file agree; see
// Verify. With indexesOnly it leaves out what concerns neither an index nor
// the counts: the job id counter and the lease tokens.
func verifyRecords(tx *Tx, sum *Summary, indexesOnly bool) {
	backfillFrom := uint64(0) // terminal jobs above this may not be indexed yet
	backfilling := tx.BackfillPending()
	if backfilling {
		backfillFrom = btoi(tx.tx.Bucket(bucketMeta).Get(keyFinishedBackfill))
	}
	finished, teamJobs := 0, 0
	sum.LastToken = tx.LastToken()
	lastJobID := tx.tx.Bucket(bucketJobs).Sequence()
	unfinished := map[uint64]bool{}
	c := tx.tx.Bucket(bucketUnfinished).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		unfinished[btoi(k)] = true
	}
	sum.Unfinished = len(unfinished)

	batchCounts := map[uint64]*jobs.Counts{}
	teamCounts := map[string]*jobs.Counts{}
	tokens := map[uint64]uint64{}  // token -> job
	batchOf := map[uint64]uint64{} // job -> its batch, for every decoded job
	jc := tx.tx.Bucket(bucketJobs).Cursor()
	for k, v := jc.First(); k != nil; k, v = jc.Next() {
		id := btoi(k)
		sum.Jobs++
		j, err := decodeJob(id, v)
		if err != nil {
			sum.problemf("job %d: %v", id, err)
			continue
		}
		if !indexesOnly && id > lastJobID {
			sum.problemf("job %d: above the job id counter %d", id, lastJobID)
		}
		if live := !j.Phase.Terminal(); live != unfinished[id] {
			sum.problemf("job %d: phase %s, but in the index of unfinished jobs: %t", id, j.Phase, unfinished[id])
		}
		delete(unfinished, id)
		batchOf[id] = j.BatchID
		isFinished := tx.tx.Bucket(bucketFinished).Get(finishedKey(FinishTime(j), j.ID)) != nil
		if isFinished {
			finished++
		}
		switch {
		case !j.Phase.Terminal() && isFinished:
			sum.problemf("job %d: phase %s, but in the index of finished jobs", id, j.Phase)
		case j.Phase.Terminal() && !isFinished && (!backfilling || id <= backfillFrom):
			sum.problemf("job %d: phase %s since %v, but not in the index of finished jobs", id, j.Phase, FinishTime(j))
		}
		if tx.tx.Bucket(bucketTeamJobs).Get(teamKey(j.Team, j.ID)) == nil {
			sum.problemf("job %d: not in the index of team %s", id, j.Team)
		} else {
			teamJobs++
		}
		countIn(batchCounts, j.BatchID, j.Phase)
		countIn(teamCounts, j.Team, j.Phase)
		if !indexesOnly {
			verifyLeases(j, sum, tokens)
			if err := verifyJobData(tx, j, sum); err != nil {
				sum.problemf("job %d: %v", id, err)
			}
		}
	}
	sum.tokens = tokens
	for _, id := range slices.Sorted(maps.Keys(unfinished)) {
		sum.problemf("job %d: in the index of unfinished jobs, but has no record", id)
	}
	if n := tx.tx.Bucket(bucketFinished).Stats().KeyN; n != finished {
		sum.problemf("the index of finished jobs holds %d entries, %d of them terminal jobs at their finish time", n, finished)
	}
	if n := tx.tx.Bucket(bucketTeamJobs).Stats().KeyN; n != teamJobs {
		sum.problemf("the team index of jobs holds %d entries, %d of them jobs of their team", n, teamJobs)
	}
	stored := verifyBatches(tx, sum, batchCounts, batchOf)
	verifyBatchRefs(tx, sum, stored)
	verifyTeams(tx, sum, teamCounts)
	if !indexesOnly {
		verifyObjectRefs(tx, sum)
	}
}

// pointTo counts j's pointer to an object of the artifact store.
func (s *Summary) pointTo(j jobs.Job) {
	if s.pointers == nil {
		s.pointers = map[[2]string]*StoredPointer{}
	}
	k := [2]string{j.Team, j.Artifact.Digest}
	p := s.pointers[k]
	if p == nil {
		p = &StoredPointer{Team: j.Team, Digest: j.Artifact.Digest, Size: j.Artifact.Size}
		s.pointers[k] = p
	}
	p.Count++
	if len(p.Jobs) < maxPointerJobs {
		p.Jobs = append(p.Jobs, j.ID)
	}
	if p.Size != j.Artifact.Size {
		s.problemf("job %d: points to %s/sha256/%s of %d bytes, which job %d names with %d bytes", j.ID, j.Team, j.Artifact.Digest,
			j.Artifact.Size, p.Jobs[0], p.Size)
	}
}

// verifyObjectRefs checks the counts of "artifact_refs" against the
// pointers the jobs hold, and lists the pointers in the summary.
func verifyObjectRefs(tx *Tx, sum *Summary) {
	for _, r := range tx.ObjectRefsList() {
		p := sum.pointers[[2]string{r.Team, r.Digest}]
		switch {
		case p == nil:
			sum.problemf("artifact_refs counts %d pointers to %s/sha256/%s, which no job names", r.Refs, r.Team, r.Digest)
		case uint64(p.Count) != r.Refs:
			sum.problemf("artifact_refs counts %d pointers to %s/sha256/%s, which %d jobs name", r.Refs, r.Team, r.Digest, p.Count)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(sum.pointers), func(a, b [2]string) int {
		return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1]))
	}) {
		p := sum.pointers[k]
		if tx.ObjectRefs(p.Team, p.Digest) == 0 {
			sum.problemf("jobs %v point to %s/sha256/%s, which artifact_refs does not count", p.Jobs, p.Team, p.Digest)
		}
		sum.Pointers = append(sum.Pointers, *p)
	}
}

// verifyLeases checks j's lease tokens against the counter and the tokens
// of the jobs seen before it.
func verifyLeases(j jobs.Job, sum *Summary, tokens map[uint64]uint64) {
	var prev uint64
	for _, l := range j.Leases {
		switch other, dup := tokens[l.Token]; {
		case l.Token == 0 || l.Token > sum.LastToken:
			sum.problemf("job %d: lease token %d is not between 1 and the token counter %d", j.ID, l.Token, sum.LastToken)
		case dup:
			sum.problemf("job %d: lease token %d was also granted to job %d", j.ID, l.Token, other)
		case l.Token <= prev:
			sum.problemf("job %d: lease token %d follows token %d", j.ID, l.Token, prev)
		}
		tokens[l.Token] = j.ID
		prev = max(prev, l.Token)
	}
	if j.Phase == jobs.PhaseLeased {
		if n := len(j.Leases); n == 0 || j.Leases[n-1].Token != j.Lease.Token || j.Leases[n-1].Kind != jobs.LeaseLive {
			sum.problemf("job %d: LEASED under token %d, which is not its last, live lease", j.ID, j.Lease.Token)
		}
	}
	for _, l := range j.Leases {
		if sum.leasesTo == nil {
			sum.leasesTo = map[string]int{}
		}
		sum.leasesTo[l.Renderer]++
		if isLive := l.Kind == jobs.LeaseLive; isLive != (j.Phase == jobs.PhaseLeased && l.Token == j.Lease.Token) {
			sum.problemf("job %d: %v under token %d, and lease %d is %v", j.ID, j.Phase, j.Lease.Token, l.Token, l.Kind)
		}
	}
}

// verifyJobData checks what a job keeps besides its record: a success
// keeps exactly the preview its completion referenced, and an ended job no
// other; the document is kept while the job may be rendered (again); the
// history is one record per event, in order. An error is a read that
// failed.
func verifyJobData(tx *Tx, j jobs.Job, sum *Summary) error {
	for _, l := range j.Leases {
		a, err := tx.Artifact(j.ID, l.Token)
		stored := err == nil
		if err != nil && !errors.Is(err, ErrArtifactNotFound) {
			return err
		}
		switch {
		case j.Phase == jobs.PhaseSucceeded && l.Token == j.Artifact.Token && j.Artifact.Stored:
			// The preview is an object of the artifact store; an upload the
			// coordinator staged for it may remain, naming the same object.
			if stored && (!a.Stored || a.Digest != j.Artifact.Digest || a.Size != j.Artifact.Size) {
				sum.problemf("job %d: SUCCEEDED with stored preview %s of %d bytes under token %d, staged %s of %d bytes (stored %t)",
					j.ID, j.Artifact.Digest, j.Artifact.Size, l.Token, a.Digest, a.Size, a.Stored)
			}
			sum.pointTo(j)
		case j.Phase == jobs.PhaseSucceeded && l.Token == j.Artifact.Token:
			if !stored || a.Digest != j.Artifact.Digest || a.Renderer != j.Artifact.Renderer || int64(len(a.Content)) != j.Artifact.Size {
				sum.problemf("job %d: SUCCEEDED with preview %s of %d bytes by %s under token %d, stored %s of %d bytes by %s",
					j.ID, j.Artifact.Digest, j.Artifact.Size, j.Artifact.Renderer, l.Token, a.Digest, len(a.Content), a.Renderer)
			}
		case j.Phase.Terminal() && stored:
			sum.problemf("job %d: %v, and keeps the preview of lease %d", j.ID, j.Phase, l.Token)
		}
	}
	if j.Phase == jobs.PhaseSucceeded && !slices.ContainsFunc(j.Leases, func(l jobs.LeaseRecord) bool {
		return l.Token == j.Artifact.Token && l.Kind == jobs.LeaseCompleted && l.Outcome == jobs.Outcome(true, j.Artifact.Digest, 0)
	}) {
		sum.problemf("job %d: artifact token %d is not a lease completed with its digest", j.ID, j.Artifact.Token)
	}
	doc := tx.Document(j.ID)
	switch {
	case (j.Phase == jobs.PhaseSucceeded || j.Phase == jobs.PhaseCancelled) && doc != nil:
		sum.problemf("job %d: %v, and keeps its document", j.ID, j.Phase)
	case !j.Phase.Terminal() && j.ContentBytes > 0 && int64(len(doc)) != j.ContentBytes:
		sum.problemf("job %d: %v with %d bytes of document, want %d", j.ID, j.Phase, len(doc), j.ContentBytes)
	}
	evs, err := tx.Events(j.ID, 0)
	if err != nil {
		return err
	}
	if len(evs) != int(j.EventSeq) {
		sum.problemf("job %d: event sequence %d, %d events stored", j.ID, j.EventSeq, len(evs))
	}
	for i, ev := range evs {
		if ev.Seq != uint32(i+1) {
			sum.problemf("job %d: event %d has seq %d", j.ID, i+1, ev.Seq)
			break
		}
	}
	return nil
}

// TokenState is what a check learned of the fencing tokens, for the next
// check to compare against.
type TokenState struct {
	// LastToken is the token counter.
	LastToken uint64
	// Tokens maps every token granted to its job.
	Tokens map[uint64]uint64
	// LeasesTo counts the leases granted per renderer.
	LeasesTo map[string]int
}

// VerifySince is Verify, and checks besides that the tokens granted since
// prev (the state an earlier check returned, or the zero TokenState) are
// above every token granted before it, that no token seen then belongs to
// another job now, and that the counter never went back. It returns the
// state to compare the next check against. Any goroutine may call it on a
// live store; it costs a read of every job, its history and its previews.
func (s *Store) VerifySince(prev TokenState) (Summary, TokenState, error) {
	sum, err := s.Verify()
	now := TokenState{LastToken: sum.LastToken, Tokens: sum.tokens, LeasesTo: sum.leasesTo}
	if now.LeasesTo == nil {
		now.LeasesTo = map[string]int{}
	}
	if err != nil {
		return sum, now, err
	}
	for tok, job := range now.Tokens {
		if owner, seen := prev.Tokens[tok]; seen && owner != job {
			sum.problemf("job %d: token %d was job %d's at the previous check", job, tok, owner)
		} else if !seen && tok <= prev.LastToken {
			sum.problemf("job %d: new token %d is not above the last token %d of the previous check", job, tok, prev.LastToken)
		}
	}
	if now.LastToken < prev.LastToken {
		sum.problemf("the token counter went back from %d to %d", prev.LastToken, now.LastToken)
	}
	return sum, now, err
}

// verifyBatches checks every batch record against its jobs (all present
// but those retention deleted, each naming the batch, and counted as the
// batch's counts say), its team index entry and its request id, and
// returns the ids of the stored batches. counts holds the counts of the
// jobs per batch; it is emptied. batchOf names the batch of every job
// decoded (a job that did not decode is reported with the job).
func verifyBatches(tx *Tx, sum *Summary, counts map[uint64]*jobs.Counts, batchOf map[uint64]uint64) map[uint64]bool {
	stored := map[uint64]bool{}
	bc := tx.tx.Bucket(bucketBatches).Cursor()
	for k, _ := bc.First(); k != nil; k, _ = bc.Next() {
		id := btoi(k)
		sum.Batches++
		stored[id] = true
		b, _, err := tx.Batch(id)
		if err != nil {
			sum.problemf("batch %d: %v", id, err)
			continue
		}
		if tx.tx.Bucket(bucketTeamBatches).Get(teamKey(b.Team, b.ID)) == nil {
			sum.problemf("batch %d: not in the index of team %s", id, b.Team)
		}
		if v := tx.tx.Bucket(bucketRequests).Get(requestKey(b.Team, b.RequestID)); v == nil || btoi(v) != id {
			sum.problemf("batch %d: request id %q of team %s does not name it", id, b.RequestID, b.Team)
		}
		var missing []uint64
		for _, jid := range b.JobIDs() {
			named, decoded := batchOf[jid]
			switch {
			case !decoded && tx.tx.Bucket(bucketJobs).Get(itob(jid)) == nil:
				missing = append(missing, jid)
			case decoded && named != id:
				sum.problemf("batch %d: job %d names batch %d", id, jid, named)
			}
		}
		// Retention deletes a batch's terminal jobs one by one and counts
		// them; any other missing job was lost.
		switch {
		case len(missing) != int(b.Purged):
			for _, jid := range missing {
				sum.problemf("batch %d: job %d is missing (%d of its %d jobs deleted by retention, %d missing)",
					id, jid, b.Purged, b.Count, len(missing))
			}
		case len(missing) == int(b.Count):
			sum.problemf("batch %d: retention deleted all its jobs but not the batch", id)
		}
		stored, err := tx.BatchCounts(id)
		if err != nil {
			sum.problemf("batch %d: counts: %v", id, err)
		}
		var got jobs.Counts
		if c := counts[id]; c != nil {
			got = *c
		}
		if err == nil && stored != got {
			sum.problemf("batch %d: counts per phase %v, its jobs' phases %v", id, stored, got)
		}
		delete(counts, id)
	}
	for _, id := range slices.Sorted(maps.Keys(counts)) {
		sum.problemf("batch %d: %d jobs name it, but there is no such batch", id, counts[id].Total())
	}
	return stored
}

// verifyBatchRefs checks that every batch count, request id and team index
// entry names a stored batch.
func verifyBatchRefs(tx *Tx, sum *Summary, stored map[uint64]bool) {
	for _, ref := range []struct {
		bucket []byte
		id     func(k, v []byte) uint64
	}{
		{bucketBatchCounts, func(k, _ []byte) uint64 { return btoi(k) }},
		{bucketRequests, func(_, v []byte) uint64 { return btoi(v) }},
		{bucketTeamBatches, func(k, _ []byte) uint64 { return btoi(k[len(k)-8:]) }},
	} {
		c := tx.tx.Bucket(ref.bucket).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if id := ref.id(k, v); !stored[id] {
				sum.problemf("%s entry %q names batch %d, which is not stored", ref.bucket, k, id)
			}
		}
	}
}

// verifyTeams checks every team's stored counts against its jobs'. counts
// holds the counts of the jobs per team; it is emptied.
func verifyTeams(tx *Tx, sum *Summary, counts map[string]*jobs.Counts) {
	err := tx.ForEachTeamCounts(func(team string, stored jobs.Counts) error {
		var got jobs.Counts
		if c := counts[team]; c != nil {
			got = *c
		}
		if stored != got {
			sum.problemf("team %s: counts per phase %v, its jobs' phases %v", team, stored, got)
		}
		delete(counts, team)
		return nil
	})
	if err != nil {
		sum.problemf("team counts: %v", err)
	}
	for _, team := range slices.Sorted(maps.Keys(counts)) {
		sum.problemf("team %s: has %d jobs, but no counts", team, counts[team].Total())
	}
}

// countIn counts one job of phase p under key.
func countIn[K comparable](m map[K]*jobs.Counts, key K, p jobs.Phase) {
	c := m[key]
	if c == nil {
		c = &jobs.Counts{}
		m[key] = c
	}
	if p >= 0 && int(p) < len(c) {
		c[p]++
	}
}
