package cluster

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/leasehold/leasehold/coordinator/internal/mutation"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// Entry kinds: the first byte of every command entry this code proposes.
// A kind this code does not know is an entry from a newer release (or
// one no release wrote): the node stops rather than skip it, unless an
// operator allowed that entry to be skipped (store.AllowSkip).
const (
	// entryWriteSet is one writer group's write set (storagev1.WriteSet).
	entryWriteSet byte = 1
)

// errEntryKind is an entry whose kind this release does not know.
var errEntryKind = errors.New("an entry of a kind this release does not know")

// UnappliableError is a committed entry this node cannot apply: of a kind
// this release does not know, or a malformed write set. Every node that
// reaches it stops there (FSM.Fatal), having recorded it in its store
// (store.Halt), and refuses to start again (FSM.CheckHalt) until a
// release that can apply it runs, or the operator allows the entry to be
// skipped on every node (coordinator cluster recover --skip-entry).
type UnappliableError struct {
	Index, Term uint64
	Err         error
}

func (e *UnappliableError) Error() string {
	fix := "if every node stopped at it, skip it on each (stopped): coordinator cluster recover --data-dir DIR --skip-entry " +
		strconv.FormatUint(e.Index, 10) + ", then start them (see the cluster-operations runbook)"
	if errors.Is(e.Err, errEntryKind) {
		fix = "if the cluster runs a newer release, upgrade this node; otherwise " + fix
	}
	return fmt.Sprintf("replicated entry %d (term %d) cannot be applied by this node: %v; it stops there; %s", e.Index, e.Term, e.Err, fix)
}

// Unwrap returns why the entry cannot be applied.
func (e *UnappliableError) Unwrap() error { return e.Err }

// decodeEntry returns the write set an entry's data carries, or why it
// carries none this release can apply.
func decodeEntry(data []byte) ([]byte, error) {
	if len(data) == 0 || data[0] != entryWriteSet {
		return nil, fmt.Errorf("%w (%x)", errEntryKind, data[:min(len(data), 1)])
	}
	return data[1:], nil
}

// FSM is the raft state machine over the coordinator's store (raft.FSM and
// raft.BatchingFSM): it applies every committed write set into the store's
// own schema, with the index it applied, in the same transaction, so the
// store says by itself how far it has applied, and a replay of entries it
// already holds changes nothing. Followers never run a command; the store
// a follower holds is a single-node data file.
//
// Every entry raft hands it in one call goes into one store transaction,
// a batch (store.Batch). On a follower of a running node (StartNode) the
// batch stays open across calls and commits, with its fsync, once
// batchInterval after it began, once raft has handed it nothing for
// batchIdle, or once it holds batchEntries entries or batchBytes of write
// sets; and before a snapshot, a restore and the node's shutdown. The
// raft log's own fsync made every entry durable before it counted
// towards its commit, and raft hands the store again, after a restart,
// every entry after its last snapshot, which never passes what the store
// committed (Snapshot commits first): a batch lost with its process is
// applied again from the log. bbolt's NoSync is never used: a batch
// commits with fsync or not at all. While this node leads (raft says so,
// or its writer was promoted: Lead, until Follow) no batch stays open
// past the call that began it: the writer needs bbolt's one write
// transaction. Everything the FSM reports (Applied, WallFloor)
// and every read of the store (stale reads, backups) is what the store
// committed, never the open batch.
//
// raft calls Apply, ApplyBatch, Snapshot and Restore from one goroutine;
// Persist runs concurrently with them, and so do the batch's timer and
// Lead. A write set that cannot be applied (malformed, or the store
// failed: a full disk, say) stops the node (Fatal): its state would
// diverge from the log, and the cluster goes on without it. Restarted
// once the fault is mended, the node applies the log from where its
// store stopped.
type FSM struct {
	st *store.Store
	// wallFloor is the largest wall clock committed, in Unix
	// nanoseconds, which the writer reads between groups; applied the
	// index of the last entry committed. A group's base is read in its
	// own transaction (store.Tx.Group), not here.
	wallFloor atomic.Int64
	applied   atomic.Uint64

	// mu guards the batch and what follows: raft's goroutine applies into
	// the batch, the timer and Lead commit it.
	mu sync.Mutex
	// batch is the open batch, nil when none; opened is when it began;
	// first and last are the indexes of the entries applied into it (0
	// while none is), which name them if its commit fails.
	batch       *store.Batch
	opened      time.Time
	first, last uint64
	// own is the leader's evaluated group waiting for its entry
	// (owngroup.go).
	own ownGroup
	// pending is how many entries the open batch holds, its commit
	// included while it runs; the metrics read it without mu, so that a
	// scrape never waits for a commit.
	pending atomic.Int64
	// timer commits the open batch when raft hands nothing more.
	timer *time.Timer
	// hold keeps a batch open across calls (holdBatches) unless raft
	// says this node leads (leads) or the writer was promoted (leading,
	// set by Lead and cleared by Follow).
	hold, leading bool
	leads         func() bool
	// interval and idle are batchInterval and batchIdle (tests: longer).
	interval, idle time.Duration
	// metrics time ApplyBatch; StartNode sets them before raft runs.
	metrics *Metrics
	// Fatal is called with an entry that cannot be applied (on the FSM
	// goroutine; an *UnappliableError when the entry itself is at fault)
	// or a write the raft log refused (on raft's), and must not return: it
	// stops the process. Nil panics.
	Fatal func(error)
	// Skipped, when set, is told of an entry applied as nothing because
	// the operator allowed it to be skipped, on the FSM goroutine.
	Skipped func(index uint64, why error)
}

