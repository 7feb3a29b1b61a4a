package server

import (
	"context"
	"slices"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/overview"
	"github.com/leasehold/leasehold/coordinator/internal/reads"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// OverviewServer implements leasehold.v1.OverviewService: the same views
// for operators and submitters, each restricted to the teams the caller
// sees. Every answer is built from the overview the writer publishes and
// from per-batch counts; none scans the store.
type OverviewServer struct {
	leaseholdv1.UnimplementedOverviewServiceServer
	*core
	e OverviewEngine
}

var _ leaseholdv1.OverviewServiceServer = (*OverviewServer)(nil)

// OverviewServiceName is the health service's name of OverviewService.
const OverviewServiceName = "leasehold.v1.OverviewService"

// Bounds of WatchOverview.
const (
	// DefaultOverviewInterval is the longest gap between two messages when
	// the request names none.
	DefaultOverviewInterval = 2 * time.Second
	// MinOverviewInterval and MaxOverviewInterval bound the interval a
	// watcher may ask for.
	MinOverviewInterval = time.Second
	MaxOverviewInterval = time.Minute
	// OverviewMinSpacing is the shortest gap between two messages: changes
	// that come faster are sent together.
	OverviewMinSpacing = 250 * time.Millisecond
)

// throughputWindows are the windows of TeamOverview.throughput, in minutes.
var throughputWindows = []int{1, 5, 15, 60}

// teamScope is which teams an answer covers: the one team asked for, or
// every team the caller may read.
type teamScope struct {
	// teams lists them; nil means every team.
	teams []string
}

// covers reports whether the scope includes team.
func (s teamScope) covers(team string) bool { return s.teams == nil || slices.Contains(s.teams, team) }

// coversAll reports whether the scope includes every one of teams.
func (s teamScope) coversAll(teams []string) bool {
	for _, t := range teams {
		if !s.covers(t) {
			return false
		}
	}
	return true
}

// scopeOf returns the teams p's answer covers: team alone when it is named
// (PERMISSION_DENIED when p may not see it, as ListJobs answers), otherwise
// every team p reads (readTeams, which refuses a caller with neither
// role).
func scopeOf(p auth.Principal, team string) (teamScope, error) {
	if team != "" {
		if _, ok := access(p, team); !ok {
			return teamScope{}, denied("%s may not read team %q", p.Name, team)
		}
		return teamScope{teams: []string{team}}, nil
	}
	teams, err := readTeams(p)
	return teamScope{teams: teams}, err
}

// GetOverview implements OverviewService.GetOverview.
func (s *OverviewServer) GetOverview(ctx context.Context, req *leaseholdv1.GetOverviewRequest) (*leaseholdv1.GetOverviewResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	sc, err := scopeOf(p, req.GetTeam())
	if err != nil {
		return nil, s.status(err)
	}
	o, _, err := s.e.Overview()
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.GetOverviewResponse{Overview: overviewToProto(o, sc)}, nil
}

// ListRenderers implements OverviewService.ListRenderers.
func (s *OverviewServer) ListRenderers(ctx context.Context, _ *leaseholdv1.ListRenderersRequest) (*leaseholdv1.ListRenderersResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	sc, err := scopeOf(p, "")
	if err != nil {
		return nil, s.status(err)
	}
	o, _, err := s.e.Overview()
	if err != nil {
		return nil, s.status(err)
	}
	return &leaseholdv1.ListRenderersResponse{Renderers: renderersToProto(o, sc)}, nil
}

// ListBatches implements OverviewService.ListBatches.
func (s *OverviewServer) ListBatches(ctx context.Context, req *leaseholdv1.ListBatchesRequest) (*leaseholdv1.ListBatchesResponse, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, s.status(err)
	}
	f := reads.BatchFilter{CreatedAfter: fromTS(req.GetCreatedAfter()), CreatedBefore: fromTS(req.GetCreatedBefore())}
	switch req.GetState() {
	case leaseholdv1.BatchState_BATCH_STATE_UNSPECIFIED:
	case leaseholdv1.BatchState_BATCH_STATE_RUNNING:
		f.State = reads.BatchRunning
	case leaseholdv1.BatchState_BATCH_STATE_DONE:
		f.State = reads.BatchDone
	default:
		return nil, s.status(invalidArg("state", reasonInvalidBatchState, "unknown batch state %d", req.GetState()))
	}
	if f.Limit, err = pageSize(req.GetPageSize()); err != nil {
		return nil, s.status(err)
	}
	if f.Before, err = decodePageToken(req.GetPageToken()); err != nil {
		return nil, s.status(err)
	}
	sc, err := scopeOf(p, req.GetTeam())
	if err != nil {
		return nil, s.status(err)
	}
	f.Teams = sc.teams
	page, err := s.e.ListBatches(f)
	if err != nil {
		return nil, s.status(err)
	}
	resp := &leaseholdv1.ListBatchesResponse{}
	if page.Next != 0 {
		resp.NextPageToken = encodePageToken(page.Next)
	}
	for _, bv := range page.Batches {
		// The engine filtered by team; never show what slipped through.
		if _, ok := access(p, bv.Batch.Team); ok && sc.covers(bv.Batch.Team) {
			resp.Batches = append(resp.Batches, batchToProto(bv, false))
		}
	}
	return resp, nil
}

