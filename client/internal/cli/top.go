package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// topOpts are the options of "leasehold top".
type topOpts struct {
	args      []string
	Team      string
	Interval  time.Duration
	Count     int
	Renderers bool
}

func (o *topOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.Team, "team", "", "only `TEAM`")
	fs.DurationVar(&o.Interval, "interval", 2*time.Second, "refresh at least every `DURATION` (1s to 1m); changes show sooner")
	fs.IntVar(&o.Count, "count", 0, "stop after `N` refreshes (0: until interrupted)")
	fs.BoolVar(&o.Renderers, "renderers", true, "show the renderers too")
}

func (o *topOpts) setArgs(args []string) { o.args = args }

// Validate checks the options.
func (o *topOpts) Validate() error {
	switch {
	case len(o.args) > 0:
		return usagef("top takes no arguments, got %q", o.args[0])
	case o.Interval < time.Second || o.Interval > time.Minute:
		return usagef("--interval must be 1s to 1m")
	case o.Count < 0:
		return usagef("--count must not be negative")
	}
	return nil
}

// Terminal control sequences of the live view: home the cursor and clear
// the screen before each redraw.
const clearScreen = "\x1b[H\x1b[2J"

func (o *topOpts) run(ctx context.Context, a *app) error {
	live := !a.jsonOutput() && a.env.IsTerminal != nil && a.env.IsTerminal(a.out)
	req := &leaseholdv1.WatchOverviewRequest{Team: o.Team, Interval: durationpb.New(o.Interval), IncludeRenderers: o.Renderers}
	n := 0
	cl := clusterView{ask: !a.jsonOutput()}
	for msg, err := range a.c.WatchOverview(ctx, req) {
		if err != nil {
			return err
		}
		if a.jsonOutput() {
			if err := a.printJSON(msg); err != nil {
				return err
			}
		} else {
			var buf bytes.Buffer
			if live {
				buf.WriteString(clearScreen)
			} else if n > 0 {
				buf.WriteString("\n")
			}
			writeTop(&buf, msg, o.Renderers, cl.get(ctx, a))
			if _, err := a.out.Write(buf.Bytes()); err != nil {
				return err
			}
		}
		n++
		if o.Count > 0 && n >= o.Count {
			return nil
		}
	}
	return nil
}

// clusterView asks for the cluster with each refresh, for the callers
// allowed to see it (operators whose scope is every team): after one
// refusal, or from a coordinator without ClusterService, it stops asking.
type clusterView struct{ ask bool }

// get returns the cluster, or nil when it is not to be shown: a single
// node, a caller who may not see it, a call that failed.
func (v *clusterView) get(ctx context.Context, a *app) *leaseholdv1.GetClusterResponse {
	if !v.ask {
		return nil
	}
	resp, err := a.c.GetCluster(ctx)
	switch {
	case errors.Is(err, client.ErrPermissionDenied), status.Code(err) == codes.Unimplemented:
		v.ask = false
		return nil
	case err != nil || !resp.GetReplicated():
		return nil
	}
	return resp
}

// writeTop writes one overview as tables: a header line, the teams, the
// cluster when there is one to show, and the renderers.
func writeTop(buf *bytes.Buffer, msg *leaseholdv1.WatchOverviewResponse, renderers bool, cluster *leaseholdv1.GetClusterResponse) {
	o := msg.GetOverview()
	dispatch := "running"
	if o.GetDispatchPaused() {
		dispatch = "PAUSED since " + formatTime(o.GetPausedSince())
	}
	fmt.Fprintf(buf, "leasehold top  %s  dispatch %s  live capacity %d\n\n", formatTime(o.GetAsOf()), dispatch, o.GetLiveCapacity())
	t := newTable(buf)
	fmt.Fprintln(t, "TEAM\tQUEUED\tLEASED\tRETRY\tSUCCEEDED\tFAILED\tCANCELLED\tOLDEST QUEUED\tPER MIN (5m)\tFAILED (5m)")
	for _, tm := range o.GetTeams() {
		c := map[leaseholdv1.Phase]uint32{}
		for _, pc := range tm.GetCounts() {
			c[pc.GetPhase()] = pc.GetCount()
		}
		oldest := "-"
		if age := tm.GetOldestQueuedAge(); age != nil {
			oldest = age.AsDuration().Round(100 * time.Millisecond).String()
		}
		perMin, failed := "-", "-"
		for _, tp := range tm.GetThroughput() {
			if tp.GetWindow().AsDuration() == 5*time.Minute {
				perMin, failed = fmt.Sprintf("%.1f", tp.GetPerMinute()), fmt.Sprintf("%.0f%%", tp.GetFailureRate()*100)
			}
		}
		fmt.Fprintf(t, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", tm.GetTeam(), tm.GetQueueDepth(), tm.GetLeasesInFlight(),
			c[leaseholdv1.Phase_PHASE_RETRY_WAIT], c[leaseholdv1.Phase_PHASE_SUCCEEDED], c[leaseholdv1.Phase_PHASE_FAILED],
			c[leaseholdv1.Phase_PHASE_CANCELLED], oldest, perMin, failed)
	}
	t.Flush()
	writeTopCluster(buf, cluster)
	if !renderers {
		return
	}
	buf.WriteString("\n")
	t = newTable(buf)
	fmt.Fprintln(t, "RENDERER\tSTATE\tCAPACITY\tLEASES\tLAST SEEN")
	for _, r := range msg.GetRenderers() {
		fmt.Fprintf(t, "%s\t%s\t%d\t%d\t%s\n", r.GetRendererId(), rendererState(r.GetConnected(), r.GetDraining()),
			r.GetCapacity(), len(r.GetLeases()), formatTime(r.GetLastSeenAt()))
	}
	t.Flush()
}

// writeTopCluster writes the cluster's members, the leader and each
// member's lag as the answering node knows it (the leader knows every
// member's; a follower none).
func writeTopCluster(buf *bytes.Buffer, cl *leaseholdv1.GetClusterResponse) {
	if cl == nil {
		return
	}
	leader := cl.GetLeaderId()
	if leader == "" {
		leader = "NONE"
	}
	fmt.Fprintf(buf, "\ncluster  leader %s  term %d  commit %d\n", leader, cl.GetTerm(), cl.GetCommitIndex())
	t := newTable(buf)
	fmt.Fprintln(t, "NODE\tROLE\tRAFT ADDRESS\tMATCH\tLAG\tLAST CONTACT")
	for _, m := range cl.GetMembers() {
		role := "follower"
		if m.GetLeader() {
			role = "leader"
		}
		match, lag, contact := "-", "-", "-"
		if p := m.GetProgress(); p != nil {
			match, lag = fmt.Sprint(p.GetMatchIndex()), fmt.Sprint(p.GetLagEntries())
			if lc := p.GetLastContact(); lc != nil {
				contact = lc.AsDuration().Round(time.Millisecond).String()
			}
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\n", m.GetId(), role, m.GetRaftAddress(), match, lag, contact)
	}
	t.Flush()
}
