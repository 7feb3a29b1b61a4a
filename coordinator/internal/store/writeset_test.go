package store_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// recorded runs fn in a recording transaction on st, commits it, and
// returns its write set built on base.
func recorded(t *testing.T, st *store.Store, base uint64, fn func(*store.Tx) error) []byte {
	t.Helper()
	tx, err := st.Begin()
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	tx.Record()
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		t.Fatalf("writing: %v", err)
	}
	ws := tx.WriteSet(base, t0)
	if err := tx.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	return ws
}

func digest(t *testing.T, st *store.Store) [32]byte {
	t.Helper()
	d, err := st.Digest()
	if err != nil {
		t.Fatalf("Digest: %v", err)
	}
	return d
}

func TestWriteSet(t *testing.T) {
	t.Parallel()

	// later changes what populateTx wrote: every kind of write, deletes
	// and sequences included.
	later := func(tx *store.Tx) error {
		j := fullJob(3, 2, "ab")
		j.Phase = jobs.PhaseSucceeded
		if err := tx.PutJob(j); err != nil {
			return err
		}
		if err := tx.SetUnfinished(3, false); err != nil {
			return err
		}
		if err := tx.DeleteDocument(3); err != nil {
			return err
		}
		if err := tx.DeleteArtifacts(1, 0); err != nil {
			return err
		}
		if _, err := tx.NextToken(); err != nil {
			return err
		}
		if _, err := tx.PutRejection(fullRejection(3, 7, t0)); err != nil {
			return err
		}
		_, err := tx.PutAudit(jobs.AuditRecord{At: t0, Principal: "ops", Action: jobs.AuditResume, Reason: "done"})
		return err
	}

	t.Run("ReplaysEveryWriteOntoAnEqualStore", func(t *testing.T) {
		t.Parallel()
		primary, replica := setup(t), setup(t)
		ws1 := recorded(t, primary.st, 0, populateTx)
		ws2 := recorded(t, primary.st, 1, later)
		for i, ws := range [][]byte{ws1, ws2} {
			if err := replica.st.ApplyWriteSet(uint64(i+1), ws); err != nil {
				t.Fatalf("ApplyWriteSet(%d): %v", i+1, err)
			}
			if i == 0 {
				if got, want := digest(t, replica.st), digest(t, primary.st); got == want {
					t.Fatalf("the replica equals the primary after the first of two write sets")
				}
			}
		}
		if got, want := digest(t, replica.st), digest(t, primary.st); got != want {
			t.Fatalf("replica digest %x, primary %x", got, want)
		}
		teams, artifacts := []string{"a", "ab"}, [][2]uint64{{1, 40}}
		if diff := cmp.Diff(takeSnapshot(t, primary.st, teams, artifacts), takeSnapshot(t, replica.st, teams, artifacts)); diff != "" {
			t.Fatalf("the replica reads differently from the primary (-primary +replica):\n%s", diff)
		}
		rs, err := replica.st.ReplicaState()
		if err != nil {
			t.Fatal(err)
		}
		if rs.Applied != 2 || rs.Group != 2 || !rs.WallFloor.Equal(t0) {
			t.Fatalf("ReplicaState = %+v, want applied 2, group 2, wall floor %v", rs, t0)
		}
	})

	t.Run("IsIdempotentOnReplay", func(t *testing.T) {
		t.Parallel()
		primary, replica := setup(t), setup(t)
		ws1 := recorded(t, primary.st, 0, populateTx)
		ws2 := recorded(t, primary.st, 1, later)
		for _, step := range []struct {
			index uint64
			ws    []byte
		}{{1, ws1}, {2, ws2}, {1, ws1}, {2, ws2}} {
			if err := replica.st.ApplyWriteSet(step.index, step.ws); err != nil {
				t.Fatalf("ApplyWriteSet(%d): %v", step.index, err)
			}
		}
		replica.reopen(t)
		if err := replica.st.ApplyWriteSet(2, ws2); err != nil {
			t.Fatalf("ApplyWriteSet(2) after reopening: %v", err)
		}
		if got, want := digest(t, replica.st), digest(t, primary.st); got != want {
			t.Fatalf("after replays the replica digest is %x, the primary's %x", got, want)
		}
	})

	t.Run("RefusesAWriteSetBuiltOnAnotherBase", func(t *testing.T) {
		t.Parallel()
		primary, replica := setup(t), setup(t)
		ws1 := recorded(t, primary.st, 0, populateTx)
		ws2 := recorded(t, primary.st, 1, later)
		if err := replica.st.ApplyWriteSet(5, ws1); err != nil {
			t.Fatal(err)
		}
		before := digest(t, replica.st)
		// ws2 names base 1, but the replica's last write set is at 5.
		if err := replica.st.ApplyWriteSet(6, ws2); !errors.Is(err, store.ErrStaleBase) {
			t.Fatalf("ApplyWriteSet on another base: %v, want ErrStaleBase", err)
		}
		if got := digest(t, replica.st); got != before {
			t.Fatalf("a stale write set changed the store")
		}
		rs, _ := replica.st.ReplicaState()
		if rs.Applied != 6 || rs.Group != 5 {
			t.Fatalf("ReplicaState = %+v, want applied 6 (the entry is consumed), group 5 (its writes are not)", rs)
		}
	})

	t.Run("RefusesAMalformedWriteSetUnchanged", func(t *testing.T) {
		t.Parallel()
		replica := setup(t)
		before := digest(t, replica.st)
		for _, ws := range [][]byte{{0xff, 0xff}, {0x08, 0x09}} {
			if err := replica.st.ApplyWriteSet(1, ws); !errors.Is(err, store.ErrWriteSet) {
				t.Errorf("ApplyWriteSet(%x) = %v, want ErrWriteSet", ws, err)
			}
		}
		if digest(t, replica.st) != before {
			t.Fatalf("a malformed write set changed the store")
		}
		if rs, _ := replica.st.ReplicaState(); rs.Applied != 0 {
			t.Fatalf("a malformed write set was counted applied: %+v", rs)
		}
	})

	t.Run("IsNilWithoutRecording", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tx, err := b.st.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := populateTx(tx); err != nil {
			t.Fatal(err)
		}
		if ws := tx.WriteSet(0, t0); ws != nil || tx.WriteSetOps() != 0 {
			t.Fatalf("a transaction that does not record returned a write set of %d bytes", len(ws))
		}
	})
}

