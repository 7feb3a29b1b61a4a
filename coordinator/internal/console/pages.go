package console

import (
	"context"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// overviewView is the overview page.
type overviewView struct {
	O       *leaseholdv1.Overview
	Teams   []teamView
	Batches []*leaseholdv1.Batch
	Queued  uint32
	Leased  uint32
	// Cluster is the cluster panel (cluster.go), nil when there is none.
	Cluster *clusterView
}

// teamView is one team's row and charts.
type teamView struct {
	T          *leaseholdv1.TeamOverview
	Last5      *leaseholdv1.Throughput
	Depth      chart
	Throughput chart
}

func (c *Console) overview(w http.ResponseWriter, r *request) error {
	resp, err := c.svc.Overview.GetOverview(r.ctx, &leaseholdv1.GetOverviewRequest{})
	if err != nil {
		return err
	}
	batches, err := c.svc.Overview.ListBatches(r.ctx, &leaseholdv1.ListBatchesRequest{PageSize: 10})
	if err != nil {
		return err
	}
	v := overviewView{O: resp.GetOverview(), Batches: batches.GetBatches()}
	if v.Cluster, err = c.cluster(r); err != nil {
		return err
	}
	for _, t := range v.O.GetTeams() {
		tv := teamView{T: t, Depth: depthChart(t), Throughput: throughputChart(t)}
		for _, tp := range t.GetThroughput() {
			if tp.GetWindow().AsDuration() == 5*time.Minute {
				tv.Last5 = tp
			}
		}
		v.Queued += t.GetQueueDepth()
		v.Leased += t.GetLeasesInFlight()
		v.Teams = append(v.Teams, tv)
	}
	c.render(w, r.Request, http.StatusOK, "overview", r.sess, v)
	return nil
}

// batchesView is the batch list.
type batchesView struct {
	Team, State, Created string
	Batches              []*leaseholdv1.Batch
	Next                 string
}

// createdWindows are the creation filters the batch list offers.
var createdWindows = map[string]time.Duration{"hour": time.Hour, "day": 24 * time.Hour, "week": 7 * 24 * time.Hour}

func (c *Console) batches(w http.ResponseWriter, r *request) error {
	q := r.URL.Query()
	v := batchesView{Team: q.Get("team"), State: q.Get("state"), Created: q.Get("created")}
	req := &leaseholdv1.ListBatchesRequest{Team: v.Team, PageToken: q.Get("page"), PageSize: 50}
	switch v.State {
	case "running":
		req.State = leaseholdv1.BatchState_BATCH_STATE_RUNNING
	case "done":
		req.State = leaseholdv1.BatchState_BATCH_STATE_DONE
	}
	if d, ok := createdWindows[v.Created]; ok {
		req.CreatedAfter = timestamppb.New(time.Now().Add(-d))
	}
	resp, err := c.svc.Overview.ListBatches(r.ctx, req)
	if err != nil {
		return err
	}
	v.Batches, v.Next = resp.GetBatches(), resp.GetNextPageToken()
	c.render(w, r.Request, http.StatusOK, "batches", r.sess, v)
	return nil
}

// batchView is one batch with a page of its jobs.
type batchView struct {
	B    *leaseholdv1.Batch
	Jobs []*leaseholdv1.Job
	Next string
	Page string
	// Progress is the share of jobs in a terminal phase, 0 to 100.
	Progress int
}

func (c *Console) batch(w http.ResponseWriter, r *request) error {
	id := r.PathValue("id")
	resp, err := c.svc.Jobs.GetBatch(r.ctx, &leaseholdv1.GetBatchRequest{BatchId: id})
	if err != nil {
		return err
	}
	page := r.URL.Query().Get("page")
	jobs, err := c.svc.Jobs.ListJobs(r.ctx, &leaseholdv1.ListJobsRequest{BatchId: id, OmitEvents: true, PageSize: 100, PageToken: page})
	if err != nil {
		return err
	}
	b := resp.GetBatch()
	v := batchView{B: b, Jobs: jobs.GetJobs(), Next: jobs.GetNextPageToken(), Page: page}
	if b.GetJobCount() > 0 {
		done := countOf(b.GetCounts(), "SUCCEEDED") + countOf(b.GetCounts(), "FAILED") + countOf(b.GetCounts(), "CANCELLED")
		v.Progress = int(done * 100 / b.GetJobCount())
	}
	c.render(w, r.Request, http.StatusOK, "batch", r.sess, v)
	return nil
}

// jobView is one job with its history, lease, rejections and preview.
type jobView struct {
	J *leaseholdv1.Job
	// Rejections are the job's refused completions, when the caller may
	// list them (operators); nil otherwise.
	Rejections []*leaseholdv1.RejectedCompletion
	// Preview says the caller may read the preview (GetArtifact's rule).
	Preview bool
}

func (c *Console) job(w http.ResponseWriter, r *request) error {
	resp, err := c.svc.Jobs.GetJob(r.ctx, &leaseholdv1.GetJobRequest{JobId: r.PathValue("id")})
	if err != nil {
		return err
	}
	j := resp.GetJob()
	v := jobView{J: j, Preview: j.GetPhase() == leaseholdv1.Phase_PHASE_SUCCEEDED && r.sess.principal.CanReadArtifact(j.GetTeam())}
	if r.sess.principal.CanOperate() {
		rej, err := c.svc.Operators.ListRejectedCompletions(r.ctx, &leaseholdv1.ListRejectedCompletionsRequest{JobId: j.GetId(), PageSize: 100})
		if err != nil {
			return err
		}
		v.Rejections = rej.GetRejections()
	}
	c.render(w, r.Request, http.StatusOK, "job", r.sess, v)
	return nil
}

// preview streams a job's preview image through GetArtifact, whose rule
// (only submitters of the job's team) decides.
func (c *Console) preview(w http.ResponseWriter, r *request) error {
	sink := &artifactSink{ctx: r.ctx}
	if err := c.svc.Jobs.GetArtifact(&leaseholdv1.GetArtifactRequest{JobId: r.PathValue("id")}, sink); err != nil {
		return err
	}
	previewHeaders(w.Header(), sink.meta.GetContentType(), r.PathValue("id"))
	_, _ = w.Write(sink.data)
	return nil
}

// previewHeaders sets the headers a preview is served with. A media type
// that jobs.PreviewMediaType accepts (a raster image) is served inline
// under exactly its normalised form; anything else, such as a type stored
// by an earlier release, is a download of opaque bytes. Either way the
// browser may not sniff another type, and the response is a sandbox: were
// a browser to render it as a document after all, it would run on no
// origin, without script, forms or navigation of the console.
func previewHeaders(h http.Header, contentType, jobID string) {
	ct, err := jobs.PreviewMediaType(contentType)
	if err != nil {
		ct = jobs.OpaquePreviewType
		disp := mime.FormatMediaType("attachment", map[string]string{"filename": jobID + ".bin"})
		if disp == "" {
			disp = "attachment"
		}
		h.Set("Content-Disposition", disp)
	}
	h.Set("Content-Type", ct)
	h.Set("Content-Security-Policy", "sandbox")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "private, no-store")
}