// fatal stops the node on an entry it cannot apply or store.
func (f *FSM) fatal(err error) {
	if f.Fatal != nil {
		f.Fatal(err)
	}
	panic(err.Error())
}

// NewFSM returns the state machine over st, at what st already applied.
func NewFSM(st *store.Store) (*FSM, error) {
	f := &FSM{st: st}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// load reads the applied indexes from the store.
func (f *FSM) load() error {
	rs, err := f.st.ReplicaState()
	if err != nil {
		return fmt.Errorf("reading the replica state: %w", err)
	}
	f.set(rs)
	return nil
}

// set takes rs, what the store committed, as the FSM's state.
func (f *FSM) set(rs store.ReplicaState) {
	f.applied.Store(rs.Applied)
	if !rs.WallFloor.IsZero() {
		f.wallFloor.Store(rs.WallFloor.UnixNano())
	}
}

// Store returns the store the FSM applies to.
func (f *FSM) Store() *store.Store { return f.st }

// Applied returns the index of the last entry the store committed (an
// open batch holds more).
func (f *FSM) Applied() uint64 { return f.applied.Load() }

// Pending returns how many entries were applied into the open batch and
// not yet committed, its commit included while it runs: 0 when no batch
// is open.
func (f *FSM) Pending() int { return int(f.pending.Load()) }

// WallFloor returns the largest group wall clock committed (zero when none):
// a writer taking over stamps nothing earlier.
func (f *FSM) WallFloor() time.Time {
	if ns := f.wallFloor.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// AnnouncedLeader returns the leader last announced in the log applied
// (engine.Announce): its id and gRPC address.
func (f *FSM) AnnouncedLeader() (id, addr string) {
	_ = f.st.View(func(tx *store.Tx) error {
		id, addr = tx.Leader()
		return nil
	})
	return id, addr
}

// Apply implements raft.FSM.
func (f *FSM) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch implements raft.BatchingFSM: every write set of logs in one
// store transaction. Each response is nil, or store.ErrStaleBase for a
// write set evaluated on another base (it changed nothing). An entry that
// cannot be applied stops the node there, the entries before it applied
// (unappliable), unless it may be skipped.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	cmds := make([]Command, 0, len(logs))
	at := make([]int, 0, len(logs))
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			cmds = append(cmds, Command{Index: l.Index, Term: l.Term, Data: l.Data})
			at = append(at, i)
		}
	}
	res := make([]any, len(logs))
	for j, r := range f.ApplyCommands(cmds) {
		res[at[j]] = r
	}
	return res
}

// Command is a committed command entry of the log: its index and term,
// and the bytes a Committer proposed.
type Command struct {
	Index, Term uint64
	Data        []byte
}

// Follower batches (see FSM): a batch commits this long after it began,
// after raft handed the FSM nothing for batchIdle, or once it holds this
// many entries or bytes of write sets. etcd commits its backend every
// 100 ms or 10,000 writes; an entry here is a writer group, many writes.
// Raft's queue to the state machine cannot be seen from here, and a
// follower keeping up with its leader has emptied it after nearly every
// call: a quiet spell of batchIdle stands for "nothing more is coming".
const (
	batchInterval = 100 * time.Millisecond
	batchIdle     = 25 * time.Millisecond
	batchEntries  = 1024
	batchBytes    = 64 << 20
)

// holdBatches lets batches stay open across calls while this node does
// not lead: neither raft (leads) nor Lead says it does. StartNode sets it
// once raft runs. An interval of 0 sets no timer: a batch then commits
// only at its bound, or on Flush, Lead, Snapshot or Restore.
func (f *FSM) holdBatches(leads func() bool, interval, idle time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hold, f.leads, f.interval, f.idle = true, leads, interval, idle
}

