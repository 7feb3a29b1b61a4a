package store

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// WriteSetVersion is the write set format this code writes and applies.
const WriteSetVersion = 1

// bucketIDs numbers the schema's buckets for write sets. The numbers are
// part of the format: append, never renumber.
var bucketIDs = [...][]byte{
	1: bucketMeta, 2: bucketJobs, 3: bucketEvents, 4: bucketDocuments, 5: bucketArtifacts,
	6: bucketBatches, 7: bucketRequests, 8: bucketUnfinished, 9: bucketTeamJobs, 10: bucketTeamBatches,
	11: bucketBatchCounts, 12: bucketTeamCounts, 13: bucketRejections, 14: bucketAudit,
	15: bucketReplays, 16: bucketTokens, 17: bucketFinished, 18: bucketObjectRefs, 19: bucketObjectTombs,
}

// bucketReplica holds a replica's own bookkeeping (replicaApplied,
// replicaGroup, replicaWallFloor): what it applied, not what the writer
// wrote, so it is in no write set and no digest.
var bucketReplica = []byte("replica")

var (
	keyReplicaApplied   = []byte("applied_index")
	keyReplicaGroup     = []byte("group_index")
	keyReplicaWallFloor = []byte("wall_floor")
)

// Errors of applying a write set.
var (
	// ErrStaleBase is returned when a write set was evaluated on another
	// state than the store holds: its base is not the last write set the
	// store applied. The store is left as it was.
	ErrStaleBase = errors.New("write set was evaluated on another base")
	// ErrWriteSet is returned for a write set that cannot be applied as
	// written: an unknown format, bucket or operation, or a sequence moved
	// backwards (every sequence of the schema only grows: a write set that
	// lowers one was evaluated on a state this store never had).
	ErrWriteSet = errors.New("malformed write set")
)

// recorder collects a transaction's writes in order.
type recorder struct {
	ops []recordedOp
	// bytes is about how large the encoded write set will be.
	bytes int
}

type recordedOp struct {
	kind   storagev1.WriteOp_Kind
	bucket uint32
	key    []byte
	value  []byte
	seq    uint64
}

func bucketID(name []byte) uint32 {
	for id, b := range bucketIDs {
		if b != nil && bytes.Equal(b, name) {
			return uint32(id)
		}
	}
	panic(fmt.Sprintf("store: bucket %q has no write set number", name))
}

// Record makes the transaction record every write it makes from now on,
// for WriteSet. Recording costs a copy of each key and a reference to each
// value; without it the write path pays one nil check.
func (t *Tx) Record() { t.rec = &recorder{} }

func (r *recorder) add(op recordedOp) {
	r.ops = append(r.ops, op)
	r.bytes += len(op.key) + len(op.value) + 16
}

// recordPut records a put. The value is referenced, not copied: values are
// encoded into the transaction's arena or owned by the command, and either
// outlives the transaction.
func (t *Tx) recordPut(bucket, key, val []byte) {
	t.rec.add(recordedOp{kind: storagev1.WriteOp_KIND_PUT, bucket: bucketID(bucket), key: bytes.Clone(key), value: val})
}

func (t *Tx) recordDelete(bucket, key []byte) {
	t.rec.add(recordedOp{kind: storagev1.WriteOp_KIND_DELETE, bucket: bucketID(bucket), key: bytes.Clone(key)})
}

// nextSequence is bbolt's NextSequence on bucket, recorded.
func (t *Tx) nextSequence(bucket []byte) (uint64, error) {
	t.dirty = true
	seq, err := t.tx.Bucket(bucket).NextSequence()
	if err == nil && t.rec != nil {
		t.rec.add(recordedOp{kind: storagev1.WriteOp_KIND_SET_SEQUENCE, bucket: bucketID(bucket), seq: seq})
	}
	return seq, err
}

// setSequence is bbolt's SetSequence on bucket, recorded.
func (t *Tx) setSequence(bucket []byte, seq uint64) error {
	t.dirty = true
	err := t.tx.Bucket(bucket).SetSequence(seq)
	if err == nil && t.rec != nil {
		t.rec.add(recordedOp{kind: storagev1.WriteOp_KIND_SET_SEQUENCE, bucket: bucketID(bucket), seq: seq})
	}
	return err
}

