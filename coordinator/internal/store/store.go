// Package store keeps the coordinator's records in bbolt: jobs and their
// histories, document content, previews, batches, the indexes the writer and
// the listings need, rejected completions, the audit trail, the dispatch
// switch and the sequences (fencing tokens, job and batch ids).
//
// Records are protobuf messages of the storage schema
// (leasehold.storage.v1), apart from the wire API. Keys are big-endian
// numbers, so bbolt's byte order is numeric order. Helpers that need a
// transaction are methods on Tx; only the engine's writer goroutine writes.
//
// # Schema 2
//
// The hot job record is small: it never carries its history, which is one
// record per event under (job, seq); a preview lives under (job, token) of
// the lease that made it, written in the transaction that records the
// success; document content is dropped when a job succeeds or is cancelled.
// Start-up reads only the index of unfinished jobs, and listings walk the
// index of jobs by team, so both cost what the live work costs, not the
// whole history. jobs.Counts per phase, per batch and per team, are kept as
// jobs move. Open migrates a schema 1 file in place (see migrate.go).
//
// # Retention, backup, compaction
//
// Terminal jobs are indexed by when they ended, so that retention deletes
// the oldest in bounded steps without scanning (retention.go). WriteBackup
// copies the file from one short read transaction into a temporary file
// and hands it out from there while the writer goes on; Compact and Restore work on a file no coordinator holds (backup.go).
package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"
)

// SchemaVersion is the on-disk schema this code reads and writes.
const SchemaVersion = 2

var (
	bucketMeta        = []byte("meta")
	bucketJobs        = []byte("jobs")
	bucketEvents      = []byte("events")
	bucketDocuments   = []byte("documents")
	bucketArtifacts   = []byte("artifacts")
	bucketBatches     = []byte("batches")
	bucketRequests    = []byte("batch_requests")
	bucketUnfinished  = []byte("unfinished")
	bucketTeamJobs    = []byte("team_jobs")
	bucketTeamBatches = []byte("team_batches")
	bucketBatchCounts = []byte("batch_counts")
	bucketTeamCounts  = []byte("team_counts")
	bucketRejections  = []byte("rejections")
	bucketAudit       = []byte("audit")
	bucketReplays     = []byte("replay_requests")
	bucketTokens      = []byte("tokens")
	bucketFinished    = []byte("finished")
	// bucketObjectRefs and bucketObjectTombs (objects.go) came after schema
	// 2: Open creates them in a file that lacks them, and a backup without
	// them is still whole.
	bucketObjectRefs  = []byte("artifact_refs")
	bucketObjectTombs = []byte("artifact_tombs")
	bucketsOfSchema2  = [][]byte{bucketEvents, bucketArtifacts, bucketUnfinished, bucketTeamJobs, bucketTeamBatches, bucketBatchCounts, bucketTeamCounts, bucketFinished}
	keySchema         = []byte("schema_version")
	keyDispatch       = []byte("dispatch")
	// keyLeader is the leader of a replicated coordinator as it announced
	// itself: id, then a NUL, then its gRPC address.
	keyLeader          = []byte("leader")
	keyMigrationCursor = []byte("migration_cursor")
	// keyFinishedBackfill is the last job id indexed by the backfill of the
	// finished-jobs index, present while it is under way.
	keyFinishedBackfill = []byte("finished_backfill")

	allBuckets = [][]byte{bucketMeta, bucketJobs, bucketEvents, bucketDocuments, bucketArtifacts, bucketBatches, bucketRequests,
		bucketUnfinished, bucketTeamJobs, bucketTeamBatches, bucketBatchCounts, bucketTeamCounts,
		bucketRejections, bucketAudit, bucketReplays, bucketTokens, bucketFinished, bucketObjectRefs, bucketObjectTombs}
	// laterBuckets are in allBuckets but not required of a schema 2 file
	// or backup: Open creates them.
	laterBuckets = [][]byte{bucketObjectRefs, bucketObjectTombs}
)

// Errors returned by Open and by transactions.
var (
	// ErrSchemaVersion is returned when the file was written by a schema
	// version this code cannot read.
	ErrSchemaVersion = errors.New("unsupported schema version")
	// ErrLocked is returned when another process holds the file open.
	ErrLocked = errors.New("database file is in use by another process")
	// ErrInjected is the error returned by an injected fault.
	ErrInjected = errors.New("injected storage fault")
)

