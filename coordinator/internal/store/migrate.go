package store

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
)

// Migration reports what Open did to a schema 1 file.
type Migration struct {
	// From is the schema version the file had; 0 when nothing was migrated.
	From uint64
	// Jobs is the number of job records rewritten.
	Jobs int
	// Artifacts is the number of previews copied from the legacy directory;
	// MissingArtifacts the succeeded jobs whose preview file was not there
	// (their GetArtifact answers ARTIFACT_NOT_FOUND).
	Artifacts, MissingArtifacts int
}

// Migration returns what Open migrated.
func (s *Store) Migration() Migration { return s.migration }

// migrateFrom1 rewrites a schema 1 file as schema 2, in transactions of
// migrateChunk jobs. Schema 1 kept each job's history inside its record,
// its last completion in two fields, document content wrapped in a
// DocumentRecord, and previews as files. A crash mid-way resumes from the
// persisted cursor: the file says schema 1 until the last step.
func (s *Store) migrateFrom1() error {
	s.migration.From = 1
	for {
		done, err := s.migrateChunkFrom1()
		if err != nil {
			return fmt.Errorf("migrating from schema 1: %w", err)
		}
		if done {
			break
		}
	}
	err := s.update(func(btx *bbolt.Tx) error {
		tx := &Tx{tx: btx, fault: s.fault}
		if err := tx.rebuildIndexes(); err != nil {
			return err
		}
		meta := btx.Bucket(bucketMeta)
		if err := meta.Delete(keyMigrationCursor); err != nil {
			return err
		}
		if err := meta.Delete(keyFinishedBackfill); err != nil {
			return err
		}
		return meta.Put(keySchema, itob(SchemaVersion))
	})
	if err != nil {
		return fmt.Errorf("migrating from schema 1: %w", err)
	}
	return nil
}

// migrateChunkFrom1 converts the next chunk of jobs and reports whether
// none were left.
func (s *Store) migrateChunkFrom1() (done bool, err error) {
	err = s.update(func(btx *bbolt.Tx) error {
		tx := &Tx{tx: btx, fault: s.fault}
		meta := btx.Bucket(bucketMeta)
		var after uint64
		if v := meta.Get(keyMigrationCursor); v != nil {
			after = btoi(v)
		}
		type old struct {
			id  uint64
			rec *storagev1.JobRecord
		}
		var chunk []old
		c := btx.Bucket(bucketJobs).Cursor()
		for k, v := c.Seek(itob(after + 1)); k != nil && len(chunk) < s.migrateChunk; k, v = c.Next() {
			var r storagev1.JobRecord
			if err := proto.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decoding job %d: %w", btoi(k), err)
			}
			chunk = append(chunk, old{btoi(k), &r})
		}
		if len(chunk) == 0 {
			done = true
			return nil
		}
		for _, o := range chunk {
			if err := s.migrateJob(tx, o.rec); err != nil {
				return fmt.Errorf("job %d: %w", o.id, err)
			}
		}
		return meta.Put(keyMigrationCursor, itob(chunk[len(chunk)-1].id))
	})
	return done, err
}

// migrateJob rewrites one schema 1 job: its history to the events bucket,
// its lease records and rejection keys from that history, its content
// unwrapped (or dropped once it succeeded or was cancelled) and its preview
// into the artifacts bucket.
func (s *Store) migrateJob(tx *Tx, r *storagev1.JobRecord) error {
	j := jobFromRecord(r)
	j.Events = make([]jobs.Event, len(r.Events))
	for i, e := range r.Events {
		j.Events[i] = eventFromRecord(e)
	}
	summarizeHistory(&j)
	if n := len(j.Events); n > 0 {
		j.EventSeq = j.Events[n-1].Seq
	}
	if err := tx.PutEvents(j.ID, j.Events); err != nil {
		return err
	}
	j.Events = nil
	if v := tx.tx.Bucket(bucketDocuments).Get(itob(j.ID)); v != nil {
		var d storagev1.DocumentRecord
		if err := proto.Unmarshal(v, &d); err != nil {
			return fmt.Errorf("decoding its document: %w", err)
		}
		j.ContentBytes = int64(len(d.Content))
		if j.Phase == jobs.PhaseSucceeded || j.Phase == jobs.PhaseCancelled {
			if err := tx.DeleteDocument(j.ID); err != nil {
				return err
			}
		} else if err := tx.PutDocument(j.ID, d.Content); err != nil {
			return err
		}
	}
	if j.Phase == jobs.PhaseSucceeded && j.Artifact.Digest != "" {
		if err := s.migrateArtifact(tx, j); err != nil {
			return err
		}
	}
	if err := tx.PutJob(j); err != nil {
		return err
	}
	s.migration.Jobs++
	return nil
}

// migrateArtifact copies a succeeded job's preview file into the database.
func (s *Store) migrateArtifact(tx *Tx, j jobs.Job) error {
	d := j.Artifact.Digest
	if s.legacyArtifacts == "" || len(d) != 64 {
		s.migration.MissingArtifacts++
		return nil
	}
	content, err := os.ReadFile(filepath.Join(s.legacyArtifacts, d[:2], d))
	if errors.Is(err, fs.ErrNotExist) {
		s.migration.MissingArtifacts++
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading its preview: %w", err)
	}
	s.migration.Artifacts++
	return tx.PutArtifact(j.ID, j.Artifact.Token, Artifact{Digest: d, ContentType: j.Artifact.ContentType, Content: content, Renderer: j.Artifact.Renderer})
}