// HoldBatchesUntilFlush lets batches stay open across calls while leads
// reports false and Lead was not called, as a follower's do, with no
// timer: a batch commits at its bound, or on Flush, Lead, Snapshot or
// Restore. It is for a caller that stands in for raft and decides when
// time passes (the simulator), which calls Flush where a follower's timer
// would fire.
func (f *FSM) HoldBatchesUntilFlush(leads func() bool) { f.holdBatches(leads, 0, 0) }

// Abandon rolls the open batch back, as the process's death would: what
// the store committed stays, the batch's entries are applied again from
// the log after a restart. A caller that stands in for a crash (the
// simulator) calls it before closing the store, which waits for every
// transaction to end.
func (f *FSM) Abandon() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.release(); err != nil {
		return err
	}
	if f.batch == nil {
		return nil
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	b := f.batch
	f.batch, f.first, f.last = nil, 0, 0
	f.pending.Store(0)
	return b.Rollback()
}

// ApplyCommands applies committed command entries, in order, as
// ApplyBatch does (raft calls that; a stand-in for raft, a simulator's,
// calls this), and returns each one's response: nil, or
// store.ErrStaleBase.
func (f *FSM) ApplyCommands(cmds []Command) []any {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.batch != nil {
		failpointBatchOpen()
	}
	res := make([]any, len(cmds))
	first := 0
	if f.applyOwn(cmds) {
		first = 1
	}
	var pending []int // indexes in cmds of write sets not yet applied
	for i, c := range cmds[first:] {
		i += first
		if _, err := decodeEntry(c.Data); err != nil {
			f.applyWriteSets(cmds, pending, res)
			pending = pending[:0]
			f.commit()
			f.unappliable(c, err)
			continue
		}
		pending = append(pending, i)
	}
	f.applyWriteSets(cmds, pending, res)
	f.settle()
	return res
}

// applyWriteSets applies the write sets of cmds[i] for each i of pending,
// in order, into the batch, and sets their responses in res; a batch that
// reaches its bound commits on the way. A malformed one is unappliable;
// the ones after it are applied once it was skipped.
func (f *FSM) applyWriteSets(cmds []Command, pending []int, res []any) {
	for len(pending) > 0 {
		failpointBeforeApply()
		b := f.open()
		n := len(pending)
		if f.hold {
			used, _ := b.Len()
			n = min(n, batchEntries-used)
		}
		entries := make([]store.Entry, n)
		for j, i := range pending[:n] {
			entries[j] = store.Entry{Index: cmds[i].Index, WriteSet: cmds[i].Data[1:]}
		}
		start := time.Now()
		out, err := b.Apply(entries)
		f.metrics.observeApply(time.Since(start))
		var bad *store.EntryError
		if err != nil && !errors.As(err, &bad) {
			f.fatal(fmt.Errorf("replica: applying entries %d to %d: %w", entries[0].Index, entries[len(entries)-1].Index, err))
		}
		if f.first == 0 {
			f.first = entries[0].Index
		}
		f.last = entries[len(entries)-1].Index
		used, _ := b.Len()
		f.pending.Store(int64(used))
		for j, e := range out {
			if e != nil {
				res[pending[j]] = e
			}
		}
		if bad != nil {
			f.commit()
			at := slices.IndexFunc(entries, func(e store.Entry) bool { return e.Index == bad.Index })
			f.unappliable(cmds[pending[at]], bad.Err)
			pending = pending[at+1:]
			continue
		}
		pending = pending[n:]
		if f.full() {
			if len(pending) > 0 && mutation.On(mutation.BatchAppliedAhead) {
				if err := b.AdvanceApplied(cmds[pending[len(pending)-1]].Index); err != nil {
					f.fatal(err)
				}
			}
			f.commit()
		}
	}
}

// open returns the open batch, beginning one if none is.
func (f *FSM) open() *store.Batch {
	if f.batch == nil {
		b, err := f.st.BeginBatch()
		if err != nil {
			f.fatal(fmt.Errorf("replica: beginning a transaction: %w", err))
		}
		f.batch, f.opened = b, time.Now()
	}
	return f.batch
}

// full reports whether the open batch reached its bound.
func (f *FSM) full() bool {
	if f.batch == nil {
		return false
	}
	entries, bytes := f.batch.Len()
	return entries >= batchEntries || bytes >= batchBytes
}

