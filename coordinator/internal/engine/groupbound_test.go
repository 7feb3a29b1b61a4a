package engine

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// sizingCommitter commits in place with every write recorded, and keeps
// the size of each group's write set and how many commits it made.
type sizingCommitter struct {
	mu    sync.Mutex
	sizes []int
	// gate, when set, holds the first commit until it is closed; entered
	// receives once that commit waits.
	gate, entered chan struct{}
}

func (c *sizingCommitter) Record() bool { return true }

func (c *sizingCommitter) Commit(tx *store.Tx, _ time.Time) error {
	c.mu.Lock()
	c.sizes = append(c.sizes, tx.WriteSetBytes())
	first := len(c.sizes) == 1
	c.mu.Unlock()
	if first && c.gate != nil {
		c.entered <- struct{}{}
		<-c.gate
	}
	return tx.Commit()
}

// manyDocs is a submit of 100 small documents: a request of a few KiB
// (its size, which the writer's gathering bounds) that writes several
// times that (a record, an event and index entries per document).
func manyDocs(req string) SubmitRequest {
	names := make([]string, 100)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%03d.pdf", req, i)
	}
	return SubmitRequest{Team: "alpha", RequestID: req, Docs: docs(names...)}
}

// TestGroupBoundedByWriteSet: with a committer that records write sets, a
// group takes no more commands once its write set reached MaxWriteSetBytes,
// so that one raft entry stays within the bound; the commands it left run
// in the next group, in order, and every one is answered once.
func TestGroupBoundedByWriteSet(t *testing.T) {
	t.Parallel()
	const bound = 64 << 10

	t.Run("Stepper", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		sc := &sizingCommitter{}
		b.cfg.Committer, b.cfg.MaxWriteSetBytes = sc, bound
		s := b.stepped(t)
		var subs []*Pending[SubmitResult]
		for i := range 6 {
			subs = append(subs, s.Submit(manyDocs(fmt.Sprint("r", i))))
		}
		step(t, s, 6)
		if s.Queued() == 0 {
			t.Fatal("one group took six submits of 100 documents each under a write set bound of 64 KiB")
		}
		for s.Queued() > 0 {
			step(t, s, s.Queued())
		}
		checkBounded(t, sc, subs, bound)
	})

	t.Run("Writer", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t.TempDir())
		sc := &sizingCommitter{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
		b.cfg.Committer, b.cfg.MaxWriteSetBytes = sc, bound
		b.open(t)
		// The first group waits in its commit while six submits queue
		// behind it in the writer's channel.
		first := make(chan error, 1)
		go func() {
			_, err := b.e.Submit(context.Background(), SubmitRequest{Team: "alpha", RequestID: "first", Docs: docs("a.pdf")})
			first <- err
		}()
		<-sc.entered
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range 6 {
			wg.Go(func() {
				_, errs[i] = b.e.Submit(context.Background(), manyDocs(fmt.Sprint("r", i)))
			})
		}
		for len(b.e.reqC) < 6 {
			runtime.Gosched()
		}
		close(sc.gate)
		wg.Wait()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("submit %d: %v", i, err)
			}
		}
		checkBounded(t, sc, nil, bound)
		if len(sc.sizes) < 3 {
			t.Errorf("six submits of 100 documents queued together made %d groups after the first, want them cut at the write set bound of 64 KiB", len(sc.sizes)-1)
		}
	})
}

// checkBounded checks that every submit succeeded and every group's write
// set stayed within twice bound (the bound and the one command that
// passed it).
func checkBounded(t *testing.T, sc *sizingCommitter, subs []*Pending[SubmitResult], bound int) {
	t.Helper()
	for i, p := range subs {
		if _, err := p.Result(); err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i, n := range sc.sizes {
		if n > 2*bound {
			t.Errorf("group %d wrote a write set of %d bytes, past twice the bound of %d", i, n, bound)
		}
	}
	t.Logf("write sets of the groups: %v", sc.sizes)
}