// artifactSink is GetArtifact's server stream, in process: it collects
// what the console's client receives (see jobsClient.GetArtifact).
type artifactSink struct {
	ctx  context.Context
	meta *leaseholdv1.Artifact
	data []byte
}

// renderersView is the renderer list.
type renderersView struct {
	Renderers []*leaseholdv1.Renderer
	AsOf      *timestamppb.Timestamp
	Capacity  uint32
}

func (c *Console) renderers(w http.ResponseWriter, r *request) error {
	resp, err := c.svc.Overview.ListRenderers(r.ctx, &leaseholdv1.ListRenderersRequest{})
	if err != nil {
		return err
	}
	ov, err := c.svc.Overview.GetOverview(r.ctx, &leaseholdv1.GetOverviewRequest{})
	if err != nil {
		return err
	}
	c.render(w, r.Request, http.StatusOK, "renderers", r.sess, renderersView{Renderers: resp.GetRenderers(),
		AsOf: ov.GetOverview().GetAsOf(), Capacity: ov.GetOverview().GetLiveCapacity()})
	return nil
}

// listView is a page of rejections or audit records.
type listView[T any] struct {
	Items []T
	Next  string
}

func (c *Console) rejections(w http.ResponseWriter, r *request) error {
	resp, err := c.svc.Operators.ListRejectedCompletions(r.ctx, &leaseholdv1.ListRejectedCompletionsRequest{PageSize: 100, PageToken: r.URL.Query().Get("page")})
	if err != nil {
		return err
	}
	c.render(w, r.Request, http.StatusOK, "rejections", r.sess, listView[*leaseholdv1.RejectedCompletion]{Items: resp.GetRejections(), Next: resp.GetNextPageToken()})
	return nil
}

func (c *Console) audit(w http.ResponseWriter, r *request) error {
	resp, err := c.svc.Operators.GetAudit(r.ctx, &leaseholdv1.GetAuditRequest{PageSize: 100, PageToken: r.URL.Query().Get("page")})
	if err != nil {
		return err
	}
	c.render(w, r.Request, http.StatusOK, "audit", r.sess, listView[*leaseholdv1.AuditRecord]{Items: resp.GetRecords(), Next: resp.GetNextPageToken()})
	return nil
}

