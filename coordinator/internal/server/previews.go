package server

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Previews.
const (
	// DefaultStoreAbove is the inline threshold: previews up to it stay in
	// the job's records, as they always did, and larger ones go to the
	// artifact store. Measured (docs/performance.md, "Previews and the
	// artifact store"): up to 16 KiB a preview in the B+tree and the raft
	// log costs less than an object (two fsyncs in the directory, a
	// presigned PUT and a HEAD with an S3-compatible store), on a single
	// node and in a cluster; at 32 KiB the single node is even and a
	// cluster writes four times the bytes on every node to keep it inline.
	DefaultStoreAbove = 16 << 10
	// DefaultStoreTimeout bounds one call to the store.
	DefaultStoreTimeout = 10 * time.Second
	// DefaultPresignTTL is how long a presigned URL is valid.
	DefaultPresignTTL = 5 * time.Minute
)

// Previews is the artifact store as the services use it, and where each
// preview goes.
type Previews struct {
	// Store keeps previews larger than StoreAbove; nil keeps every preview
	// inline.
	Store artifacts.Store
	// StoreAbove is the inline threshold (DefaultStoreAbove).
	StoreAbove int
	// InlineCap, when set, refuses previews larger than it with
	// ARTIFACT_STORE_REQUIRED: a cluster without a shared store keeps
	// previews inline, in its replicated records, up to it.
	InlineCap int
	// Timeout bounds one call to the store (DefaultStoreTimeout).
	Timeout time.Duration
	// PresignTTL is how long presigned URLs live (DefaultPresignTTL).
	PresignTTL time.Duration
	// Health, when set, is told the outcome of every call to the store.
	Health func(err error)
}

func (p Previews) withDefaults() Previews {
	p.StoreAbove = cmp.Or(p.StoreAbove, DefaultStoreAbove)
	p.Timeout = cmp.Or(p.Timeout, DefaultStoreTimeout)
	p.PresignTTL = cmp.Or(p.PresignTTL, DefaultPresignTTL)
	if p.Health == nil {
		p.Health = func(error) {}
	}
	return p
}

// presigns reports whether renderers may upload straight to the store.
func (p Previews) presigns() bool { return p.Store != nil && p.Store.Shared() }

// observe tells Health how a call went: a missing object is an answer.
func (p Previews) observe(err error) error {
	if err == nil || errors.Is(err, artifacts.ErrNotFound) {
		p.Health(nil)
	} else if errors.Is(err, artifacts.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		p.Health(err)
	}
	return err
}

// storeErr turns a store failure into the error a caller is answered:
// a time-out is the store's unavailability, not the caller's deadline.
func storeErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, artifacts.ErrUnavailable) {
		return errors.Join(artifacts.ErrUnavailable, err)
	}
	return err
}

// StoreHealth keeps whether the artifact store answered its last call,
// in the leasehold_artifact_store_degraded gauge, and tells OnChange's
// function (the health entry) when that changes.
type StoreHealth struct {
	mu       sync.Mutex
	degraded bool
	last     error
	gauge    prometheus.Gauge
	failures prometheus.Counter
	// onChange is told each change between answering (nil) and degraded
	// (the failure).
	onChange func(err error)
}

// NewStoreHealth returns a StoreHealth registering its metrics on reg.
func NewStoreHealth(reg prometheus.Registerer) *StoreHealth {
	h := &StoreHealth{
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leasehold_artifact_store_degraded",
			Help: "1 while the artifact store's last call failed (unreachable, refused or slow), else 0."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "leasehold_artifact_store_failures_total",
			Help: "Calls to the artifact store that failed for want of an answer."}),
	}
	if reg != nil {
		reg.MustRegister(h.gauge, h.failures)
	}
	return h
}

