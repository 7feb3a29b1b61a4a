package coordinator

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// CheckReport is what Check found in a data directory's database.
type CheckReport struct {
	// Path is the database file checked.
	Path string `json:"path"`
	// Schema is the file's schema version; the record checks run on the
	// current schema only (an earlier one is migrated on start).
	Schema uint64 `json:"schema"`
	// Jobs, Unfinished and Batches count the job records, the jobs in the
	// index of unfinished jobs that start-up reads, and the batches.
	Jobs       int `json:"jobs"`
	Unfinished int `json:"unfinished"`
	Batches    int `json:"batches"`
	// LastToken is the largest fencing token ever granted; the next lease
	// gets a larger one.
	LastToken uint64 `json:"last_token"`
	// Digest is a SHA-256 over every record of the schema, in hex: two
	// nodes of a cluster that applied the same entries have the same
	// digest, whatever their page layout.
	Digest string `json:"digest"`
	// AppliedIndex is the index of the last raft entry the store applied,
	// 0 for a single node's store.
	AppliedIndex uint64 `json:"applied_index"`
	// Problems lists the inconsistencies found (at most 100; Omitted counts
	// the rest). None means the file is consistent.
	Problems []string `json:"problems"`
	Omitted  int      `json:"omitted,omitempty"`
	// ArtifactStore names the store the pointers' objects were looked for
	// in; StoredPointers counts the jobs whose preview is an object of it
	// and Objects the objects they name. MissingObjects are those the store
	// does not hold with the size named: previews that are lost (each is
	// also a problem).
	ArtifactStore  string          `json:"artifact_store"`
	StoredPointers int             `json:"stored_pointers"`
	Objects        int             `json:"objects"`
	MissingObjects []MissingObject `json:"missing_objects"`
}

// MissingObject is an object of the artifact store that jobs' pointers
// name and the store does not hold.
type MissingObject struct {
	// Key is <team>/sha256/<digest>; Size the size the pointers name.
	Key  string `json:"key"`
	Size int64  `json:"size_bytes"`
	// Jobs are the first few jobs that name it, of Count.
	Jobs  []string `json:"jobs"`
	Count int      `json:"count"`
}

// OK reports whether the check found no problem.
func (r CheckReport) OK() bool { return len(r.Problems) == 0 && r.Omitted == 0 }

// Check verifies the database in dataDir while no coordinator runs on it:
// bbolt's consistency check of the file (pages, freelist, key order), and
// on a file of the current schema that its records agree with one another
// (the index of unfinished jobs with the jobs' phases, batches whole, counts
// per phase with the jobs, lease tokens unique and at most the token
// counter). The report also carries the store's digest and, for a
// cluster's node, the raft index it applied. It opens the file read-only and changes nothing. Its cost
// follows the whole store: it reads every job record.
//
// It then looks in the artifact store that artifactStore names (as
// --artifact-store does: empty for the directory beside the database) for
// every object a job's pointer names, and reports those missing: previews
// lost. It changes nothing there either. A store that does not answer is a
// problem of the report.
//
// What it finds wrong is listed in the report; the error is for a check
// that could not run: no database in dataDir, or one that a coordinator
// holds open (wrapping ErrDataDirInUse, after waiting a second for it).
func Check(ctx context.Context, dataDir, artifactStore string) (CheckReport, error) {
	path := filepath.Join(dataDir, DBFile)
	rep := CheckReport{Path: path, Problems: []string{}, MissingObjects: []MissingObject{}}
	st, err := store.OpenReadOnly(path)
	if errors.Is(err, store.ErrLocked) {
		return rep, fmt.Errorf("data directory %s: %w (its database %s is locked); stop it before checking", dataDir, ErrDataDirInUse, path)
	}
	if err != nil {
		return rep, err
	}
	defer st.Close()
	sum, err := st.Verify()
	if err != nil {
		return rep, fmt.Errorf("checking %s: %w", path, err)
	}
	rep.Schema, rep.Jobs, rep.Unfinished, rep.Batches, rep.LastToken = sum.Schema, sum.Jobs, sum.Unfinished, sum.Batches, sum.LastToken
	digest, err := st.Digest()
	if err != nil {
		return rep, fmt.Errorf("digest of %s: %w", path, err)
	}
	rs, err := st.ReplicaState()
	if err != nil {
		return rep, fmt.Errorf("replica state of %s: %w", path, err)
	}
	rep.Digest, rep.AppliedIndex = hex.EncodeToString(digest[:]), rs.Applied
	rep.Problems = append(rep.Problems, sum.Problems...)
	rep.Omitted = sum.Omitted
	rep.Objects = len(sum.Pointers)
	for _, p := range sum.Pointers {
		rep.StoredPointers += p.Count
	}
	if len(sum.Pointers) == 0 {
		return rep, nil
	}
	missing, where, err := missingObjects(ctx, dataDir, artifactStore, sum.Pointers)
	rep.ArtifactStore = where
	if err != nil {
		rep.Problems = append(rep.Problems, fmt.Sprintf("the artifact store %s: %v: the %d objects pointers name were not looked for", where, err, len(sum.Pointers)))
		return rep, nil
	}
	rep.MissingObjects = missing
	for _, m := range missing {
		rep.Problems = append(rep.Problems, fmt.Sprintf("jobs %v (%d) point to %s, which the artifact store does not hold with %d bytes: their preview is lost",
			m.Jobs, m.Count, m.Key, m.Size))
	}
	return rep, nil
}

// missingObjects looks in the store artifactStore names (beside dataDir
// when empty) for the objects of pointers, without changing it, and
// returns those it lacks and the store's name.
func missingObjects(ctx context.Context, dataDir, artifactStore string, pointers []store.StoredPointer) ([]MissingObject, string, error) {
	st, err := artifacts.OpenForReading(ctx, artifactStore, dataDir)
	if err != nil {
		return nil, artifactStore, err
	}
	wanted := make([]artifacts.Wanted, len(pointers))
	byKey := make(map[artifacts.Key]store.StoredPointer, len(pointers))
	for i, p := range pointers {
		k := artifacts.Key{Team: p.Team, Digest: p.Digest}
		wanted[i] = artifacts.Wanted{Key: k, Size: p.Size}
		byKey[k] = p
	}
	lost, err := artifacts.FindMissing(ctx, st, wanted)
	if err != nil {
		return nil, st.String(), err
	}
	out := make([]MissingObject, 0, len(lost))
	for _, w := range lost {
		p := byKey[w.Key]
		m := MissingObject{Key: w.Key.String(), Size: w.Size, Count: p.Count, Jobs: make([]string, len(p.Jobs))}
		for i, id := range p.Jobs {
			m.Jobs[i] = server.JobID(id)
		}
		out = append(out, m)
	}
	return out, st.String(), nil
}