// settle ends a call: the open batch commits unless it may stay open (a
// follower's, within its bounds), in which case the timer is set to
// commit it when raft hands nothing more.
func (f *FSM) settle() {
	if f.batch == nil {
		return
	}
	now := time.Now()
	due := f.opened.Add(f.interval)
	timed := f.interval > 0
	if !f.hold || f.leading || f.leads() || f.full() || (timed && !now.Before(due)) {
		f.commit()
		return
	}
	if !timed {
		return
	}
	wait := min(due.Sub(now), f.idle)
	if f.timer == nil {
		f.timer = time.AfterFunc(wait, f.Flush)
	} else {
		f.timer.Reset(wait)
	}
}

// commit commits the open batch, if any, and takes what it committed as
// the FSM's state; the metrics see how long the batch was open, from its
// beginning until its commit returned. A store that cannot commit stops
// the node.
func (f *FSM) commit() {
	if f.batch == nil {
		return
	}
	b, first, last := f.batch, f.first, f.last
	f.batch, f.first, f.last = nil, 0, 0
	if f.timer != nil {
		f.timer.Stop()
	}
	rs, err := b.Commit()
	if err != nil {
		// The same words as a failed apply: to the operator both are the
		// store refusing these entries.
		f.fatal(fmt.Errorf("replica: applying entries %d to %d: %w", first, last, err))
	}
	batchCommitted()
	f.pending.Store(0)
	f.metrics.observeHeld(time.Since(f.opened))
	f.set(rs)
}

// batchCommitted is called once a batch committed, before the FSM takes
// its state: a test's hook.
var batchCommitted = func() {}

// Flush commits the open batch, if any.
func (f *FSM) Flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commit()
}

// Lead commits the open batch and, until Follow, has every later call
// commit what it applied before it returns: the leader's writer, once
// promoted, begins its own write transaction, and bbolt has one writer.
// The leadership calls it after raft's barrier, before it promotes the
// writer.
func (f *FSM) Lead() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leading = true
	f.commit()
}

// Follow lets batches stay open across calls again: the writer was
// demoted.
func (f *FSM) Follow() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leading = false
}

// unappliable handles l, an entry this release cannot apply: applied as
// nothing when the operator allowed it to be skipped, else recorded in the
// store and the node stopped (Fatal) with an *UnappliableError naming it.
func (f *FSM) unappliable(l Command, why error) {
	skipped, err := f.st.SkipEntry(l.Index)
	if err != nil {
		f.fatal(fmt.Errorf("replica: skipping entry %d: %w", l.Index, err))
	}
	if skipped {
		if err := f.load(); err != nil {
			f.fatal(fmt.Errorf("replica: %w", err))
		}
		if f.Skipped != nil {
			f.Skipped(l.Index, why)
		}
		return
	}
	uerr := &UnappliableError{Index: l.Index, Term: l.Term, Err: why}
	if err := f.st.Halt(store.HaltedEntry{Index: l.Index, Term: l.Term, Data: l.Data}); err != nil {
		f.fatal(errors.Join(uerr, fmt.Errorf("recording it in the store: %w", err)))
	}
	f.fatal(uerr)
}

// CheckHalt refuses to start a node that stopped at an entry it could not
// apply (an *UnappliableError naming it) unless this release can apply it
// now, or the operator allowed it to be skipped; either forgets the halt,
// and raft then gives the entry to the FSM again.
func (f *FSM) CheckHalt() error {
	h, ok, err := f.st.Halted()
	if err != nil || !ok {
		return err
	}
	ws, err := decodeEntry(h.Data)
	if err == nil {
		err = f.st.CheckWriteSet(h.Index, ws)
	}
	if err != nil {
		return &UnappliableError{Index: h.Index, Term: h.Term, Err: err}
	}
	return f.st.ClearHalt()
}

// Snapshot implements raft.FSM: a read transaction of the whole store,
// which Persist copies while the FSM goes on applying. The open batch
// commits first: raft takes the snapshot as holding every entry it handed
// the FSM, and, after a restart, hands the store again only the entries
// after it.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.Flush()
	sn, err := f.st.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("beginning a snapshot: %w", err)
	}
	return &snapshot{sn: sn}, nil
}

// Restore implements raft.FSM: the snapshot becomes the store's file.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	f.Flush()
	if err := f.st.ReplaceFile(rc); err != nil {
		return fmt.Errorf("restoring a snapshot: %w", err)
	}
	return f.load()
}

// snapshot is an FSM snapshot: the store's file as of one read
// transaction.
type snapshot struct{ sn *store.Snapshot }

// Persist implements raft.FSMSnapshot.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.sn.WriteTo(sink); err != nil {
		return errors.Join(err, sink.Cancel())
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot.
func (s *snapshot) Release() { s.sn.Release() }

var (
	_ raft.BatchingFSM = (*FSM)(nil)
	_ raft.FSMSnapshot = (*snapshot)(nil)
)