// WatchOverview implements OverviewService.WatchOverview: it sends the
// overview at once, then whenever the writer publishes a new one (at most
// one message per OverviewMinSpacing), and at least once per interval. It
// is the only goroutine that sends.
func (s *OverviewServer) WatchOverview(req *leaseholdv1.WatchOverviewRequest, stream leaseholdv1.OverviewService_WatchOverviewServer) error {
	ctx := stream.Context()
	p, err := principal(ctx)
	if err != nil {
		return s.status(err)
	}
	interval := DefaultOverviewInterval
	if d := req.GetInterval().AsDuration(); d != 0 {
		interval = d
		if interval < MinOverviewInterval || interval > MaxOverviewInterval {
			return s.status(invalidArg("interval", reasonInvalidInterval, "interval must be %v to %v (unset for %v)",
				MinOverviewInterval, MaxOverviewInterval, DefaultOverviewInterval))
		}
	}
	sc, err := scopeOf(p, req.GetTeam())
	if err != nil {
		return s.status(err)
	}
	s.holdScope(ctx, req.GetTeam(), sc)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		o, changed, err := s.e.Overview()
		if err != nil {
			return s.status(err)
		}
		msg := &leaseholdv1.WatchOverviewResponse{Overview: overviewToProto(o, sc)}
		if req.GetIncludeRenderers() {
			msg.Renderers = renderersToProto(o, sc)
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		timer.Reset(interval)
		select {
		case <-ctx.Done():
			return s.streamEnd(ctx.Err())
		case <-s.closing:
			return s.status(errShuttingDown)
		case <-timer.C:
			continue
		case <-changed:
		}
		// A change: send it, but not sooner than OverviewMinSpacing after
		// the last message.
		spacing := time.NewTimer(OverviewMinSpacing)
		select {
		case <-ctx.Done():
			spacing.Stop()
			return s.streamEnd(ctx.Err())
		case <-s.closing:
			spacing.Stop()
			return s.status(errShuttingDown)
		case <-spacing.C:
		}
	}
}

// overviewToProto converts the teams of o that sc covers.
func overviewToProto(o overview.Overview, sc teamScope) *leaseholdv1.Overview {
	po := &leaseholdv1.Overview{
		PublishedAt:    ts(o.At),
		AsOf:           ts(o.ReadAt),
		DispatchPaused: o.Dispatch.Paused,
		LiveCapacity:   uint32(o.LiveCapacity),
	}
	if o.Dispatch.Paused {
		po.PausedSince = ts(o.Dispatch.Since)
	}
	for _, t := range o.Teams {
		if sc.covers(t.Team) {
			po.Teams = append(po.Teams, teamToProto(t, o.ReadAt))
		}
	}
	return po
}

// teamToProto converts one team's figures, with ages and windows measured
// to now.
func teamToProto(t overview.TeamStats, now time.Time) *leaseholdv1.TeamOverview {
	pt := &leaseholdv1.TeamOverview{
		Team:           t.Team,
		Counts:         countsToProto(t.Counts),
		QueueDepth:     uint32(t.Depth),
		LeasesInFlight: uint32(t.InFlight),
	}
	if !t.OldestQueuedAt.IsZero() {
		pt.OldestQueuedAt = ts(t.OldestQueuedAt)
		pt.OldestQueuedAge = durationpb.New(max(now.Sub(t.OldestQueuedAt), 0))
	}
	for _, m := range t.Minutes {
		pt.Minutes = append(pt.Minutes, &leaseholdv1.MinuteStats{Start: ts(m.Start), Succeeded: uint32(m.Succeeded),
			Failed: uint32(m.Failed), Cancelled: uint32(m.Cancelled), QueueDepth: uint32(m.Depth)})
	}
	for _, w := range throughputWindows {
		tp := &leaseholdv1.Throughput{Window: durationpb.New(time.Duration(w) * time.Minute)}
		for _, m := range t.Minutes[max(len(t.Minutes)-w, 0):] {
			tp.Succeeded += uint32(m.Succeeded)
			tp.Failed += uint32(m.Failed)
			tp.Cancelled += uint32(m.Cancelled)
		}
		if ended := tp.Succeeded + tp.Failed; ended > 0 {
			tp.PerMinute = float64(ended) / float64(w)
			tp.FailureRate = float64(tp.Failed) / float64(ended)
		}
		pt.Throughput = append(pt.Throughput, tp)
	}
	return pt
}

// renderersToProto converts the renderers of o with the leases of the
// teams sc covers.
func renderersToProto(o overview.Overview, sc teamScope) []*leaseholdv1.Renderer {
	out := make([]*leaseholdv1.Renderer, 0, len(o.Renderers))
	for _, r := range o.Renderers {
		pr := &leaseholdv1.Renderer{
			RendererId: r.ID,
			Capacity:   uint32(r.Capacity),
			Connected:  r.Connected,
			Draining:   r.Draining,
			LastSeenAt: ts(r.LastSeen),
		}
		for _, l := range r.Leases {
			if sc.covers(l.Team) {
				pr.Leases = append(pr.Leases, &leaseholdv1.RendererLease{JobId: JobID(l.Job), Team: l.Team, Token: l.Token, Deadline: ts(l.Deadline)})
			}
		}
		out = append(out, pr)
	}
	return out
}