// WriteSet returns what the transaction wrote since Record, encoded as a
// storagev1.WriteSet with base and wall, or nil when it is not recording.
// Call it before the transaction ends: the recorded values live as long as
// the transaction's own.
func (t *Tx) WriteSet(base uint64, wall time.Time) []byte {
	return t.AppendWriteSet(nil, base, wall)
}

// AppendWriteSet appends WriteSet(base, wall) to b, growing b once: a
// replicated entry is the write set behind a type byte, made without
// copying the write set.
func (t *Tx) AppendWriteSet(b []byte, base uint64, wall time.Time) []byte {
	if t.rec == nil {
		return b
	}
	return encodeWriteSet(b, t.rec, base, wall)
}

// Group returns the index of the last write set applied to the state the
// transaction reads: the base of a group evaluated in it.
func (t *Tx) Group() uint64 { return readReplicaState(t.tx).Group }

// WriteSetOps reports how many writes the transaction recorded.
func (t *Tx) WriteSetOps() int {
	if t.rec == nil {
		return 0
	}
	return len(t.rec.ops)
}

// WriteSetBytes reports about how many bytes the transaction's write set
// holds so far: what WriteSet would encode.
func (t *Tx) WriteSetBytes() int {
	if t.rec == nil {
		return 0
	}
	return t.rec.bytes
}

// encodeWriteSet appends r to b as a storagev1.WriteSet, encoded by hand,
// in one allocation, without a message per write.
func encodeWriteSet(b []byte, r *recorder, base uint64, wall time.Time) []byte {
	b = slices.Grow(b, r.bytes+32)
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, WriteSetVersion)
	if base != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, base)
	}
	if ns := wall.UnixNano(); !wall.IsZero() && ns != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(ns))
	}
	for _, op := range r.ops {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(opSize(op)))
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(op.kind))
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(op.bucket))
		if len(op.key) > 0 {
			b = protowire.AppendTag(b, 3, protowire.BytesType)
			b = protowire.AppendBytes(b, op.key)
		}
		if len(op.value) > 0 {
			b = protowire.AppendTag(b, 4, protowire.BytesType)
			b = protowire.AppendBytes(b, op.value)
		}
		if op.seq != 0 {
			b = protowire.AppendTag(b, 5, protowire.VarintType)
			b = protowire.AppendVarint(b, op.seq)
		}
	}
	return b
}

// opSize is the encoded size of op's WriteOp message.
func opSize(op recordedOp) int {
	n := 1 + protowire.SizeVarint(uint64(op.kind)) + 1 + protowire.SizeVarint(uint64(op.bucket))
	if len(op.key) > 0 {
		n += 1 + protowire.SizeBytes(len(op.key))
	}
	if len(op.value) > 0 {
		n += 1 + protowire.SizeBytes(len(op.value))
	}
	if op.seq != 0 {
		n += 1 + protowire.SizeVarint(op.seq)
	}
	return n
}

// ReplicaState is what a store applied as a replica: the index of the last
// entry applied, the index of the last write set applied (the base the
// next one must name), and the largest wall clock a write set carried.
type ReplicaState struct {
	Applied   uint64
	Group     uint64
	WallFloor time.Time
}

// wallFloorNanos is WallFloor in Unix nanoseconds, 0 when unset.
func (rs ReplicaState) wallFloorNanos() int64 {
	if rs.WallFloor.IsZero() {
		return 0
	}
	return rs.WallFloor.UnixNano()
}

// ReplicaState returns the store's replica bookkeeping; zero for a store
// that never applied a write set.
func (s *Store) ReplicaState() (ReplicaState, error) {
	var rs ReplicaState
	err := s.view(func(tx *bbolt.Tx) error {
		rs = readReplicaState(tx)
		return nil
	})
	return rs, err
}

func readReplicaState(tx *bbolt.Tx) ReplicaState {
	var rs ReplicaState
	b := tx.Bucket(bucketReplica)
	if b == nil {
		return rs
	}
	if v := b.Get(keyReplicaApplied); v != nil {
		rs.Applied = btoi(v)
	}
	if v := b.Get(keyReplicaGroup); v != nil {
		rs.Group = btoi(v)
	}
	if v := b.Get(keyReplicaWallFloor); v != nil {
		rs.WallFloor = time.Unix(0, int64(btoi(v)))
	}
	return rs
}

