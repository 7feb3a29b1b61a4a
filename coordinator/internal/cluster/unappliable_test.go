package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// openStore opens a store in a new directory of t.
func openStore(t testing.TB, name string) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), name+".db"), store.WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// groupOn writes a queued job of id on primary as the writer would, and
// returns the entry that replicates it on base.
func groupOn(t testing.TB, primary *store.Store, base, id uint64) []byte {
	t.Helper()
	tx, err := primary.Begin()
	if err != nil {
		t.Fatal(err)
	}
	tx.Record()
	j := jobs.Job{ID: id, BatchID: 1, Team: "alpha", Phase: jobs.PhaseQueued, CreatedAt: time.Unix(1, 0)}
	if _, err := tx.NextJobIDs(1); err != nil {
		t.Fatal(err)
	}
	if err := tx.PutJob(j); err != nil {
		t.Fatal(err)
	}
	ws := tx.WriteSet(base, time.Unix(1, 0))
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return append([]byte{entryWriteSet}, ws...)
}

// stopped is the panic a test's Fatal stops the FSM with.
type stopped struct{ err error }

// applyUntilStopped gives logs to f as raft does and returns the error f
// stopped with, if it did.
func applyUntilStopped(f *FSM, logs []*raft.Log) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s, ok := r.(stopped)
			if !ok {
				panic(r)
			}
			err = s.err
		}
	}()
	f.ApplyBatch(logs)
	return nil
}

// newTestFSM returns an FSM over st that stops by panicking with stopped,
// and records the entries it skipped.
func newTestFSM(t testing.TB, st *store.Store, skipped *[]uint64) *FSM {
	t.Helper()
	f, err := NewFSM(st)
	if err != nil {
		t.Fatal(err)
	}
	f.Fatal = func(err error) { panic(stopped{err}) }
	f.Skipped = func(index uint64, _ error) { *skipped = append(*skipped, index) }
	return f
}

// TestUnappliableEntry: an entry the FSM cannot apply (a kind this release
// does not know, a malformed write set) stops the node at its index, after
// the entries before it, and is recorded; a restart is refused with one
// line naming it and the fix; once the operator allows it to be skipped,
// the same entries given again (raft replays them) apply around it. A
// release that can apply the recorded entry starts.
func TestUnappliableEntry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"An unknown kind", []byte{0x7f, 0x00}, "upgrade this node"},
		{"An empty entry", []byte{}, "upgrade this node"},
		{"A malformed write set", []byte{entryWriteSet, 0xff, 0xff}, "malformed write set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary, st := openStore(t, "primary"), openStore(t, "replica")
			logs := []*raft.Log{
				{Index: 1, Term: 1, Type: raft.LogConfiguration},
				{Index: 2, Term: 1, Type: raft.LogCommand, Data: groupOn(t, primary, 0, 1)},
				{Index: 3, Term: 2, Type: raft.LogCommand, Data: tc.data},
				{Index: 4, Term: 2, Type: raft.LogCommand, Data: groupOn(t, primary, 2, 2)},
			}
			var skipped []uint64
			f := newTestFSM(t, st, &skipped)
			err := applyUntilStopped(f, logs)
			var uerr *UnappliableError
			if !errors.As(err, &uerr) || uerr.Index != 3 || uerr.Term != 2 {
				t.Fatalf("ApplyBatch stopped with %v, want an UnappliableError naming entry 3 of term 2", err)
			}
			if f.Applied() != 2 {
				t.Errorf("applied %d, want 2: the entries before it, not those after", f.Applied())
			}
			if h, ok, _ := st.Halted(); !ok || h.Index != 3 {
				t.Errorf("Halted = %+v, %v; want entry 3 recorded", h, ok)
			}

			// A restart of the same release is refused before raft runs.
			err = newTestFSM(t, st, &skipped).CheckHalt()
			if !errors.As(err, &uerr) || uerr.Index != 3 {
				t.Fatalf("CheckHalt = %v, want entry 3 named", err)
			}
			msg := err.Error()
			for _, want := range []string{"entry 3 (term 2)", "--skip-entry 3", tc.want} {
				if !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
					t.Errorf("the refusal %q is not one line containing %q", msg, want)
				}
			}

			if err := st.AllowSkip(3); err != nil {
				t.Fatal(err)
			}
			f = newTestFSM(t, st, &skipped)
			if err := f.CheckHalt(); err != nil {
				t.Fatalf("CheckHalt after the skip was allowed: %v", err)
			}
			if err := applyUntilStopped(f, logs); err != nil {
				t.Fatalf("ApplyBatch after the skip was allowed: %v", err)
			}
			if f.Applied() != 4 || f.LastGroup() != 4 || fmt.Sprint(skipped) != "[3]" {
				t.Errorf("applied %d, last group %d, skipped %v; want 4, 4 and [3]", f.Applied(), f.LastGroup(), skipped)
			}
			if a, b := mustDigest(t, primary), mustDigest(t, st); a != b {
				t.Error("the replica differs from the primary after skipping the entry")
			}
		})
	}
	t.Run("A release that can apply the recorded entry starts", func(t *testing.T) {
		t.Parallel()
		primary, st := openStore(t, "primary"), openStore(t, "replica")
		if err := st.Halt(store.HaltedEntry{Index: 1, Term: 1, Data: groupOn(t, primary, 0, 1)}); err != nil {
			t.Fatal(err)
		}
		var skipped []uint64
		if err := newTestFSM(t, st, &skipped).CheckHalt(); err != nil {
			t.Fatalf("CheckHalt of an entry this release applies: %v", err)
		}
		if _, ok, _ := st.Halted(); ok {
			t.Error("the halt was kept")
		}
	})
}

