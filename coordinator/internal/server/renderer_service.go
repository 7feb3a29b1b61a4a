package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/leasehold/leasehold/client/limits"
	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/engine"
	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RendererServer implements leasehold.v1.RendererService.
type RendererServer struct {
	leaseholdv1.UnimplementedRendererServiceServer
	*core
	e RendererEngine
	// keepalives is Config.SessionKeepalives.
	keepalives bool
}

var _ leaseholdv1.RendererServiceServer = (*RendererServer)(nil)

// Renderer request bounds.
const (
	maxRendererIDBytes = limits.MaxRendererIDBytes
	maxInstanceBytes   = limits.MaxInstanceIDBytes
	maxLeasesPerCall   = 64
	maxCapacity        = limits.MaxRendererCapacity
	maxMessageBytes    = 4096
	// replyOverheadBytes is what a reply costs besides its grants.
	replyOverheadBytes = 1 << 10
)

// validID reports whether id is 1 to n bytes of [A-Za-z0-9._-].
func validID(id string, n int) bool {
	if id == "" || len(id) > n {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func checkRendererID(id string) error {
	if !validID(id, maxRendererIDBytes) {
		return invalidArg("renderer_id", reasonInvalidRendererID, "renderer_id must be 1 to %d bytes of [A-Za-z0-9._-]", maxRendererIDBytes)
	}
	return nil
}

// checkContentType refuses a preview media type that jobs.PreviewMediaType
// refuses, and returns it normalised; an empty type is left for preview to
// sniff from the bytes. The type is stored in the job's record, shown with
// the job and served as the preview's Content-Type.
func checkContentType(field, ct string) (string, error) {
	if ct == "" {
		return "", nil
	}
	mt, err := jobs.PreviewMediaType(ct)
	if err != nil {
		return "", invalidArg(field, reasonInvalidContentType, "%s: %v", field, err)
	}
	return mt, nil
}

// checkDigest refuses a preview digest that is neither empty nor a SHA-256
// in lower-case hex, as the coordinator computes and stores them: a digest
// is recorded with a refused completion.
func checkDigest(field, d string) error {
	if d == "" {
		return nil
	}
	if len(d) != 2*sha256.Size || strings.ContainsFunc(d, func(r rune) bool { return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') }) {
		return invalidArg(field, reasonInvalidDigest, "%s must be a SHA-256 digest in lower-case hex (64 characters)", field)
	}
	return nil
}

// replyBudget returns what a reply of at most limit bytes (0: gRPC's
// default) may spend on grants, refusing a limit below one grant of the
// largest inline document.
func (s *RendererServer) replyBudget(limit uint32, field string) (int, error) {
	n := int(limit)
	if n == 0 {
		n = defaultClientMessageBytes
	}
	if need := s.e.MaxGrantBytes() + replyOverheadBytes; n < need {
		return 0, invalidArg(field, reasonMessageLimit, "%s is %d bytes; a grant of the largest inline document this coordinator accepts needs %d", field, n, need)
	}
	return n - replyOverheadBytes, nil
}

// Acquire implements RendererService.Acquire over a renderer session: it
// opens one with max_leases credit (granted at once, in the open's own
// group), waits for grants up to the wait when it got none, and closes it,
// answering with every grant the session took. A call that ends before it
// can answer hands its grants back uncounted.
func (s *RendererServer) Acquire(ctx context.Context, req *leaseholdv1.AcquireRequest) (*leaseholdv1.AcquireResponse, error) {
	p, err := require(ctx, auth.RoleRenderer)
	if err != nil {
		return nil, s.status(err)
	}
	r, err := rendererFor(p, req.GetRendererId())
	if err != nil {
		return nil, s.status(err)
	}
	// A reload of the principals file that revokes the credential or the
	// id ends the long poll, as it ends the renderer's streams.
	s.holdRenderer(ctx, r.ID)
	capacity := req.GetCapacity()
	if capacity == 0 {
		capacity = req.GetMaxLeases()
	}
	if req.GetMaxLeases() < 1 || req.GetMaxLeases() > maxLeasesPerCall {
		return nil, s.status(invalidArg("max_leases", reasonInvalidCapacity, "max_leases must be 1 to %d", maxLeasesPerCall))
	}
	if capacity < req.GetMaxLeases() || capacity > maxCapacity {
		return nil, s.status(invalidArg("capacity", reasonInvalidCapacity, "capacity must be at least max_leases and at most %d", maxCapacity))
	}
	budget, err := s.replyBudget(req.GetMaxResponseBytes(), "max_response_bytes")
	if err != nil {
		return nil, s.status(err)
	}
	// An unset wait is zero: no long poll.
	wait := min(max(req.GetWait().AsDuration(), 0), MaxAcquireWait)
	// The writer's answers are awaited even if the caller leaves, so that
	// grants made for it are handed back rather than left to expire.
	wctx := context.WithoutCancel(ctx)
	conn, _, err := s.e.Open(wctx, engine.SessionOpen{Renderer: r, Capacity: int(capacity), Credits: int(req.GetMaxLeases()), MaxBytes: budget})
	if err != nil {
		return nil, s.status(err)
	}
	grants, _, ended := conn.Outbox.Take()
	if len(grants) == 0 && ended == nil && wait > 0 {
		// Revocations of the renderer's leases reach this session too;
		// they are its heartbeat stream's to tell, so the poll waits on.
		t := time.NewTimer(wait)
	poll:
		for len(grants) == 0 && ended == nil {
			select {
			case <-conn.Outbox.Ready():
				grants, _, ended = conn.Outbox.Take()
			case <-t.C:
				break poll
			case <-s.closing:
				break poll
			case <-ctx.Done():
				break poll
			}
		}
		t.Stop()
	}
	left, err := s.e.Close(wctx, conn, nil)
	grants = append(grants, left...)
	if err != nil && (len(grants) == 0 || ctx.Err() != nil) {
		s.release(r, grants)
		return nil, s.status(err)
	}
	if err != nil {
		// The grants were committed and applied before they were
		// published: they are the renderer's leases, which the next
		// leader keeps, whatever became of this session. Refusing the
		// call (NOT_LEADER when the term ended meanwhile) would tell the
		// renderer that nothing was applied while its leases stand.
		s.log.Info("acquire: session close failed after its grants; delivering them", "leases", len(grants), "err", err)
	}
	if ctx.Err() != nil {
		s.release(r, grants)
		return nil, s.status(ctx.Err())
	}
	// A long poll that ended empty, the common answer of an idle
	// coordinator, needs no read transaction.
	if len(grants) > 0 {
		if err := s.e.ReadContent(grants); err != nil {
			s.release(r, grants)
			return nil, s.status(err)
		}
	}
	resp := &leaseholdv1.AcquireResponse{
		DispatchPaused:    s.e.DispatchState().Paused,
		HeartbeatInterval: durationpb.New(s.e.HeartbeatInterval()),
	}
	if len(grants) > 0 {
		resp.Leases = make([]*leaseholdv1.Grant, len(grants))
		for i, g := range grants {
			resp.Leases[i] = grantToProto(g)
		}
	}
	return resp, nil
}

// release hands grants that never reached r back to their queues,
// uncounted: one session message outside any session.
func (s *RendererServer) release(r engine.Renderer, grants []engine.Grant) {
	if len(grants) == 0 {
		return
	}
	if _, err := s.e.Receive(context.Background(), nil, engine.SessionInput{Renderer: r, Undelivered: grantRefs(grants)}); err != nil {
		s.log.Warn("undelivered leases left to expire", "leases", len(grants), "err", err)
	}
}

func grantRefs(grants []engine.Grant) []engine.LeaseRef {
	refs := make([]engine.LeaseRef, len(grants))
	for i, g := range grants {
		refs[i] = engine.LeaseRef{Job: g.Job.ID, Token: g.Job.Lease.Token}
	}
	return refs
}

// leaseRefs converts lease references; a malformed job id is refused.
func leaseRefs(in []*leaseholdv1.LeaseRef, field string) ([]engine.LeaseRef, error) {
	out := make([]engine.LeaseRef, 0, len(in))
	for _, r := range in {
		id, err := parseJobID(r.GetJobId(), field+".job_id")
		if err != nil {
			return nil, err
		}
		out = append(out, engine.LeaseRef{Job: id, Token: r.GetToken()})
	}
	return out, nil
}

// refList is one list of a renderer message: its field and how many
// leases (or completions) it names.
type refList struct {
	field string
	n     int
}

// checkLeaseRefs refuses a renderer message, or a session's opening, one
// of whose lists names more than limit leases (engine.MaxLeaseRefs of the
// renderer's capacity): INVALID_ARGUMENT TOO_MANY_LEASE_REFS naming the
// first such list. The message is refused whole, before anything of it is
// converted or applied, and its stream ends: a renderer names in one list
// at most the leases it works on at once, so a longer one is a client
// that does not follow the protocol, and answering each of its items
// would cost the writer what the bound is there to stop.
func checkLeaseRefs(limit int, lists ...refList) error {
	for _, l := range lists {
		if l.n > limit {
			return invalidArg(l.field, reasonTooManyLeaseRefs, "%s names %d leases; a renderer names at most %d in one list of a message (its capacity)",
				l.field, l.n, limit)
		}
	}
	return nil
}

// leaseList is one list of lease references in a renderer's message: the
// well-formed ones, for the writer, and an answer to each malformed one at
// its position, so that one bad reference neither ends the stream nor
// costs the leases beside it their extension.
type leaseList struct {
	refs []engine.LeaseRef
	// invalid answers the malformed references by their index in the list.
	invalid map[int]*leaseholdv1.LeaseStatus
	n       int
}

// parseLeaseList converts a list of lease references, answering each
// malformed job id LOST INVALID_ID.
func parseLeaseList(in []*leaseholdv1.LeaseRef) leaseList {
	l := leaseList{refs: make([]engine.LeaseRef, 0, len(in)), n: len(in)}
	for i, r := range in {
		id, err := parseJobID(r.GetJobId(), "job_id")
		if err != nil {
			if l.invalid == nil {
				l.invalid = make(map[int]*leaseholdv1.LeaseStatus)
			}
			l.invalid[i] = &leaseholdv1.LeaseStatus{JobId: r.GetJobId(), Token: r.GetToken(),
				State: leaseholdv1.LeaseState_LEASE_STATE_LOST, Reason: reasonInvalidID}
			continue
		}
		l.refs = append(l.refs, engine.LeaseRef{Job: id, Token: r.GetToken()})
	}
	return l
}

// answers returns the list's answers in its order: the writer's statuses
// of the well-formed references (one each, in order), the malformed ones'
// in their places.
func (l leaseList) answers(statuses []engine.LeaseStatus) []*leaseholdv1.LeaseStatus {
	out := make([]*leaseholdv1.LeaseStatus, 0, l.n)
	for i := range l.n {
		if st, bad := l.invalid[i]; bad {
			out = append(out, st)
			continue
		}
		out = append(out, leaseStatusToProto(statuses[0]))
		statuses = statuses[1:]
	}
	return out
}

// invalidAnswers returns the answers to the list's malformed references,
// in order.
func (l leaseList) invalidAnswers() []*leaseholdv1.LeaseStatus {
	var out []*leaseholdv1.LeaseStatus
	for i := range l.n {
		if st, bad := l.invalid[i]; bad {
			out = append(out, st)
		}
	}
	return out
}

// Heartbeat implements RendererService.Heartbeat over a renderer session
// with no credit: each request is one session message. A goroutine
// receives; this one answers each request in order and forwards
// revocations as soon as the writer publishes them. When the stream ends
// the session closes, and the renderer's live capacity is dropped.
func (s *RendererServer) Heartbeat(stream leaseholdv1.RendererService_HeartbeatServer) error {
	ctx := stream.Context()
	p, err := require(ctx, auth.RoleRenderer)
	if err != nil {
		return s.status(err)
	}
	first, err := stream.Recv()
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return err
	}
	r, err := rendererFor(p, first.GetRendererId())
	if err != nil {
		return s.status(err)
	}
	s.holdRenderer(ctx, r.ID)
	if first.GetCapacity() > maxCapacity {
		return s.status(invalidArg("capacity", reasonInvalidCapacity, "capacity must be at most %d", maxCapacity))
	}
	// The most leases a message may name follows the capacity the stream
	// declared last (engine.MaxLeaseRefs).
	capacity := int(first.GetCapacity())
	if err := checkLeaseRefs(engine.MaxLeaseRefs(capacity, r), heartbeatLists(first)...); err != nil {
		return s.status(err)
	}
	conn, _, err := s.e.Open(ctx, engine.SessionOpen{Renderer: r, Capacity: capacity})
	if err != nil {
		return s.streamEnd(err)
	}
	defer func() {
		if _, err := s.e.Close(context.Background(), conn, nil); err != nil {
			s.log.Debug("closing a heartbeat stream", "renderer", r.ID, "err", err)
		}
	}()
	if err := s.answerHeartbeat(ctx, stream, conn, r, first, capacity); err != nil {
		return s.streamEnd(err)
	}
	reqC, errC := receive(ctx, stream.Recv)
	for {
		select {
		case <-s.closing:
			return s.status(errShuttingDown)
		case <-ctx.Done():
			return s.streamEnd(ctx.Err())
		case err := <-errC:
			if err == io.EOF {
				return nil
			}
			return s.streamEnd(err)
		case m := <-reqC:
			if c := int(m.GetCapacity()); c > 0 {
				capacity = c
			}
			if err := s.answerHeartbeat(ctx, stream, conn, r, m, capacity); err != nil {
				return s.streamEnd(err)
			}
		case <-conn.Outbox.Ready():
			if err := s.forwardRevocations(stream, conn); err != nil {
				return err
			}
		}
	}
}

// answerHeartbeat applies one HeartbeatRequest as a message of the
// stream's session and sends its answer: the heartbeated leases, then the
// hand-backs, in order. capacity is the one the stream declared last.
func (s *RendererServer) answerHeartbeat(ctx context.Context, stream leaseholdv1.RendererService_HeartbeatServer, conn *engine.Conn, r engine.Renderer,
	m *leaseholdv1.HeartbeatRequest, capacity int) error {
	if id := m.GetRendererId(); id != "" && id != r.ID {
		return invalidArg("renderer_id", reasonInvalidRendererID, "renderer_id changed from %q to %q on one stream", r.ID, id)
	}
	if m.GetCapacity() > maxCapacity {
		return invalidArg("capacity", reasonInvalidCapacity, "capacity must be at most %d", maxCapacity)
	}
	if err := checkLeaseRefs(engine.MaxLeaseRefs(capacity, r), heartbeatLists(m)...); err != nil {
		return err
	}
	// A malformed reference is answered LOST INVALID_ID in its place (an
	// acknowledgement has no answer and is dropped); the rest are applied.
	leases, handBacks := parseLeaseList(m.GetLeases()), parseLeaseList(m.GetHandBacks())
	in := engine.SessionInput{Capacity: int(m.GetCapacity()),
		Heartbeats: leases.refs, Acks: parseLeaseList(m.GetCancelAcks()).refs, HandBacks: handBacks.refs}
	res, err := s.e.Receive(ctx, conn, in)
	if err != nil {
		return err
	}
	resp := &leaseholdv1.HeartbeatResponse{Leases: append(leases.answers(res.Heartbeats), handBacks.answers(res.HandBacks)...)}
	return stream.Send(resp)
}

// heartbeatLists are the lists of a HeartbeatRequest that name leases.
func heartbeatLists(m *leaseholdv1.HeartbeatRequest) []refList {
	return []refList{{"leases", len(m.GetLeases())}, {"hand_backs", len(m.GetHandBacks())}, {"cancel_acks", len(m.GetCancelAcks())}}
}

// forwardRevocations sends the revocations the writer published to a
// heartbeat stream, and ends the stream when the writer ended it.
func (s *RendererServer) forwardRevocations(stream leaseholdv1.RendererService_HeartbeatServer, conn *engine.Conn) error {
	_, revoked, ended := conn.Outbox.Take()
	if len(revoked) > 0 {
		resp := &leaseholdv1.HeartbeatResponse{}
		for _, r := range revoked {
			resp.Revoked = append(resp.Revoked, leaseStatusToProto(r))
		}
		if err := stream.Send(resp); err != nil {
			return s.streamEnd(err)
		}
	}
	if ended != nil {
		return s.status(ended)
	}
	return nil
}

// receive runs a stream's receive loop on its own goroutine: messages on
// the first channel, the final error (io.EOF for a clean end) on the
// second. The goroutine ends with the stream.
func receive[M any](ctx context.Context, recv func() (M, error)) (<-chan M, <-chan error) {
	reqC := make(chan M)
	errC := make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				errC <- err
				return
			}
			select {
			case reqC <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return reqC, errC
}

// streamEnd returns a stream's final error: status errors from the
// transport unchanged (logged at Debug when the client went away), the rest
// through the error table.
func (c *core) streamEnd(err error) error {
	if st, ok := status.FromError(err); ok {
		if st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded {
			c.log.Debug("stream ended by the client", "err", err)
		}
		return err
	}
	return c.status(err)
}

// preview returns a preview's digest and normalised media type, computed
// here, off the writer goroutine; an empty type is sniffed from the bytes,
// and a type outside jobs.PreviewTypes, given or sniffed, is refused
// INVALID_CONTENT_TYPE on field.
func preview(field string, content []byte, contentType string) (*jobs.Preview, error) {
	if contentType == "" {
		contentType = http.DetectContentType(content)
	}
	mt, err := checkContentType(field, contentType)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(content)
	return &jobs.Preview{Digest: hex.EncodeToString(sum[:]), ContentType: mt, Content: content}, nil
}

// completion converts a completion's outcome, checking what the writer
// cannot: the outcome is set, the failure class known, the message and the
// inline preview within their bounds.
func (c *core) completion(jobID string, token uint64, renderer string, success *leaseholdv1.CompleteSuccess, failure *leaseholdv1.CompleteFailure) (engine.CompleteRequest, error) {
	id, err := parseJobID(jobID, "job_id")
	if err != nil {
		return engine.CompleteRequest{}, err
	}
	req := engine.CompleteRequest{Job: id, Completion: jobs.Completion{Token: token, Renderer: renderer}}
	switch {
	case success != nil:
		req.Success = true
		req.Digest = success.GetArtifactDigest()
		if err := checkDigest("success.artifact_digest", req.Digest); err != nil {
			return req, err
		}
		content := success.GetContent()
		switch {
		case c.previews.InlineCap > 0 && len(content) > c.previews.InlineCap:
			return req, storeRequired("success.content", c.previews.InlineCap)
		case len(content) > c.maxInline:
			return req, invalidArg("success.content", reasonArtifactTooLarge, "an inline preview is at most %d bytes; upload larger ones with UploadArtifact", c.maxInline)
		case len(content) > 0:
			if req.Preview, err = preview("success.content_type", content, success.GetContentType()); err != nil {
				return req, err
			}
			if req.Digest != "" && req.Digest != req.Preview.Digest {
				return req, invalidArg("success.artifact_digest", reasonDigestMismatch, "the inline preview hashes to %s, not %s", req.Preview.Digest, req.Digest)
			}
		case req.Digest == "":
			return req, invalidArg("success.content", reasonEmptyArtifact, "a success needs the preview inline or the digest of its upload")
		case success.GetSizeBytes() != 0:
			if err := c.namedObject(&req, success); err != nil {
				return req, err
			}
		}
	case failure != nil:
		req.Class = jobs.FailureClass(failure.GetClass())
		req.Message = failure.GetMessage()
		if req.Class <= jobs.ClassUnspecified || req.Class > jobs.ClassTransient {
			return req, invalidArg("failure.class", reasonMissingOutcome, "failure.class must name a failure class")
		}
		if err := checkText("failure.message", req.Message, maxMessageBytes, reasonInvalidMessage); err != nil {
			return req, err
		}
	default:
		return req, invalidArg("outcome", reasonMissingOutcome, "a completion needs success or failure")
	}
	return req, nil
}

// namedObject makes a success naming a digest and a size one that names
// an object of the artifact store (a presigned upload), to be checked
// there before the writer sees it. Without a store the size is only
// checked to be sane and the digest names an upload under the lease.
func (c *core) namedObject(req *engine.CompleteRequest, success *leaseholdv1.CompleteSuccess) error {
	size := success.GetSizeBytes()
	switch {
	case size < 0 || size > c.maxBytes:
		return invalidArg("success.size_bytes", reasonArtifactTooLarge, "size_bytes must be 1 to %d", c.maxBytes)
	case c.previews.Store == nil:
		return nil
	}
	ct, err := storedContentType(success.GetContentType())
	if err != nil {
		return err
	}
	req.Stored, req.Size, req.ContentType = true, size, ct
	return nil
}

// storeRequired refuses a preview over the inline cap of a cluster
// without a shared artifact store.
func storeRequired(field string, limit int) error {
	return invalidArg(field, reasonStoreRequired, "this cluster has no shared artifact store and keeps previews inline, "+
		"at most %d bytes; configure --artifact-store s3://… to take larger ones", limit)
}

// Complete implements RendererService.Complete: one session message,
// outside any session, carrying the completion.
func (s *RendererServer) Complete(ctx context.Context, req *leaseholdv1.CompleteRequest) (*leaseholdv1.CompleteResponse, error) {
	p, err := require(ctx, auth.RoleRenderer)
	if err != nil {
		return nil, s.status(err)
	}
	r, err := rendererFor(p, req.GetRendererId())
	if err != nil {
		return nil, s.status(err)
	}
	cr, err := s.completion(req.GetJobId(), req.GetToken(), r.ID, req.GetSuccess(), req.GetFailure())
	if err != nil {
		return nil, s.status(err)
	}
	reqs := []engine.CompleteRequest{cr}
	if errs := s.resolve(ctx, s.e, reqs); errs != nil && errs[0] != nil {
		return nil, s.status(errs[0])
	}
	cr = reqs[0]
	out, err := s.e.Receive(ctx, nil, engine.SessionInput{Renderer: r, Completions: []engine.CompleteRequest{cr}})
	if err == nil {
		err = out.Completions[0].Err
	}
	if err != nil {
		return nil, s.status(notFound(err, reasonJobNotFound, "job %s not found", req.GetJobId()))
	}
	res := out.Completions[0]
	return &leaseholdv1.CompleteResponse{Job: jobToProto(res.Job, viewFull, false), Replayed: res.Replayed}, nil
}