// ApplyWriteSet applies the encoded write set ws as the replicated entry at
// index, in one transaction that also records index as applied. It is
// idempotent: an entry at or below the last applied index changes nothing
// and returns nil. A write set whose base is not the last write set the
// store applied changes nothing but the applied index and returns
// ErrStaleBase. A malformed one returns ErrWriteSet and changes nothing.
// Any other error is the store's own.
func (s *Store) ApplyWriteSet(index uint64, ws []byte) error {
	res, err := s.ApplyWriteSets([]Entry{{Index: index, WriteSet: ws}})
	if err != nil {
		return err
	}
	return res[0]
}

// Entry is one replicated write set and its index in the log.
type Entry struct {
	Index    uint64
	WriteSet []byte
}

// EntryError is a replicated write set the store cannot apply as
// written (Err wraps ErrWriteSet), and the index of its entry.
type EntryError struct {
	Index uint64
	Err   error
}

func (e *EntryError) Error() string { return fmt.Sprintf("entry %d: %v", e.Index, e.Err) }

// Unwrap returns the reason, which wraps ErrWriteSet.
func (e *EntryError) Unwrap() error { return e.Err }

// ApplyWriteSets applies entries in order, each as ApplyWriteSet does, in
// one transaction: one commit for a replica catching up on many. The
// result holds each entry's outcome (nil or ErrStaleBase). A malformed
// write set ends the run there: the entries before it are applied and
// committed (their outcomes in the result), it and the ones after it are
// not, and the error is an *EntryError naming it. Any other error is the
// store's own, and nothing was applied.
func (s *Store) ApplyWriteSets(entries []Entry) ([]error, error) {
	b, err := s.BeginBatch()
	if err != nil {
		return nil, err
	}
	res, err := b.Apply(entries)
	var malformed *EntryError
	if err != nil && !errors.As(err, &malformed) {
		return nil, errors.Join(err, b.Rollback())
	}
	if _, err := b.Commit(); err != nil {
		return nil, err
	}
	if malformed != nil {
		return res, malformed
	}
	return res, nil
}

// Batch is a read-write transaction of replicated entries that stays open
// across calls of Apply until Commit: a replica applies what raft hands
// it as it comes and commits (with fsync) once for many calls. It holds
// bbolt's one write transaction while open: any other write of the store
// waits for its Commit or Rollback, and so does ReplaceFile and Close.
// Read transactions see what was committed before it, nothing of it.
// One goroutine at a time uses a batch.
type Batch struct {
	s       *Store
	tx      *bbolt.Tx
	release func()
	// before is the replica state the batch began on.
	before ReplicaState
	// entries and bytes are what Apply was given since the batch began.
	entries, bytes int
}

// BeginBatch begins a batch of replicated entries.
func (s *Store) BeginBatch() (*Batch, error) {
	tx, release, err := s.beginWrite()
	if err != nil {
		return nil, err
	}
	return &Batch{s: s, tx: tx, release: release, before: readReplicaState(tx)}, nil
}

// Apply applies entries in order into the batch, each as ApplyWriteSet
// does, and returns each one's outcome (nil or ErrStaleBase). A malformed
// write set ends the run there: the entries before it are in the batch,
// it and the ones after it are not, and the error is an *EntryError
// naming it; the batch stays usable. Any other error is the store's own:
// the batch must then be rolled back. The batch keeps references to the
// write sets' bytes until it ends: they must not change meanwhile (raft
// never changes an entry's data).
func (b *Batch) Apply(entries []Entry) ([]error, error) {
	res := make([]error, len(entries))
	for i, e := range entries {
		b.entries++
		b.bytes += len(e.WriteSet)
		stale, err := applyWriteSet(b.tx, e.Index, e.WriteSet)
		if errors.Is(err, ErrWriteSet) {
			// It wrote nothing: what came before it stays in the batch.
			return res, &EntryError{Index: e.Index, Err: err}
		}
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", e.Index, err)
		}
		if stale {
			res[i] = ErrStaleBase
		}
	}
	return res, nil
}

// Len returns how many entries the batch was given, and their write
// sets' bytes.
func (b *Batch) Len() (entries, bytes int) { return b.entries, b.bytes }

