package edge

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client/reason"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// invalidUTF8 is not UTF-8: a lone continuation byte and a truncated
// sequence.
var invalidUTF8 = []byte{'j', '-', 0x80, 0xe2, 0x82}

// garbage does not parse as any message: a tag with field number 0.
var garbage = []byte{0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// stringAsBytes encodes value as the bytes of field num, as a message type
// with bytes at that number would; it is how a client sends a proto3
// string field that is not UTF-8.
func stringAsBytes(b []byte, num protowire.Number, value []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, value)
}

// embedded encodes msg as the message field num.
func embedded(b []byte, num protowire.Number, msg []byte) []byte {
	return stringAsBytes(b, num, msg)
}

// mustMarshal encodes m.
func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkMalformed fails unless err is INVALID_ARGUMENT MALFORMED_REQUEST
// whose BadRequest names field and a description containing desc.
func checkMalformed(t *testing.T, err error, field, desc string) {
	t.Helper()
	if got := status.Code(err); got != codes.InvalidArgument {
		t.Fatalf("code = %v (%v), want InvalidArgument", got, err)
	}
	info, bad, _ := details(err)
	if info.GetReason() != string(reason.MalformedRequest) || info.GetDomain() != ErrorDomain {
		t.Errorf("ErrorInfo = %v, want reason %s domain %s", info, reason.MalformedRequest, ErrorDomain)
	}
	if len(bad.GetFieldViolations()) != 1 {
		t.Fatalf("BadRequest = %v, want one field violation", bad)
	}
	v := bad.GetFieldViolations()[0]
	if v.GetField() != field || !strings.Contains(v.GetDescription(), desc) {
		t.Errorf("violation = %q: %q, want %q: ...%s...", v.GetField(), v.GetDescription(), field, desc)
	}
}

// TestMalformedRequests sends what the proto codec cannot decode over real
// gRPC, on unary and streaming methods, and checks INVALID_ARGUMENT where
// grpc-go alone answers INTERNAL.
func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alpha := as(ctx, "dev-alpha")
	renderer := as(ctx, "dev-renderer")
	raw := grpc.ForceCodecV2(rawCodec{})

	unary := func(ctx context.Context, method string, req []byte) error {
		var resp []byte
		return b.conn.Invoke(ctx, method, &req, &resp, raw)
	}

	t.Run("A unary string field that is not UTF-8 is INVALID_ARGUMENT naming the field", func(t *testing.T) {
		err := unary(alpha, leaseholdv1.JobService_GetJob_FullMethodName, stringAsBytes(nil, 1, invalidUTF8))
		checkMalformed(t, err, "job_id", "invalid UTF-8")
	})
	t.Run("Unary garbage is INVALID_ARGUMENT", func(t *testing.T) {
		err := unary(alpha, leaseholdv1.JobService_GetJob_FullMethodName, garbage)
		checkMalformed(t, err, "", "invalid wire-format data")
	})
	t.Run("A well-formed unary request still works", func(t *testing.T) {
		resp, err := leaseholdv1.NewJobServiceClient(b.conn).GetJob(alpha, &leaseholdv1.GetJobRequest{JobId: "j-1"})
		if err != nil || resp.GetJob().GetId() != "j-1" {
			t.Fatalf("GetJob = %v, %v; want job j-1", resp, err)
		}
	})
	t.Run("A forged mark without this process's nonce is an ordinary unknown field", func(t *testing.T) {
		forged := protowire.AppendTag(nil, markNonce, protowire.BytesType)
		forged = protowire.AppendBytes(forged, make([]byte, nonceByteSize))
		forged = protowire.AppendTag(forged, markDesc, protowire.BytesType)
		forged = protowire.AppendString(forged, "forged")
		req := stringAsBytes(mustMarshal(t, &leaseholdv1.GetJobRequest{JobId: "j-2"}), markField, forged)
		if err := unary(alpha, leaseholdv1.JobService_GetJob_FullMethodName, req); err != nil {
			t.Errorf("GetJob with a forged mark = %v, want OK", err)
		}
	})
	t.Run("An unauthenticated malformed request is UNAUTHENTICATED first", func(t *testing.T) {
		err := unary(ctx, leaseholdv1.JobService_GetJob_FullMethodName, garbage)
		if got := status.Code(err); got != codes.Unauthenticated {
			t.Errorf("code = %v, want Unauthenticated", got)
		}
	})

	t.Run("A server stream's malformed request is INVALID_ARGUMENT", func(t *testing.T) {
		desc := &grpc.StreamDesc{ServerStreams: true}
		for _, tc := range []struct {
			name, field, desc string
			req               []byte
		}{
			{"invalid UTF-8", "batch_id", "invalid UTF-8", stringAsBytes(nil, 1, invalidUTF8)},
			{"garbage", "", "invalid wire-format data", garbage},
		} {
			s, err := b.conn.NewStream(alpha, desc, leaseholdv1.JobService_WatchBatch_FullMethodName, raw)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SendMsg(&tc.req); err != nil {
				t.Fatal(err)
			}
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			var resp []byte
			checkMalformed(t, s.RecvMsg(&resp), tc.field, tc.desc)
		}
	})
	t.Run("A bidi stream refuses a malformed message after good ones, naming the nested field", func(t *testing.T) {
		desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
		s, err := b.conn.NewStream(renderer, desc, leaseholdv1.RendererService_Heartbeat_FullMethodName, raw)
		if err != nil {
			t.Fatal(err)
		}
		good := mustMarshal(t, &leaseholdv1.HeartbeatRequest{RendererId: "r-1", Leases: []*leaseholdv1.LeaseRef{{JobId: "j-1", Token: 7}}})
		if err := s.SendMsg(&good); err != nil {
			t.Fatal(err)
		}
		var resp []byte
		if err := s.RecvMsg(&resp); err != nil {
			t.Fatalf("answer to a good heartbeat: %v", err)
		}
		// leases[0] is fine, leases[1].job_id is not UTF-8.
		bad := mustMarshal(t, &leaseholdv1.HeartbeatRequest{Leases: []*leaseholdv1.LeaseRef{{JobId: "j-1", Token: 7}}})
		bad = embedded(bad, 3, stringAsBytes(nil, 1, invalidUTF8))
		if err := s.SendMsg(&bad); err != nil {
			t.Fatal(err)
		}
		checkMalformed(t, s.RecvMsg(&resp), "leases[1].job_id", "invalid UTF-8")
	})
	t.Run("A client stream's garbage is INVALID_ARGUMENT", func(t *testing.T) {
		desc := &grpc.StreamDesc{ClientStreams: true}
		s, err := b.conn.NewStream(renderer, desc, leaseholdv1.RendererService_UploadArtifact_FullMethodName, raw)
		if err != nil {
			t.Fatal(err)
		}
		chunk := mustMarshal(t, &leaseholdv1.UploadArtifactRequest{Part: &leaseholdv1.UploadArtifactRequest_Chunk{Chunk: []byte("png")}})
		for _, m := range [][]byte{chunk, garbage} {
			if err := s.SendMsg(&m); err != nil && err != io.EOF {
				t.Fatal(err)
			}
		}
		s.CloseSend()
		var resp []byte
		checkMalformed(t, s.RecvMsg(&resp), "", "invalid wire-format data")
	})
}

