package coordinator

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestClusterNodeRefusesASingleNodesDatabase checks that a node of a new
// cluster of three does not bootstrap over a data directory that holds a
// single node's records (as the first pod of a StatefulSet finds the
// claim a single-node deployment left): its peers start empty, and the
// stores would differ from the first entry on. One voter alone may adopt
// the records, and an empty directory starts as ever.
func TestClusterNodeRefusesASingleNodesDatabase(t *testing.T) {
	t.Parallel()
	singleNode := func(t *testing.T) string {
		t.Helper()
		dir := t.TempDir()
		st, err := store.Open(filepath.Join(dir, DBFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Update(func(tx *store.Tx) error {
			_, err := tx.PutAudit(jobs.AuditRecord{Principal: "oncall", Action: "PAUSE_DISPATCH", Reason: "before the cluster"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	start := func(dir string, voters int) (*Coordinator, error) {
		var peers []Peer
		for i := range voters {
			peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i+1), RaftAddr: fmt.Sprintf("n%d", i+1)})
		}
		_, trans := raft.NewInmemTransportWithTimeout("n1", 300*time.Millisecond)
		return New(Config{
			Listen:  "127.0.0.1:0",
			DataDir: dir,
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
			Cluster: &Cluster{NodeID: "n1", Peers: peers, transport: trans,
				HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 50 * time.Millisecond},
		})
	}
	t.Run("Three voters over a single node's records: refused, and the file is free again", func(t *testing.T) {
		dir := singleNode(t)
		c, err := start(dir, 3)
		if err == nil {
			c.Close()
			t.Fatal("a node of three started over a single node's records")
		}
		if !errors.Is(err, cluster.ErrRecordsWithoutRaftState) {
			t.Errorf("New: %v, want ErrRecordsWithoutRaftState", err)
		}
		// Nothing was bootstrapped: once the records are moved away, the
		// node starts.
		st, err := store.Open(filepath.Join(dir, DBFile))
		if err != nil {
			t.Fatalf("the refused node kept the database open: %v", err)
		}
		st.Close()
	})
	t.Run("One voter adopts a single node's records", func(t *testing.T) {
		c, err := start(singleNode(t), 1)
		if err != nil {
			t.Fatalf("New with one voter: %v", err)
		}
		c.Close()
	})
	t.Run("Three voters on an empty directory start", func(t *testing.T) {
		c, err := start(t.TempDir(), 3)
		if err != nil {
			t.Fatalf("New on an empty directory: %v", err)
		}
		c.Close()
	})
}
