package edge

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testBundle is a gRPC server over bufconn with the edge in front of fake
// services, and a client connection to it.
type testBundle struct {
	conn *grpc.ClientConn
	caps *StreamCaps
	// ended receives the method of every stream once the interceptors,
	// the stream caps' release included, have returned.
	ended chan string
}

// setup starts the server with caps (DefaultStreamCaps when nil), the
// codec, authentication with the development principals and the malformed
// interceptors, in the coordinator's order.
func setup(t *testing.T, caps []StreamCap) *testBundle {
	t.Helper()
	if caps == nil {
		caps = DefaultStreamCaps()
	}
	b := &testBundle{caps: NewStreamCaps(caps...), ended: make(chan string, 64)}
	principals := auth.DevPrincipals()
	signalEnd := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		b.ended <- info.FullMethod
		return err
	}
	s := grpc.NewServer(
		grpc.ForceServerCodecV2(ServerCodec()),
		grpc.ChainUnaryInterceptor(principals.UnaryServerInterceptor(), MalformedUnaryInterceptor()),
		grpc.ChainStreamInterceptor(signalEnd, principals.StreamServerInterceptor(), b.caps.StreamServerInterceptor(), MalformedStreamInterceptor()),
	)
	leaseholdv1.RegisterJobServiceServer(s, fakeJobs{})
	leaseholdv1.RegisterRendererServiceServer(s, fakeRenderers{})
	lis := bufconn.Listen(1 << 20)
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	b.conn = conn
	t.Cleanup(func() {
		conn.Close()
		s.Stop()
		<-served
	})
	return b
}

// as returns ctx carrying the bearer token.
func as(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// fakeJobs answers GetJob with the id asked for and holds WatchBatch open,
// after one first message, until the client goes.
type fakeJobs struct {
	leaseholdv1.UnimplementedJobServiceServer
}

func (fakeJobs) GetJob(_ context.Context, req *leaseholdv1.GetJobRequest) (*leaseholdv1.GetJobResponse, error) {
	return &leaseholdv1.GetJobResponse{Job: &leaseholdv1.Job{Id: req.GetJobId()}}, nil
}

func (fakeJobs) WatchBatch(req *leaseholdv1.WatchBatchRequest, stream leaseholdv1.JobService_WatchBatchServer) error {
	if err := stream.Send(&leaseholdv1.WatchBatchResponse{}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return stream.Context().Err()
}

// fakeRenderers echoes each heartbeat's leases and answers an upload with
// the number of chunks.
type fakeRenderers struct {
	leaseholdv1.UnimplementedRendererServiceServer
}

func (fakeRenderers) Heartbeat(stream leaseholdv1.RendererService_HeartbeatServer) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		resp := &leaseholdv1.HeartbeatResponse{}
		for _, l := range req.GetLeases() {
			resp.Leases = append(resp.Leases, &leaseholdv1.LeaseStatus{JobId: l.GetJobId(), Token: l.GetToken()})
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (fakeRenderers) UploadArtifact(stream leaseholdv1.RendererService_UploadArtifactServer) error {
	n := 0
	for {
		_, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(&leaseholdv1.UploadArtifactResponse{Digest: string(rune('0' + n))})
		}
		if err != nil {
			return err
		}
		n++
	}
}

// rawCodec is a client codec that sends the bytes it is given as they are,
// so that tests can send what no generated type would encode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// details returns the ErrorInfo, BadRequest and QuotaFailure of err.
func details(err error) (*errdetails.ErrorInfo, *errdetails.BadRequest, *errdetails.QuotaFailure) {
	var (
		info  *errdetails.ErrorInfo
		bad   *errdetails.BadRequest
		quota *errdetails.QuotaFailure
	)
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			bad = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	return info, bad, quota
}
