package server

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

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

// readMethods are the methods served from the store rather than the writer: the
// ones the read mode applies to. Backup is a copy of the store at one
// instant and may come from any node: it is always served where it is
// asked, as a stale read.
var readMethods = map[string]bool{
	"/leasehold.v1.JobService/GetJob":                       true,
	"/leasehold.v1.JobService/ListJobs":                     true,
	"/leasehold.v1.JobService/GetBatch":                     true,
	"/leasehold.v1.JobService/WatchBatch":                   true,
	"/leasehold.v1.JobService/GetArtifact":                  true,
	"/leasehold.v1.OperatorService/ListRejectedCompletions": true,
	"/leasehold.v1.OperatorService/GetAudit":                true,
	"/leasehold.v1.OperatorService/Backup":                  true,
	"/leasehold.v1.OverviewService/GetOverview":             true,
	"/leasehold.v1.OverviewService/WatchOverview":           true,
	"/leasehold.v1.OverviewService/ListBatches":             true,
	"/leasehold.v1.OverviewService/ListRenderers":           true,
}

// readFirstWrites are the writes whose handlers read the store before the
// writer sees them: the job or batch, for the caller's view of it and the
// audit record of a refusal. Off the leader that read comes from a store a
// little behind, or from a deposed leader's that misses what the new one
// took, and would answer NOT_FOUND for what exists; so these verify
// leadership first, whatever the read mode, as a linearizable read does.
var readFirstWrites = map[string]bool{
	"/leasehold.v1.JobService/CancelJob":   true,
	"/leasehold.v1.JobService/CancelBatch": true,
}

// leaderOnly are the reads fed by the writer itself (watch events, the
// overview it publishes): a follower has nothing to serve them from, so
// they are never stale reads.
var leaderOnly = map[string]bool{
	"/leasehold.v1.JobService/WatchBatch":         true,
	"/leasehold.v1.OverviewService/GetOverview":   true,
	"/leasehold.v1.OverviewService/WatchOverview": true,
	"/leasehold.v1.OverviewService/ListRenderers": true,
}

// Consistency returns the interceptors that apply the read mode on a
// replicated coordinator: before a read runs, a linearizable one has this
// node verify its leadership (NOT_LEADER otherwise) and a stale one gets
// the applied index in its header; a write that reads first (see
// readFirstWrites) is verified as a linearizable read. Other methods pass
// through.
func Consistency(l Leadership, log *slog.Logger) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	// check returns the header of a stale read, or why the read may not
	// run here.
	check := func(ctx context.Context, method string) (metadata.MD, error) {
		if readFirstWrites[method] {
			return nil, l.VerifyLeader(ctx)
		}
		if !readMethods[method] {
			return nil, nil
		}
		if staleRead(ctx, method) {
			return metadata.Pairs(AppliedIndexKey, strconv.FormatUint(l.Applied(), 10)), nil
		}
		if staleReadMutant {
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

// staleRead reports whether a read of method may be served from this
// node's store as it is: a backup always, another read when the caller
// asked for it, unless the writer itself feeds it.
func staleRead(ctx context.Context, method string) bool {
	if method == backupMethod {
		return true
	}
	if leaderOnly[method] {
		return false
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(ReadModeKey) {
		if strings.EqualFold(v, ReadStale) {
			return true
		}
	}
	return false
}

// backupMethod is OperatorService.Backup's full name.
const backupMethod = "/leasehold.v1.OperatorService/Backup"
