package store

import (
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
)

// WithMigrateChunk sets how many jobs one migration transaction converts,
// so that tests can interrupt a migration between chunks.
func WithMigrateChunk(n int) Option { return func(s *Store) { s.migrateChunk = n } }

// DecodeJob is the job decoder that Tx.Job and the listings use.
func DecodeJob(v []byte) (jobs.Job, error) { return decodeJob(0, v) }

// EncodeJob is the encoding PutJob writes.
func EncodeJob(j jobs.Job) ([]byte, error) { return proto.Marshal(jobToRecord(j)) }

// ScanQueued, ScanState and ScanArtifact are the readers that take single
// fields out of encoded records without decoding them.
func ScanQueued(v []byte) (QueuedJob, bool, error) { return scanQueued(0, v, map[string]string{}) }

func ScanState(v []byte) (jobs.State, error) { return scanState(0, v) }

func ScanArtifact(v []byte) (Staged, error) { return scanArtifact(0, v) }

// DeleteJobRecord deletes a job's record and nothing else, as a lost write
// would leave the file.
func (t *Tx) DeleteJobRecord(id uint64) error { return t.del(bucketJobs, itob(id)) }

// TxID is the id of the store's last committed transaction: bbolt moves it
// by one per commit.
func (s *Store) TxID() (id int) {
	_ = s.view(func(tx *bbolt.Tx) error {
		id = tx.ID()
		return nil
	})
	return id
}

// ParseWriteSet is the decoder a replica applies write sets with, its
// result as a storagev1.WriteSet.
func ParseWriteSet(ws []byte) (*storagev1.WriteSet, error) {
	m, err := parseWriteSet(ws)
	if err != nil {
		return nil, err
	}
	out := &storagev1.WriteSet{Version: m.version, Base: m.base, WallUnixNano: m.wall}
	for _, op := range m.ops {
		out.Ops = append(out.Ops, &storagev1.WriteOp{Kind: op.kind, Bucket: op.bucket, Key: op.key, Value: op.value, Sequence: op.seq})
	}
	return out, nil
}
