package edge

import (
	"fmt"
	"slices"
	"sync"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
)

// Default stream caps per principal.
const (
	// DefaultWatchStreams bounds one principal's concurrent WatchBatch
	// streams.
	DefaultWatchStreams = 64
	// DefaultRendererStreams bounds one principal's concurrent Session,
	// Heartbeat and UploadArtifact streams, counted together.
	DefaultRendererStreams = 256
	// DefaultOverviewStreams bounds one principal's concurrent
	// WatchOverview streams.
	DefaultOverviewStreams = 16
	// DefaultBackupStreams bounds one principal's concurrent Backup
	// streams: each reads the whole database in a read transaction.
	DefaultBackupStreams = 1
)

// StreamCap bounds the concurrent streams one principal holds on a group of
// methods.
type StreamCap struct {
	// Name names the cap in refusals ("watch", "renderer").
	Name string
	// Methods are the full method names the cap counts together
	// ("/leasehold.v1.JobService/WatchBatch").
	Methods []string
	// PerPrincipal is the most streams one principal may hold open on
	// Methods at once; it must be at least 1.
	PerPrincipal int
}

// DefaultStreamCaps returns the coordinator's caps: DefaultWatchStreams
// WatchBatch streams, DefaultRendererStreams renderer streams (Session,
// Heartbeat, UploadArtifact), DefaultOverviewStreams WatchOverview streams
// and DefaultBackupStreams Backup streams per principal.
func DefaultStreamCaps() []StreamCap {
	return []StreamCap{
		{Name: "watch", Methods: []string{leaseholdv1.JobService_WatchBatch_FullMethodName}, PerPrincipal: DefaultWatchStreams},
		{Name: "renderer", Methods: []string{
			leaseholdv1.RendererService_Session_FullMethodName,
			leaseholdv1.RendererService_Heartbeat_FullMethodName,
			leaseholdv1.RendererService_UploadArtifact_FullMethodName,
		}, PerPrincipal: DefaultRendererStreams},
		{Name: "overview", Methods: []string{leaseholdv1.OverviewService_WatchOverview_FullMethodName}, PerPrincipal: DefaultOverviewStreams},
		{Name: "backup", Methods: []string{leaseholdv1.OperatorService_Backup_FullMethodName}, PerPrincipal: DefaultBackupStreams},
	}
}

// StreamCaps counts the open streams of each principal on each cap and
// refuses one over the cap. It is safe for concurrent use.
type StreamCaps struct {
	byMethod map[string]*StreamCap

	mu   sync.Mutex
	open map[capKey]int
}

// capKey is one principal on one cap.
type capKey struct {
	cap       *StreamCap
	principal string
}

// NewStreamCaps returns caps counting streams per principal. It panics if
// a cap's PerPrincipal is below 1 or a method belongs to two caps: both are
// programming errors.
func NewStreamCaps(caps ...StreamCap) *StreamCaps {
	s := &StreamCaps{byMethod: make(map[string]*StreamCap), open: make(map[capKey]int)}
	caps = slices.Clone(caps)
	for i := range caps {
		c := &caps[i]
		if c.PerPrincipal < 1 {
			panic(fmt.Sprintf("edge: stream cap %q must allow at least 1 stream, got %d", c.Name, c.PerPrincipal))
		}
		for _, m := range c.Methods {
			if _, dup := s.byMethod[m]; dup {
				panic(fmt.Sprintf("edge: method %s is in two stream caps", m))
			}
			s.byMethod[m] = c
		}
	}
	return s
}

// StreamServerInterceptor returns the interceptor that counts the streams
// of the authenticated principal (auth.FromContext) and refuses one over
// its cap with RESOURCE_EXHAUSTED TOO_MANY_STREAMS, before the handler
// runs. It must come after the authentication interceptor. Streams of other
// methods, or without a principal, pass uncounted.
func (s *StreamCaps) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		c, ok := s.byMethod[info.FullMethod]
		if !ok {
			return handler(srv, ss)
		}
		p, ok := auth.FromContext(ss.Context())
		if !ok {
			return handler(srv, ss)
		}
		key := capKey{cap: c, principal: p.Name}
		if !s.acquire(key) {
			return tooManyStreamsError(p.Name, c.Name, c.PerPrincipal)
		}
		defer s.release(key)
		return handler(srv, ss)
	}
}

// acquire counts one more stream for key if it is under its cap.
func (s *StreamCaps) acquire(key capKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[key] >= key.cap.PerPrincipal {
		return false
	}
	s.open[key]++
	return true
}

// release counts one stream of key fewer.
func (s *StreamCaps) release(key capKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[key] <= 1 {
		delete(s.open, key)
		return
	}
	s.open[key]--
}

// Open returns how many streams principal holds open on the cap named
// capName.
func (s *StreamCaps) Open(principal, capName string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, v := range s.open {
		if k.principal == principal && k.cap.Name == capName {
			n += v
		}
	}
	return n
}
