package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
)

// deniedWindow is how long the refused cancels of one operator on one team
// are gathered into one audit record after the first, which is recorded
// at once.
const deniedWindow = time.Minute

// deniedAudits records the DENIED audit records of operators' cancels
// refused out of scope, without letting a caller who repeats them make
// the writer store one record per attempt: the first refusal of an
// operator on a team is recorded at once, the ones that follow within
// deniedWindow are counted, and when the window ends one record says how
// many there were and names the last. It is safe for concurrent use.
type deniedAudits struct {
	record func(context.Context, jobs.AuditRecord) error
	log    *slog.Logger
	window time.Duration

	mu   sync.Mutex
	open map[deniedKey]*deniedSince
}

// deniedKey is whose refusals on which team a window gathers.
type deniedKey struct{ principal, team string }

// deniedSince is one window: the refusals after its first, and the last.
type deniedSince struct {
	start time.Time
	more  int
	last  jobs.AuditRecord
	timer *time.Timer
}

func newDeniedAudits(record func(context.Context, jobs.AuditRecord) error, log *slog.Logger) *deniedAudits {
	return &deniedAudits{record: record, log: log, window: deniedWindow, open: make(map[deniedKey]*deniedSince)}
}

// deny records rec, the refusal of one cancel, or counts it in the window
// its operator's refusals on its team already opened.
func (d *deniedAudits) deny(ctx context.Context, rec jobs.AuditRecord) {
	key := deniedKey{rec.Principal, rec.Teams[0]}
	d.mu.Lock()
	if w := d.open[key]; w != nil {
		w.more++
		w.last = rec
		d.mu.Unlock()
		return
	}
	d.open[key] = &deniedSince{start: time.Now(), timer: time.AfterFunc(d.window, func() { d.flush(key) })}
	d.mu.Unlock()
	d.write(ctx, rec)
}

// flush ends key's window, recording the refusals it counted, if any.
func (d *deniedAudits) flush(key deniedKey) {
	d.mu.Lock()
	w := d.open[key]
	delete(d.open, key)
	d.mu.Unlock()
	if w == nil || w.more == 0 {
		return
	}
	rec := w.last
	rec.Reason = fmt.Sprintf("%d more cancels out of scope refused within %v; the last: %s", w.more, time.Since(w.start).Round(time.Second), rec.Reason)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.write(ctx, rec)
}

// flushAll ends every window now (at shutdown, while the writer runs).
func (d *deniedAudits) flushAll() {
	d.mu.Lock()
	keys := make([]deniedKey, 0, len(d.open))
	for k, w := range d.open {
		w.timer.Stop()
		keys = append(keys, k)
	}
	d.mu.Unlock()
	for _, k := range keys {
		d.flush(k)
	}
}

// write records rec; the refusal stands even if it cannot be written.
func (d *deniedAudits) write(ctx context.Context, rec jobs.AuditRecord) {
	if err := d.record(ctx, rec); err != nil {
		d.log.Warn("recording a denied cancel", "principal", rec.Principal, "err", err)
	}
}
