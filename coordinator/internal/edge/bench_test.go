package edge

import (
	"context"
	"fmt"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// benchRequest returns a batch of n small inline documents, the
// coordinator's most common large request.
func benchRequest(b *testing.B, n int) mem.BufferSlice {
	b.Helper()
	req := &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "bench-1"}
	for i := range n {
		req.Documents = append(req.Documents, &leaseholdv1.Document{
			Name: fmt.Sprintf("doc-%d.pdf", i), ContentType: "application/pdf", Content: make([]byte, 512),
		})
	}
	data, err := proto.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	return mem.BufferSlice{mem.SliceBuffer(data)}
}

// BenchmarkUnmarshal compares grpc-go's proto codec with ServerCodec plus
// the malformed check on a well-formed request: what every request pays.
//
//	go test -run '^$' -bench Unmarshal -benchmem -count 10 ./coordinator/internal/edge/
func BenchmarkUnmarshal(b *testing.B) {
	check := MalformedUnaryInterceptor()
	pass := func(context.Context, any) (any, error) { return nil, nil }
	info := &grpc.UnaryServerInfo{}
	for _, docs := range []int{1, 100} {
		data := benchRequest(b, docs)
		b.Run(fmt.Sprintf("docs=%d/codec=proto", docs), func(b *testing.B) {
			c := encoding.GetCodecV2(grpcproto.Name)
			b.ReportAllocs()
			for b.Loop() {
				var m leaseholdv1.SubmitBatchRequest
				if err := c.Unmarshal(data, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("docs=%d/codec=edge+check", docs), func(b *testing.B) {
			c := ServerCodec()
			b.ReportAllocs()
			for b.Loop() {
				var m leaseholdv1.SubmitBatchRequest
				if err := c.Unmarshal(data, &m); err != nil {
					b.Fatal(err)
				}
				if _, err := check(context.Background(), &m, info, pass); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMalformedCheck measures the check alone on a decoded request.
func BenchmarkMalformedCheck(b *testing.B) {
	m := &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "bench-1"}
	for b.Loop() {
		if _, ok := markOf(m); ok {
			b.Fatal("marked")
		}
	}
}