// State returns the replica state the batch holds: what the store will
// say it applied once the batch commits.
func (b *Batch) State() ReplicaState { return readReplicaState(b.tx) }

// AdvanceApplied records index as applied in the batch without writing
// any entry: only a planted bug calls it (mutation.BatchAppliedAhead).
func (b *Batch) AdvanceApplied(index uint64) error {
	rs := readReplicaState(b.tx)
	rs.Applied = max(rs.Applied, index)
	return putReplicaState(b.tx, rs)
}

// Commit commits the batch with its fsync and returns the replica state
// it committed. The batch is over either way.
func (b *Batch) Commit() (ReplicaState, error) {
	defer b.end()
	failpointApplyBeforeCommit()
	applied := readReplicaState(b.tx)
	apart := mutation.On(mutation.ApplyIndexApart)
	if apart {
		if err := putReplicaState(b.tx, b.before); err != nil {
			return ReplicaState{}, errors.Join(err, b.tx.Rollback())
		}
	}
	if err := b.tx.Commit(); err != nil {
		return ReplicaState{}, err
	}
	failpointApplyCommitted()
	if apart {
		if err := b.s.db.Update(func(tx *bbolt.Tx) error { return putReplicaState(tx, applied) }); err != nil {
			return ReplicaState{}, err
		}
	}
	return applied, nil
}

// Rollback abandons the batch: nothing of it reaches the file, as if the
// process had died before its commit.
func (b *Batch) Rollback() error {
	defer b.end()
	return b.tx.Rollback()
}

// end lets go of the store's lock, once.
func (b *Batch) end() {
	if b.release != nil {
		b.release()
		b.release = nil
	}
}

// putReplicaState writes rs as the store's replica bookkeeping.
func putReplicaState(tx *bbolt.Tx, rs ReplicaState) error {
	var wall []byte
	if ns := rs.wallFloorNanos(); ns != 0 {
		wall = itob(uint64(ns))
	}
	return errors.Join(putReplica(tx, keyReplicaApplied, itob(rs.Applied)), putReplica(tx, keyReplicaGroup, itob(rs.Group)),
		putReplica(tx, keyReplicaWallFloor, wall))
}

// CheckWriteSet reports whether the write set ws of the entry at index
// could be applied onto the store as it is now: an error wrapping
// ErrWriteSet when it is malformed, nil when applying it would apply it,
// or change nothing (an entry at or below the applied index, or one
// evaluated on another base). It writes nothing.
func (s *Store) CheckWriteSet(index uint64, ws []byte) error {
	return s.view(func(tx *bbolt.Tx) error {
		rs := readReplicaState(tx)
		if index <= rs.Applied {
			return nil
		}
		_, err := checkWriteSet(tx, rs, ws)
		return err
	})
}

// checkWriteSet decodes ws and checks every write before any is made, so
// that a malformed write set is refused whole (decodeWriteSet), and, when
// it was evaluated on the state tx holds (its base is the last write set
// applied), that no sequence moves backwards: every sequence of the schema
// only grows, so a write set that lowers one was evaluated on a state this
// store never had. A write set of another base is applied as nothing
// whatever its sequences say.
func checkWriteSet(tx *bbolt.Tx, rs ReplicaState, ws []byte) (parsedWriteSet, error) {
	m, err := decodeWriteSet(tx, ws)
	if err != nil || m.base != rs.Group {
		return m, err
	}
	var seqs map[uint32]uint64
	for i, op := range m.ops {
		if op.kind != storagev1.WriteOp_KIND_SET_SEQUENCE {
			continue
		}
		if seqs == nil {
			seqs = map[uint32]uint64{}
		}
		cur, ok := seqs[op.bucket]
		if !ok {
			cur = m.buckets[op.bucket].Sequence()
		}
		if op.seq < cur {
			return parsedWriteSet{}, fmt.Errorf("%w: write %d moves the sequence of %q back from %d to %d",
				ErrWriteSet, i, bucketIDs[op.bucket], cur, op.seq)
		}
		seqs[op.bucket] = op.seq
	}
	return m, nil
}

