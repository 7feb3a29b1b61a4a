package cluster_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// sizeCommitter commits each group in place, as a single node does, and
// keeps the size of the largest entry a replicated committer would have
// proposed for it.
type sizeCommitter struct {
	mu      sync.Mutex
	largest int
}

func (c *sizeCommitter) Record() bool { return true }

func (c *sizeCommitter) Commit(tx *store.Tx, wall time.Time) error {
	n := 1 + len(tx.WriteSet(0, wall))
	c.mu.Lock()
	c.largest = max(c.largest, n)
	c.mu.Unlock()
	return tx.Commit()
}

// TestEntryBound: the largest batch the default limits take, every field
// at its longest, makes an entry within the bound of one command
// (cluster.CommandBytes) of the largest request gRPC receives for it.
func TestEntryBound(t *testing.T) {
	t.Parallel()
	st, err := store.Open(filepath.Join(t.TempDir(), "leasehold.db"), store.WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sc := &sizeCommitter{}
	lim := jobs.Limits{}.WithDefaults()
	e, err := engine.New(engine.Config{Store: st, Committer: sc, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	defer e.Stop()
	docs := make([]jobs.DocInput, lim.MaxDocuments)
	inline := int(lim.MaxBatchInlineBytes) / lim.MaxDocuments
	for i := range docs {
		name := fmt.Sprintf("%03d", i) + strings.Repeat("n", lim.MaxNameBytes-3)
		docs[i] = jobs.DocInput{
			Document: jobs.Document{Name: name, ContentType: "text/plain;" + strings.Repeat("c", 200), SizeBytes: int64(inline),
				SourceURI: "https://example.com/" + strings.Repeat("u", 2000)},
			Content: []byte(strings.Repeat("x", inline)),
		}
	}
	if _, err := e.Submit(context.Background(), engine.SubmitRequest{Team: strings.Repeat("t", 64), RequestID: strings.Repeat("r", 128), Docs: docs}); err != nil {
		t.Fatal(err)
	}
	recv := lim.MaxBatchInlineBytes + int64(lim.MaxDocuments)*(4<<10) + 64<<10
	t.Logf("largest entry %d bytes for a request of at most %d", sc.largest, recv)
	if bound := cluster.CommandBytes(recv, 0); int64(sc.largest) > bound {
		t.Errorf("the largest batch made an entry of %d bytes, over the bound of %d", sc.largest, bound)
	}
}

// TestCheckEntryBound: the default limits fit an entry; a batch limit of
// 32 MiB, or a preview of 24 MiB, does not.
func TestCheckEntryBound(t *testing.T) {
	t.Parallel()
	recv := int64(16<<20 + 500*4<<10 + 64<<10)
	if err := cluster.CheckEntryBound(recv, 8<<20); err != nil {
		t.Errorf("the default limits: %v", err)
	}
	for _, tc := range [][2]int64{{recv + 16<<20, 8 << 20}, {recv, 24 << 20}} {
		if err := cluster.CheckEntryBound(tc[0], tc[1]); err == nil {
			t.Errorf("a request of %d bytes and a preview of %d passed", tc[0], tc[1])
		}
	}
}