// summarizeHistory sets what schema 2 keeps in the record from j's schema 1
// history: every lease and how it ended, the rejections recorded in the
// current cycle, whether a cancel after the end was recorded in it, and how
// many of its leases this cycle were re-queued uncounted because they were
// never heard from or handed back.
func summarizeHistory(j *jobs.Job) {
	var (
		leases         []jobs.LeaseRecord
		rejected       []jobs.RejectionKey
		cancelRejected bool
		undelivered    uint32
		handedBack     uint32
	)
	end := func(token uint64, kind jobs.LeaseEndKind, outcome string) {
		for i := len(leases) - 1; i >= 0; i-- {
			if leases[i].Token == token && leases[i].Kind == jobs.LeaseLive {
				leases[i].Kind, leases[i].Outcome = kind, outcome
				return
			}
		}
	}
	for _, ev := range j.Events {
		switch ev.Kind {
		case jobs.EventLeased:
			leases = append(leases, jobs.LeaseRecord{Token: ev.Token, Renderer: ev.Renderer})
		case jobs.EventLeaseExpired:
			end(ev.Token, jobs.LeaseExpired, "")
		case jobs.EventRequeued:
			if ev.Token != 0 {
				end(ev.Token, jobs.LeaseReleased, "")
			}
			switch ev.Reason {
			case jobs.ReleaseNeverHeard:
				undelivered++
			case jobs.ReleaseHandedBack:
				handedBack++
			}
		case jobs.EventSucceeded:
			end(ev.Token, jobs.LeaseCompleted, jobs.Outcome(true, ev.Message, 0))
		case jobs.EventAttemptFailed:
			end(ev.Token, jobs.LeaseCompleted, "failure:"+ev.Reason)
		case jobs.EventFailed:
			if ev.Token != 0 && ev.Reason != jobs.ReasonAttemptsExhausted.String() {
				end(ev.Token, jobs.LeaseCompleted, "failure:"+ev.Reason)
			}
		case jobs.EventCancelled:
			if ev.Token != 0 {
				end(ev.Token, jobs.LeaseRevoked, "")
			}
		case jobs.EventReplayed:
			rejected, cancelRejected, undelivered, handedBack = nil, false, 0, 0
		case jobs.EventCompletionRejected:
			if len(rejected) < jobs.MaxRejectionEvents {
				rejected = append(rejected, jobs.RejectionKey{Token: ev.Token, Reason: ev.Reason, Renderer: ev.Renderer})
			}
		case jobs.EventCancelRejected:
			cancelRejected = true
		}
	}
	j.Leases, j.Rejected, j.CancelRejected, j.Undelivered, j.HandedBack = leases, rejected, cancelRejected, undelivered, handedBack
}

// rebuildIndexes recomputes every schema 2 index from the job and batch
// records: unfinished and finished jobs, jobs and batches by team, and the
// counts per phase of every batch and team.
func (t *Tx) rebuildIndexes() error {
	for _, b := range bucketsOfSchema2 {
		if bytes.Equal(b, bucketEvents) || bytes.Equal(b, bucketArtifacts) {
			continue
		}
		if err := t.tx.DeleteBucket(b); err != nil && !errors.Is(err, bbolt.ErrBucketNotFound) {
			return err
		}
		if _, err := t.tx.CreateBucket(b); err != nil {
			return err
		}
	}
	batchCounts := map[uint64]*jobs.Counts{}
	teamCounts := map[string]*jobs.Counts{}
	err := t.ForEachJob(0, func(j jobs.Job) (bool, error) {
		if !j.Phase.Terminal() {
			if err := t.SetUnfinished(j.ID, true); err != nil {
				return false, err
			}
		} else if err := t.IndexFinished(j); err != nil {
			return false, err
		}
		if err := t.IndexTeamJob(j.Team, j.ID); err != nil {
			return false, err
		}
		if batchCounts[j.BatchID] == nil {
			batchCounts[j.BatchID] = &jobs.Counts{}
		}
		if teamCounts[j.Team] == nil {
			teamCounts[j.Team] = &jobs.Counts{}
		}
		batchCounts[j.BatchID][j.Phase]++
		teamCounts[j.Team][j.Phase]++
		return true, nil
	})
	if err != nil {
		return err
	}
	err = t.tx.Bucket(bucketBatches).ForEach(func(k, v []byte) error {
		var r storagev1.BatchRecord
		if err := proto.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("decoding batch %d: %w", btoi(k), err)
		}
		return t.put(bucketTeamBatches, teamKey(r.Team, r.Id), nil)
	})
	if err != nil {
		return err
	}
	for id, c := range batchCounts {
		if err := t.putCounts(bucketBatchCounts, itob(id), *c); err != nil {
			return err
		}
	}
	for team, c := range teamCounts {
		if err := t.putCounts(bucketTeamCounts, []byte(team), *c); err != nil {
			return err
		}
	}
	return nil
}