// parsedWriteSet is a decoded storagev1.WriteSet: its writes' keys and
// values are slices of the encoded bytes, not copies.
type parsedWriteSet struct {
	version uint32
	base    uint64
	wall    int64
	ops     []recordedOp
	// buckets are the buckets the writes name, by id, opened once in
	// the transaction the write set is checked in (decodeWriteSet).
	buckets [len(bucketIDs)]*bbolt.Bucket
}

// parseWriteSet decodes ws as proto.Unmarshal decodes a storagev1.WriteSet
// (unknown fields skipped, the last of a repeated scalar kept), without a
// message per write: a follower decodes every write the leader makes.
func parseWriteSet(ws []byte) (parsedWriteSet, error) {
	writes := 0
	if err := walkFields(ws, func(num protowire.Number, typ protowire.Type, b []byte) int {
		if num == 4 {
			writes++
		}
		return protowire.ConsumeFieldValue(num, typ, b)
	}); err != nil {
		return parsedWriteSet{}, err
	}
	m := parsedWriteSet{ops: make([]recordedOp, 0, writes)}
	err := walkFields(ws, func(num protowire.Number, typ protowire.Type, b []byte) int {
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			m.version = uint32(v)
			return n
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			m.base = v
			return n
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			m.wall = int64(v)
			return n
		case num == 4 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n
			}
			op, err := parseWriteOp(v)
			if err != nil {
				return -1
			}
			m.ops = append(m.ops, op)
			return n
		}
		return protowire.ConsumeFieldValue(num, typ, b)
	})
	return m, err
}

// parseWriteOp decodes one storagev1.WriteOp.
func parseWriteOp(b []byte) (recordedOp, error) {
	var op recordedOp
	err := walkFields(b, func(num protowire.Number, typ protowire.Type, b []byte) int {
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			op.kind = storagev1.WriteOp_Kind(int32(v))
			return n
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			op.bucket = uint32(v)
			return n
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			op.key = v
			return n
		case num == 4 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			op.value = v
			return n
		case num == 5 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			op.seq = v
			return n
		}
		return protowire.ConsumeFieldValue(num, typ, b)
	})
	return op, err
}

// walkFields calls field with each field's number, type and the bytes
// after its tag; field returns how many of them the value takes, or a
// negative protowire error.
func walkFields(b []byte, field func(num protowire.Number, typ protowire.Type, b []byte) int) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("field number %d is out of range", num)
		}
		b = b[n:]
		if n = field(num, typ, b); n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// decodeWriteSet decodes ws and checks the form of every write: the
// format, each bucket and operation, and each key's and value's size as
// bbolt takes them.
func decodeWriteSet(tx *bbolt.Tx, ws []byte) (parsedWriteSet, error) {
	m, err := parseWriteSet(ws)
	if err != nil {
		return parsedWriteSet{}, fmt.Errorf("%w: %w", ErrWriteSet, err)
	}
	if m.version != WriteSetVersion {
		return parsedWriteSet{}, fmt.Errorf("%w: version %d, this code applies %d", ErrWriteSet, m.version, WriteSetVersion)
	}
	for i, op := range m.ops {
		id := op.bucket
		if id == 0 || int(id) >= len(bucketIDs) || bucketIDs[id] == nil {
			return parsedWriteSet{}, fmt.Errorf("%w: write %d names bucket %d", ErrWriteSet, i, id)
		}
		if m.buckets[id] == nil {
			if m.buckets[id] = tx.Bucket(bucketIDs[id]); m.buckets[id] == nil {
				return parsedWriteSet{}, fmt.Errorf("%w: bucket %q is missing", ErrWriteSet, bucketIDs[id])
			}
		}
		switch op.kind {
		case storagev1.WriteOp_KIND_PUT, storagev1.WriteOp_KIND_DELETE:
			if k := len(op.key); k == 0 || k > bbolt.MaxKeySize || int64(len(op.value)) > bbolt.MaxValueSize {
				return parsedWriteSet{}, fmt.Errorf("%w: write %d has a key of %d bytes and a value of %d", ErrWriteSet, i, k, len(op.value))
			}
		case storagev1.WriteOp_KIND_SET_SEQUENCE:
		default:
			return parsedWriteSet{}, fmt.Errorf("%w: write %d has kind %v", ErrWriteSet, i, op.kind)
		}
	}
	return m, nil
}

