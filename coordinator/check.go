package coordinator

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"

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
// What it finds wrong is listed in the report; the error is for a check
// that could not run: no database in dataDir, or one that a coordinator
// holds open (wrapping ErrDataDirInUse, after waiting a second for it).
func Check(dataDir string) (CheckReport, error) {
	path := filepath.Join(dataDir, DBFile)
	rep := CheckReport{Path: path, Problems: []string{}}
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
	return rep, nil
}
