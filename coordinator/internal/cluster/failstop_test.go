package cluster

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
)

// fullDisk is a raft log and stable store whose writes fail as on a full
// disk.
type fullDisk struct{ *raft.InmemStore }

func (fullDisk) StoreLog(*raft.Log) error         { return syscall.ENOSPC }
func (fullDisk) StoreLogs([]*raft.Log) error      { return syscall.ENOSPC }
func (fullDisk) DeleteRange(uint64, uint64) error { return syscall.ENOSPC }
func (fullDisk) Set([]byte, []byte) error         { return syscall.ENOSPC }
func (fullDisk) SetUint64([]byte, uint64) error   { return syscall.ENOSPC }

func TestFailStopLog(t *testing.T) {
	t.Parallel()
	t.Run("EveryFailedWriteStopsTheNodeWithItsCause", func(t *testing.T) {
		t.Parallel()
		var got []error
		s := stopOnWriteError(fullDisk{raft.NewInmemStore()}, fullDisk{raft.NewInmemStore()}, func(err error) { got = append(got, err) })
		writes := []struct {
			name, want string
			write      func() error
		}{
			{"StoreLogs", "appending entries 7 to 8 to the raft log", func() error {
				return s.StoreLogs([]*raft.Log{{Index: 7}, {Index: 8}})
			}},
			{"StoreLog", "appending entry 9 to the raft log", func() error { return s.StoreLog(&raft.Log{Index: 9}) }},
			{"DeleteRange", "deleting entries 1 to 4 of the raft log", func() error { return s.DeleteRange(1, 4) }},
			{"SetUint64", "storing raft's CurrentTerm", func() error { return s.SetUint64([]byte("CurrentTerm"), 3) }},
			{"Set", "storing raft's LastVoteCand", func() error { return s.Set([]byte("LastVoteCand"), []byte("n2")) }},
		}
		for i, w := range writes {
			err := w.write()
			if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), w.want) {
				t.Errorf("%s = %v, want ENOSPC saying %q", w.name, err, w.want)
			}
			if len(got) != i+1 || got[i] != err {
				t.Errorf("%s: fatal called with %v, want once with %v", w.name, got[i:], err)
			}
		}
	})
	t.Run("ReadsAndGoodWritesPassThrough", func(t *testing.T) {
		t.Parallel()
		mem := raft.NewInmemStore()
		s := stopOnWriteError(mem, mem, func(err error) { t.Errorf("fatal(%v) on a store that takes every write", err) })
		if err := s.StoreLogs([]*raft.Log{{Index: 1, Data: []byte("a")}, {Index: 2, Data: []byte("b")}}); err != nil {
			t.Fatal(err)
		}
		var l raft.Log
		if err := s.GetLog(2, &l); err != nil || string(l.Data) != "b" {
			t.Errorf("GetLog(2) = %q, %v; want b", l.Data, err)
		}
		if last, err := s.LastIndex(); last != 2 || err != nil {
			t.Errorf("LastIndex = %d, %v; want 2", last, err)
		}
		if err := s.SetUint64([]byte("CurrentTerm"), 5); err != nil {
			t.Fatal(err)
		}
		if v, err := s.GetUint64([]byte("CurrentTerm")); v != 5 || err != nil {
			t.Errorf("GetUint64 = %d, %v; want 5", v, err)
		}
	})
	t.Run("MonotonicAsTheWrappedLog", func(t *testing.T) {
		t.Parallel()
		w, err := wal.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if s := stopOnWriteError(w, w, nil); !s.IsMonotonic() {
			t.Error("raft-wal wrapped is not monotonic: raft would leave a gap in it after a snapshot")
		}
		if s := stopOnWriteError(raft.NewInmemStore(), raft.NewInmemStore(), nil); s.IsMonotonic() {
			t.Error("an in-memory store wrapped claims to be monotonic")
		}
	})
}
