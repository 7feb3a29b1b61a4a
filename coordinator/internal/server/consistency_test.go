package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/engine"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// apiMethods returns the full name of every method of every service of
// package leasehold.v1, from the descriptors the generated code
// registers.
func apiMethods(t *testing.T) []string {
	t.Helper()
	_ = leaseholdv1.File_leasehold_v1_job_service_proto // the package's files are registered
	var names []string
	protoregistry.GlobalFiles.RangeFilesByPackage("leasehold.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				names = append(names, "/"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name()))
			}
		}
		return true
	})
	if len(names) == 0 {
		t.Fatal("no service of leasehold.v1 is registered")
	}
	return names
}

// TestEveryMethodHasAMode keeps the read-consistency table whole: every
// method of the API is named in it (one missing would be verified, which
// is safe but perhaps not meant), every read of the API (Get*, List*,
// Watch*, Backup) is classified as one, and the table names no method
// that does not exist.
func TestEveryMethodHasAMode(t *testing.T) {
	t.Parallel()
	methods := apiMethods(t)
	known := map[string]bool{}
	for _, m := range methods {
		known[m] = true
		mode, ok := modes[m]
		if !ok {
			t.Errorf("%s has no mode in the consistency table", m)
			continue
		}
		name := m[strings.LastIndex(m, "/")+1:]
		isRead := mode == read || mode == leaderRead || mode == localRead || mode == nodeRead
		for _, prefix := range []string{"Get", "List", "Watch", "Backup"} {
			if strings.HasPrefix(name, prefix) && !isRead {
				t.Errorf("%s is a read by its name, but its mode is %d", m, mode)
			}
		}
	}
	for m := range modes {
		if !known[m] {
			t.Errorf("the consistency table names %s, which is no method of the API", m)
		}
	}
}

// leadershipStub is a node that does not lead: VerifyLeader refuses and
// counts.
type leadershipStub struct{ verified int }

func (l *leadershipStub) VerifyLeader(context.Context) error {
	l.verified++
	return engine.NotLeader("n2", "n2:7070", nil)
}

func (l *leadershipStub) Applied() uint64 { return 42 }

// headerStream is the server transport stream of a unary call, for
// grpc.SetHeader.
type headerStream struct {
	grpc.ServerTransportStream
	header metadata.MD
}

func (s *headerStream) SetHeader(md metadata.MD) error {
	s.header = metadata.Join(s.header, md)
	return nil
}

// TestConsistencyDecidesByDefault runs the unary interceptor on a node
// that does not lead: a method the table does not name is verified (and
// refused) like a linearizable read, not let through.
func TestConsistencyDecidesByDefault(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, method string
		stale        bool
		wantVerified bool
		wantHeader   bool
	}{
		{"A method of the API the table does not name is verified", "/leasehold.v1.JobService/GetSomethingNew", false, true, false},
		{"Even when the caller asks for a stale read", "/leasehold.v1.JobService/GetSomethingNew", true, true, false},
		{"A method of a service the table does not know is verified", "/leasehold.v1.NewService/Do", false, true, false},
		{"A linearizable read is verified", "/leasehold.v1.JobService/GetJob", false, true, false},
		{"A stale read is served with the applied index", "/leasehold.v1.JobService/GetJob", true, false, true},
		{"A read the writer feeds is verified even when asked stale", "/leasehold.v1.OverviewService/GetOverview", true, true, false},
		{"A write that reads first is verified", "/leasehold.v1.JobService/CancelJob", false, true, false},
		{"A write is left to the writer", "/leasehold.v1.JobService/SubmitBatch", false, false, false},
		{"A backup is served where it is asked", "/leasehold.v1.OperatorService/Backup", false, false, true},
		{"This node's view of the cluster is served where it is asked", "/leasehold.v1.ClusterService/GetCluster", false, false, false},
		{"Health checks pass through", "/grpc.health.v1.Health/Check", false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := &leadershipStub{}
			unary, _ := Consistency(l, slog.New(slog.DiscardHandler))
			ctx := context.Background()
			if tt.stale {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(ReadModeKey, ReadStale))
			}
			hs := &headerStream{}
			ctx = grpc.NewContextWithServerTransportStream(ctx, hs)
			ran := false
			_, err := unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: tt.method}, func(context.Context, any) (any, error) {
				ran = true
				return nil, nil
			})
			if got := l.verified > 0; got != tt.wantVerified {
				t.Errorf("verified %v, want %v", got, tt.wantVerified)
			}
			if tt.wantVerified {
				if ran || status.Code(err) != codes.Unavailable {
					t.Errorf("ran %v, err %v; want UNAVAILABLE NOT_LEADER before the handler", ran, err)
				}
			} else if !ran || err != nil {
				t.Errorf("ran %v, err %v; want the handler run", ran, err)
			}
			if got := len(hs.header.Get(AppliedIndexKey)) > 0; got != tt.wantHeader {
				t.Errorf("applied index header %v, want %v", hs.header, tt.wantHeader)
			}
		})
	}
}
