package server

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	"github.com/leasehold/leasehold/coordinator/internal/mutation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Read consistency on a replicated coordinator.
//
// Writes and renderer streams go through the writer, which runs on the
// leader only: elsewhere it answers NOT_LEADER by itself. Reads are served
// from this node's store, which a follower's state machine keeps a little
// behind the leader's; so a read is linearizable only when the node that
// serves it confirmed, after the read arrived, that it still leads. That
// is the default. A caller that can do with a possibly stale answer (a
// dashboard, a backup) asks for it with the request metadata
// "leasehold-read: stale", and any node serves it at once, saying in the
// response header "leasehold-applied-index" how far its store had applied
// the log.
const (
	// ReadModeKey is the request metadata that chooses a read's
	// consistency; ReadStale is its one value.
	ReadModeKey = "leasehold-read"
	ReadStale   = "stale"
	// AppliedIndexKey is the response header with the applied index.
	AppliedIndexKey = "leasehold-applied-index"
)

// Leadership is what the read path needs of a replicated coordinator's
// raft node.
type Leadership interface {
	// VerifyLeader confirms with a quorum that this node leads, and
	// returns an error wrapping engine.ErrNotLeader otherwise.
	VerifyLeader(ctx context.Context) error
	// Applied is the index of the last log entry this node's store applied.
	Applied() uint64
}

// mode is how a method of the API is served on a replicated coordinator.
type mode int

const (
	// verified methods run only once this node has confirmed with a
	// quorum that it leads, whatever the read mode: the mode of a method
	// the table does not name, so that a new read is never served stale
	// by mistake. The writes whose handlers read the store before the
	// writer sees them are named too: the job or batch, for the caller's
	// view of it and the audit record of a refusal. Off the leader that
	// read comes from a store a little behind, or from a deposed leader's
	// that misses what the new one took, and would answer NOT_FOUND for
	// what exists.
	verified mode = iota
	// write methods go through the writer, which runs on the leader only
	// and elsewhere answers NOT_LEADER by itself; the cluster changes
	// find the leader in their handlers.
	write
	// read methods are served from this node's store: linearizable by
	// default (verified first), stale on request (served at once, with
	// the applied index).
	read
	// leaderRead methods are fed by the writer itself (watch events, the
	// overview it publishes): a follower has nothing to serve them from,
	// so they are never stale reads.
	leaderRead
	// localRead methods are always served where they are asked, with the
	// applied index: a backup is a copy of the store at one instant and
	// may come from any node.
	localRead
	// nodeRead methods report this node's own view (of the cluster), and
	// are served where they are asked.
	nodeRead
)

// modes is the mode of every method of the API (see mode); a method of
// package leasehold.v1 missing here is verified. Other services (health,
// reflection) pass through.
var modes = map[string]mode{
	"/leasehold.v1.JobService/SubmitBatch": write,
	"/leasehold.v1.JobService/GetJob":      read,
	"/leasehold.v1.JobService/ListJobs":    read,
	"/leasehold.v1.JobService/GetBatch":    read,
	"/leasehold.v1.JobService/WatchBatch":  leaderRead,
	"/leasehold.v1.JobService/CancelJob":   verified,
	"/leasehold.v1.JobService/CancelBatch": verified,
	"/leasehold.v1.JobService/GetArtifact": read,

	"/leasehold.v1.RendererService/Session":        write,
	"/leasehold.v1.RendererService/Acquire":        write,
	"/leasehold.v1.RendererService/Heartbeat":      write,
	"/leasehold.v1.RendererService/UploadArtifact": write,
	"/leasehold.v1.RendererService/Complete":       write,
	// PrepareUpload reads the job from the store to check the lease before
	// it signs: off the leader that read may miss the grant.
	"/leasehold.v1.RendererService/PrepareUpload": verified,

	"/leasehold.v1.OperatorService/ListRejectedCompletions": read,
	"/leasehold.v1.OperatorService/ReplayJobs":              write,
	"/leasehold.v1.OperatorService/PauseDispatch":           write,
	"/leasehold.v1.OperatorService/ResumeDispatch":          write,
	"/leasehold.v1.OperatorService/GetAudit":                read,
	"/leasehold.v1.OperatorService/Backup":                  localRead,

	"/leasehold.v1.OverviewService/GetOverview":   leaderRead,
	"/leasehold.v1.OverviewService/WatchOverview": leaderRead,
	"/leasehold.v1.OverviewService/ListBatches":   read,
	"/leasehold.v1.OverviewService/ListRenderers": leaderRead,

	"/leasehold.v1.ClusterService/GetCluster":         nodeRead,
	"/leasehold.v1.ClusterService/TransferLeadership": write,
	"/leasehold.v1.ClusterService/AddVoter":           write,
	"/leasehold.v1.ClusterService/RemoveServer":       write,
}

// apiPrefix begins the full name of every method of the API.
const apiPrefix = "/leasehold.v1."

// modeOf returns the mode of method, verified for a method of the API the
// table does not name, and write (passed through) for another service's.
func modeOf(method string) mode {
	m, ok := modes[method]
	if mutation.On(mutation.ReadTableGap) && method == apiPrefix+"JobService/ListJobs" {
		ok = false
	}
	if ok {
		return m
	}
	if strings.HasPrefix(method, apiPrefix) {
		if mutation.On(mutation.ReadTableGap) {
			return localRead
		}
		return verified
	}
	return write
}

// Consistency returns the interceptors that apply the read mode on a
// replicated coordinator (see mode): before a method runs, a verified one,
// or a linearizable read, has this node verify its leadership
// (NOT_LEADER otherwise), and a stale read gets the applied index in its
// header. Writes pass through.
func Consistency(l Leadership, log *slog.Logger) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	// check returns the header of a stale read, or why the method may not
	// run here.
	check := func(ctx context.Context, method string) (metadata.MD, error) {
		switch m := modeOf(method); {
		case m == write, m == nodeRead:
			return nil, nil
		case m == localRead, m == read && staleAsked(ctx):
			return metadata.Pairs(AppliedIndexKey, strconv.FormatUint(l.Applied(), 10)), nil
		case (m == read || m == leaderRead) && mutation.On(mutation.StaleRead):
			return nil, nil
		}
		return nil, l.VerifyLeader(ctx)
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := check(ctx, info.FullMethod)
		if err != nil {
			return nil, toStatus(log, err)
		}
		if md != nil {
			if err := grpc.SetHeader(ctx, md); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := check(ss.Context(), info.FullMethod)
		if err != nil {
			return toStatus(log, err)
		}
		if md != nil {
			if err := ss.SetHeader(md); err != nil {
				return err
			}
		}
		return handler(srv, ss)
	}
	return unary, stream
}

// staleAsked reports whether the caller asked for a stale read.
func staleAsked(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(ReadModeKey) {
		if strings.EqualFold(v, ReadStale) {
			return true
		}
	}
	return false
}