// Defaults for Open.
const (
	// lockTimeout bounds the wait for the file lock, so a second
	// coordinator on the same data directory fails fast instead of hanging.
	lockTimeout = time.Second
	// initialMmapSize is the address space mapped at open. Growing the
	// mapping blocks until every read transaction ends, so mapping a
	// generous size up front keeps readers from stalling the writer; it
	// costs address space, not memory.
	initialMmapSize = 1 << 30
)

// Store is an open bbolt database.
type Store struct {
	// mu is held for reading by every transaction and for writing while
	// ReplaceFile swaps the file under db.
	mu sync.RWMutex
	// wl is the store's one read-write transaction (writeLock), taken
	// before mu.
	wl writeLock
	db *bbolt.DB
	// fault, when set, is called before every record write; an error aborts
	// the transaction. Tests use it to fail a commit mid-way.
	fault func(op string) error
	// legacyArtifacts is the schema 1 artifact directory, read by the
	// migration.
	legacyArtifacts string
	migrateChunk    int
	migration       Migration
	// mmapSize is the address space mapped at open.
	mmapSize int
	// noSync opens the file with bbolt's NoSync (WithoutSync).
	noSync bool
	// pageSize is the page size of a file Open creates (WithPageSize);
	// 0 is the operating system's.
	pageSize int
}

// Option configures Open.
type Option func(*Store)

// WithFault installs a fault hook called before each record write with the
// bucket name, those of a schema 1 migration included; returning an error
// fails the write and so the transaction.
func WithFault(f func(op string) error) Option { return func(s *Store) { s.fault = f } }

// WithLegacyArtifacts names the directory where schema 1 kept preview files
// (<dir>/<2 hex>/<sha256>); migrating a schema 1 file copies the preview of
// every succeeded job from it into the database.
func WithLegacyArtifacts(dir string) Option { return func(s *Store) { s.legacyArtifacts = dir } }

// WithInitialMmapSize maps n bytes at open instead of the default 1 GiB,
// so that a test can make the file outgrow its mapping, and bbolt remap
// it, with a few MiB of writes.
func WithInitialMmapSize(n int) Option { return func(s *Store) { s.mmapSize = n } }

// WithPageSize has Open create a missing file with pages of n bytes
// instead of the operating system's page size. A file that exists keeps
// the size it was created with, whatever n is.
func WithPageSize(n int) Option { return func(s *Store) { s.pageSize = n } }

// Open opens (creating if needed) the database at path, migrating a schema 1
// file to schema 2. It waits at most one second for the file lock and then
// fails with ErrLocked.
func Open(path string, opts ...Option) (*Store, error) {
	// The freelist is written at every commit, so that opening reads it
	// instead of scanning every page of the file: a scan would make
	// start-up time and memory follow the whole history (at a million jobs,
	// 2 s and the whole 1.5 GiB file mapped in). The array freelist keeps
	// its ids sorted as it goes; the hashmap one sorts them at every commit,
	// which cost a tenth of the writer's time.
	s := &Store{migrateChunk: 10_000, mmapSize: initialMmapSize}
	for _, o := range opts {
		o(s)
	}
	db, err := s.openDB(path)
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("opening %s: %w (%w)", path, ErrLocked, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	db.NoSync = s.noSync
	s.db = db
	version, err := s.prepare()
	if err == nil && version == 1 {
		err = s.migrateFrom1()
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialising %s: %w", path, err)
	}
	return s, nil
}

// openDB opens the bbolt file at path with the store's options.
func (s *Store) openDB(path string) (*bbolt.DB, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{
		Timeout:         lockTimeout,
		FreelistType:    bbolt.FreelistArrayType,
		InitialMmapSize: s.mmapSize,
		PageSize:        s.pageSize,
	})
	if err == nil {
		db.NoSync = s.noSync
	}
	return db, err
}