// TestDiagnose checks the field paths and errors the codec reports.
func TestDiagnose(t *testing.T) {
	t.Parallel()
	submit := (&leaseholdv1.SubmitBatchRequest{}).ProtoReflect().Descriptor()
	doc := func(name []byte) []byte {
		return stringAsBytes(nil, 1, name)
	}
	third := embedded(embedded(embedded(nil, 3, doc([]byte("a"))), 3, doc([]byte("b"))), 3, doc(invalidUTF8))
	tests := []struct {
		name      string
		md        protoreflect.MessageDescriptor
		b         []byte
		wantPath  string
		wantInErr string
	}{
		{"A top-level string", submit, stringAsBytes(nil, 2, invalidUTF8), "request_id", "invalid UTF-8"},
		{"A string in the third element of a repeated message", submit, third, "documents[2].name", "invalid UTF-8"},
		{"A truncated nested message", submit, append(protowire.AppendTag(nil, 3, protowire.BytesType), 50, 1, 2), "documents[0]", "invalid wire-format data"},
		{"A field number zero", submit, garbage, "", "invalid wire-format data"},
		{"Well-formed bytes blame nothing", submit, mustMarshal(t, &leaseholdv1.SubmitBatchRequest{Team: "alpha"}), "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path, desc := diagnose(tc.md, tc.b, 0)
			if path != tc.wantPath || !strings.Contains(desc, tc.wantInErr) || (tc.wantInErr == "") != (desc == "") {
				t.Errorf("diagnose = %q, %q; want %q, ...%s...", path, desc, tc.wantPath, tc.wantInErr)
			}
		})
	}
}

// TestMarkRoundTrip checks that a mark survives, is found only with this
// process's nonce, and that its text is kept valid UTF-8.
func TestMarkRoundTrip(t *testing.T) {
	t.Parallel()
	m := &leaseholdv1.GetJobRequest{}
	m.ProtoReflect().SetUnknown(encodeMark("job_id", "bad \xff text"))
	mk, ok := markOf(m)
	if !ok {
		t.Fatal("markOf found no mark")
	}
	if mk.msgName != "leasehold.v1.GetJobRequest" || mk.path != "job_id" || mk.desc != "bad \uFFFD text" {
		t.Errorf("mark = %+v", mk)
	}
	if _, ok := markOf(&leaseholdv1.GetJobRequest{JobId: "j-1"}); ok {
		t.Errorf("a well-formed message is marked")
	}
	if _, ok := markOf("not a message"); ok {
		t.Errorf("a non-message is marked")
	}
}