// replayView is the replay form, its dry-run plan, or the result.
type replayView struct {
	Batch, Jobs, TerminalReason, Reason string
	IncludePermanent                    bool
	// RequestID is fixed when the plan is shown, so that confirming twice
	// replays once.
	RequestID string
	Plan      *leaseholdv1.ReplayJobsResponse
	Result    *leaseholdv1.ReplayJobsResponse
	Reasons   []string
}

// replayReasons are the terminal reasons a replay may be narrowed to.
var replayReasons = []string{"ATTEMPTS_EXHAUSTED", "INVALID_DOCUMENT", "UNSUPPORTED_FORMAT"}

func (c *Console) replayForm(w http.ResponseWriter, r *request) error {
	q := r.URL.Query()
	c.render(w, r.Request, http.StatusOK, "replay", r.sess, replayView{Batch: q.Get("batch"), Jobs: q.Get("job"), Reasons: replayReasons})
	return nil
}

// replay shows the dry-run plan (action "plan") or performs the replay the
// plan showed (action "run"), with the request id fixed at the plan.
func (c *Console) replay(w http.ResponseWriter, r *request) error {
	v := replayView{
		Batch: strings.TrimSpace(r.PostFormValue("batch")), Jobs: strings.TrimSpace(r.PostFormValue("jobs")),
		TerminalReason: r.PostFormValue("terminal_reason"), Reason: r.PostFormValue("reason"),
		IncludePermanent: r.PostFormValue("include_permanent") != "", RequestID: r.PostFormValue("request_id"), Reasons: replayReasons,
	}
	req := &leaseholdv1.ReplayJobsRequest{BatchId: v.Batch, JobIds: strings.FieldsFunc(v.Jobs, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' }),
		Reason: v.Reason, IncludePermanent: v.IncludePermanent}
	if v.TerminalReason != "" {
		n, ok := leaseholdv1.TerminalReason_value["TERMINAL_REASON_"+v.TerminalReason]
		if !ok {
			// An unknown name must not become "any reason": it goes to
			// ReplayJobs as a number no reason has, which it refuses.
			n = -1
		}
		req.TerminalReason = leaseholdv1.TerminalReason(n)
	}
	switch r.PostFormValue("action") {
	case "run":
		req.RequestId = v.RequestID
		resp, err := c.svc.Operators.ReplayJobs(r.ctx, req)
		if err != nil {
			return err
		}
		v.Result = resp
	default:
		req.DryRun = true
		resp, err := c.svc.Operators.ReplayJobs(r.ctx, req)
		if err != nil {
			return err
		}
		v.Plan, v.RequestID = resp, "console-"+randomToken()[:24]
	}
	c.render(w, r.Request, http.StatusOK, "replay", r.sess, v)
	return nil
}

func (c *Console) cancelJob(w http.ResponseWriter, r *request) error {
	id := r.PathValue("id")
	if _, err := c.svc.Jobs.CancelJob(r.ctx, &leaseholdv1.CancelJobRequest{JobId: id, Reason: r.PostFormValue("reason")}); err != nil {
		return err
	}
	http.Redirect(w, r.Request, "/console/jobs/"+id, http.StatusSeeOther)
	return nil
}

func (c *Console) cancelBatch(w http.ResponseWriter, r *request) error {
	id := r.PathValue("id")
	if _, err := c.svc.Jobs.CancelBatch(r.ctx, &leaseholdv1.CancelBatchRequest{BatchId: id, Reason: r.PostFormValue("reason")}); err != nil {
		return err
	}
	http.Redirect(w, r.Request, "/console/batches/"+id, http.StatusSeeOther)
	return nil
}

func (c *Console) pause(w http.ResponseWriter, r *request) error {
	if _, err := c.svc.Operators.PauseDispatch(r.ctx, &leaseholdv1.PauseDispatchRequest{Reason: r.PostFormValue("reason")}); err != nil {
		return err
	}
	http.Redirect(w, r.Request, Prefix, http.StatusSeeOther)
	return nil
}

func (c *Console) resume(w http.ResponseWriter, r *request) error {
	if _, err := c.svc.Operators.ResumeDispatch(r.ctx, &leaseholdv1.ResumeDispatchRequest{Reason: r.PostFormValue("reason")}); err != nil {
		return err
	}
	http.Redirect(w, r.Request, Prefix, http.StatusSeeOther)
	return nil
}
