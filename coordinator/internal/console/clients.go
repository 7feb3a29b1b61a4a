package console

import (
	"errors"
	"io"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
)

// clients are the services the console calls, as gRPC clients on the
// coordinator's own server (Config.Conn).
type clients struct {
	Jobs      jobsClient
	Operators leaseholdv1.OperatorServiceClient
	Overview  leaseholdv1.OverviewServiceClient
	Cluster   leaseholdv1.ClusterServiceClient
}

func newClients(conn grpc.ClientConnInterface) clients {
	return clients{
		Jobs:      jobsClient{leaseholdv1.NewJobServiceClient(conn)},
		Operators: leaseholdv1.NewOperatorServiceClient(conn),
		Overview:  leaseholdv1.NewOverviewServiceClient(conn),
		Cluster:   leaseholdv1.NewClusterServiceClient(conn),
	}
}

// jobsClient is JobService's client, with GetArtifact reading the whole
// server stream into a sink.
type jobsClient struct {
	leaseholdv1.JobServiceClient
}

// GetArtifact calls GetArtifact in sink's context and collects the
// preview's metadata and bytes into sink, or returns the call's status.
func (c jobsClient) GetArtifact(req *leaseholdv1.GetArtifactRequest, sink *artifactSink) error {
	stream, err := c.JobServiceClient.GetArtifact(sink.ctx, req)
	if err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.GetArtifact() != nil {
			sink.meta = m.GetArtifact()
		}
		sink.data = append(sink.data, m.GetChunk()...)
	}
}