// OnChange sets fn to be told, in order, each change between answering
// (nil) and degraded (the failure); it is called with the current state
// at once. fn must not call h.
func (h *StoreHealth) OnChange(fn func(err error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onChange = fn
	fn(h.last)
}

// Observe records a call's outcome (nil: the store answered).
func (h *StoreHealth) Observe(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if was := h.degraded; was != (err != nil) && h.onChange != nil {
		h.onChange(err)
	}
	h.degraded, h.last = err != nil, err
	if err != nil {
		h.gauge.Set(1)
		h.failures.Inc()
	} else {
		h.gauge.Set(0)
	}
}

// storeInline decides an inline preview's place before the completion
// goes to the writer: one larger than StoreAbove is put in the store
// (off the writer, with the job's team read from its record) and the
// completion names the stored object instead. A job that does not exist
// is left to the writer to refuse.
func (c *core) storeInline(ctx context.Context, e RendererEngine, req *engine.CompleteRequest) error {
	p := req.Preview
	if c.previews.Store == nil || p == nil || len(p.Content) <= c.previews.StoreAbove {
		return nil
	}
	team, ok, err := teamOf(e, req.Job)
	if !ok {
		return err
	}
	seen, err := c.putObject(ctx, e, artifacts.Key{Team: team, Digest: p.Digest}, p.Content)
	if err != nil {
		return err
	}
	req.Stored, req.Digest, req.Size, req.ContentType, req.Seen = true, p.Digest, int64(len(p.Content)), p.ContentType, seen
	req.Preview = nil
	return nil
}

// teamOf reads, off the writer, the team whose objects a completion of
// job names. ok is false, with a nil error, for a job that does not
// exist: the writer refuses its completion.
func teamOf(e RendererEngine, job uint64) (team string, ok bool, err error) {
	j, err := e.Record(job)
	if errors.Is(err, jobs.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return j.Team, true, nil
}

// putObject puts content in the store under k, off the writer, and
// returns the object clock's reading from before the put, for the writer
// to judge whether the sweep deleted the object since.
func (c *core) putObject(ctx context.Context, e RendererEngine, k artifacts.Key, content []byte) (uint64, error) {
	seen, err := e.ObjectClock()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.previews.Timeout)
	defer cancel()
	if err := c.previews.observe(c.previews.Store.Put(ctx, k, content)); err != nil {
		return 0, storeErr(err)
	}
	return seen, nil
}

// checkStored checks, off the writer, that the object a completion names
// (a presigned upload: digest and size_bytes) is in the store with that
// size and, where the store keeps one, that checksum. A missing or
// different object is the writer's to refuse, after the fencing check, as
// ARTIFACT_NOT_FOUND; a store that does not answer refuses the completion
// here, UNAVAILABLE, and nothing changes.
func (c *core) checkStored(ctx context.Context, e RendererEngine, req *engine.CompleteRequest) error {
	if !req.Stored {
		return nil
	}
	team, ok, err := teamOf(e, req.Job)
	if !ok {
		return err
	}
	seen, err := e.ObjectClock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.previews.Timeout)
	defer cancel()
	info, err := c.previews.Store.Stat(ctx, artifacts.Key{Team: team, Digest: req.Digest})
	switch {
	case errors.Is(c.previews.observe(err), artifacts.ErrNotFound):
		req.ArtifactMissing = true
	case err != nil:
		return storeErr(err)
	case info.Size != req.Size || (info.SHA256 != "" && info.SHA256 != req.Digest):
		req.ArtifactMissing = true
	}
	req.Seen = seen
	return nil
}

// needsStore reports whether one of reqs has a part for the store to do:
// a stored object to check, or an inline preview above the threshold to
// put.
func (c *core) needsStore(reqs []engine.CompleteRequest) bool {
	return c.previews.Store != nil && slices.ContainsFunc(reqs, c.storeWork)
}

// storeWork reports whether the store has a part in r.
func (c *core) storeWork(r engine.CompleteRequest) bool {
	return r.Stored || (r.Preview != nil && len(r.Preview.Content) > c.previews.StoreAbove)
}

// refuseStoreWork returns err for each of reqs the store has a part in,
// as resolve would for a store that did not answer.
func (c *core) refuseStoreWork(reqs []engine.CompleteRequest, err error) []error {
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		if c.storeWork(r) {
			errs[i] = err
		}
	}
	return errs
}

// resolve does the store's part of each completion, concurrently: errs[i]
// refuses completion i (the store did not answer), nil lets it go to the
// writer.
func (c *core) resolve(ctx context.Context, e RendererEngine, reqs []engine.CompleteRequest) []error {
	if c.previews.Store == nil {
		return nil
	}
	var errs []error
	var wg sync.WaitGroup
	for i := range reqs {
		r := &reqs[i]
		if !c.storeWork(*r) {
			continue
		}
		if errs == nil {
			errs = make([]error, len(reqs))
		}
		wg.Go(func() {
			if err := c.storeInline(ctx, e, r); err != nil {
				errs[i] = err
				return
			}
			errs[i] = c.checkStored(ctx, e, r)
		})
	}
	wg.Wait()
	return errs
}

// sniffable is a preview's media type as checked: stored previews name
// theirs, since the coordinator never sees their bytes.
func storedContentType(ct string) (string, error) {
	if ct == "" {
		return "", invalidArg("success.content_type", reasonInvalidContentType, "a preview stored with PrepareUpload names its content_type")
	}
	return checkContentType("success.content_type", ct)
}

// headerMap copies presigned headers for the wire.
func headerMap(h map[string]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[http.CanonicalHeaderKey(k)] = v
	}
	return out
}