// prepare creates missing buckets and returns the file's schema version,
// writing the current one into a new file.
func (s *Store) prepare() (uint64, error) {
	var version uint64
	err := s.update(func(tx *bbolt.Tx) error {
		// Any bucket without a version: not a file this code wrote, and
		// not one to stamp with a version.
		hasBuckets, _ := tx.Cursor().First()
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keySchema); v != nil {
			version = binary.BigEndian.Uint64(v)
		} else if hasBuckets != nil {
			return fmt.Errorf("%w: the file has no schema version, so no coordinator wrote it; "+
				"check the data path, or restore a backup", ErrSchemaVersion)
		} else {
			version = SchemaVersion
			if err := meta.Put(keySchema, itob(SchemaVersion)); err != nil {
				return err
			}
		}
		if version != 1 && version != SchemaVersion {
			return fmt.Errorf("%w: the file has schema %d, this coordinator reads 1 (migrating it) and %d; "+
				"run the coordinator release that wrote it, or restore a backup", ErrSchemaVersion, version, SchemaVersion)
		}
		// A file written before the finished-jobs index existed has its
		// terminal jobs indexed in steps (BackfillFinished); a schema 1
		// file is indexed whole by its migration.
		if hasBuckets != nil && tx.Bucket(bucketFinished) == nil {
			if err := meta.Put(keyFinishedBackfill, itob(0)); err != nil {
				return err
			}
		}
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	return version, err
}

// Close closes the database.
func (s *Store) Close() error {
	s.wl.lock()
	defer s.wl.unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.db.Close()
}

// Path returns the database file's path.
func (s *Store) Path() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.db.Path()
}