// applyWriteSet applies ws at index in tx; it reports a stale base. A
// malformed write set (ErrWriteSet) writes nothing. bbolt keeps the keys
// and values, slices of ws, until tx ends: ws must not change before.
func applyWriteSet(tx *bbolt.Tx, index uint64, ws []byte) (stale bool, err error) {
	rs := readReplicaState(tx)
	if index <= rs.Applied && !mutation.On(mutation.Reapply) {
		return false, nil
	}
	m, err := checkWriteSet(tx, rs, ws)
	if err != nil {
		return false, err
	}
	rb, err := tx.CreateBucketIfNotExists(bucketReplica)
	if err != nil {
		return false, err
	}
	if m.base != rs.Group {
		return true, rb.Put(keyReplicaApplied, itob(index))
	}
	for i, op := range m.ops {
		b := m.buckets[op.bucket]
		switch op.kind {
		case storagev1.WriteOp_KIND_PUT:
			b.FillPercent = appendFill
			err = b.Put(op.key, op.value)
		case storagev1.WriteOp_KIND_DELETE:
			err = b.Delete(op.key)
		case storagev1.WriteOp_KIND_SET_SEQUENCE:
			err = b.SetSequence(op.seq)
		}
		if err != nil {
			return false, fmt.Errorf("applying write %d: %w", i, err)
		}
	}
	if err := rb.Put(keyReplicaApplied, itob(index)); err != nil {
		return false, err
	}
	if err := rb.Put(keyReplicaGroup, itob(index)); err != nil {
		return false, err
	}
	if m.wall > rs.wallFloorNanos() {
		return false, rb.Put(keyReplicaWallFloor, itob(uint64(m.wall)))
	}
	return false, nil
}

// Digest returns a SHA-256 over every record of the schema: each bucket's
// name and sequence, then its keys and values in order. Two stores with the
// same records have the same digest, whatever their page layout; a
// replica's own bookkeeping is left out.
func (s *Store) Digest() ([32]byte, error) {
	var sum [32]byte
	err := s.view(func(tx *bbolt.Tx) error {
		h := sha256.New()
		var n [8]byte
		word := func(v uint64) {
			for i := range n {
				n[i] = byte(v >> (56 - 8*i))
			}
			h.Write(n[:])
		}
		field := func(b []byte) {
			word(uint64(len(b)))
			h.Write(b)
		}
		for _, name := range allBuckets {
			b := tx.Bucket(name)
			if b == nil {
				continue
			}
			field(name)
			word(b.Sequence())
			if err := b.ForEach(func(k, v []byte) error {
				field(k)
				field(v)
				return nil
			}); err != nil {
				return err
			}
		}
		copy(sum[:], h.Sum(nil))
		return nil
	})
	return sum, err
}

// SameAsFor reports whether s and o hold the same value (or both none) for
// every key ws writes, and the same sequence in every bucket it changes: a
// check of one group's replication that costs what the group wrote, not
// what the stores hold.
func (s *Store) SameAsFor(o *Store, ws []byte) (bool, error) {
	var m storagev1.WriteSet
	if err := proto.Unmarshal(ws, &m); err != nil {
		return false, fmt.Errorf("%w: %w", ErrWriteSet, err)
	}
	same := true
	err := s.view(func(a *bbolt.Tx) error {
		return o.db.View(func(b *bbolt.Tx) error {
			for _, op := range m.GetOps() {
				id := op.GetBucket()
				if id == 0 || int(id) >= len(bucketIDs) || bucketIDs[id] == nil {
					return fmt.Errorf("%w: bucket %d", ErrWriteSet, id)
				}
				ba, bb := a.Bucket(bucketIDs[id]), b.Bucket(bucketIDs[id])
				if ba == nil || bb == nil {
					same = ba == bb
				} else if op.GetKind() == storagev1.WriteOp_KIND_SET_SEQUENCE {
					same = ba.Sequence() == bb.Sequence()
				} else {
					same = bytes.Equal(ba.Get(op.GetKey()), bb.Get(op.GetKey())) &&
						(ba.Get(op.GetKey()) == nil) == (bb.Get(op.GetKey()) == nil)
				}
				if !same {
					return nil
				}
			}
			return nil
		})
	})
	return same, err
}
