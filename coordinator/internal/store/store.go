// Package store keeps the coordinator's records in bbolt: jobs, document
// content, batches, rejected completions, the audit trail, the dispatch
// switch and the sequences (fencing tokens, job and batch ids).
//
// Records are protobuf messages of the storage schema
// (leasehold.storage.v1), apart from the wire API. Keys are 8-byte
// big-endian numbers, so bbolt's byte order is numeric order. Helpers that
// need a transaction are methods on Tx; only the engine's writer goroutine
// calls Update.
package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"
)

// SchemaVersion is the on-disk schema this code reads and writes.
const SchemaVersion = 1

var (
	bucketMeta       = []byte("meta")
	bucketJobs       = []byte("jobs")
	bucketDocuments  = []byte("documents")
	bucketBatches    = []byte("batches")
	bucketRequests   = []byte("batch_requests")
	bucketRejections = []byte("rejections")
	bucketAudit      = []byte("audit")
	bucketReplays    = []byte("replay_requests")
	bucketTokens     = []byte("tokens")

	keySchema   = []byte("schema_version")
	keyDispatch = []byte("dispatch")

	allBuckets = [][]byte{bucketMeta, bucketJobs, bucketDocuments, bucketBatches, bucketRequests, bucketRejections, bucketAudit, bucketReplays, bucketTokens}
)

// Errors returned by Open.
var (
	// ErrSchemaVersion is returned when the file was written by an
	// incompatible schema version.
	ErrSchemaVersion = errors.New("unsupported schema version")
	// ErrInjected is the error returned by an injected fault.
	ErrInjected = errors.New("injected storage fault")
)

// Store is an open bbolt database.
type Store struct {
	db *bbolt.DB
	// fault, when set, is called before every record write; an error aborts
	// the transaction. Tests use it to fail a commit mid-way.
	fault func(op string) error
}

// Option configures Open.
type Option func(*Store)

// WithFault installs a fault hook called before each record write with the
// bucket name; returning an error fails the write and so the transaction.
func WithFault(f func(op string) error) Option { return func(s *Store) { s.fault = f } }

// Open opens (creating if needed) the database at path. It waits at most
// one second for the file lock, so a second coordinator on the same data
// directory fails fast instead of hanging.
func Open(path string, opts ...Option) (*Store, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	s := &Store{db: db}
	for _, o := range opts {
		o(s)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keySchema); v != nil {
			if got := binary.BigEndian.Uint64(v); got != SchemaVersion {
				return fmt.Errorf("%w: file has %d, code reads %d", ErrSchemaVersion, got, SchemaVersion)
			}
			return nil
		}
		return meta.Put(keySchema, itob(SchemaVersion))
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialising %s: %w", path, err)
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Update runs fn in one read-write transaction and commits (with fsync)
// when fn returns nil. Only the writer goroutine calls it.
func (s *Store) Update(fn func(*Tx) error) error {
	return s.db.Update(func(tx *bbolt.Tx) error { return fn(&Tx{tx: tx, fault: s.fault}) })
}

// View runs fn in a read-only transaction. Any goroutine may call it;
// values must not be kept past fn.
func (s *Store) View(fn func(*Tx) error) error {
	return s.db.View(func(tx *bbolt.Tx) error { return fn(&Tx{tx: tx}) })
}

// Begin starts a read-write transaction for the writer's group commit.
// The caller ends it with Commit or Rollback.
func (s *Store) Begin() (*Tx, error) {
	tx, err := s.db.Begin(true)
	if err != nil {
		return nil, err
	}
	return &Tx{tx: tx, fault: s.fault}, nil
}

// Tx is a transaction with the record helpers.
type Tx struct {
	tx    *bbolt.Tx
	fault func(op string) error
	dirty bool
}

// Dirty reports whether anything was written in the transaction.
func (t *Tx) Dirty() bool { return t.dirty }

// Commit commits (and fsyncs) a transaction from Begin.
func (t *Tx) Commit() error { return t.tx.Commit() }

// Rollback abandons a transaction from Begin.
func (t *Tx) Rollback() error { return t.tx.Rollback() }

func itob(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func btoi(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

func (t *Tx) put(bucket, key, val []byte) error {
	if t.fault != nil {
		if err := t.fault(string(bucket)); err != nil {
			return err
		}
	}
	t.dirty = true
	return t.tx.Bucket(bucket).Put(key, val)
}

// NextToken returns the next fencing token. The counter is persisted by the
// same transaction, so a token is never handed out twice, even if the
// process dies between the grant and the answer.
func (t *Tx) NextToken() (uint64, error) {
	t.dirty = true
	return t.tx.Bucket(bucketTokens).NextSequence()
}

// LastToken returns the largest token ever handed out.
func (t *Tx) LastToken() uint64 { return t.tx.Bucket(bucketTokens).Sequence() }

// NextJobIDs reserves n consecutive job ids and returns the first.
func (t *Tx) NextJobIDs(n int) (uint64, error) {
	t.dirty = true
	b := t.tx.Bucket(bucketJobs)
	first := b.Sequence() + 1
	if err := b.SetSequence(b.Sequence() + uint64(n)); err != nil {
		return 0, err
	}
	return first, nil
}

// NextBatchID returns the next batch id.
func (t *Tx) NextBatchID() (uint64, error) {
	t.dirty = true
	return t.tx.Bucket(bucketBatches).NextSequence()
}