// TestEveryWriteIsRecorded fails when a function of the store writes to
// bbolt other than through the recorded helpers (Tx.put, Tx.del,
// Tx.nextSequence, Tx.setSequence, the recorded cursor delete): such a
// write would reach the leader's file and no replica. Offline code that
// never runs under the writer (migration, backup and restore, the replica's
// own apply) is exempt by function.
func TestEveryWriteIsRecorded(t *testing.T) {
	t.Parallel()
	allowed := map[string]bool{
		// The recorded surface.
		"put": true, "del": true, "nextSequence": true, "setSequence": true, "DeleteDocument": true,
		// Not under the writer: opening, migrating, restoring, applying.
		"prepare": true, "migrateFrom1": true, "migrateChunkFrom1": true, "rebuildIndexes": true,
		"skipAhead": true, "Restore": true, "Compact": true, "applyWriteSet": true,
		// The replica's own bookkeeping (what it applied, stopped at or may skip).
		"putReplica": true,
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, unrecordedWrites(t, f, src, allowed)...)
	}
	if len(found) > 0 {
		t.Fatalf("writes that bypass the write set recorder:\n%s", strings.Join(found, "\n"))
	}

	t.Run("CatchesAPlantedWrite", func(t *testing.T) {
		planted := []byte(`package store
func (t *Tx) PutSomething(k, v []byte) error { return t.tx.Bucket(bucketJobs).Put(k, v) }
func (t *Tx) BumpSomething() { t.tx.Bucket(bucketTokens).SetSequence(9) }
`)
		got := unrecordedWrites(t, "planted.go", planted, allowed)
		if len(got) != 2 {
			t.Fatalf("the check found %q in a file with two unrecorded writes", got)
		}
	})
}

// unrecordedWrites lists calls of bbolt's write methods in src outside the
// allowed functions.
func unrecordedWrites(t *testing.T, name string, src []byte, allowed map[string]bool) []string {
	t.Helper()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, name, src, 0)
	if err != nil {
		t.Fatalf("parsing %s: %v", name, err)
	}
	writes := []string{"Put", "Delete", "NextSequence", "SetSequence", "CreateBucket", "CreateBucketIfNotExists", "DeleteBucket"}
	var out []string
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil || allowed[fn.Name.Name] {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && slices.Contains(writes, sel.Sel.Name) {
				out = append(out, fset.Position(call.Pos()).String()+": "+fn.Name.Name+" calls "+sel.Sel.Name)
			}
			return true
		})
	}
	return out
}

func TestWriteSetRefusesASequenceMovedBack(t *testing.T) {
	t.Parallel()
	primary, replica := setup(t), setup(t)
	ws1 := recorded(t, primary.st, 0, populateTx)
	if err := replica.st.ApplyWriteSet(1, ws1); err != nil {
		t.Fatal(err)
	}
	// A second primary that granted fewer tokens: its write set, applied
	// on top of the first's, would lower the token counter.
	other := setup(t)
	ws := recorded(t, other.st, 1, func(tx *store.Tx) error {
		_, err := tx.NextToken()
		return err
	})
	before := digest(t, replica.st)
	if err := replica.st.ApplyWriteSet(2, ws); !errors.Is(err, store.ErrWriteSet) {
		t.Fatalf("a write set that moves the token counter back: %v, want ErrWriteSet", err)
	}
	if digest(t, replica.st) != before {
		t.Fatal("the refused write set changed the store")
	}
}