// view runs fn in a bbolt read transaction. A transaction must not begin
// another on the same goroutine: with ReplaceFile waiting, the second
// would wait for ever.
func (s *Store) view(fn func(*bbolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.db.View(fn)
}

// update runs fn in a bbolt read-write transaction and commits it.
func (s *Store) update(fn func(*bbolt.Tx) error) error {
	s.wl.lock()
	defer s.wl.unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.db.Update(fn)
}

// Update runs fn in one read-write transaction and commits (with fsync)
// when fn returns nil. Only the writer goroutine calls it.
func (s *Store) Update(fn func(*Tx) error) error {
	return s.update(func(tx *bbolt.Tx) error { return fn(&Tx{tx: tx, fault: s.fault}) })
}

// View runs fn in a read-only transaction. Any goroutine may call it;
// values must not be kept past fn. Keep it short: a long read transaction
// holds pages the writer cannot reuse.
func (s *Store) View(fn func(*Tx) error) error {
	return s.view(func(tx *bbolt.Tx) error { return fn(&Tx{tx: tx}) })
}

// Begin starts a read-write transaction for the writer's group commit.
// The caller ends it with Commit or Rollback.
func (s *Store) Begin() (*Tx, error) {
	tx, release, err := s.beginWrite()
	if err != nil {
		return nil, err
	}
	return &Tx{tx: tx, fault: s.fault, release: release, wl: &s.wl}, nil
}

// beginWrite begins a bbolt read-write transaction under the store's
// write lock; release lets the locks go once the transaction ended.
func (s *Store) beginWrite() (tx *bbolt.Tx, release func(), err error) {
	s.wl.lock()
	s.mu.RLock()
	release = func() {
		s.mu.RUnlock()
		s.wl.unlock()
	}
	if tx, err = s.db.Begin(true); err != nil {
		release()
		return nil, nil, err
	}
	return tx, release, nil
}

// Stats is the database file's size and its free pages.
type Stats struct {
	Size int64
	// FreePages are pages no record uses, reused by later writes; those
	// freed while a read transaction still sees them included.
	FreePages int
	PageSize  int
}

// Stats reports the database file's size and its free pages. Any goroutine
// may call it.
func (s *Store) Stats() (Stats, error) {
	var st Stats
	err := s.view(func(tx *bbolt.Tx) error {
		st.Size = tx.Size()
		return nil
	})
	s.mu.RLock()
	bs := s.db.Stats()
	st.PageSize = s.db.Info().PageSize
	s.mu.RUnlock()
	st.FreePages = bs.FreePageN + bs.PendingPageN
	return st, err
}

// Check runs bbolt's consistency check and returns the problems it found,
// joined, or nil.
func (s *Store) Check() error {
	var errs []error
	err := s.view(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

// Tx is a transaction with the record helpers.
type Tx struct {
	tx    *bbolt.Tx
	fault func(op string) error
	dirty bool
	// rec, when set, records every write (Record).
	rec *recorder
	// release, for a transaction from Begin, lets go of the store's locks
	// when the transaction ends; wl is the write lock it holds.
	release func()
	wl      *writeLock
	// arena holds the encoded values written in the transaction: bbolt
	// keeps a reference to every value until commit, so they cannot share
	// a reused buffer, but they can share one allocation.
	arena []byte
	// jobRec is the record PutJob fills and encodes, one for every job
	// the transaction writes.
	jobRec *storagev1.JobRecord
}

// arenaChunk is the size of one arena allocation.
const arenaChunk = 64 << 10

// encode marshals m into the transaction's arena and returns the bytes,
// valid for the life of the transaction.
func (t *Tx) encode(m proto.Message) ([]byte, error) {
	if cap(t.arena)-len(t.arena) < 512 {
		t.arena = make([]byte, 0, arenaChunk)
	}
	free := t.arena[len(t.arena):]
	out, err := proto.MarshalOptions{}.MarshalAppend(free, m)
	if err != nil {
		return nil, err
	}
	if len(out) <= cap(free) {
		t.arena = t.arena[:len(t.arena)+len(out)]
	}
	return out[:len(out):len(out)], nil
}

// Dirty reports whether anything was written in the transaction.
func (t *Tx) Dirty() bool { return t.dirty }

// Commit commits (and fsyncs) a transaction from Begin.
func (t *Tx) Commit() error {
	defer t.end()
	return t.tx.Commit()
}

// Rollback abandons a transaction from Begin. Rolling back a transaction
// that has ended returns an error and does nothing.
func (t *Tx) Rollback() error {
	defer t.end()
	return t.tx.Rollback()
}

// Yieldable lets any other writer of the store end the transaction, a
// transaction from Begin that now only waits, by calling yield instead of
// waiting for it: yield must end it (Commit or Rollback), on the caller's
// goroutine. It holds until the transaction ends. A writer already
// waiting calls yield at once.
func (t *Tx) Yieldable(yield func()) {
	if t.wl != nil && t.release != nil {
		t.wl.yieldTo(yield)
	}
}

// end releases the store's lock, once.
func (t *Tx) end() {
	if t.release != nil {
		t.release()
		t.release = nil
	}
}

// Size returns the size of the database file as seen by the transaction.
func (t *Tx) Size() int64 { return t.tx.Size() }

func itob(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func btoi(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// key2 is a 16-byte key of two big-endian numbers.
func key2(a, b uint64) []byte {
	k := make([]byte, 16)
	binary.BigEndian.PutUint64(k, a)
	binary.BigEndian.PutUint64(k[8:], b)
	return k
}

// appendFill is how full bbolt fills a page before splitting it. Every
// bucket's keys mostly grow (ids come from counters) and a page that splits
// at the end of the key range is never written again, so the default of
// half-full pages would leave half of it empty for good: twice the pages to
// write at each commit, twice the file, twice the memory mapped.
const appendFill = 0.95

func (t *Tx) put(bucket, key, val []byte) error {
	if t.fault != nil {
		if err := t.fault(string(bucket)); err != nil {
			return err
		}
	}
	t.dirty = true
	if t.rec != nil {
		t.recordPut(bucket, key, val)
	}
	b := t.tx.Bucket(bucket)
	b.FillPercent = appendFill
	return b.Put(key, val)
}

func (t *Tx) del(bucket, key []byte) error {
	if t.fault != nil {
		if err := t.fault(string(bucket)); err != nil {
			return err
		}
	}
	t.dirty = true
	if t.rec != nil {
		t.recordDelete(bucket, key)
	}
	return t.tx.Bucket(bucket).Delete(key)
}

// NextToken returns the next fencing token. The counter is persisted by the
// same transaction, so a token is never handed out twice, even if the
// process dies between the grant and the answer.
func (t *Tx) NextToken() (uint64, error) { return t.nextSequence(bucketTokens) }

// LastToken returns the largest token ever handed out.
func (t *Tx) LastToken() uint64 { return t.tx.Bucket(bucketTokens).Sequence() }

// NextJobIDs reserves n consecutive job ids and returns the first.
func (t *Tx) NextJobIDs(n int) (uint64, error) {
	first := t.tx.Bucket(bucketJobs).Sequence() + 1
	if err := t.setSequence(bucketJobs, first+uint64(n)-1); err != nil {
		return 0, err
	}
	return first, nil
}

// NextBatchID returns the next batch id.
func (t *Tx) NextBatchID() (uint64, error) { return t.nextSequence(bucketBatches) }