func mustDigest(t testing.TB, st *store.Store) [32]byte {
	t.Helper()
	d, err := st.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// raftDir writes the raft state of a node n1 bootstrapped alone, its log
// holding entries after the configuration, and returns its directory and
// its snapshot store.
func raftDir(t *testing.T, entries ...*raft.Log) (string, raft.SnapshotStore) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := wal.Open(filepath.Join(dir, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	snaps, err := raft.NewFileSnapshotStore(dir, snapshotsRetained, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("")
	defer trans.Close()
	rc := raft.DefaultConfig()
	rc.LocalID = "n1"
	conf := raft.Configuration{Servers: []raft.Server{{ID: "n1", Address: "127.0.0.1:7201"}}}
	if err := raft.BootstrapCluster(rc, w, w, snaps, trans, conf); err != nil {
		t.Fatal(err)
	}
	if err := w.StoreLogs(entries); err != nil {
		t.Fatal(err)
	}
	return dir, snaps
}

// TestRecoverPastAnUnappliableEntry: a lost-quorum recovery over a log
// holding an entry the store cannot apply fails naming it, without a
// panic and with the raft state left as it was; given the entry to skip,
// it recovers and applies the entries after it.
func TestRecoverPastAnUnappliableEntry(t *testing.T) {
	t.Parallel()
	primary, st := openStore(t, "primary"), openStore(t, "replica")
	peers := []Peer{{ID: "n1", RaftAddr: "127.0.0.1:7201"}}
	dir, snaps := raftDir(t,
		&raft.Log{Index: 2, Term: 1, Type: raft.LogCommand, Data: groupOn(t, primary, 0, 1)},
		&raft.Log{Index: 3, Term: 1, Type: raft.LogCommand, Data: []byte{0x7f, 0x00}},
		&raft.Log{Index: 4, Term: 1, Type: raft.LogCommand, Data: groupOn(t, primary, 2, 2)},
	)
	fsm, err := NewFSM(st)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Recover(dir, "n1", peers, fsm, nil)
	var uerr *UnappliableError
	if !errors.As(err, &uerr) || uerr.Index != 3 {
		t.Fatalf("Recover = %v, want an UnappliableError naming entry 3", err)
	}
	if list, _ := snaps.List(); len(list) != 0 {
		t.Errorf("a failed recovery wrote %d snapshots", len(list))
	}
	w, err := wal.Open(filepath.Join(dir, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	first, _ := w.FirstIndex()
	last, _ := w.LastIndex()
	w.Close()
	if first != 1 || last != 4 {
		t.Errorf("after a failed recovery the log holds %d to %d, want 1 to 4 as it was", first, last)
	}

	res, err := Recover(dir, "n1", peers, fsm, []uint64{3})
	if err != nil {
		t.Fatalf("Recover skipping entry 3: %v", err)
	}
	if res.LastIndex != 4 || fsm.Applied() != 4 {
		t.Errorf("recovered at %d, applied %d; want both 4", res.LastIndex, fsm.Applied())
	}
	if mustDigest(t, primary) != mustDigest(t, st) {
		t.Error("the recovered store differs from the primary")
	}
}

// TestRecoverReplaysAppliedEntries: a recovery replays the log onto a
// store that applied it already, where each entry changes nothing, though
// the sequences the first entries set are below the store's.
func TestRecoverReplaysAppliedEntries(t *testing.T) {
	t.Parallel()
	primary, st := openStore(t, "primary"), openStore(t, "replica")
	logs := []*raft.Log{
		{Index: 2, Term: 1, Type: raft.LogCommand, Data: groupOn(t, primary, 0, 1)},
		{Index: 3, Term: 1, Type: raft.LogCommand, Data: groupOn(t, primary, 2, 2)},
	}
	dir, _ := raftDir(t, logs...)
	var skipped []uint64
	fsm := newTestFSM(t, st, &skipped)
	if err := applyUntilStopped(fsm, logs); err != nil {
		t.Fatal(err)
	}
	if _, err := Recover(dir, "n1", []Peer{{ID: "n1", RaftAddr: "127.0.0.1:7201"}}, fsm, nil); err != nil {
		t.Fatalf("Recover over applied entries: %v", err)
	}
	if mustDigest(t, primary) != mustDigest(t, st) {
		t.Error("the recovered store differs from the primary")
	}
}

// FuzzApplyBatch gives the FSM command entries of arbitrary bytes, one at
// a time, on one store: each is applied (or refused as evaluated on
// another base), or stops the node naming its index with the store's
// records as they were; nothing else, and never a panic of its own. The
// node is then let past the entry, as an operator's skip does.
func FuzzApplyBatch(f *testing.F) {
	primary, st := openStore(f, "primary"), openStore(f, "replica")
	f.Add(groupOn(f, primary, 0, 1))
	f.Add([]byte{0x7f, 0x00})
	f.Add([]byte{entryWriteSet, 0xff, 0xff})
	f.Add([]byte{})
	var skipped []uint64
	fsm := newTestFSM(f, st, &skipped)
	f.Fuzz(func(t *testing.T, data []byte) {
		index := fsm.Applied() + 1
		before := mustDigest(t, st)
		err := applyUntilStopped(fsm, []*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: data}})
		if err == nil {
			if fsm.Applied() != index {
				t.Fatalf("entry %d applied without error, but the store applied up to %d", index, fsm.Applied())
			}
			return
		}
		var uerr *UnappliableError
		if !errors.As(err, &uerr) || uerr.Index != index {
			t.Fatalf("entry %d (%x) stopped the node with %v, want an UnappliableError naming it", index, data, err)
		}
		if mustDigest(t, st) != before || fsm.Applied() != index-1 {
			t.Fatalf("entry %d (%x) that could not be applied changed the store (applied %d)", index, data, fsm.Applied())
		}
		if err := st.AllowSkip(index); err != nil {
			t.Fatal(err)
		}
		if skipped, err := st.SkipEntry(index); !skipped || err != nil {
			t.Fatalf("SkipEntry(%d) = %v, %v", index, skipped, err)
		}
		if err := fsm.load(); err != nil {
			t.Fatal(err)
		}
	})
}
